// The CPU instantiations of the transformer graph, and the CPU trainer's StageModel.
#include "model/cpu_model.hpp"

#include "model/cpu_bf16_kernels.hpp"
#include "model/transformer_stage.hpp"
#include "util/error.hpp"

namespace trident {

template class Transformer<CpuKernels<float>>;
template class Transformer<CpuKernels<double>>;
template class Transformer<CpuBf16Kernels>;

const ParamInfo& StageModel::param(std::string_view name) const {
  for (const ParamInfo& p : params())
    if (p.name == name) return p;
  throw Error("no parameter named '" + std::string(name) + "' on this rank");
}

std::unique_ptr<StageModel> make_cpu_stage_model(const ModelConfig& config,
                                                 const ModelShard& shard,
                                                 Communicator& tensor_comm, Device& host) {
  if (!host.is_host()) throw Error("the CPU model needs the host device");
  return std::make_unique<TransformerStage<CpuKernels<float>>>(config, shard, tensor_comm,
                                                               CpuKernels<float>(host));
}

std::unique_ptr<StageModel> make_cpu_bf16_stage_model(const ModelConfig& config,
                                                      const ModelShard& shard,
                                                      Communicator& tensor_comm, Device& host,
                                                      bool onednn) {
  if (!host.is_host()) throw Error("the CPU model needs the host device");
  return std::make_unique<TransformerStage<CpuBf16Kernels>>(
      config, shard, tensor_comm,
      CpuBf16Kernels(host, onednn ? Bf16Gemm::OneDnn : Bf16Gemm::Fma));
}

}  // namespace trident

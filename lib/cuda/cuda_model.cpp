// The transformer graph (model/transformer.hpp) on the CUDA kernel set, fp32 and bf16.
#include "cuda/cuda_model.hpp"

#include "cuda/cuda_kernels.hpp"
#include "model/transformer_stage.hpp"
#include "util/error.hpp"

namespace trident {

template class Transformer<CudaKernels<float>>;
template class Transformer<CudaKernels<cuda::bf16>>;

std::unique_ptr<StageModel> make_cuda_stage_model(const ModelConfig& config,
                                                  const ModelShard& shard,
                                                  Communicator& tensor_comm, CudaDevice& device,
                                                  bool bf16) {
  const int64_t head_size = config.head_size();
  if (head_size != 32 && head_size != 64 && head_size != 128)
    throw Error("model.width / model.heads = " + std::to_string(head_size) +
                ": the CUDA attention kernels support head sizes 32, 64 and 128");
  if (bf16)
    return std::make_unique<TransformerStage<CudaKernels<cuda::bf16>>>(
        config, shard, tensor_comm, CudaKernels<cuda::bf16>(device, shard.deterministic));
  return std::make_unique<TransformerStage<CudaKernels<float>>>(config, shard, tensor_comm,
                                                                CudaKernels<float>(device));
}

}  // namespace trident

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
  // train.attention_kernel: wgmma asked for where it cannot run is refused here, before a step.
  const cuda::AttentionKernel attention =
      shard.attention_kernel == "wgmma"      ? cuda::AttentionKernel::wgmma
      : shard.attention_kernel == "mma_sync" ? cuda::AttentionKernel::mma_sync
                                             : cuda::AttentionKernel::automatic;
  if (attention == cuda::AttentionKernel::wgmma &&
      (!bf16 || !cuda::attention_wgmma_available(head_size)))
    throw Error("train.attention_kernel = \"wgmma\" needs bf16 activations, head size 64 or 128 "
                "and a GPU of compute capability 9.0 (H100, H200); here " +
                std::string(bf16 ? "bf16" : "fp32") + ", head size " +
                std::to_string(head_size) + " (\"auto\" picks what runs)");
  if (bf16)
    return std::make_unique<TransformerStage<CudaKernels<cuda::bf16>>>(
        config, shard, tensor_comm,
        CudaKernels<cuda::bf16>(device, shard.deterministic, attention));
  return std::make_unique<TransformerStage<CudaKernels<float>>>(config, shard, tensor_comm,
                                                                CudaKernels<float>(device));
}

}  // namespace trident

#pragma once
// The transformer shard of one rank on one GPU: the graph of model/transformer.hpp over the
// CUDA kernel set (cuda/cuda_kernels.hpp, which describes the fp32 and bf16 precisions), the
// same parallel split and flat parameter layout as on the CPU.
#include <memory>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "cuda/cuda_device.hpp"
#include "model/stage_model.hpp"

namespace trident {

// Throws trident::Error naming the key when the CUDA kernels cannot run this model (head size
// not 32, 64 or 128).
std::unique_ptr<StageModel> make_cuda_stage_model(const ModelConfig& config,
                                                  const ModelShard& shard,
                                                  Communicator& tensor_comm, CudaDevice& device,
                                                  bool bf16);

}  // namespace trident

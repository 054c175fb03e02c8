#pragma once
// The GPT shard of one rank on one GPU: the same model, the same parallel split and the same
// flat parameter layout as the CPU Gpt (model/gpt.hpp), computed with the CUDA kernels of
// kernels/cuda.
//
// Precision:
//  * fp32: activations and weights fp32; GEMMs in true fp32 (no TF32), the parity reference
//    against the CPU.
//  * bf16: activations, the residual stream, pipeline messages and tensor-parallel all-reduces
//    in bf16; GEMMs bf16 x bf16 with fp32 accumulation; LayerNorm, softmax, attention and
//    cross-entropy statistics in fp32. fp32 master weights: the optimizer updates them and the
//    model keeps a bf16 copy for compute (weights_changed() refreshes it). Gradients are fp32.
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

#pragma once
// Derived figures printed at start and used for GFLOP/s (formulas documented in docs/model.md).
#include <cstdint>

#include "config/config.hpp"

namespace trident {

// Unique trainable parameters of the global model (vocabulary unpadded, tied LM head once):
// V*C + T*C + L*(12*C^2 + 13*C) + 2*C
int64_t parameter_count(const ModelConfig& m);

// Training FLOPs (forward + backward) per token, counting matmuls only (Megatron's convention):
// 3 * (L * (24*C^2 + 4*T*C) + 2*C*Vp), with Vp the padded vocabulary actually multiplied.
double training_flops_per_token(const ModelConfig& m, int64_t padded_vocab);

}  // namespace trident

#pragma once
// Derived figures printed at start (and by `trident model`) and used for GFLOP/s, for both
// architectures (model.arch). The formulas are documented in docs/model.md. Symbols: V vocab
// (unpadded), Vp padded vocabulary, T seq_len, C width, L layers, NH heads, KVH kv_head_count(),
// HS = C / NH head size, F = ffn_size().
#include <cstdint>

#include "config/config.hpp"

namespace trident {

// Unique trainable parameters of the global model (vocabulary unpadded; a tied LM head counted
// once, as the token embedding):
//   V*C  (+ T*C position table, gpt2)
//   + L * ( C*(NH + 2*KVH)*HS + NH*HS*C                 attention: qkv, output projection
//           (+ (NH + 2*KVH)*HS + C                      their biases, gpt2)
//           + 2*C*F + F + C  (gpt2: fc1, fc2, biases)  |  3*C*F  (llama: gate, up, down)
//           + 4*C (gpt2: two LayerNorms)               |  2*C    (llama: two RMSNorms) )
//   + 2*C (gpt2 final LayerNorm)  |  C (llama final RMSNorm)
//   + V*C when model.tie_embeddings is false (separate LM head)
// gpt2 with F = 4C, KVH = NH: V*C + T*C + L*(12*C^2 + 13*C) + 2*C.
// Exact; throws trident::Error naming model.width when the count does not fit in int64.
int64_t parameter_count(const ModelConfig& m);

// Training FLOPs (forward + backward = 3 x forward) per token, counting matmuls only
// (Megatron-LM's convention: attention over the full T x T, embedding lookups and elementwise
// work not counted), with Vp the padded vocabulary the LM head multiplies:
//   3 * ( 2*L*( C*(NH + 2*KVH)*HS + NH*HS*C + M*C*F )  +  L*4*T*NH*HS  +  2*C*Vp ),
// M = 2 MLP matrices (gpt2) or 3 (llama). gpt2 with F = 4C, KVH = NH reduces to
// 3 * ( L*(24*C^2 + 4*T*C) + 2*C*Vp ). Computed exactly in integers (a double holds it
// exactly below 2^53); throws trident::Error naming model.width if that overflows.
double training_flops_per_token(const ModelConfig& m, int64_t padded_vocab);

// The same training FLOPs per token in the parts a cost model places on different pipeline
// stages and recomputes differently (lib/plan):
//   layer_linear    = 3 * 2*( C*(NH + 2*KVH)*HS + NH*HS*C + M*C*F )   one layer's matmuls
//   layer_attention = 3 * 4*T*NH*HS                                   one layer's scores and
//                                                                     weighted sum
//   head            = 3 * 2*C*Vp                                      the LM head
// training_flops_per_token = L*(layer_linear + layer_attention) + head, exactly.
struct TrainingFlopsParts {
  double layer_linear = 0.0;
  double layer_attention = 0.0;
  double head = 0.0;
};
TrainingFlopsParts training_flops_parts(const ModelConfig& m, int64_t padded_vocab);

}  // namespace trident

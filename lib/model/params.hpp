#pragma once
// The parameter registry: every tensor a rank holds, with its global (layout-free, unpadded)
// shape and the map from its local shard to global indices. Initialisation, gradient-norm
// accounting, checkpoints and parity tests all work through this map, so they are correct on
// every layout by construction.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trident {

enum class Init { Normal, NormalResidual, Zeros, Ones };

// A run of `length` consecutive global indices along the split dimension, stored at local
// indices [local_begin, local_begin + length).
struct ShardBlock {
  int64_t global_begin = 0;
  int64_t local_begin = 0;
  int64_t length = 0;
  bool operator==(const ShardBlock&) const = default;
};

// How the tensor ranks divide a tensor along its split dimension (pure functions, unit-tested):
//  * contiguous: rank r owns [r*E/tp, (r+1)*E/tp)                    (E % tp == 0)
//  * fused:      E = sum of parts (q | k | v, or gate | up); each part is split contiguously and
//                rank r's pieces are stored one after the other: one block per part
//  * vocab:      rows padded to `padded`; rank r owns padded rows [r*P, (r+1)*P), P = padded/tp;
//                only those < E are real (the rest are local padding rows with no global index)
std::vector<ShardBlock> contiguous_blocks(int64_t extent, int tp_rank, int tp_size);
std::vector<ShardBlock> fused_blocks(const std::vector<int64_t>& parts, int tp_rank, int tp_size);
// Three equal parts of `width` (multi-head attention's q | k | v).
inline std::vector<ShardBlock> qkv_blocks(int64_t width, int tp_rank, int tp_size) {
  return fused_blocks({width, width, width}, tp_rank, tp_size);
}
std::vector<ShardBlock> vocab_blocks(int64_t vocab_size, int64_t padded, int tp_rank, int tp_size);

struct ParamInfo {
  std::string name;                    // e.g. "layers.3.mlp.fc1.weight"
  std::vector<int64_t> global_shape;   // unpadded, layout-free (1-D or 2-D)
  std::vector<int64_t> local_shape;    // this rank's tensor (may include padding rows)
  int split_dim = -1;                  // -1: replicated on every tensor rank
  std::vector<ShardBlock> blocks;      // along split_dim (empty when replicated)
  Init init = Init::Normal;
  bool weight_decay = false;
  bool counted_in_norm = true;         // false on the copies that another rank already counts
  // Replicated, but each tensor rank's backward sees only its sequence shard (sequence
  // parallelism): the gradient is summed over the tensor group before it is used.
  bool tensor_partial_grad = false;
  // Expert parallelism (parallel.expert > 1): a stacked-experts tensor of a MoE layer, of which
  // this rank holds its expert rank's experts only: global rows [row_begin, row_begin + local
  // rows) (for split_dim 0, the blocks' global rows are relative to row_begin). Its gradient is
  // reduced over the expert-data group, not the data group (optim/grad_sync.hpp).
  bool expert = false;
  int64_t row_begin = 0;
  int64_t offset = 0;                  // into the flat local parameter/gradient buffer

  int64_t numel() const;
  int64_t global_numel() const;
  // Global flat index of local flat index `i`, or nullopt for a padding element.
  std::optional<int64_t> global_index(int64_t i) const;
};

}  // namespace trident

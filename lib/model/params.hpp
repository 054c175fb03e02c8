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

struct FlatRange {
  int64_t begin = 0, end = 0;  // [begin, end) of the flat parameter/gradient buffer
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

// Pure: `ranges` sorted, empty ones dropped, touching neighbours merged.
std::vector<FlatRange> coalesced(std::vector<FlatRange> ranges);

// Pure: the slice of `range` that rank `rank` of `size` owns when it is sharded over a group
// (ZeRO): slices of ceil(len/size) elements; the last ones may be short or empty.
FlatRange zero_slice(const FlatRange& range, int rank, int size);

// Which elements of the flat buffer a device array stores, and where: `ranges` (sorted,
// disjoint) concatenated in order. The whole buffer is one range [0, flat_size), stored at its
// flat offsets; under ZeRO-2/3 the gradients (and at stage 3 the weights) store only this rank's
// slices, packed.
struct FlatStore {
  std::vector<FlatRange> ranges;
  static FlatStore whole(int64_t flat_size) { return {{FlatRange{0, flat_size}}}; }
  int64_t size() const;  // elements stored
  // Where flat offset `flat` is stored (it must be: trident::Error otherwise).
  int64_t index_of(int64_t flat) const;
  // Calls visit(flat_begin, stored_index, length) for each stored run of [begin, end) (in order).
  template <class F>
  void for_each_stored(int64_t begin, int64_t end, F&& visit) const {
    int64_t index = 0;
    for (const FlatRange& r : ranges) {
      const int64_t lo = begin > r.begin ? begin : r.begin, hi = end < r.end ? end : r.end;
      if (lo < hi) visit(lo, index + (lo - r.begin), hi - lo);
      index += r.size();
    }
  }
};

// The units ZeRO-2/3 shard, gather and reduce at once: a layer's parameters ("layers.N.*"; its
// stacked experts a unit of their own, reduced over another group), and each other tensor group
// (the token embedding, the position embedding, the final norm, the LM head). Each unit covers a
// contiguous range of the flat buffer: from its first parameter's offset to the next unit's (the
// first from 0, the last to flat_size), so that the units tile the buffer.
struct ParamUnit {
  FlatRange range;
  int layer = -1;       // the layer index of "layers.N" (-1: not a layer's)
  bool expert = false;  // the stacked experts (ParamInfo::expert) of a layer
  std::vector<int> params;  // indices into the params list
};
// Pure: the units of `params` (in flat order), tiling [0, flat_size).
std::vector<ParamUnit> param_units(const std::vector<ParamInfo>& params, int64_t flat_size);

}  // namespace trident

#include "model/params.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace trident {

std::vector<ShardBlock> contiguous_blocks(int64_t extent, int tp_rank, int tp_size) {
  if (extent % tp_size != 0)
    throw Error("cannot split extent " + std::to_string(extent) + " over " +
                std::to_string(tp_size) + " tensor ranks");
  const int64_t len = extent / tp_size;
  return {{tp_rank * len, 0, len}};
}

std::vector<ShardBlock> fused_blocks(const std::vector<int64_t>& parts, int tp_rank,
                                     int tp_size) {
  std::vector<ShardBlock> blocks;
  int64_t global = 0, local = 0;
  for (int64_t part : parts) {
    if (part % tp_size != 0)
      throw Error("cannot split a fused part of " + std::to_string(part) + " rows over " +
                  std::to_string(tp_size) + " tensor ranks");
    const int64_t len = part / tp_size;
    blocks.push_back({global + tp_rank * len, local, len});
    global += part;
    local += len;
  }
  return blocks;
}

std::vector<ShardBlock> vocab_blocks(int64_t vocab_size, int64_t padded, int tp_rank,
                                     int tp_size) {
  if (padded % tp_size != 0 || padded < vocab_size)
    throw Error("padded vocabulary " + std::to_string(padded) + " cannot be split over " +
                std::to_string(tp_size) + " tensor ranks");
  const int64_t rows = padded / tp_size;
  const int64_t begin = tp_rank * rows;
  const int64_t real = std::clamp<int64_t>(vocab_size - begin, 0, rows);
  if (real == 0) return {};
  return {{begin, 0, real}};
}

int64_t ParamInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : local_shape) n *= d;
  return n;
}

int64_t ParamInfo::global_numel() const {
  int64_t n = 1;
  for (int64_t d : global_shape) n *= d;
  return n;
}

std::optional<int64_t> ParamInfo::global_index(int64_t i) const {
  const int64_t local_cols = local_shape.size() == 2 ? local_shape[1] : 1;
  const int64_t global_cols = global_shape.size() == 2 ? global_shape[1] : 1;
  int64_t row = i / local_cols, col = i % local_cols;
  if (split_dim >= 0) {
    int64_t& along = split_dim == 0 ? row : col;
    const ShardBlock* block = nullptr;
    for (const ShardBlock& b : blocks)
      if (along >= b.local_begin && along < b.local_begin + b.length) block = &b;
    if (!block) return std::nullopt;  // a padding row
    along = block->global_begin + (along - block->local_begin);
  }
  return (row_begin + row) * global_cols + col;
}

}  // namespace trident

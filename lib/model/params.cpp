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

std::vector<FlatRange> coalesced(std::vector<FlatRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  std::vector<FlatRange> out;
  for (const FlatRange& r : ranges) {
    if (r.size() == 0) continue;
    if (!out.empty() && out.back().end == r.begin)
      out.back().end = r.end;
    else
      out.push_back(r);
  }
  return out;
}

FlatRange zero_slice(const FlatRange& range, int rank, int size) {
  const int64_t slice = (range.size() + size - 1) / size;
  const int64_t begin = std::min(range.end, range.begin + rank * slice);
  const int64_t end = std::min(range.end, begin + slice);
  return {begin, end};
}

int64_t FlatStore::index_of(int64_t flat) const {
  int64_t index = 0;
  for (const FlatRange& r : ranges) {
    if (flat >= r.begin && flat < r.end) return index + (flat - r.begin);
    index += r.size();
  }
  throw Error("flat offset " + std::to_string(flat) + " is not stored on this rank");
}

int64_t FlatStore::size() const {
  int64_t n = 0;
  for (const FlatRange& r : ranges) n += r.size();
  return n;
}

namespace {
// "layers.3.mlp.fc1.weight" -> ("layers.3", 3); "final_norm.weight" -> ("final_norm", -1).
std::pair<std::string, int> unit_key(const std::string& name) {
  if (name.rfind("layers.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    return {name.substr(0, dot), std::stoi(name.substr(7, dot - 7))};
  }
  return {name.substr(0, name.rfind('.')), -1};
}
}  // namespace

std::vector<ParamUnit> param_units(const std::vector<ParamInfo>& params, int64_t flat_size) {
  std::vector<int> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return params[a].offset < params[b].offset; });
  std::vector<ParamUnit> units;
  std::string open_key;
  for (int i : order) {
    const ParamInfo& p = params[static_cast<size_t>(i)];
    const auto [key, layer] = unit_key(p.name);
    if (units.empty() || key != open_key || p.expert != units.back().expert) {
      if (!units.empty()) units.back().range.end = p.offset;
      units.push_back({{units.empty() ? 0 : p.offset, 0}, layer, p.expert, {}});
      open_key = key;
    }
    units.back().params.push_back(i);
  }
  if (!units.empty()) units.back().range.end = flat_size;
  return units;
}

}  // namespace trident

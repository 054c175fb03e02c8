#include "train/checkpointing.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace trident {

std::string dataset_path(const std::string& root, const std::string& param_name) {
  std::string path = root;
  std::stringstream parts(param_name);
  std::string part;
  bool after_layers = false;
  while (std::getline(parts, part, '.')) {
    if (after_layers && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%03d", std::stoi(part));
      part = buf;
    }
    after_layers = part == "layers";
    path += "/" + part;
  }
  return path;
}

std::vector<Run> param_runs(const ParamInfo& p, int64_t begin, int64_t end, int64_t local_base) {
  std::vector<Run> runs;
  for (int64_t i = begin; i < end; ++i) {
    const auto g = p.global_index(i);
    if (!g) continue;
    Run& last = runs.empty() ? runs.emplace_back() : runs.back();
    const bool extends = last.length > 0 && last.global_offset + last.length == *g &&
                         last.local_offset + last.length == local_base + (i - begin);
    if (extends) {
      ++last.length;
    } else if (last.length == 0) {
      last = {local_base + (i - begin), *g, 1};
    } else {
      runs.push_back({local_base + (i - begin), *g, 1});
    }
  }
  return runs;
}

std::vector<Run> state_runs(const ParamInfo& p, const std::vector<FlatRange>& owned) {
  std::vector<Run> runs;
  int64_t state_offset = 0;
  for (const FlatRange& r : owned) {
    const int64_t lo = std::max(p.offset, r.begin), hi = std::min(p.offset + p.numel(), r.end);
    if (lo < hi) {
      auto part = param_runs(p, lo - p.offset, hi - p.offset, state_offset + (lo - r.begin));
      runs.insert(runs.end(), part.begin(), part.end());
    }
    state_offset += r.size();
  }
  return runs;
}

}  // namespace trident

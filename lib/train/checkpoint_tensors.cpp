#include "train/checkpoint_tensors.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "model/architecture.hpp"
#include "model/fp8_scaling.hpp"

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

std::vector<Fp8StateDataset> fp8_state_datasets(const Config& config) {
  const Fp8Settings fp8 = fp8_settings(config.train);
  std::vector<Fp8StateDataset> out;
  if (!fp8.delayed) return out;
  for (int64_t layer = 0; layer < config.model.layers; ++layer)
    if (fp8.covers(layer, config.model.layers)) {
      const int64_t experts = config.model.is_moe_layer(layer) ? config.model.moe_experts : 0;
      out.push_back({layer, dataset_path(kFp8Root, "layers." + std::to_string(layer)),
                     {Fp8DelayedRecipe::layer_rows(experts),
                      2 + static_cast<int64_t>(fp8.history)}});
    }
  return out;
}

std::vector<Run> param_runs(const ParamInfo& p, int64_t begin, int64_t end, int64_t local_base) {
  // Candidate runs from the shard map, one per block (row split, replicated) or per row and
  // block (column split), clipped to [begin, end); adjacent ones merged.
  std::vector<Run> runs;
  auto add = [&](int64_t local, int64_t global, int64_t length) {
    const int64_t lo = std::max(local, begin), hi = std::min(local + length, end);
    if (lo >= hi) return;
    const Run run{local_base + (lo - begin), global + (lo - local), hi - lo};
    if (!runs.empty()) {
      Run& last = runs.back();
      if (last.local_offset + last.length == run.local_offset &&
          last.global_offset + last.length == run.global_offset) {
        last.length += run.length;
        return;
      }
    }
    runs.push_back(run);
  };
  const int64_t cols = p.local_shape.size() == 2 ? p.local_shape[1] : 1;
  const int64_t global_cols = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
  // Expert parallelism: the rank's rows start at global row p.row_begin (0 otherwise).
  const int64_t base = p.row_begin * global_cols;
  if (p.split_dim < 0) {
    add(0, base, p.numel());
  } else if (p.split_dim == 0) {
    for (const ShardBlock& b : p.blocks)
      add(b.local_begin * cols, base + b.global_begin * cols, b.length * cols);
  } else {
    const int64_t rows = p.local_shape[0];
    for (int64_t r = 0; r < rows; ++r)
      for (const ShardBlock& b : p.blocks)
        add(r * cols + b.local_begin, base + r * global_cols + b.global_begin, b.length);
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

void for_each_checkpoint_tensor(const ModelConfig& model, const std::vector<ParamInfo>& local,
                                const std::function<void(const CheckpointTensor&)>& visit) {
  std::map<std::string, const ParamInfo*> mine;
  for (const ParamInfo& p : local) mine[p.name] = &p;
  for (const ParamInfo& g : global_parameters(model)) {
    const auto it = mine.find(g.name);
    visit(CheckpointTensor{g, it == mine.end() ? nullptr : it->second});
  }
}

}  // namespace trident

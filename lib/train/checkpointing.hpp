#pragma once
// The model's and optimizer's tensors in a checkpoint file: dataset names and the runs each
// rank writes and reads. A checkpoint holds every tensor once, with its global shape, so any
// layout reads what any layout wrote (docs/checkpoint-format.md).
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/ckpt_runs.hpp"
#include "model/params.hpp"
#include "optim/grad_sync.hpp"

namespace trident {

inline constexpr int64_t kCheckpointFormatVersion = 1;

// "layers.3.mlp.fc1.weight" under "/model" -> "/model/layers/003/mlp/fc1/weight".
std::string dataset_path(const std::string& root, const std::string& param_name);

// Runs of the local elements [begin, end) of parameter `p` (indices within the parameter's
// local tensor): local_offset = local_base + (i - begin). Padding rows are left out.
std::vector<Run> param_runs(const ParamInfo& p, int64_t begin, int64_t end, int64_t local_base);

// The runs of parameter `p` that fall in the optimizer's owned ranges of the flat buffer, with
// local offsets into the optimizer's state (the owned ranges' moments, concatenated).
std::vector<Run> state_runs(const ParamInfo& p, const std::vector<FlatRange>& owned);

}  // namespace trident

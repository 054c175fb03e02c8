#pragma once
// The layers of each pipeline stage for a model, as the trainer cuts them and the planner
// prices them (one source of truth): parallel.pipeline_layers when given, otherwise the split
// parallel.pipeline_balance names (pipeline/schedule.hpp: stage_layer_counts for "even",
// balanced_stage_layer_counts for "flops" with the model's own training FLOPs per token).
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace trident {

std::vector<int64_t> stage_split(const ModelConfig& m, int stages,
                                 const std::vector<int64_t>& explicit_counts,
                                 const std::string& balance);

}  // namespace trident

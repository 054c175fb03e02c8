#pragma once
// The tensors of a model checkpoint and where each rank's shard of them lies: the one walk
// over them that every reader and writer of a model checkpoint uses (save, resume,
// train.init_from, `trident eval`, `trident generate`, `trident import`, the schema
// check_checkpoint verifies for `trident ckpt info`). A checkpoint holds every tensor once,
// with its global shape, under three roots: the weights and AdamW's two moments
// (docs/checkpoint-format.md).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/ckpt_runs.hpp"
#include "config/config.hpp"
#include "model/params.hpp"
#include "optim/grad_sync.hpp"

namespace trident {

// train.fp8_recipe = "delayed": the scaling state of the FP8 GEMMs, one dataset per layer whose
// linear layers run in FP8 ("/fp8/layers/003"), of Fp8DelayedRecipe::layer_state's
// [layer_rows(experts), 2 + history] floats (a MoE layer's with its experts' rows). A checkpoint holds all of them or none (another precision or
// recipe, `trident import`): a run then starts the state afresh.
inline constexpr const char* kFp8Root = "/fp8";
struct Fp8StateDataset {
  int64_t layer = 0;
  std::string name;
  std::vector<int64_t> shape;
};
// Those of a run of `config`, by layer; none unless it trains in FP8 with the delayed recipe.
std::vector<Fp8StateDataset> fp8_state_datasets(const Config& config);

// The roots of a model checkpoint's datasets, in the order every tensor writes them.
inline constexpr const char* kWeightsRoot = "/model";
inline constexpr const char* kExpAvgRoot = "/optim/exp_avg";
inline constexpr const char* kExpAvgSqRoot = "/optim/exp_avg_sq";
inline constexpr const char* kCheckpointRoots[] = {kWeightsRoot, kExpAvgRoot, kExpAvgSqRoot};

// "layers.3.mlp.fc1.weight" under "/model" -> "/model/layers/003/mlp/fc1/weight".
std::string dataset_path(const std::string& root, const std::string& param_name);

// One tensor of a model checkpoint as one rank sees it.
struct CheckpointTensor {
  const ParamInfo& global;  // its name and global shape
  const ParamInfo* local;   // this rank's shard of it; nullptr where the rank holds none
  // Its dataset under `root` (one of kCheckpointRoots).
  std::string dataset(const char* root) const { return dataset_path(root, global.name); }
};

// Every tensor of the model `model` describes, in global_parameters' order, each with this
// rank's shard among `local` (a model shard's params(); empty for none). Reads and writes of a
// checkpoint are collective: every rank makes the same calls in this order, whatever it holds.
void for_each_checkpoint_tensor(const ModelConfig& model, const std::vector<ParamInfo>& local,
                                const std::function<void(const CheckpointTensor&)>& visit);

// Runs of the local elements [begin, end) of parameter `p` (indices within the parameter's
// local tensor): local_offset = local_base + (i - begin). Padding rows are left out.
std::vector<Run> param_runs(const ParamInfo& p, int64_t begin, int64_t end, int64_t local_base);

// The runs of parameter `p` that fall in the optimizer's owned ranges of the flat buffer, with
// local offsets into the optimizer's state (the owned ranges' moments, concatenated).
std::vector<Run> state_runs(const ParamInfo& p, const std::vector<FlatRange>& owned);

}  // namespace trident

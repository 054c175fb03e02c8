#pragma once
// The model's and optimizer's tensors in a checkpoint file: dataset names and the runs each
// rank writes and reads. A checkpoint holds every tensor once, with its global shape, so any
// layout reads what any layout wrote (docs/checkpoint-format.md).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/ckpt_runs.hpp"
#include "checkpoint/h5_file.hpp"
#include "config/config.hpp"
#include "model/params.hpp"
#include "optim/grad_sync.hpp"

namespace trident {

class StageModel;

// 2: the root's attributes are sealed (attributes_checksum). 1 is still read (no seal; every
// other check applies).
inline constexpr int64_t kCheckpointFormatVersion = 2;
inline constexpr int64_t kCheckpointOldestFormatVersion = 1;

// What a model checkpoint's root attributes say, once check_checkpoint accepted them.
struct CheckpointMeta {
  int64_t format_version = 0;
  int64_t step = 0;               // optimizer steps done: training resumes at this step
  int64_t optimizer_updates = 0;  // AdamW updates (bias correction)
  int64_t skipped_steps = 0;
  int64_t sampler_position = 0;   // the global batch index the next step reads
  std::vector<int64_t> skipped_batches;  // attribute skipped_batches; absent: none
  int64_t rollbacks = 0;                 // attribute rollbacks; absent: 0
  Config config;                  // the config it was written with (attribute "config")
};

// The checks of a model checkpoint that need no tensor data; resume and `trident ckpt info
// --verify` both run them, then read every dataset with checkpoint_reader_options() (checksum
// and values). Local (the reader's index: the same on every rank). Throws one line naming the
// file: format version; types and values of the root attributes and their seal (version >= 2);
// that they agree with each other and with the stored config (step >= 0, optimizer_updates +
// skipped_steps = step, consumed_samples = step * train.global_batch, consumed_tokens,
// sampler_position = batch_of_step(step, skipped_batches) (= step when none are skipped),
// seed = train.seed, step <= train.steps, model_* = the model keys);
// the complete schema: every dataset of the stored model (weights and both moments) with its
// shape, float32 and a uint64 checksum, and no other dataset.
CheckpointMeta check_checkpoint(const CheckpointReader& reader);

// Where training stands when a checkpoint is written: the counters of its root attributes.
struct CheckpointProgress {
  int64_t step = 0;               // optimizer steps done
  int64_t optimizer_updates = 0;  // AdamW updates (step minus the skipped steps)
  int64_t skipped_steps = 0;
  std::string layout;             // "tensor=2 pipeline=2 data=2 zero_stage=1"; who wrote it
  // The run's skip list (train.skip_batches and the batches rollbacks skipped; sorted), the
  // rollbacks taken and the learning rate factor they brought (train.rollback_lr_scale).
  std::vector<int64_t> skipped_batches;
  int64_t rollbacks = 0;
  double lr_scale = 1.0;
};

// Collective (a CheckpointWriter call): every root attribute of a model checkpoint (the table
// in docs/checkpoint-format.md: format version, counters, config, model_*), then the seal.
// The one place that writes them: the trainer's checkpoints and `trident import` both call it,
// so check_checkpoint accepts both.
void write_checkpoint_attributes(CheckpointWriter& writer, const Config& config,
                                 const CheckpointProgress& progress);

// The first model key (in schema order, kv_heads and ffn_width resolved) on which a
// checkpoint's stored model and a run's differ, as one phrase:
// "model.width = 64 in the checkpoint but 32 in run.toml"; "" when they describe the same
// model. vocab_multiple is not compared (padding, a layout matter), nor norm_eps and
// rope_theta between two gpt2 models (which use neither).
std::string model_config_difference(const ModelConfig& checkpoint, const ModelConfig& run,
                                    const std::string& run_source);

// What a model checkpoint's values must be: finite, second moments also >= 0.
ValueCheck checkpoint_value_check(const std::string& dataset);
// Reader options for a model checkpoint (value_check = checkpoint_value_check).
ReaderOptions checkpoint_reader_options();

// Collective: check_checkpoint, then every dataset read whole (checksum and values). For
// `trident ckpt info --verify`; the reader must have checkpoint_reader_options().
CheckpointMeta verify_checkpoint(CheckpointReader& reader);

// The keys that decide which samples each step reads (train.global_batch, train.seed,
// data.shuffle, the normalised weights of a data.train blend) that differ between the config a
// checkpoint was written with and `now`:
// "train.global_batch 8 -> 16, data.shuffle true -> false"; "" if none does.
std::string data_order_changes(const Config& written, const Config& now);

// Collective over the reader's ranks: this rank's shard of every weight of the model
// checkpoint into model.weights() (any layout's checkpoint into the model's layout), then
// weights_changed(). Every rank visits every weight dataset in the same order; each parameter
// for which `counts_checksum` holds on one copy of the model (data-parallel rank 0; for an
// expert under expert parallelism, expert-data rank 0) counts what it read in the checksums, which reader.close() verifies. The model must be the checkpoint's (the caller
// compares the configs first).
void read_model_weights(CheckpointReader& reader, StageModel& model,
                        const std::function<bool(const ParamInfo&)>& counts_checksum);

// "layers.3.mlp.fc1.weight" under "/model" -> "/model/layers/003/mlp/fc1/weight".
std::string dataset_path(const std::string& root, const std::string& param_name);

// Runs of the local elements [begin, end) of parameter `p` (indices within the parameter's
// local tensor): local_offset = local_base + (i - begin). Padding rows are left out.
std::vector<Run> param_runs(const ParamInfo& p, int64_t begin, int64_t end, int64_t local_base);

// The runs of parameter `p` that fall in the optimizer's owned ranges of the flat buffer, with
// local offsets into the optimizer's state (the owned ranges' moments, concatenated).
std::vector<Run> state_runs(const ParamInfo& p, const std::vector<FlatRange>& owned);

}  // namespace trident

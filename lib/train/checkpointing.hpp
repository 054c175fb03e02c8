#pragma once
// A model checkpoint's metadata and the checks on it: its root attributes, the checks of a
// file on its own (check_checkpoint) and against a run's model (check_checkpoint_compatible).
// Its tensors and each rank's shards of them: train/checkpoint_tensors.hpp; what a training
// run saves and loads: train/training_checkpoint.hpp. A checkpoint holds every tensor once,
// with its global shape, so any layout reads what any layout wrote
// (docs/checkpoint-format.md).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/ckpt_runs.hpp"
#include "checkpoint/h5_file.hpp"
#include "config/config.hpp"
#include "train/checkpoint_tensors.hpp"

namespace trident {

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
  // The divergence guard's window of good losses and its streak of bad steps when written
  // (guard_losses, guard_bad_streak); absent in older files: nullopt and 0.
  std::optional<std::vector<double>> guard_losses;
  int64_t guard_bad_streak = 0;
  bool rollback_save = false;     // attribute rollback_save; absent: false
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
  // The divergence guard's state (DivergenceGuard::losses, bad_streak), which a resume restores.
  std::vector<double> guard_losses;
  int64_t guard_bad_streak = 0;
  // Written when the run diverged with no checkpoint to roll back to: the weights from before
  // the bad steps, which were never applied (docs/reliability.md).
  bool rollback_save = false;
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

// The first dataset (weights and both moments of every tensor, in the walk's order) that the
// model `run` describes and the file lacks or holds with another shape, as one phrase:
// "dataset '/model/layers/001/mlp/router/weight': shape mismatch: expected [2, 32], found
// [4, 32]"; "" when the file holds every one.
std::string checkpoint_tensor_difference(const CheckpointReader& reader, const ModelConfig& run);

// The one compatibility check of a checkpoint with a run's model (resume, train.init_from,
// `trident eval`), after check_checkpoint gave `meta`: the stored model's keys against the
// run's (model_config_difference) and the run's tensors against the file's datasets
// (checkpoint_tensor_difference). Throws one line: `subject` (how the file was named:
// "checkpoint 'F'", "train.init_from 'F'"), the first differing key with both values and the
// run's config file, and the first dataset that differs with both shapes:
// "checkpoint 'F': model.moe_experts = 4 in the checkpoint but 2 in run.toml (dataset
// '/model/layers/001/mlp/router/weight': shape mismatch: expected [2, 32], found [4, 32])".
void check_checkpoint_compatible(const CheckpointReader& reader, const CheckpointMeta& meta,
                                 const ModelConfig& run, const std::string& run_source,
                                 const std::string& subject);

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

}  // namespace trident

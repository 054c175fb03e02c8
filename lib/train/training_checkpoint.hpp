#pragma once
// What a training run saves and loads: one rank's model shard, AdamW's moments and the run's
// counters, in the model checkpoint format of train/checkpointing.hpp. Every reader and writer
// here goes through the one walk over the checkpoint's tensors (train/checkpoint_tensors.hpp)
// and the one compatibility check (check_checkpoint_compatible). All functions are collective
// over `comm` (the job's ranks) and throw one trident::Error line naming the file.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/ckpt_runs.hpp"
#include "checkpoint/h5_file.hpp"
#include "config/config.hpp"
#include "model/params.hpp"
#include "train/checkpointing.hpp"

namespace trident {

class AdamW;
class CommWatchdog;
class GradientSync;
class StageModel;

// One rank's part of the training state a checkpoint holds.
struct CheckpointedState {
  StageModel& model;
  AdamW& optimizer;          // its moments (of the ranges it owns) and update count
  const GradientSync& sync;  // which replica of each tensor writes it (and counts its checksum)
};

// What one save writes, apart from the live model: every tensor's three datasets with this
// rank's runs into three host buffers (the rank's flat weights and AdamW's two moments), the
// counters and the config. A synchronous save points the buffers at the state itself (a GPU
// rank's staged copies); an asynchronous one at its staging copy (train/async_checkpoint.hpp).
struct CheckpointContent {
  struct Tensor {
    std::string weights, exp_avg, exp_avg_sq;  // dataset paths
    std::vector<int64_t> shape;                // global
    // This rank's runs into the buffers; none for the copies another rank writes.
    std::vector<Run> weight_runs, moment_runs;
  };
  // A layer's FP8 scaling state (fp8_state_datasets): its rows where this rank writes them,
  // else none. Copied when planned: small, and the next step changes the live state.
  struct Fp8Layer {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> rows;
  };
  Config config;
  CheckpointProgress progress;
  std::vector<Tensor> tensors;  // for_each_checkpoint_tensor's order: the same on every rank
  std::vector<Fp8Layer> fp8;    // fp8_state_datasets' order: the same on every rank
  std::span<const float> weights, exp_avg, exp_avg_sq;
};

// The content of checkpoint `progress` of `state`, its buffers not set.
CheckpointContent plan_checkpoint(const Config& config, const CheckpointedState& state,
                                  CheckpointProgress progress);
// The rank's state a checkpoint holds, in its device memory, in the order of kCheckpointRoots:
// the flat weights (weight_store()'s floats) and AdamW's two moments.
struct CheckpointBuffers {
  static constexpr int kCount = 3;
  float* data[kCount];
  int64_t size[kCount];  // floats
  int64_t total() const { return size[0] + size[1] + size[2]; }
};
CheckpointBuffers checkpoint_buffers(const CheckpointedState& state);

// Collective over `comm`: writes `content` as checkpoint content.progress.step into
// content.config.checkpoint.dir atomically (checkpoint/commit.hpp). Then, where `report`
// holds (rank 0), prunes the directory to checkpoint.keep (never the new file nor
// `resumed_from`) and prints its line: path, size, seconds, MB/s, and `how` ("" or
// ", asynchronous") after the step. Returns the path. `watchdog` (when not null) watches the
// write (checkpoint.io_timeout_s, comm/comm_watchdog.hpp). Touches nothing but `content`, the
// file system and `comm`: the asynchronous writer runs it in its own thread.
std::string write_training_checkpoint(const CheckpointContent& content, MPI_Comm comm,
                                      bool report, const std::string& resumed_from,
                                      CommWatchdog* watchdog, const char* how = "");

// Writes checkpoint `progress.step` of `state` into config.checkpoint.dir atomically
// (checkpoint/commit.hpp). Then, where `report` holds (rank 0), prunes the directory to
// checkpoint.keep (never the new file nor `resumed_from`) and prints its line: path, size,
// seconds, MB/s. Returns the path. `watchdog` (when not null) watches the write
// (checkpoint.io_timeout_s, comm/comm_watchdog.hpp); so it does the reads below.
std::string save_training_checkpoint(const Config& config, const CheckpointedState& state,
                                     const CheckpointProgress& progress, MPI_Comm comm,
                                     bool report, const std::string& resumed_from,
                                     CommWatchdog* watchdog = nullptr);

// The checkpoint a rollback goes back to: the newest committed one in `dir` (list_checkpoints,
// checkpoint/commit.hpp) at step <= max_step (the first bad step: one written inside the
// streak, by a stop or the last step, holds the streak's steps as done), as rank 0 finds it,
// on every rank, so that all read the same file; "" when there is none.
std::string agreed_checkpoint_at_or_before(const std::string& dir, int64_t max_step,
                                           MPI_Comm comm);

// What a resume takes from its checkpoint besides the tensors.
struct ResumedProgress {
  CheckpointMeta meta;                   // step, optimizer updates, skipped steps, rollbacks
  std::vector<int64_t> skipped_batches;  // the run's skip list joined with the checkpoint's
};

// Loads a checkpoint written by any layout into `state` (weights, moments, the optimizer's
// update count): check_checkpoint, check_checkpoint_compatible with config.model, the data
// order and skip list (refused if they changed, unless checkpoint.allow_data_change), every
// tensor's checksum and values; refuses a step past train.steps. `run_skips`: the run's skip
// list. Where `report` holds (rank 0) it prints the note of a changed data order and the
// read's line.
ResumedProgress load_training_checkpoint(const std::string& path, const Config& config,
                                         const std::vector<int64_t>& run_skips,
                                         const CheckpointedState& state, MPI_Comm comm, bool report,
                                         CommWatchdog* watchdog = nullptr);

// train.init_from (and `trident eval`): the weights of a checkpoint written by any layout into
// `model` in place of its init, after check_checkpoint and check_checkpoint_compatible (the
// message names "train.init_from 'PATH'"); checksums and values verified. `counts_checksum`
// as for read_model_weights. Returns the step the checkpoint was written at.
int64_t load_checkpoint_weights(const std::string& path, const Config& config, StageModel& model,
                                const std::function<bool(const ParamInfo&)>& counts_checksum,
                                MPI_Comm comm, CommWatchdog* watchdog = nullptr);

// Collective over the reader's ranks: this rank's shard of every weight of the model
// checkpoint into model.weights() (any layout's checkpoint into the model's layout), then
// weights_changed(). Each parameter for which `counts_checksum` holds on one copy of the model
// (data-parallel rank 0; for an expert under expert parallelism, expert-data rank 0) counts
// what it read in the checksums, which reader.close() verifies. The model must be the
// checkpoint's (check_checkpoint_compatible).
void read_model_weights(CheckpointReader& reader, StageModel& model,
                        const std::function<bool(const ParamInfo&)>& counts_checksum);

}  // namespace trident

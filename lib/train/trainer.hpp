#pragma once
// The training loop of one rank: data → micro-batches → forward/backward → gradient reduction
// → global norm and clipping → AdamW → log. It knows the groups it talks to, not how they were
// built (the process grid does that).
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "data/blend.hpp"
#include "grid/grid.hpp"
#include "grid/parallel_dims.hpp"
#include "model/architecture.hpp"
#include "model/stage_model.hpp"
#include "optim/adamw.hpp"
#include "optim/grad_sync.hpp"
#include "pipeline/executor.hpp"
#include "runtime/backend.hpp"
#include "train/async_checkpoint.hpp"
#include "train/divergence_guard.hpp"
#include "train/metrics_log.hpp"
#include "train/moe_metrics.hpp"
#include "train/run_reports.hpp"
#include "train/test_corruption.hpp"
#include "train/timeline_trace.hpp"
#include "util/rank_log.hpp"

namespace trident {

class BpeTokenizer;
struct CheckpointedState;

// How a run ended: all steps done; stopped early (signal, time limit) after a checkpoint; or
// diverged: the divergence guard asked for a rollback that could not be taken (no committed
// checkpoint, or train.max_rollbacks used up).
enum class RunOutcome { Finished, Stopped, Diverged };

class Trainer {
 public:
  // Builds the device, model and device communicators of train.device.
  using BackendFactory =
      std::function<Backend(const Config&, const ParallelDims&, const ModelShard&)>;
  // `groups`: this rank's table of dimensions (ProcessGrid::dims(), SelfGroups); the trainer
  // adds the backend's device communicators to its copy.
  Trainer(const Config& config, ParallelDims groups) : Trainer(config, groups, make_backend) {}
  // With another factory (tests: the CPU model behind the staged communicators of the GPU's
  // MPI path).
  Trainer(const Config& config, ParallelDims groups, const BackendFactory& make);

  // Trains from start_step() to train.steps, logging, evaluating and checkpointing as
  // configured. Throws (every rank) when train.max_consecutive_skips steps in a row were
  // skipped for a non-finite gradient norm. Between steps all ranks agree (one all-reduce) whether any rank's stop check
  // fired or train.exit_after_minutes has passed; if so they write a checkpoint and return
  // Stopped. When train.max_bad_steps steps in a row were bad (the divergence guard), it rolls
  // back to a committed checkpoint from before the streak and goes on without the bad steps'
  // global batches; when it cannot, it returns Diverged (every rank).
  RunOutcome run();
  int64_t start_step() const { return start_step_; }
  // Called on every rank between steps and between evaluation batches; true asks the whole
  // job to checkpoint and stop (it must stay true once it was: a stop inside an evaluation is
  // acted on at the step boundary that follows).
  void set_stop_check(std::function<bool()> check) { stop_check_ = std::move(check); }
  // The rank's collective watchdog, told about every checkpoint write and read so that one
  // that stalls ends the job (checkpoint.io_timeout_s, comm/comm_watchdog.hpp); not owned.
  void set_checkpoint_watchdog(CommWatchdog* watchdog) {
    checkpoint_watchdog_ = watchdog;
    if (async_saves_) async_saves_->set_watchdog(watchdog);
  }

  // Collective: writes checkpoint `steps_done` into checkpoint.dir atomically and prunes old
  // ones; returns its path. Synchronous whatever checkpoint.async says (after the
  // asynchronous save in flight, if any).
  std::string save_checkpoint(int64_t steps_done);
  // Collective: loads a checkpoint written by any layout; training continues at its step.
  // Runs check_checkpoint and check_checkpoint_compatible (train/checkpointing.hpp), refuses a
  // model other than the config's and, unless checkpoint.allow_data_change, another data order
  // (train.global_batch, train.seed, data.shuffle, data.train blend weights); the tensors must
  // be intact (checksums) and finite (train/training_checkpoint.hpp).
  void load_checkpoint(const std::string& path);
  // Collective: takes the weights of a checkpoint written by any layout (train.init_from; an
  // imported one too) in place of the random init; the step counter, optimizer state and data
  // order stay fresh. Runs check_checkpoint and check_checkpoint_compatible: refuses a
  // checkpoint whose stored model differs from the config's, naming the first differing key
  // and both values; its weights must be intact (checksums) and finite. Returns the step the
  // checkpoint was written at.
  int64_t init_weights_from(const std::string& path);
  // One optimizer step (0-based `step`): forward_backward, then apply_update.
  StepMetrics train_step(int64_t step);
  // Gradients of the global batch of `step`, averaged over micro-batches and replicas (left in
  // model().grads(), device memory); returns the mean loss of the global batch.
  double forward_backward(int64_t step);
  // Global norm, clipping and AdamW on the gradients forward_backward left; fills the metrics
  // other than timing.
  StepMetrics apply_update(int64_t step, double loss);
  // Mean validation loss over eval.steps global batches from the start of the val set;
  // nullopt if a stop was requested (the stop check, agreed by all ranks between batches).
  std::optional<double> evaluate();
  // eval.sample_prompt and its continuation of eval.sample_tokens tokens from the current
  // weights (train/generation.hpp; eval.sample_temperature, seed train.seed). Collective over
  // the tensor group: every rank calls it (the whole model on each rank: pipeline 1).
  std::string sample_text();

  StageModel& model() { return *backend_.model; }
  Device& device() { return *backend_.device; }
  // The communicators of device buffers that are not the groups' own (GPU runs).
  // GPU runs: the communicators the device's stream carries (nullptr on the CPU).
  std::shared_ptr<CommWatch> comm_watch() const { return backend_.watch; }
  const std::vector<std::unique_ptr<Communicator>>& device_communicators() const {
    return backend_.owned;
  }
  // Host copies of this rank's flat weights and gradients (tests, whatever the device).
  std::vector<float> host_weights();
  std::vector<float> host_grads();
  GradientSync& gradient_sync() { return *sync_; }
  // The host-memory communicators of the data-parallel replicas (scalars: norms, counts).
  ReplicaGroups host_replicas() const {
    return {groups_.grad_reduce().host, groups_.expert().host, groups_.expert_data().host};
  }
  // Test hook: runs on this rank after the step's backward, before the gradient reductions
  // that follow it. Buckets above the first may already be in flight: touch only the first
  // parameter's gradients (offset 0), as the non-finite-gradient test does. `grads` is device
  // memory.
  void set_gradient_test_hook(std::function<void(int64_t step, float* grads)> hook) {
    gradient_test_hook_ = std::move(hook);
  }
  // Per-rank memory (parameters, gradients, optimizer state, peak activations counted; the
  // device allocator's bytes now and at their peak, measured), gathered on every rank; one
  // line per rank.
  std::string memory_report();
  PipelineExecutor& pipeline() { return *executor_; }
  AdamW& optimizer() { return *optimizer_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t rollbacks() const { return rollbacks_; }
  // The run's skip list: train.skip_batches, those of a resumed checkpoint, and the batches of
  // the bad steps each rollback left out (sorted).
  const std::vector<int64_t>& skipped_batches() const { return skipped_batches_; }
  // The global batch index step `step` reads.
  int64_t batch_of(int64_t step) const { return batch_of_step(step, skipped_batches_); }
  double train_seconds() const { return train_seconds_; }  // in train steps, evaluation excluded
  int64_t steps_run() const { return steps_run_; }          // by run() in this process
  // The checkpoints run() saved and the wall seconds their saves took outside the steps (a
  // synchronous save's write; an asynchronous one's start, on a GPU its staging copy).
  int64_t checkpoint_saves() const { return checkpoint_saves_; }
  double checkpoint_seconds() const { return checkpoint_seconds_; }
  bool is_logging_rank() const { return groups_.world().index == 0; }
  // "" unless writes of the run's log failed on this rank (MetricsLog::failure).
  std::string log_failure() const { return log_ ? log_->failure() : ""; }
  // Per-stage pipeline figures gathered on every rank: "stage p: bubble measured x, theory y".
  std::string pipeline_report();

 private:
  // Rank 0's log line of the samples each dataset of the data.train blend gave in steps
  // [0, steps_done) (at the end and when stopping).
  void log_blend_counts(int64_t steps_done) const;
  // Fills tokens/targets of micro-batch `micro` of `step` for this data-parallel rank.
  void load_microbatch(const BlendedDataset& data, int64_t step,
                       int64_t micro, int32_t* tokens, int32_t* targets) const;
  // The last stage's value, on every rank of the pipeline group.
  double from_last_stage(double value);
  // The mean of `value` over the data x context group (the replicas of a loss).
  double replica_mean(double value);
  // Collective: the rollback after the bad steps up to step `step` (0-based) — the newest
  // committed checkpoint at or before the streak's first step read again (an older one when
  // the streak began right at the step the last rollback went to), the bad steps' batches
  // added to the skip list, one log line and one metrics.jsonl record. False (after saying
  // why) when there is no checkpoint to go back to (then after save_rollback_checkpoint) or
  // train.max_rollbacks rollbacks were taken already.
  bool roll_back(int64_t step);
  // Throws (every rank) when train.max_consecutive_skips steps in a row up to `step` were
  // skipped for a non-finite gradient norm.
  void throw_if_skipping_for_ever(int64_t step) const;
  // Collective: whether any rank's stop check fired, train.exit_after_minutes has passed
  // since `started`, or step `step` (0-based) ends a train.exit_interval.
  bool stop_requested(int64_t step, std::chrono::steady_clock::time_point started);
  // Collective, when a rollback finds no checkpoint: writes the state from before the streak
  // that began at step `first_bad` (bad steps are never applied) as checkpoint `first_bad`,
  // the streak's batches skipped, marked rollback_save. Returns its path.
  std::string save_rollback_checkpoint(int64_t first_bad, const std::vector<int64_t>& bad_batches);
  // checkpoint.async: starts the asynchronous save of checkpoint `steps_done` (after the one in
  // flight; train/async_checkpoint.hpp). Collective.
  void start_async_save(int64_t steps_done);
  // Waits for the asynchronous save in flight, if any, and throws its error (every rank the
  // same); rank 0 says how long training waited `before` ("before the final save").
  void finish_async_save(const char* before);
  // Before the optimizer update changes the weights and moments: waits for the staging copy of
  // the asynchronous save just started; rank 0 logs what training waited for it (the most
  // over ranks: one all-reduce, at the same step on every rank).
  void wait_async_staging();
  // The counters a checkpoint of `steps_done` holds.
  CheckpointProgress checkpoint_progress(int64_t steps_done) const;
  // "tensor=2 pipeline=2 data=2 zero_stage=1": the checkpoint attribute layout.
  std::string layout() const;
  // The learning rate factor of the rollbacks taken: train.rollback_lr_scale ^ rollbacks.
  double rollback_lr_factor() const;
  // What checkpoints hold of this rank (train/training_checkpoint.hpp).
  CheckpointedState checkpointed_state();
  // Collective over the pipeline group: every stage's measured bubble (wait / busy) since the
  // previous call (StepMetrics::pipeline_bubble).
  std::vector<double> interval_bubbles();
  // Collective: writes log.dir/trace.json once the last traced step (or the run) is over.
  void finish_trace(int64_t steps_done, bool run_over);

  Config config_;
  ParallelDims groups_;  // device communicators set once backend_ is built
  RankLog out_;          // the logging rank's lines on standard output
  // Loaded by the constructor where eval.sample_interval > 0 (sample_text's).
  std::shared_ptr<const BpeTokenizer> sample_tokenizer_;
  Backend backend_;
  StageModel* model_ = nullptr;  // backend_.model
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<AdamW> optimizer_;
  std::function<void(int64_t, float*)> gradient_test_hook_;
  // A plain data.train is a blend of one dataset (the same order as BatchSampler's).
  std::unique_ptr<BlendedDataset> train_data_, val_data_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<MetricsLog> log_;
  // log.trace; declared after backend_ so that it uninstalls itself from the communicators
  // before they go.
  std::unique_ptr<TimelineTrace> trace_;
  PipelineBubbles bubbles_;  // interval_bubbles()' last figures
  double flops_per_step_ = 0;
  int64_t skipped_steps_ = 0;
  MoeStats step_moe_;  // the last forward_backward's, this rank's layers
  MoeStepMetrics moe_metrics_;  // StepMetrics::moe... of step_moe_, agreed by all ranks
  int64_t consecutive_skipped_ = 0;  // skipped steps in a row up to the last one
  DivergenceGuard guard_;
  std::vector<int64_t> skipped_batches_;  // sorted
  int64_t rollbacks_ = 0;                 // taken by this run, resumes included
  int64_t rolled_back_to_ = -1;           // the step of the last rollback's checkpoint
  // Test only (TRIDENT_TEST_CORRUPT_BATCHES): a loss spike the guard must catch, on purpose.
  BatchCorruption test_corruption_;
  double train_seconds_ = 0;
  int64_t steps_run_ = 0;
  int64_t checkpoint_saves_ = 0;
  double checkpoint_seconds_ = 0;
  int64_t start_step_ = 0;
  std::string resumed_from_;
  std::function<bool()> stop_check_;
  CommWatchdog* checkpoint_watchdog_ = nullptr;
  // checkpoint.async's writer (with a checkpoint.dir), made with its staging buffer before
  // training. Last: destroyed first, so that its thread has ended (its staging copy reads the
  // model and optimizer) before they go.
  std::unique_ptr<AsyncCheckpointer> async_saves_;
};

}  // namespace trident

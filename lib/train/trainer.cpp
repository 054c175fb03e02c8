#include "train/trainer.hpp"
#include "train/straggler.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tokenizer/bpe_tokenizer.hpp"
#include "train/training_checkpoint.hpp"
#include "train/generation.hpp"
#include "train/run_reports.hpp"
#include "train/rollback_plan.hpp"
#include "train/run_trace.hpp"
#include "train/startup_checks.hpp"
#include "model/model_stats.hpp"
#include "optim/grad_finalize.hpp"
#include "optim/lr_schedule.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/shard_plan.hpp"
#include "util/error.hpp"

namespace trident {

namespace {
// eval.sample_tokenizer read and eval.sample_prompt encoded with it: at start-up, so that a bad
// file or a prompt the model cannot read is an error then, not at the first sample.
std::shared_ptr<const BpeTokenizer> load_sample_tokenizer(const Config& config) {
  const EvalConfig& e = config.eval;
  std::shared_ptr<const BpeTokenizer> tokenizer;
  try {
    tokenizer = std::make_shared<const BpeTokenizer>(
        e.sample_tokenizer.empty() ? BpeTokenizer::bytes()
                                   : BpeTokenizer::from_file(e.sample_tokenizer));
  } catch (const Error& error) {  // the key that named the file, not generate's option
    throw Error("eval.sample_tokenizer: " + std::string(error.what()));
  }
  const int64_t vocab = config.model.vocab_size;
  for (const int32_t id : tokenizer->encode(e.sample_prompt))
    if (id >= vocab)
      throw Error("eval.sample_prompt: token id " + std::to_string(id) + " of the tokenizer " +
                  (e.sample_tokenizer.empty() ? std::string("(byte-level)")
                                              : "'" + e.sample_tokenizer + "'") +
                  " is outside model.vocab_size (" + std::to_string(vocab) + ")");
  return tokenizer;
}
}  // namespace

Trainer::Trainer(const Config& config, ParallelDims groups, const BackendFactory& make)
    : config_(config),
      groups_(groups),
      out_(groups.world().index == 0),
      guard_({config.train.spike_factor, config.train.spike_window, config.train.max_bad_steps}),
      skipped_batches_(merged_skip_list(config.train.skip_batches, {})) {
  const ModelConfig& m = config.model;
  const ModelShard shard =
      plan_model_shard(config, {groups.tensor().index, groups.tensor().size,
                                groups.pipeline().index, groups.pipeline().size,
                                groups.expert().index, groups.expert().size,
                                groups.context().index, groups.context().size});
  // Agreed across ranks before anything is allocated: an unusable checkpoint.dir (else found
  // at the first save, after training up to it) and a rank whose share of the model and
  // activations cannot fit in the node's memory (else std::bad_alloc, naming nothing).
  agree_start_up_checks(config, shard, groups);
  if (config.eval.sample_interval > 0) sample_tokenizer_ = load_sample_tokenizer(config);
  backend_ = make(config, groups, shard);
  groups_.set_device(backend_.comms);
  model_ = backend_.model.get();
  model_->set_expert_group(groups_.expert().device);
  model_->set_context_group(groups_.context().device);
  // Each data x context replica averages its own share of the batch: its output gradients are
  // that many times one rank's (the FP8 delayed recipe keeps its state layout-free).
  if (Fp8DelayedRecipe* fp8 = model_->fp8_delayed())
    fp8->set_gradient_replicas(groups_.grad_reduce().size);
  const int zero_stage = static_cast<int>(config.optim.zero_stage);
  const bool split_experts = groups_.expert().size > 1;
  if (zero_stage >= 2)
    model_->set_zero(*groups_.grad_reduce().device,
                     split_experts ? groups_.expert_data().device : nullptr);
  Device& device = *backend_.device;
  model_->init_weights(static_cast<uint64_t>(config.train.seed));
  if (groups.pipeline().size > 1 && groups_.embedding().device && m.tie_embeddings) {
    // The tied embedding starts identical on the first and the last stage: the counter-based
    // init makes it so already; the broadcast keeps it so whatever produced the weights.
    const ParamInfo& wte = model_->param("embedding.token.weight");
    model_->weight_store().for_each_stored(
        wte.offset, wte.offset + wte.numel(), [&](int64_t, int64_t at, int64_t n) {
          groups_.embedding().device->broadcast(model_->weights() + at, n, DType::F32, 0);
        });
  }
  model_->weights_changed();
  sync_ = std::make_unique<GradientSync>(
      model_->params(), model_->flat_size(),
      ReplicaGroups{groups_.grad_reduce().device, groups_.expert().device,
                    groups_.expert_data().device},
      config.parallel.dp_bucket_mb, zero_stage, device);
  // The model's shards and the optimizer's must be the same slices (one unit rule for both).
  if (zero_stage >= 2 && model_->grad_store().ranges != sync_->owned())
    throw Error("ZeRO-" + std::to_string(zero_stage) +
                ": the model's gradient slices are not the optimizer's (internal error)");
  optimizer_ = std::make_unique<AdamW>(model_->params(), sync_->owned(), config.optim, device,
                                       &model_->weight_store(), &model_->grad_store());

  train_data_ = std::make_unique<BlendedDataset>(
      parse_blend(config.data.train, "data.train"), m.seq_len, m.vocab_size,
      config.train.global_batch, config.data.shuffle, static_cast<uint64_t>(config.train.seed));
  if (!config.data.val.empty()) {
    // Validation always reads consecutive windows from the start of each val dataset.
    val_data_ = std::make_unique<BlendedDataset>(parse_blend(config.data.val, "data.val"),
                                                 m.seq_len, m.vocab_size,
                                                 config.train.global_batch, false, 0);
  }
  out_.text(blend_shares_text(train_data_.get(), val_data_.get()));
  executor_ = std::make_unique<PipelineExecutor>(
      *model_, *groups_.pipeline().device, parse_schedule_kind(config.parallel.schedule),
      config.train.micro_batch);
  // Data-parallel reduction overlaps the last backward, except under sequence parallelism:
  // there the LayerNorm gradients are complete only after their sum over the tensor group,
  // which forward_backward runs after the backward.
  if (!shard.sequence_parallel)
    executor_->set_last_backward_hook(
        [this](int64_t watermark) { sync_->grads_final_from(model_->grads(), watermark); });
  flops_per_step_ = training_flops_per_token(m, padded_vocab_size(m, groups.tensor().size)) *
                    static_cast<double>(config.tokens_per_step());
  // An empty log.dir: no metrics log (`trident eval` builds a trainer that never trains).
  if (is_logging_rank() && !config.log.dir.empty()) {
    log_ = std::make_unique<MetricsLog>(config.log.dir);
    if (config.log.tensorboard) log_->enable_tensorboard(config.to_toml_with_provenance());
  }
  if (config.log.trace) trace_ = start_run_trace(config.log, groups_, *executor_);
  if (config.checkpoint.saves_async()) {
    async_saves_ = std::make_unique<AsyncCheckpointer>(groups_.mpi_world, is_logging_rank());
    async_saves_->reserve(checkpointed_state());
  }
}

void Trainer::finish_trace(int64_t steps_done, bool run_over) {
  finish_run_trace(trace_.get(), config_.log, steps_done, run_over, out_);
}

void Trainer::log_blend_counts(int64_t steps_done) const {
  if (out_.on()) out_.text(blend_counts_text(*train_data_, steps_done, config_.train.global_batch));
}

void Trainer::load_microbatch(const BlendedDataset& data, int64_t step,
                              int64_t micro, int32_t* tokens, int32_t* targets) const {
  // Only the first stage needs the tokens (every stage, with packed documents: attention's
  // masks come from them) and only the last the targets; all read the same windows, so every
  // stage of a pipeline agrees on the micro-batch without a message.
  const ModelShard& shard = model_->shard();
  if (!shard.has_embedding && !shard.has_head && !shard.masks_documents()) return;
  const int64_t mb = config_.train.micro_batch, T = config_.model.seq_len;
  const int64_t first = BatchSampler::first_sample(config_.train.global_batch, groups_.data().index,
                                                   groups_.data().size, micro, mb);
  for (int64_t b = 0; b < mb; ++b)
    data.window(step, first + b, tokens + b * T, targets + b * T);
}

std::vector<float> Trainer::host_weights() {
  const int64_t n = model_->weight_store().size();
  std::vector<float> out(static_cast<size_t>(n));
  device().to_host(out.data(), model_->weights(), n * 4);
  return out;
}

std::vector<float> Trainer::host_grads() {
  const int64_t n = model_->grad_store().size();
  std::vector<float> out(static_cast<size_t>(n));
  device().to_host(out.data(), model_->grads(), n * 4);
  return out;
}

double Trainer::from_last_stage(double value) {
  if (groups_.pipeline().size > 1)
    groups_.pipeline().host->broadcast(&value, 1, DType::F64, groups_.pipeline().size - 1);
  return value;
}

double Trainer::replica_mean(double value) {
  // Every rank of the data x context group averaged the same number of tokens (a context rank
  // seq_len / CP of each of its replica's sequences): the global mean is the mean of theirs.
  const DimGroup& replicas = groups_.grad_reduce();
  if (replicas.size > 1) {
    replicas.host->all_reduce_sum(&value, 1);
    value /= replicas.size;
  }
  return value;
}

double Trainer::forward_backward(int64_t step) {
  const int64_t micro_batches = config_.num_microbatches();
  StageModel& model = *model_;
  model.zero_grads();
  model.take_moe_stats(step_moe_);  // forwards since the last step (evaluation): not this step's
  Fp8DelayedRecipe* fp8 = model.fp8_delayed();
  if (fp8) fp8->begin_step();  // likewise the amaxes an evaluation's forwards saw
  const double loss_sum = executor_->train(micro_batches, [&](int64_t micro, int32_t* tokens,
                                                              int32_t* targets) {
    load_microbatch(*train_data_, batch_of(step), micro, tokens, targets);
  });
  model.take_moe_stats(step_moe_);
  // The step's amaxes over the ranks holding the other parts of each tensor and of the global
  // batch: every layout's next scales are one rank's. A skipped step's join the history too.
  if (fp8) fp8->end_step({groups_.tensor().host, groups_.grad_reduce().host});
  model.reduce_gradients();  // ZeRO-2/3: what backward left whole
  if (gradient_test_hook_) gradient_test_hook_(step, model.grads());
  // Sequence parallelism's norms and the tied embedding's two copies (optim/grad_finalize.hpp).
  const bool tied_across_stages = groups_.pipeline().size > 1 && config_.model.tie_embeddings;
  sum_split_gradients(model.params(), model.grads(), model.grad_store(),
                      {groups_.tensor().device,
                       tied_across_stages ? groups_.embedding().device : nullptr});
  // Mean over the global batch: each replica averaged its micro-batches; average the replicas.
  double loss = replica_mean(from_last_stage(loss_sum / static_cast<double>(micro_batches)));
  sync_->finish(model.grads());
  if (test_corruption_.any())  // test only (train/test_corruption.hpp)
    test_corruption_.apply(batch_of(step), loss, device(), model.grads(),
                           model.grad_store().size());
  return loss;
}

StepMetrics Trainer::apply_update(int64_t step, double loss) {
  StageModel& model = *model_;
  float* grads = model.grads();
  const double grad_norm = global_grad_norm(*sync_, model.params(), grads, host_replicas(),
                                            *groups_.model().host);
  const double lr =
      learning_rate(config_.optim, config_.train.steps, step) * rollback_lr_factor();
  const auto optimizer_start = std::chrono::steady_clock::now();
  // Bad (non-finite norm, or a loss spike): the update is not applied, so a bad batch never
  // reaches the weights, the moments or a checkpoint. The inputs are global values; the
  // all-reduce makes sure every rank acts on the same verdict.
  int32_t bad = guard_.is_bad(loss, grad_norm);
  groups_.world().host->all_reduce(&bad, 1, DType::I32, ReduceOp::Max);
  guard_.record(loss, bad != 0);
  wait_async_staging();  // the update below changes what a save just started copies
  if (!bad) {
    const double scale = clip_scale(grad_norm, config_.optim.grad_clip);
    const bool copy_refreshed =
        optimizer_->update(model.weights(), grads, lr, scale, model.bf16_weights());
    sync_->all_gather_weights(model.weights());
    if (copy_refreshed)
      model.bf16_copy_written();
    else
      model.weights_changed();
    consecutive_skipped_ = 0;
  } else {
    ++skipped_steps_;  // the same decision on every rank
    if (!std::isfinite(grad_norm)) ++consecutive_skipped_;
  }
  if (trace_)
    trace_->add_slice("optimizer", "optimizer", optimizer_start, std::chrono::steady_clock::now());
  StepMetrics m;
  m.step = step + 1;
  m.total_steps = config_.train.steps;
  m.loss = loss;
  m.lr = lr;
  m.grad_norm = grad_norm;
  m.skipped_steps = skipped_steps_;
  moe_metrics_.fill(step_moe_, config_.model.moe_experts, config_.num_microbatches(), groups_, m);
  return m;
}

StepMetrics Trainer::train_step(int64_t step) {
  if (trace_) trace_->set_step(step + 1);
  const bool save_in_flight = async_saves_ && async_saves_->in_flight();
  const auto t0 = std::chrono::steady_clock::now();
  StepMetrics m = apply_update(step, forward_backward(step));
  m.checkpoint_in_flight = save_in_flight;
  device().synchronize();  // a GPU step is timed to the end of its optimizer update
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.ms_per_step = seconds * 1e3;
  m.tokens_per_s = static_cast<double>(config_.tokens_per_step()) / seconds;
  m.gflops_per_rank = flops_per_step_ / seconds / 1e9 / groups_.world().host->size();
  return m;
}

std::string Trainer::sample_text() {
  return sample_continuation(*model_, config_, *sample_tokenizer_);
}

std::optional<double> Trainer::evaluate() {
  const int64_t micro_batches = config_.num_microbatches();
  double loss_sum = 0.0;
  for (int64_t batch = 0; batch < config_.eval.steps; ++batch) {
    // A stop request is honoured between evaluation batches too (eval.steps may be large):
    // all ranks agree, as between steps, and the evaluation is abandoned.
    int32_t stop = stop_check_ && stop_check_();
    groups_.world().host->all_reduce(&stop, 1, DType::I32, ReduceOp::Max);
    if (stop) {
      out_.print("evaluation stopped after %lld of %lld batches (stop requested)\n",
                 static_cast<long long>(batch), static_cast<long long>(config_.eval.steps));
      return std::nullopt;
    }
    loss_sum += executor_->evaluate(micro_batches, [&](int64_t micro, int32_t* tokens,
                                                       int32_t* targets) {
      load_microbatch(*val_data_, batch, micro, tokens, targets);
    });
  }
  return replica_mean(
      from_last_stage(loss_sum / static_cast<double>(micro_batches * config_.eval.steps)));
}

void Trainer::throw_if_skipping_for_ever(int64_t step) const {
  // Every step skipped for a while: the state cannot recover by itself (it does not change),
  // so end the run rather than spend the job on it. The same count on every rank.
  const int64_t skip_limit = config_.train.max_consecutive_skips;
  if (skip_limit > 0 && consecutive_skipped_ >= skip_limit)
    throw Error("training diverged: the gradient norm was not finite in " +
                std::to_string(consecutive_skipped_) + " steps in a row (steps " +
                std::to_string(step + 2 - consecutive_skipped_) + " to " +
                std::to_string(step + 1) + ", all skipped; train.max_consecutive_skips = " +
                std::to_string(skip_limit) + ")");
}

bool Trainer::stop_requested(int64_t step, std::chrono::steady_clock::time_point started) {
  // Stop between steps if any rank was signalled or the time limit has passed: one small
  // all-reduce so that every rank takes the same decision at the same step.
  const TrainConfig& t = config_.train;
  const double minutes =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() / 60;
  const int32_t stop = (stop_check_ && stop_check_()) ||
                       (t.exit_after_minutes > 0 && minutes >= t.exit_after_minutes) ||
                       (t.exit_interval > 0 && (step + 1) % t.exit_interval == 0);
  // The same all-reduce carries whether an asynchronous save has failed on any rank: then
  // every rank throws its writer's error here (the writers agree on it), at the same step.
  int32_t flags[2] = {stop, async_saves_ && async_saves_->failed()};
  groups_.world().host->all_reduce(flags, 2, DType::I32, ReduceOp::Max);
  if (flags[1] != 0) finish_async_save("");
  return flags[0] != 0;
}

RunOutcome Trainer::run() {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const int64_t steps = config_.train.steps;
  const CheckpointConfig& ck = config_.checkpoint;
  StragglerReport straggler(config_.log.straggler_interval, *groups_.world().host,
                            timed_communicators(groups_, config_), log_.get());
  for (int64_t step = start_step_; step < steps; ++step) {
    StepMetrics m = train_step(step);
    train_seconds_ += m.ms_per_step / 1e3;
    ++steps_run_;
    straggler.step_done(step);
    const bool last = step + 1 == steps;
    const int64_t eval_every = config_.eval.interval;
    if (val_data_ && eval_every > 0 && ((step + 1) % eval_every == 0 || last))
      m.val_loss = evaluate();
    const int64_t sample_every = config_.eval.sample_interval;
    if (sample_every > 0 && ((step + 1) % sample_every == 0 || last))
      out_.text(sample_line(step + 1, sample_text()));
    const bool log_step = (step + 1) % config_.log.interval == 0 || last || m.val_loss;
    if (log_step && groups_.pipeline().size > 1)
      m.pipeline_bubble = interval_bubbles();  // all ranks
    if (log_ && log_step) {
      const int64_t samples_done = (step + 1) * config_.train.global_batch;
      if (train_data_->size() > 1)
        m.data_counts = train_data_->sampler().counts_before(samples_done);
      log_->write(m);
    }
    if (last) log_blend_counts(step + 1);
    if (guard_.rollback_due()) {
      if (!roll_back(step)) return RunOutcome::Diverged;
      step = start_step_ - 1;  // the loop's ++step makes it the checkpoint's step
      continue;
    }
    throw_if_skipping_for_ever(step);
    bool stop = stop_requested(step, started);
    // No periodic checkpoint inside a streak of bad steps that may yet end in a rollback: the
    // checkpoint it reads must be from before the streak, so that its continuation is the run
    // without the streak's batches.
    const bool periodic = ck.interval > 0 && (step + 1) % ck.interval == 0 &&
                          !(config_.train.max_bad_steps > 0 && guard_.bad_streak() > 0);
    if (!ck.dir.empty() && (periodic || last || stop)) {
      const auto save_start = Clock::now();
      // The run's final checkpoint (the last step, a stop) is written synchronously, after
      // the asynchronous save in flight: the run ends once it is committed.
      if (ck.saves_async() && !last && !stop) start_async_save(step + 1);
      else save_checkpoint(step + 1);
      const auto save_end = Clock::now();
      if (trace_) trace_->add_slice("checkpoint save", "checkpoint", save_start, save_end);
      checkpoint_seconds_ += std::chrono::duration<double>(save_end - save_start).count();
      ++checkpoint_saves_;
      // A stop requested while the checkpoint was written (a write may take minutes): that
      // checkpoint is the run's state, so stop now rather than run a step and save again.
      if (!stop && !last) stop = stop_requested(step, started);
    }
    finish_trace(step + 1, last || stop);
    if (stop && !last) {
      finish_async_save("before stopping");  // exit 75 only with this step's state committed
      log_blend_counts(step + 1);
      out_.print("stopping after step %lld of %lld (signal, time limit or exit interval)%s\n",
                 static_cast<long long>(step + 1), static_cast<long long>(steps),
                 ck.dir.empty() ? "; no checkpoint.dir, nothing saved" : "");
      return RunOutcome::Stopped;
    }
  }
  return RunOutcome::Finished;
}

CheckpointedState Trainer::checkpointed_state() { return {*model_, *optimizer_, *sync_}; }

CheckpointProgress Trainer::checkpoint_progress(int64_t steps_done) const {
  return {steps_done,      optimizer_->updates(), skipped_steps_,  layout(),
          skipped_batches_, rollbacks_,           rollback_lr_factor(), guard_.losses(),
          guard_.bad_streak()};
}

std::string Trainer::save_checkpoint(int64_t steps_done) {
  finish_async_save("before a synchronous save");
  return save_training_checkpoint(config_, checkpointed_state(), checkpoint_progress(steps_done),
                                  groups_.mpi_world, is_logging_rank(), resumed_from_,
                                  checkpoint_watchdog_);
}

void Trainer::start_async_save(int64_t steps_done) {
  const CheckpointedState state = checkpointed_state();
  async_saves_->start(plan_checkpoint(config_, state, checkpoint_progress(steps_done)), state,
                      resumed_from_);
}

void Trainer::finish_async_save(const char* before) {
  if (!async_saves_) return;
  const bool writing = async_saves_->in_flight();
  const int64_t step = async_saves_->step();
  const double waited = async_saves_->finish();  // throws the save's error
  if (writing && *before)
    out_.print("checkpoint: waited %.3f s for the asynchronous save of step %lld %s\n", waited,
               static_cast<long long>(step), before);
}

void Trainer::wait_async_staging() {
  if (!async_saves_) return;
  const std::optional<AsyncCheckpointer::Stall> stall = async_saves_->wait_staged();
  if (!stall) return;  // the same on every rank: a save was started at the step before
  double waited[2] = {stall->previous_save, stall->staging};
  groups_.world().host->all_reduce(waited, 2, DType::F64, ReduceOp::Max);
  if (!log_) return;
  char line[200];
  std::snprintf(line, sizeof line,
                "checkpoint step %lld: training waited %.3f s for the asynchronous save (%.3f s "
                "for the previous save, %.3f s for the staging copy; most over ranks)",
                static_cast<long long>(stall->step), waited[0] + waited[1], waited[0], waited[1]);
  log_->write_event(line, {{"type", "event"},
                           {"event", "checkpoint_stall"},
                           {"step", stall->step},
                           {"stall_s", waited[0] + waited[1]},
                           {"previous_save_s", waited[0]},
                           {"staging_s", waited[1]}});
}

std::string Trainer::layout() const {
  const int cp = groups_.context().size;
  return "tensor=" + std::to_string(groups_.tensor().size) +
         (cp > 1 ? " context=" + std::to_string(cp) : "") +
         " pipeline=" + std::to_string(groups_.pipeline().size) +
         " data=" + std::to_string(groups_.data().size) +
         " zero_stage=" + std::to_string(config_.optim.zero_stage);
}

std::string Trainer::save_rollback_checkpoint(int64_t first_bad,
                                              const std::vector<int64_t>& bad_batches) {
  // The bad steps' updates were never applied: the weights and moments are those of step
  // first_bad. Saved as that step with the bad batches skipped, it is the checkpoint the
  // rollback would have gone back to.
  const int64_t streak = guard_.bad_streak();
  return save_training_checkpoint(
      config_, checkpointed_state(),
      {first_bad, optimizer_->updates(), skipped_steps_ - streak, layout(),
       merged_skip_list(skipped_batches_, bad_batches), rollbacks_, rollback_lr_factor(),
       guard_.losses(), 0, true},
      groups_.mpi_world, is_logging_rank(), resumed_from_, checkpoint_watchdog_);
}

void Trainer::load_checkpoint(const std::string& path) {
  finish_async_save("before reading a checkpoint");  // and HDF5 is used by one thread at a time
  const ResumedProgress resumed =
      load_training_checkpoint(path, config_, skipped_batches_, checkpointed_state(),
                               groups_.mpi_world, is_logging_rank(), checkpoint_watchdog_);
  start_step_ = resumed.meta.step;
  skipped_steps_ = resumed.meta.skipped_steps;
  skipped_batches_ = resumed.skipped_batches;
  rollbacks_ = std::max(rollbacks_, resumed.meta.rollbacks);
  resumed_from_ = path;
  // Older checkpoints hold no guard state: the window then fills again (no spike check until
  // it is full).
  if (resumed.meta.guard_losses)
    guard_.restore(*resumed.meta.guard_losses, resumed.meta.guard_bad_streak);
}

double Trainer::rollback_lr_factor() const {
  return std::pow(config_.train.rollback_lr_scale, static_cast<double>(rollbacks_));
}

bool Trainer::roll_back(int64_t step) {
  // The save in flight may be the checkpoint to go back to: committed first.
  finish_async_save("before the rollback");
  const TrainConfig& t = config_.train;
  const RollbackPlan plan =
      plan_rollback(step, guard_.bad_streak(), rolled_back_to_, t.max_bad_steps,
                    [this](int64_t s) { return batch_of(s); });
  const std::string target =
      agreed_checkpoint_at_or_before(config_.checkpoint.dir, plan.max_step, groups_.mpi_world);
  const std::string refusal =
      rollback_refusal(plan, rollbacks_, t.max_rollbacks, target, config_.checkpoint.dir);
  if (!refusal.empty()) {
    // Nothing to go back to, but the weights are still those from before the streak (bad
    // steps are not applied): keep them, unless they are what the last load read.
    std::string saved, save_failure;
    if (target.empty() && rollbacks_ < t.max_rollbacks && plan.first_bad > start_step_) {
      // A failed save (every rank throws the same error) leaves the exit as it is: diverged.
      try {
        saved = save_rollback_checkpoint(plan.first_bad, plan.bad_batches);
      } catch (const Error& e) {
        save_failure = std::string("; the rollback save failed: ") + e.what();
      }
    }
    if (log_)
      log_->write_event(diverged_line(plan, refusal, saved, save_failure),
                        diverged_record(plan, refusal, rollbacks_, saved));
    return false;
  }
  skipped_batches_ = merged_skip_list(skipped_batches_, plan.bad_batches);
  ++rollbacks_;
  consecutive_skipped_ = 0;
  load_checkpoint(target);
  guard_.clear_streak();  // a target written inside an earlier, ended streak recorded it
  rolled_back_to_ = start_step_;
  if (log_)
    log_->write_event(rollback_line(plan, rollbacks_, t.max_rollbacks, target, start_step_),
                      rollback_record(plan, rollbacks_, start_step_, target, skipped_batches_,
                                      rollback_lr_factor()));
  return true;
}

int64_t Trainer::init_weights_from(const std::string& path) {
  // Each weight's checksum is counted by its first data-parallel replica, or at ZeRO-3 by the
  // holder of each slice.
  return load_checkpoint_weights(path, config_, *model_,
                                 [&](const ParamInfo& p) {
                                   return sync_->replica_of(p) == 0 ||
                                          sync_->weights_sharded_for(p);
                                 },
                                 groups_.mpi_world, checkpoint_watchdog_);
}

std::vector<double> Trainer::interval_bubbles() {
  return bubbles_.since_last(executor_->stats(), groups_.pipeline());
}

std::string Trainer::pipeline_report() {
  return trident::pipeline_report(executor_->stats(), groups_.pipeline(), config_);
}

std::string Trainer::memory_report() {
  return trident::memory_report(*model_, *optimizer_, *sync_, executor_->stats(), device(),
                                *groups_.world().host);
}

}  // namespace trident

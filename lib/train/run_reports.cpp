#include "train/run_reports.hpp"

#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "comm/comm.hpp"
#include "data/blend.hpp"
#include "grid/core_share.hpp"
#include "grid/parallel_dims.hpp"
#include "model/model_stats.hpp"
#include "model/stage_model.hpp"
#include "optim/adamw.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/simulator.hpp"
#include "tensor/device.hpp"

namespace trident {

namespace {

[[gnu::format(printf, 1, 2)]] std::string formatted(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(static_cast<size_t>(n > 0 ? n : 0), '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

long long ll(int64_t v) { return static_cast<long long>(v); }

}  // namespace

std::string start_up_figures(const Config& c, int world_size, int threads,
                             const std::string& threads_explained) {
  const int64_t params = parameter_count(c.model);
  const double flops =
      training_flops_per_token(c.model, padded_vocab_size(c.model, c.parallel.tensor)) *
      static_cast<double>(c.tokens_per_step());
  std::string out = formatted("# resolved config (from %s)\n%s\n", c.source.c_str(),
                              c.to_toml().c_str());
  out += formatted("model: %s, parameters: %lld (%.2f M)\n", c.model.arch.c_str(), ll(params),
                   params / 1e6);
  if (c.model.moe_experts > 0)
    out += formatted("mixture of experts: %lld experts, top-%lld, active parameters per token: "
                     "%lld\n",
                     ll(c.model.moe_experts), ll(c.model.moe_top_k),
                     ll(active_parameter_count(c.model)));
  out += formatted("tokens per step: %lld (global batch %lld x seq %lld; %lld micro-batches of "
                   "%lld per replica)\n",
                   ll(c.tokens_per_step()), ll(c.train.global_batch), ll(c.model.seq_len),
                   ll(c.num_microbatches()), ll(c.train.micro_batch));
  out += formatted("training FLOPs per step: %.4g (matmuls, forward + backward; docs/model.md)\n",
                   flops);
  out += formatted("ranks: %d, threads per rank: %d (%s)\n", world_size, threads,
                   threads_explained.c_str());
  return out;
}

std::string threads_above_share_note(int threads, const std::string& threads_source,
                                     const CoreShare& share) {
  if (threads_source.empty() || static_cast<int64_t>(threads) * share.sharers <= share.cores)
    return "";
  return formatted("note: %s = %d: rank 0's share is %s, so threads take turns on its cores "
                   "(train.threads = 0 without OMP_NUM_THREADS: one thread per core of the "
                   "share)\n",
                   threads_source.c_str(), threads, share.describe().c_str());
}

std::string overlap_without_a_core_note(const Config& config, int threads,
                                        const CoreShare& share) {
  if (!config.parallel.tp_overlap || config.parallel.tensor < 2 || config.train.device != "cpu")
    return "";
  if (static_cast<int64_t>(threads) * share.sharers < share.cores) return "";
  return formatted("note: parallel.tp_overlap: no core is left for the helper thread that drives "
                   "the overlapped collectives (rank 0: %d thread%s on %s); its polls then take "
                   "time from the GEMMs (3-6 %% of a 2-rank TP step on 2 cores, docs/model.md)\n",
                   threads, threads == 1 ? "" : "s", share.describe().c_str());
}

std::string blend_shares_text(const BlendedDataset* train, const BlendedDataset* val) {
  const std::pair<const char*, const BlendedDataset*> blends[] = {{"data.train", train},
                                                                  {"data.val", val}};
  std::string out;
  for (const auto& [key, data] : blends) {
    if (data == nullptr || data->size() < 2) continue;
    out += formatted("%s: blend of %zu datasets\n", key, data->size()) + data->describe(key);
  }
  return out;
}

std::string blend_counts_text(const BlendedDataset& train, int64_t steps_done,
                              int64_t global_batch) {
  if (train.size() < 2) return "";
  return formatted("data.train: samples per dataset in steps [0, %lld): %s\n", ll(steps_done),
                   train.describe_counts(steps_done * global_batch).c_str());
}

std::vector<double> PipelineBubbles::since_last(const PipelineStats& st,
                                                const DimGroup& pipeline) {
  double mine[2] = {st.wait_seconds - wait_seconds_, st.busy_seconds - busy_seconds_};
  wait_seconds_ = st.wait_seconds;
  busy_seconds_ = st.busy_seconds;
  std::vector<double> all(2 * pipeline.size);
  pipeline.host->all_gather(mine, all.data(), 2, DType::F64);
  std::vector<double> bubbles(pipeline.size);
  for (int s = 0; s < pipeline.size; ++s)
    bubbles[s] = all[2 * s + 1] > 0 ? all[2 * s] / all[2 * s + 1] : 0.0;
  return bubbles;
}

std::string pipeline_report(const PipelineStats& st, const DimGroup& pipeline,
                            const Config& config) {
  // [bubble fraction, peak in-flight micro-batches, peak activation MB] of every stage.
  double mine[3] = {st.busy_seconds > 0 ? st.wait_seconds / st.busy_seconds : 0.0,
                    static_cast<double>(st.peak_in_flight), st.peak_activation_bytes / 1e6};
  std::vector<double> all(3 * pipeline.size);
  pipeline.host->all_gather(mine, all.data(), 3, DType::F64);
  // The idle fraction of the schedule in use with unit costs, F = B = W (a whole backward 2):
  // 1F1B and GPipe (p-1)/(m+p-1); ZB-H1's deferred weight gradients fill two thirds of that,
  // (p-1)/(3m+p-1), and so do ZB-H2's for m >= 2p-1 (its gain needs W < B); interleaved
  // (p-1)/(vm+p-1) (Megatron-LM), "held" counting chunk micro-batches. The simulator computes
  // it for any p and m (the tests check it against these closed forms).
  const PipeSimResult unit = simulate_pipeline(
      parse_schedule_kind(config.parallel.schedule), pipeline.size, config.num_microbatches(),
      {1.0, 2.0, 0.0, 1.0}, static_cast<int>(config.parallel.virtual_stages));
  const double theory = unit.ok ? unit.bubble_fraction() : -1.0;
  std::string out;
  for (int s = 0; s < pipeline.size; ++s)
    out += formatted("pipeline stage %d: bubble %.3f measured, %.3f theory simulated for F=B=W | "
                     "peak %g micro-batches held, %.1f MB activations\n",
                     s, all[3 * s], theory, all[3 * s + 1], all[3 * s + 2]);
  return out;
}

std::string memory_report(const StageModel& model, const AdamW& optimizer,
                          const GradientSync& sync, const PipelineStats& stats,
                          const Device& device, Communicator& world) {
  const double mb = 1e6;
  // Counted: the buffers' sizes (ZeRO-2/3: the rank's slices; the compute copy and gather
  // buffers after them) and the executor's count of its stashes. Measured: what the device's
  // allocator handed out (every weight, gradient, moment, stash, scratch and message buffer the
  // rank made), now and at its most.
  const ModelStateBytes state = model.state_bytes();
  constexpr int kFigures = 8;
  double mine[kFigures] = {state.weights / mb,
                           state.gradients / mb,
                           optimizer.state_bytes() / mb,
                           stats.peak_activation_bytes / mb,
                           device.allocated_bytes() / mb,
                           device.peak_allocated_bytes() / mb,
                           state.compute / mb,
                           (state.gather + sync.staging_bytes()) / mb};
  std::vector<double> all(kFigures * world.size());
  world.all_gather(mine, all.data(), kFigures, DType::F64);
  std::string out;
  for (int r = 0; r < world.size(); ++r) {
    const double* a = &all[kFigures * r];
    out += formatted("memory rank %d: parameters %.2f MB | gradients %.2f MB | optimizer state "
                     "%.2f MB | peak activations %.2f MB | device allocated %.2f MB, peak %.2f "
                     "MB | compute copy %.2f MB | gather buffers %.2f MB\n",
                     r, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
  }
  return out;
}

std::string communication_report(const std::string& host_table,
                                 const std::vector<Communicator*>& host,
                                 const std::vector<std::unique_ptr<Communicator>>& device,
                                 int64_t steps_run, double train_seconds) {
  double comm_seconds = 0;
  for (const Communicator* c : host)
    for (const auto& [op, st] : c->stats().ops) comm_seconds += st.seconds;
  std::string out = "communication of rank 0:\n" + host_table;
  // GPU runs: the device-buffer communicators (NCCL or staged MPI) carry the tensors.
  for (const auto& c : device)
    for (const auto& [op, st] : c->stats().ops) {
      out += formatted("device communicator %-9s %-14s %8lld calls %12.3f MB %9.3f s\n",
                       c->name().c_str(), op.c_str(), ll(st.calls), st.bytes / 1e6, st.seconds);
      comm_seconds += st.seconds;
    }
  // A share of the training time only when there was some (a run resumed at its last step
  // trains nothing: its communication is the start-up's).
  const std::string share =
      steps_run > 0 && train_seconds > 0
          ? formatted(" (%.1f%% of the training time)", 100.0 * comm_seconds / train_seconds)
          : "";
  out += formatted("run summary: %lld steps in %.3f s of training; rank 0 spent %.3f s in "
                   "communication calls%s\n",
                   ll(steps_run), train_seconds, comm_seconds, share.c_str());
  return out;
}

std::string checkpoint_report(int64_t saves, double seconds, double train_seconds) {
  if (saves <= 0) return "";
  const std::string share =
      train_seconds > 0 ? formatted(" (%.1f%%)", 100.0 * seconds / train_seconds) : "";
  return formatted("checkpoints: %lld save%s took %.3f s beyond the steps' %.3f s of training%s\n",
                   ll(saves), saves == 1 ? "" : "s", seconds, train_seconds, share.c_str());
}

std::string sample_line(int64_t steps_done, const std::string& text) {
  return "sample at step " + std::to_string(steps_done) + ": " +
         nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace trident

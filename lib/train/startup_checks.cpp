#include "train/startup_checks.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "model/model_stats.hpp"
#include "pipeline/schedule.hpp"

namespace trident {
namespace {

std::string gb(double bytes) {
  char buf[64];
  const double g = bytes / 1e9;
  std::snprintf(buf, sizeof buf, g < 1e5 ? "%.1f GB" : "%.3g GB", g);
  return buf;
}

std::string count(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", n);
  return buf;
}

}  // namespace

std::string checkpoint_dir_problem(const std::string& dir) {
  if (dir.empty()) return "";
  const std::string what = "checkpoint.dir '" + dir + "'";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return what + ": cannot create: " + (ec ? ec.message() : std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return what + " is not a directory";
  // A probe file, created and removed: the only test that also holds for root, read-only
  // mounts and ACLs.
  std::random_device rd;
  char name[64];
  std::snprintf(name, sizeof name, "/.trident-write-test-%d-%08x", static_cast<int>(::getpid()),
                static_cast<unsigned>(rd()));
  const std::string probe = dir + name;
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return what + " is not writable: " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

RankMemory estimate_rank_memory(const Config& config, const ModelShard& shard, int dp_size,
                                int stage) {
  const ModelConfig& m = config.model;
  const double tp = std::max(1, shard.tp_size);
  // Per layer and the rest (embeddings, final norm, an untied head), from the exact count.
  ModelConfig one = m, two = m;
  one.layers = 1;
  two.layers = 2;
  // Every layer counted as a MoE layer when there are any: an upper bound.
  one.moe_layer_interval = two.moe_layer_interval = 1;
  const double per_layer =
      static_cast<double>(parameter_count(two)) - static_cast<double>(parameter_count(one));
  const double rest = static_cast<double>(parameter_count(one)) - per_layer;
  const double layers = static_cast<double>(shard.layer_count());
  RankMemory r;
  r.parameters = (layers * per_layer + (shard.has_embedding || shard.has_head ? rest : 0.0)) / tp;
  const bool zero = config.optim.zero_stage == 1;
  // fp32 weights and gradients; AdamW's two fp32 moments, sharded over the replicas by ZeRO-1.
  r.state_bytes = r.parameters * (4.0 + 4.0 + 8.0 / (zero ? std::max(1, dp_size) : 1));

  const double act = config.train.precision == "bf16" ? 2.0 : 4.0;
  const double B = static_cast<double>(config.train.micro_batch);
  const double T = static_cast<double>(m.seq_len), N = B * T, C = static_cast<double>(m.width);
  const double rows = shard.sequence_parallel ? N / tp : N;
  // The saved tensors of one layer (model_stats.hpp, the model's own count) for the recompute
  // mode; the attention kernels of both backends keep a row statistic [B, NH, T] (the
  // log-sum-exp; backward recomputes the probabilities). The zero-bubble schedules' split
  // backward also keeps a micro-batch's linear-layer output gradients from its input gradient
  // to its weight gradient (Transformer::deferred_weight_grad_bytes).
  ActivationShape shape;
  shape.micro_batch = config.train.micro_batch;
  shape.tp = std::max(1, shard.tp_size);
  shape.sequence_parallel = shard.sequence_parallel;
  shape.recompute = parse_recompute(config.train.recompute);
  const ScheduleKind schedule = parse_schedule_kind(config.parallel.schedule);
  shape.split_backward = splits_backward(schedule);
  shape.element_bytes = static_cast<int64_t>(act);
  shape.attention_saved_per_row = 1;
  // One micro-batch's stash: every layer's saved tensors, the stage's input and, on the last
  // stage, the final norm's output.
  double stash = layers * static_cast<double>(layer_activation_bytes(m, shape)) + act * rows * C;
  if (shard.has_head) stash += act * N * C;
  // As many as the schedule holds at once on this stage; under interleaved its peak counts
  // chunk stashes, 1/v of the stage's layers each.
  const int64_t v = std::max<int64_t>(1, config.parallel.virtual_stages);
  r.micro_batches_held = std::max<int64_t>(
      1, schedule_peak_bound(schedule, stage, static_cast<int>(config.parallel.pipeline),
                             config.num_microbatches(), static_cast<int>(v)) /
             v);
  r.activation_bytes = static_cast<double>(r.micro_batches_held) * stash;
  // Held once: what the rank recomputes in, and the LM head's logits, one chunk of rows at a
  // time.
  r.activation_bytes += static_cast<double>(recompute_workspace_bytes(m, shape));
  if (shard.has_head) {
    const double vocab = static_cast<double>(padded_vocab_size(m, shard.tp_size)) / tp;
    r.activation_bytes += static_cast<double>(lm_head_scratch_bytes(
        static_cast<int64_t>(N), static_cast<int64_t>(vocab), static_cast<int64_t>(act),
        config.train.lm_head_chunk_rows, lm_head_chunk_bytes(config.train.device == "cuda")));
  }
  return r;
}

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page);
}

std::string rank_memory_problem(const Config& config, const ModelShard& shard, int rank,
                                int dp_size, double memory_bytes, int stage) {
  const RankMemory r = estimate_rank_memory(config, shard, dp_size, stage);
  if (memory_bytes <= 0 || r.total() <= memory_bytes) return "";
  const ModelConfig& m = config.model;
  const std::string model =
      "this rank's share of the model (model.layers = " + std::to_string(m.layers) +
      ", model.width = " + std::to_string(m.width) + ", model.vocab_size = " +
      std::to_string(m.vocab_size) + " over parallel.tensor = " +
      std::to_string(config.parallel.tensor) + " x parallel.pipeline = " +
      std::to_string(config.parallel.pipeline) + ": " + count(r.parameters) +
      " parameters) needs " + gb(r.state_bytes) + " for weights, gradients and AdamW state";
  const std::string held =
      r.micro_batches_held == 1
          ? "one micro-batch of activations"
          : std::to_string(r.micro_batches_held) + " micro-batches of activations held at once (" +
                "parallel.schedule = \"" + config.parallel.schedule + "\" on pipeline stage " +
                std::to_string(stage) + ")";
  const std::string activations = held + " (model.seq_len = " + std::to_string(m.seq_len) +
                                  ", train.micro_batch = " +
                                  std::to_string(config.train.micro_batch) + ") needs " +
                                  gb(r.activation_bytes);
  const bool model_first = r.state_bytes >= r.activation_bytes;
  return "not enough memory on rank " + std::to_string(rank) + ": " +
         (model_first ? model : activations) + ", and " + (model_first ? activations : model) +
         "; at least " + gb(r.total()) + " in all, more than the " + gb(memory_bytes) +
         " of physical memory of this node";
}

}  // namespace trident

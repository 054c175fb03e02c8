#include "train/startup_checks.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "checkpoint/ckpt_mpi.hpp"
#include "grid/parallel_dims.hpp"
#include "model/model_stats.hpp"
#include "pipeline/shard_plan.hpp"
#include "pipeline/schedule.hpp"
#include "runtime/backend.hpp"

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

namespace {
// This rank's parameters and its largest ZeRO unit (an upper bound: every layer counted as a
// MoE layer where there are any; the embeddings and head as one unit).
struct ShardParameters {
  double parameters = 0, largest_unit = 0;
};
ShardParameters shard_parameters(const ModelConfig& m, const ModelShard& shard) {
  const double tp = std::max(1, shard.tp_size);
  ModelConfig one = m, two = m;
  one.layers = 1;
  two.layers = 2;
  one.moe_layer_interval = two.moe_layer_interval = 1;
  const double per_layer =
      static_cast<double>(parameter_count(two)) - static_cast<double>(parameter_count(one));
  const double rest = static_cast<double>(parameter_count(one)) - per_layer;
  const double layers = static_cast<double>(shard.layer_count());
  const bool ends = shard.has_embedding || shard.has_head;
  return {(layers * per_layer + (ends ? rest : 0.0)) / tp,
          std::max(layers > 0 ? per_layer : 0.0, ends ? rest : 0.0) / tp};
}

// checkpoint.async's host staging copy of the rank's weights and moments; 0 without it.
double async_staging_bytes(const Config& config, const ModelStateBytes& state) {
  return config.checkpoint.saves_async() ? static_cast<double>(state.weights + state.moments)
                                         : 0.0;
}

// Bytes of one stored activation or compute weight: bf16's 2 on the GPU; 4 on the CPU, whose
// bf16 precision holds bf16 values in fp32 storage (model/cpu_bf16_kernels.hpp).
double activation_element_bytes(const TrainConfig& train) {
  return train.bf16_activations() && train.device == "cuda" ? 2.0 : 4.0;
}
}  // namespace

ModelStateBytes estimate_model_state(const Config& config, const ModelShard& shard,
                                     int dp_size) {
  const ShardParameters s = shard_parameters(config.model, shard);
  const double P = s.parameters, L = s.largest_unit;
  const int stage = static_cast<int>(config.optim.zero_stage);
  const double d = stage >= 1 ? std::max(1, dp_size) : 1;
  const bool bf16 = config.train.bf16_activations();
  const double compute_element = activation_element_bytes(config.train);
  double gather = 0;
  if ((stage == 1 || stage == 2) && d > 1) {  // the largest bucket's staging (stage 2: a unit)
    const double bucket_elems = config.parallel.dp_bucket_mb * 1024 * 1024 / 4;
    const double bucket = stage == 2 ? L : std::min(P, std::max(bucket_elems, L));
    gather += 4.0 * (bucket + bucket / d);
  }
  if (stage >= 2) gather += (d > 1 ? 12.0 * L : 0.0) + 4.0 * L / d;  // 3 windows, a received slice
  if (stage == 3) {
    const double slots = config.parallel.expert > 1 ? 5 : 3;
    gather += slots * compute_element * L;
  }
  auto bytes = [](double x) { return static_cast<int64_t>(std::llround(x)); };
  ModelStateBytes b;
  b.weights = bytes(4.0 * P / (stage == 3 ? d : 1.0));
  // The CPU's oneDNN engine also packs the compute copy into bf16 bits (2 bytes a parameter).
  const bool packed = bf16 && config.train.device != "cuda" && stage < 3 &&
                      cpu_bf16_uses_onednn(config);
  b.compute = bytes(bf16 && stage < 3 ? (compute_element + (packed ? 2.0 : 0.0)) * P : 0.0);
  b.gradients = bytes(4.0 * P / (stage >= 2 ? d : 1.0));
  b.moments = bytes(8.0 * P / d);
  b.gather = bytes(gather);
  return b;
}

std::string model_state_lines(const Config& config, int dp_size) {
  std::string out;
  const int pp = static_cast<int>(config.parallel.pipeline);
  for (int stage = 0; stage < pp; ++stage) {
    ShardCoord coord;
    coord.tp_size = static_cast<int>(config.parallel.tensor);
    coord.pp_rank = stage;
    coord.pp_size = pp;
    coord.ep_size = static_cast<int>(config.parallel.expert);
    coord.cp_size = static_cast<int>(config.parallel.context);
    const ModelShard shard = plan_model_shard(config, coord);
    const ModelStateBytes b = estimate_model_state(config, shard, dp_size);
    const double mb = 1e6;
    char line[400];
    std::snprintf(line, sizeof line,
                  "model state per rank%s (ZeRO-%lld over %d replicas): weights %.2f MB | compute "
                  "copy %.2f MB | gradients %.2f MB | moments %.2f MB | gather buffers %.2f MB | "
                  "total %.2f MB",
                  pp > 1 ? (" of stage " + std::to_string(stage)).c_str() : "",
                  static_cast<long long>(config.optim.zero_stage), dp_size, b.weights / mb,
                  b.compute / mb, b.gradients / mb, b.moments / mb, b.gather / mb,
                  b.total() / mb);
    out += line;
    if (const double staging = async_staging_bytes(config, b); staging > 0) {
      std::snprintf(line, sizeof line, "; checkpoint.async staging %.2f MB (host)", staging / mb);
      out += line;
    }
    out += "\n";
  }
  return out;
}

RankMemory estimate_rank_memory(const Config& config, const ModelShard& shard, int dp_size,
                                int stage) {
  const ModelConfig& m = config.model;
  const double tp = std::max(1, shard.tp_size);
  const double layers = static_cast<double>(shard.layer_count());
  RankMemory r;
  r.parameters = shard_parameters(m, shard).parameters;
  const ModelStateBytes state = estimate_model_state(config, shard, dp_size);
  r.state_bytes = static_cast<double>(state.total());
  r.staging_bytes = async_staging_bytes(config, state);

  const double act = activation_element_bytes(config.train);
  const double B = static_cast<double>(config.train.micro_batch);
  // Under context parallelism the rank holds seq_len / CP rows of each sequence: the model as
  // its activations see it.
  ModelConfig local = m;
  local.seq_len = shard.seq_rows(m.seq_len);
  const double T = static_cast<double>(local.seq_len), N = B * T;
  const double C = static_cast<double>(m.width);
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
  shape.expert_parallel = std::max(1, shard.ep_size);
  shape.fp8_codes = config.train.device == "cuda";  // the GPU's kernel set (one-byte codes)
  // FP8's quantised copies: only a stage with a layer in FP8 ever makes them. A MoE layer
  // keeps its router's and experts' rows beyond a dense layer's stash.
  double moe_layers = 0;
  for (const auto& [begin, end] : shard.layer_chunks())
    for (int64_t l = begin; l < end; ++l) {
      shape.fp8 = shape.fp8 || shard.fp8.covers(l, m.layers);
      if (m.is_moe_layer(l)) moe_layers += 1;
    }
  // One micro-batch's stash: every layer's saved tensors, the stage's input and, on the last
  // stage, the final norm's output.
  double stash = layers * static_cast<double>(layer_activation_bytes(local, shape)) +
                 moe_layers * static_cast<double>(moe_layer_extra_bytes(local, shape)) +
                 act * rows * C;
  // The micro-batch's token and target ids; on the last stage the final norm's output and the
  // loss statistics (Transformer::activation_bytes).
  stash += 8.0 * N;
  if (config.data.document_mask)
    stash += static_cast<double>(document_bytes(static_cast<int64_t>(N), m.position_reset,
                                                shard.cp_size));
  if (shard.has_head) stash += act * N * C + 4.0 * ((m.is_llama() ? 1.0 : 2.0) * rows + 4.0 * N);
  // As many as the schedule holds at once on this stage; under interleaved its peak counts
  // chunk stashes, 1/v of the stage's layers each.
  const int64_t v = std::max<int64_t>(1, config.parallel.virtual_stages);
  r.micro_batches_held = std::max<int64_t>(
      1, schedule_peak_bound(schedule, stage, static_cast<int>(config.parallel.pipeline),
                             config.num_microbatches(), static_cast<int>(v)) /
             v);
  r.activation_bytes = static_cast<double>(r.micro_batches_held) * stash;
  // Held once: what the rank recomputes in, the backward's scratch, the MoE block's buffers,
  // the context ring's four key/value blocks (model/context_parallel.hpp), and the LM head's
  // logits, one chunk of rows at a time.
  r.activation_bytes += static_cast<double>(recompute_workspace_bytes(local, shape));
  r.activation_bytes += static_cast<double>(backward_scratch_bytes(local, shape));
  if (moe_layers > 0) r.activation_bytes += static_cast<double>(moe_buffer_bytes(local, shape));
  if (shard.cp_size > 1)
    r.activation_bytes += 4.0 * act * N * 2.0 * static_cast<double>(m.kv_head_count()) / tp *
                          static_cast<double>(m.head_size());
  if (shard.has_head) {
    const double vocab = static_cast<double>(padded_vocab_size(m, shard.tp_size)) / tp;
    r.activation_bytes += static_cast<double>(lm_head_scratch_bytes(
        static_cast<int64_t>(N), static_cast<int64_t>(vocab), static_cast<int64_t>(act),
        config.train.lm_head_chunk_rows, lm_head_chunk_bytes(config.train.device == "cuda")));
  }
  return r;
}

namespace {

// The first whitespace-separated number of a file, or -1.
double number_in_file(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word)) return -1;
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  return end != word.c_str() && *end == '\0' ? v : -1;
}

// The smaller of two limits; one of 0 bytes is none.
MemoryLimit smaller(MemoryLimit a, MemoryLimit b) {
  if (a.bytes <= 0) return b;
  if (b.bytes <= 0) return a;
  return b.bytes < a.bytes ? b : a;
}

// The smallest `file` limit in `dir` and its ancestors up to `top` (values of 2^62 and more,
// and "max", are no limit).
MemoryLimit cgroup_file_limit(const std::string& top, const std::string& path,
                              const std::string& file) {
  MemoryLimit best;
  std::string rel = path;
  while (true) {
    const std::string at = top + (rel == "/" ? "" : rel) + "/" + file;
    const double v = number_in_file(at);
    if (v >= 0 && v < 0x1p62) best = smaller(best, MemoryLimit(v, "of the memory limit of this "
                                                                 "process's cgroup (" + at + ")"));
    if (rel.empty() || rel == "/") break;
    const size_t slash = rel.rfind('/');
    rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
  }
  return best;
}

std::string mb(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f MB", n);
  return buf;
}

double env_number(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  return end != v && *end == '\0' && x > 0 ? x : -1;
}

}  // namespace

MemoryLimit address_space_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return {};
  const double page = static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  const double mapped = std::max(0.0, number_in_file("/proc/self/statm")) * page;
  const double cap = static_cast<double>(limit.rlim_cur);
  return MemoryLimit(std::max(1.0, cap - mapped),
                     "of address space this process may still map under its limit (ulimit -v, "
                     "RLIMIT_AS: " + gb(cap) + ", " + gb(mapped) + " mapped)");
}

MemoryLimit cgroup_memory_limit(const std::string& proc_self_cgroup, const std::string& root) {
  MemoryLimit best;
  std::istringstream lines(proc_self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH": v2 has ID 0 and no controllers; v1's memory line lists "memory".
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      for (const std::string& top : {root, root + "/unified"})
        best = smaller(best, cgroup_file_limit(top, path, "memory.max"));
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      best = smaller(best, cgroup_file_limit(root + "/memory", path, "memory.limit_in_bytes"));
    }
  }
  return best;
}

MemoryLimit slurm_memory_limit() {
  constexpr double kMiB = 1024.0 * 1024.0;
  if (const double node = env_number("SLURM_MEM_PER_NODE"); node > 0)
    return MemoryLimit(node * kMiB, "of the job's memory on this node (SLURM_MEM_PER_NODE = " +
                                        mb(node) + ")");
  const double cpu = env_number("SLURM_MEM_PER_CPU"), cpus = env_number("SLURM_CPUS_ON_NODE");
  if (cpu > 0 && cpus > 0)
    return MemoryLimit(cpu * cpus * kMiB, "of the job's memory on this node (SLURM_MEM_PER_CPU = " +
                                              mb(cpu) + " x SLURM_CPUS_ON_NODE = " +
                                              count(cpus) + ")");
  return {};
}

MemoryLimit usable_memory_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  MemoryLimit best;
  if (pages > 0 && page > 0) best = MemoryLimit(static_cast<double>(pages) * page);
  std::ifstream cgroup("/proc/self/cgroup");
  std::ostringstream text;
  text << cgroup.rdbuf();
  best = smaller(best, cgroup_memory_limit(text.str()));
  best = smaller(best, slurm_memory_limit());
  return smaller(best, address_space_limit());
}

std::string rank_memory_problem(const Config& config, const ModelShard& shard, int rank,
                                int dp_size, const MemoryLimit& memory, int stage) {
  const RankMemory r = estimate_rank_memory(config, shard, dp_size, stage);
  if (memory.bytes <= 0 || r.total() <= memory.bytes) return "";
  const ModelConfig& m = config.model;
  const std::string model =
      "this rank's share of the model (model.layers = " + std::to_string(m.layers) +
      ", model.width = " + std::to_string(m.width) + ", model.vocab_size = " +
      std::to_string(m.vocab_size) + " over parallel.tensor = " +
      std::to_string(config.parallel.tensor) + " x parallel.pipeline = " +
      std::to_string(config.parallel.pipeline) + ": " + count(r.parameters) +
      " parameters) needs " + gb(r.state_bytes) + " for weights, gradients and AdamW state" +
      (r.staging_bytes > 0 ? " and " + gb(r.staging_bytes) +
                                 " for checkpoint.async's staging copy of the weights and moments"
                           : "");
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
         "; at least " + gb(r.total()) + " in all, more than the " + gb(memory.bytes) + " " +
         memory.what;
}

std::string async_checkpoint_problem(const Config& config, int thread_level) {
  if (!config.checkpoint.saves_async() || thread_level >= MPI_THREAD_MULTIPLE) return "";
  return "checkpoint.async = true in " + config.source +
         " needs MPI_THREAD_MULTIPLE (the writer thread's collectives run beside training's), "
         "but this MPI library provides thread level " + std::to_string(thread_level) +
         " of " + std::to_string(MPI_THREAD_MULTIPLE) +
         "; set checkpoint.async = false or use an MPI built with thread support";
}

void agree_start_up_checks(const Config& config, const ModelShard& shard,
                           const ParallelDims& groups) {
  const int rank = groups.world().index;
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&thread_level);
  std::string problem = async_checkpoint_problem(config, thread_level);
  if (problem.empty() && rank == 0) problem = checkpoint_dir_problem(config.checkpoint.dir);
  if (problem.empty())
    problem = rank_memory_problem(config, shard, rank, groups.grad_reduce().size,
                                  config.train.device == "cpu" ? usable_memory_limit() : 0.0,
                                  groups.pipeline().index);
  ckpt::agree_or_throw(groups.mpi_world, problem);
}

}  // namespace trident

#pragma once
// Helpers for parity tests on several ranks: a shared scratch corpus, a reference run on one
// rank, and the comparison of sharded gradients with the single-rank (global) ones.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "app_fixture.hpp"
#include "comm/comm.hpp"
#include "config/config.hpp"
#include "grid/process_grid.hpp"
#include "train/checkpointing.hpp"
#include "train/trainer.hpp"

namespace trident::test {

// Runs `body(trainer, grid)` on independent groups of tp*pp*dp ranks of MPI_COMM_WORLD, each a
// whole job with the layout of `config`.
template <typename Body>
void on_layout(const Config& config, Body body) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const int size = static_cast<int>(config.parallel.world_size());
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank / size, world_rank, &sub);
  {
    ProcessGrid grid(sub, config);
    Trainer trainer(config, grid.dims());
    body(trainer, grid);
  }
  MPI_Comm_free(&sub);
}

// This process's rank in MPI_COMM_WORLD.
inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline double max_over_world(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

// What a parity test trains on. Shards: make_tiny_run's train_*.bin. Indexed: a Megatron
// indexed dataset (int32 tokens) of documents of uneven lengths, some empty, so that windows
// cross document boundaries. Blend: 0.6 of the shards and 0.4 of the indexed dataset, shuffled
// (data.shuffle = true): the blended order and both per-dataset permutations.
enum class ParityData { Shards, Indexed, Blend };

inline const char* data_name(ParityData d) {
  return d == ParityData::Shards ? "shards" : d == ParityData::Indexed ? "indexed" : "blend";
}

// dir/web_document.{idx,bin}: 26000 tokens in documents of 0 to 700 tokens.
inline void write_parity_indexed_dataset(const std::filesystem::path& dir) {
  const std::vector<uint16_t> tokens = synthetic_tokens(26000, 4);
  std::vector<std::vector<int32_t>> documents;
  size_t at = 0;
  for (uint64_t x = 12345; at < tokens.size();) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const size_t length = std::min<size_t>((x >> 33) % 701, tokens.size() - at);
    documents.emplace_back(tokens.begin() + static_cast<std::ptrdiff_t>(at),
                           tokens.begin() + static_cast<std::ptrdiff_t>(at + length));
    at += length;
  }
  write_indexed_dataset((dir / "web_document").string(), documents, kIndexDTypeInt32);
}

// A directory every rank sees, with the tiny corpus written once by world rank 0.
inline std::filesystem::path shared_corpus(const std::string& name) {
  int rank = 0, pid = ::getpid();
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("trident_mpi_" + name + "_" + std::to_string(pid));
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    make_tiny_run(dir);
    write_parity_indexed_dataset(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// The single-rank run of `config` (self communicators), computed on the calling rank.
struct Reference {
  std::vector<double> losses;                       // per step
  std::vector<double> grad_norms;                   // per step, before clipping
  std::map<std::string, std::vector<float>> grads;  // after step 1, global layout
  // A mixture of experts: per step, the load-balancing loss and the expert load shares.
  std::vector<double> aux_losses, load_min, load_max;
};

inline Reference reference_run(Config config, int64_t steps, int64_t grads_step = 0) {
  config.parallel.tensor = config.parallel.pipeline = config.parallel.data = 1;
  config.parallel.context = 1;
  if (config.parallel.schedule == "interleaved") {  // needs two stages: one rank runs 1F1B
    config.parallel.schedule = "1f1b";
    config.parallel.virtual_stages = 1;
  }
  SelfGroups self;
  Trainer t(config, self.groups());
  Reference ref;
  for (int64_t s = 0; s < steps; ++s) {
    const double loss = t.forward_backward(s);
    if (s == grads_step) {
      const std::vector<float> grads = t.host_grads();
      for (const ParamInfo& p : t.model().params())
        ref.grads[p.name].assign(grads.begin() + p.offset, grads.begin() + p.offset + p.numel());
    }
    const StepMetrics m = t.apply_update(s, loss);
    ref.grad_norms.push_back(m.grad_norm);
    ref.losses.push_back(loss);
    ref.aux_losses.push_back(m.moe_aux_loss);
    ref.load_min.push_back(m.moe_load_min);
    ref.load_max.push_back(m.moe_load_max);
  }
  return ref;
}

// Relative error ||g - g_ref|| / ||g_ref|| of every parameter, this rank's shard mapped to
// global indices and the sums completed over the tensor group (and, under ZeRO, where each
// data-parallel rank holds the averaged gradients of its slices only, over the data group).
// Returns the worst; `compared` (if given) gets the count of this rank's elements compared.
inline double worst_grad_error(Trainer& t, const Reference& ref, ProcessGrid& grid,
                               std::string* worst_name = nullptr, int64_t* compared = nullptr) {
  const StageModel& model = t.model();
  const std::vector<float> grads = t.host_grads();
  const FlatStore& stored = model.grad_store();  // ZeRO-2/3: packed slices
  const GradientSync& sync = t.gradient_sync();
  auto owned = [&](int64_t flat) {
    for (const FlatRange& r : sync.owned())
      if (flat >= r.begin && flat < r.end) return true;
    return false;
  };
  double worst = 0.0;
  for (const ParamInfo& p : model.params()) {
    const std::vector<float>& global = ref.grads.at(p.name);
    double sums[2] = {0.0, 0.0};  // diff^2, ref^2 over this rank's elements
    for (int64_t i = 0; i < p.numel(); ++i) {
      const auto gi = p.global_index(i);
      if (!gi || !owned(p.offset + i)) continue;
      if (compared) ++*compared;
      const double d =
          static_cast<double>(grads[static_cast<size_t>(stored.index_of(p.offset + i))]) -
          global[*gi];
      sums[0] += d * d;
      sums[1] += static_cast<double>(global[*gi]) * global[*gi];
    }
    if (p.split_dim >= 0) grid.tensor().all_reduce_sum(sums, 2);
    sync.sum_over_holders(p, sums, 2, t.host_replicas());  // ZeRO-1 slices, other experts
    const double rel = sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : std::sqrt(sums[0]);
    if (rel > worst) {
      worst = rel;
      if (worst_name) *worst_name = p.name;
    }
  }
  return worst;
}

// Trains steps [from, to) and returns their losses.
inline std::vector<double> train_steps(Trainer& t, int64_t from, int64_t to) {
  std::vector<double> losses;
  for (int64_t s = from; s < to; ++s) losses.push_back(t.apply_update(s, t.forward_backward(s)).loss);
  return losses;
}

// The source run of a resume test: `source` trained for `steps` in one job of all the ranks,
// saving a checkpoint after step `save_at` (then `at_save(trainer, grid, path)`, if given); its
// losses of every step and the checkpoint's path.
struct SavedRun {
  std::vector<double> losses;
  std::string path;
};
inline SavedRun train_saving_at(
    const Config& source, int64_t save_at, int64_t steps,
    const std::function<void(Trainer&, ProcessGrid&, const std::string&)>& at_save = {}) {
  SavedRun run;
  on_layout(source, [&](Trainer& t, ProcessGrid& grid) {
    run.losses = train_steps(t, 0, save_at);
    run.path = t.save_checkpoint(save_at);
    if (at_save) at_save(t, grid, run.path);
    const auto rest = train_steps(t, save_at, steps);
    run.losses.insert(run.losses.end(), rest.begin(), rest.end());
  });
  return run;
}

// `target` loads the checkpoint `run` saved after step save_at and trains to `steps`: the
// worst relative error of its losses against the uninterrupted run's (the same on every rank of
// the job; every resumed step compared, or the test fails). `what` names the target in the
// messages.
inline double resumed_loss_error(const Config& target, const SavedRun& run, int64_t save_at,
                                 int64_t steps, const std::string& what) {
  double worst = 0.0;
  int64_t compared = 0;
  on_layout(target, [&](Trainer& t, ProcessGrid&) {
    t.load_checkpoint(run.path);
    const auto losses = train_steps(t, save_at, steps);
    for (int64_t i = 0; i < steps - save_at; ++i, ++compared)
      worst = std::max(worst, std::abs(losses[i] - run.losses[save_at + i]) /
                                  run.losses[save_at + i]);
  });
  EXPECT_EQ(compared, steps - save_at) << what;
  EXPECT_LE(worst, 1e-5) << "resumed on " << what;
  return max_over_world(worst);
}

// The checkpoint tests' config: tiny_config with 4 layers, 20 steps of 4 micro-batches, the
// layout (tp, pp, dp, ZeRO stage), checkpoints in dir/ckpt, and `extra` overrides.
inline Config checkpoint_config(const std::filesystem::path& dir, int tp, int pp, int dp, int zero,
                                const std::string& ckpt, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "train.steps=20", "eval.interval=0", "model.layers=4", "train.global_batch=8",
      "train.micro_batch=2", "parallel.tensor=" + std::to_string(tp),
      "parallel.pipeline=" + std::to_string(pp), "parallel.data=" + std::to_string(dp),
      "optim.zero_stage=" + std::to_string(zero), "checkpoint.dir=" + (dir / ckpt).string(),
      "log.dir=" + (dir / ("run_" + ckpt)).string()};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return parse_config(tiny_config(dir), "ckpt.toml", overrides);
}

// The global parameter count of `config`'s model: what a comparison that covers the model
// must have compared.
inline int64_t global_param_count(const Config& config) {
  int64_t n = 0;
  for (const ParamInfo& p : global_parameters(config.model)) n += p.global_numel();
  return n;
}

// Calls `visit(p, i, state_index)` for every element i of parameter p in the ranges the
// optimizer owns (the whole buffer without ZeRO), state_index being its place in the moments
// (the owned ranges concatenated in order).
template <typename Visit>
void for_each_owned_element(Trainer& t, Visit visit) {
  int64_t state_base = 0;
  for (const FlatRange& r : t.optimizer().owned()) {
    for (const ParamInfo& p : t.model().params()) {
      const int64_t lo = std::max(p.offset, r.begin), hi = std::min(p.offset + p.numel(), r.end);
      for (int64_t f = lo; f < hi; ++f) visit(p, f - p.offset, state_base + (f - r.begin));
    }
    state_base += r.size();
  }
}

// Whether this rank is the one that accounts for element i of p in a job-wide count: the rank
// that counts p in the gradient norm (tensor rank 0 of a replicated tensor, the first stage for
// the tied embedding), on data-parallel rank 0 (an expert under expert parallelism: on its
// expert-data rank 0) unless each holder has its own slice (`moments` under ZeRO, the weights
// under ZeRO-3). Padding has no global element.
inline bool counts_element(const ParamInfo& p, int64_t i, bool moments, Trainer& t) {
  const GradientSync& sync = t.gradient_sync();
  const bool sliced = moments ? sync.zero_for(p) : sync.weights_sharded_for(p);
  return p.counted_in_norm && (sliced || sync.replica_of(p) == 0) && p.global_index(i);
}

// A rank's final training state, copied to the host.
struct TrainingState {
  std::vector<double> losses;
  std::vector<float> weights, exp_avg, exp_avg_sq;
  int64_t updates = 0;
};

inline TrainingState training_state(Trainer& t, std::vector<double> losses) {
  TrainingState s;
  s.losses = std::move(losses);
  s.weights = t.host_weights();
  const int64_t n = t.optimizer().exp_avg().size();
  s.exp_avg.resize(static_cast<size_t>(n));
  s.exp_avg_sq.resize(static_cast<size_t>(n));
  t.device().to_host(s.exp_avg.data(), t.optimizer().exp_avg().data(), n * 4);
  t.device().to_host(s.exp_avg_sq.data(), t.optimizer().exp_avg_sq().data(), n * 4);
  s.updates = t.optimizer().updates();
  return s;
}

// Elements of two runs' states compared bit for bit over the job: all of them (copies
// included), those that differ, and the distinct global elements of the weights and of each
// moment compared (the model's parameter count when everything was compared).
struct StateComparison {
  int64_t compared = 0, differing = 0;
  int64_t weights_covered = 0, exp_avg_covered = 0, exp_avg_sq_covered = 0;
};

// Collective over the layout: `a` and `b` taken on this rank of the same layout (`t` is the
// trainer `b` came from).
inline StateComparison compare_states(const TrainingState& a, const TrainingState& b, Trainer& t,
                                      ProcessGrid& grid) {
  double sums[5] = {0, 0, 0, 0, 0};  // compared, differing, covered: weights, m, v
  auto same = [](float x, float y) {
    return std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y);
  };
  if (a.weights.size() != b.weights.size() || a.exp_avg.size() != b.exp_avg.size()) {
    ADD_FAILURE() << "rank " << grid.rank() << ": the two runs hold states of other sizes";
    sums[1] = 1;
  } else {
    for (const ParamInfo& p : t.model().params())
      t.model().weight_store().for_each_stored(
          p.offset, p.offset + p.numel(), [&](int64_t flat, int64_t at, int64_t n) {
            for (int64_t j = 0; j < n; ++j) {
              const auto k = static_cast<size_t>(at + j);
              sums[0] += 1;
              sums[1] += same(a.weights[k], b.weights[k]) ? 0 : 1;
              if (counts_element(p, flat - p.offset + j, false, t)) sums[2] += 1;
            }
          });
    for_each_owned_element(t, [&](const ParamInfo& p, int64_t i, int64_t s) {
      const auto k = static_cast<size_t>(s);
      sums[0] += 2;
      sums[1] += (same(a.exp_avg[k], b.exp_avg[k]) ? 0 : 1) +
                 (same(a.exp_avg_sq[k], b.exp_avg_sq[k]) ? 0 : 1);
      if (counts_element(p, i, true, t)) sums[3] += 1, sums[4] += 1;
    });
  }
  grid.world().all_reduce_sum(sums, 5);
  StateComparison c;
  c.compared = static_cast<int64_t>(sums[0]);
  c.differing = static_cast<int64_t>(sums[1]);
  c.weights_covered = static_cast<int64_t>(sums[2]);
  c.exp_avg_covered = static_cast<int64_t>(sums[3]);
  c.exp_avg_sq_covered = static_cast<int64_t>(sums[4]);
  return c;
}

// `steps` straight, against `save_at` steps, a checkpoint, and the rest in a fresh trainer that
// loads it: every loss, every weight and both AdamW moments of every element bit for bit, and
// the update count; each global element of the three must have been compared. Returns the
// comparison (the same on every rank of the layout).
inline StateComparison expect_bitwise_resume(const Config& config, int64_t steps,
                                             int64_t save_at) {
  TrainingState straight;
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    straight = training_state(t, train_steps(t, 0, steps));
  });
  std::vector<double> first_part;
  std::string path;
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    first_part = train_steps(t, 0, save_at);
    path = t.save_checkpoint(save_at);
  });
  StateComparison c;
  TrainingState resumed;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    t.load_checkpoint(path);
    EXPECT_EQ(t.start_step(), save_at);
    std::vector<double> losses = first_part;
    const auto rest = train_steps(t, save_at, steps);
    losses.insert(losses.end(), rest.begin(), rest.end());
    resumed = training_state(t, losses);
    c = compare_states(straight, resumed, t, grid);
  });
  EXPECT_EQ(straight.losses.size(), static_cast<size_t>(steps));
  EXPECT_EQ(straight.losses, resumed.losses);  // every loss bit for bit
  EXPECT_EQ(straight.updates, resumed.updates);
  EXPECT_EQ(c.differing, 0) << "of " << c.compared << " elements compared";
  const int64_t params = global_param_count(config);
  EXPECT_GT(c.compared, 0);
  EXPECT_EQ(c.weights_covered, params) << "global weights compared";
  EXPECT_EQ(c.exp_avg_covered, params) << "global exp_avg elements compared";
  EXPECT_EQ(c.exp_avg_sq_covered, params) << "global exp_avg_sq elements compared";
  return c;
}

// Collective over the layout: this rank's AdamW moments against the global tensors of the
// checkpoint at `path` (each rank reads them whole on its own: a test of a tiny model), bit
// for bit through the shard map (ParamInfo::global_index), independently of the trainer's
// run lists. Returns the job's (compared, differing, distinct global elements compared) for
// both moments together; a complete comparison covers twice the parameter count.
struct MomentCheck {
  int64_t compared = 0, differing = 0, covered = 0;
};

inline MomentCheck check_moments_against_file(Trainer& t, ProcessGrid& grid,
                                              const std::string& path) {
  const int64_t n = t.optimizer().exp_avg().size();
  std::vector<float> moments[2] = {std::vector<float>(static_cast<size_t>(n)),
                                   std::vector<float>(static_cast<size_t>(n))};
  t.device().to_host(moments[0].data(), t.optimizer().exp_avg().data(), n * 4);
  t.device().to_host(moments[1].data(), t.optimizer().exp_avg_sq().data(), n * 4);
  const char* roots[2] = {"/optim/exp_avg", "/optim/exp_avg_sq"};
  std::map<std::string, std::vector<float>> stored[2];
  {
    CheckpointReader reader(path, MPI_COMM_SELF);
    for (const ParamInfo& g : global_parameters(t.model().config()))
      for (const ParamInfo& p : t.model().params())
        if (p.name == g.name)
          for (int m = 0; m < 2; ++m) {
            std::vector<float>& v = stored[m][p.name];
            v.resize(static_cast<size_t>(g.global_numel()));
            reader.read_tensor(dataset_path(roots[m], p.name), g.global_shape,
                               {Run{0, 0, g.global_numel()}}, v);
          }
    reader.finish();  // checksums of everything read
  }
  double sums[3] = {0, 0, 0};
  for_each_owned_element(t, [&](const ParamInfo& p, int64_t i, int64_t s) {
    const auto gi = p.global_index(i);
    if (!gi) return;  // padding: nothing stored
    for (int m = 0; m < 2; ++m) {
      const float mine = moments[m][static_cast<size_t>(s)];
      const float file = stored[m].at(p.name)[static_cast<size_t>(*gi)];
      sums[0] += 1;
      sums[1] += std::bit_cast<uint32_t>(mine) == std::bit_cast<uint32_t>(file) ? 0 : 1;
      if (counts_element(p, i, true, t)) sums[2] += 1;
    }
  });
  grid.world().all_reduce_sum(sums, 3);
  return {static_cast<int64_t>(sums[0]), static_cast<int64_t>(sums[1]),
          static_cast<int64_t>(sums[2])};
}

// Step-1 gradients of a layout against the single-rank run's, parameter by parameter: this
// rank's shard mapped to global indices (under ZeRO-1 the slices each rank owns), the sums
// completed over the job in one all-reduce. Every copy of an element is compared; `covered`
// counts the distinct global elements compared at least once, which must be the model's
// parameter count (`params`) for the comparison to be complete.
struct GradParity {
  double worst = 0;        // worst per-parameter ||g - g_ref|| / ||g_ref||
  std::string worst_name;  // its parameter
  int64_t compared = 0;    // element comparisons over the job, copies included
  int64_t covered = 0;     // distinct global elements among them
  int64_t params = 0;      // the model's parameter count
  int64_t tensors = 0;     // the model's parameter tensors
};

inline GradParity grad_parity(Trainer& t, const Reference& ref, const Config& config,
                              ProcessGrid& grid) {
  const std::vector<ParamInfo> global = global_parameters(config.model);
  std::map<std::string, size_t> index;  // name -> position in `global`
  std::vector<int64_t> base;            // start of each parameter's global elements
  int64_t total = 0;
  for (size_t k = 0; k < global.size(); ++k) {
    index[global[k].name] = k;
    base.push_back(total);
    total += global[k].global_numel();
  }
  // [0, total): times each global element was compared; then diff^2, ref^2 per parameter;
  // then the count of comparisons.
  std::vector<double> acc(static_cast<size_t>(total) + 2 * global.size() + 1, 0.0);
  double* sums = acc.data() + total;
  const std::vector<float> grads = t.host_grads();
  const std::vector<FlatRange>& owned = t.gradient_sync().owned();
  for (const ParamInfo& p : t.model().params()) {
    const size_t k = index.at(p.name);
    const std::vector<float>& want = ref.grads.at(p.name);
    for (const FlatRange& r : owned) {
      const int64_t lo = std::max(p.offset, r.begin), hi = std::min(p.offset + p.numel(), r.end);
      for (int64_t f = lo; f < hi; ++f) {
        const auto gi = p.global_index(f - p.offset);
        if (!gi) continue;
        const double d = static_cast<double>(grads[static_cast<size_t>(f)]) - want[*gi];
        acc[static_cast<size_t>(base[k] + *gi)] += 1;
        sums[2 * k] += d * d;
        sums[2 * k + 1] += static_cast<double>(want[*gi]) * want[*gi];
        acc.back() += 1;
      }
    }
  }
  grid.world().all_reduce_sum(acc.data(), static_cast<int64_t>(acc.size()));
  GradParity out;
  out.params = total;
  out.tensors = static_cast<int64_t>(global.size());
  out.compared = static_cast<int64_t>(acc.back());
  out.covered = std::count_if(acc.begin(), acc.begin() + total, [](double c) { return c > 0; });
  for (size_t k = 0; k < global.size(); ++k) {
    const double rel = sums[2 * k + 1] > 0 ? std::sqrt(sums[2 * k] / sums[2 * k + 1])
                                           : std::sqrt(sums[2 * k]);
    if (out.worst_name.empty() || rel > out.worst) {
      out.worst = rel;
      out.worst_name = global[k].name;
    }
  }
  return out;
}

// The Llama overrides of the parity tests (and `extra` after them): 8 query heads of size 4 in
// 4 kv groups (2 per kv head), the MLP 64 wide, the head untied.
inline std::vector<std::string> llama(std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.arch=llama",  "model.heads=8",
                                "model.kv_heads=4",  "model.ffn_width=64",
                                "model.tie_embeddings=false", "model.rope_theta=500.0"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// The layouts of the parity tests: tiny_config with 4 layers, vocab 250, 20 steps.
constexpr int64_t kParitySteps = 20;

struct ParityLayout {
  int tp = 1, pp = 1, dp = 1, cp = 1;
  std::string name() const {
    return "TP=" + std::to_string(tp) + (cp > 1 ? " CP=" + std::to_string(cp) : "") +
           " PP=" + std::to_string(pp) + " DP=" + std::to_string(dp);
  }
};

inline Config parity_config(const std::filesystem::path& dir, const ParityLayout& l,
                     std::vector<std::string> extra = {},
                     ParityData data = ParityData::Shards) {
  std::vector<std::string> overrides = {
      "train.steps=20", "eval.interval=0", "model.vocab_size=250", "model.layers=4",
      "parallel.tensor=" + std::to_string(l.tp), "parallel.pipeline=" + std::to_string(l.pp),
      "parallel.data=" + std::to_string(l.dp), "parallel.context=" + std::to_string(l.cp),
      "log.dir=" + (dir / "run").string()};
  const std::string indexed = (dir / "web_document").string();
  if (data == ParityData::Indexed) overrides.push_back("data.train=" + indexed);
  if (data == ParityData::Blend) {
    overrides.push_back("data.train=[\"0.6:" + (dir / "train_*.bin").string() + "\", \"0.4:" +
                        indexed + "\"]");
    overrides.push_back("data.shuffle=true");
  }
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return parse_config(tiny_config(dir), "parity.toml", overrides);
}

inline void check_parity(const ParityLayout& l, std::vector<std::string> extra = {},
                         ParityData data = ParityData::Shards) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const auto dir = shared_corpus("parity");
  const Config config = parity_config(dir, l, extra, data);
  const Reference ref = reference_run(config, kParitySteps);
  double worst_grad = 0.0, worst_loss = 0.0, worst_moe = 0.0;
  int64_t moe_steps = 0;             // steps whose MoE figures were compared
  std::string worst_name, per_step;  // per-step loss and gradient-norm errors, shown on failure
  int64_t expert_tensors = 0;        // this rank's expert-parallel tensors (ParamInfo::expert)
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    for (const ParamInfo& p : t.model().params()) expert_tensors += p.expert ? 1 : 0;
    for (int64_t s = 0; s < kParitySteps; ++s) {
      const double loss = t.forward_backward(s);
      if (s == 0) worst_grad = worst_grad_error(t, ref, grid, &worst_name);
      const StepMetrics m = t.apply_update(s, loss);
      const double norm = m.grad_norm;
      if (m.moe) {  // the aux loss and the loads, whatever the layout (docs/moe.md)
        ++moe_steps;
        worst_moe = std::max({worst_moe,
                              std::abs(m.moe_aux_loss - ref.aux_losses[s]) / ref.aux_losses[s],
                              std::abs(m.moe_load_min - ref.load_min[s]),
                              std::abs(m.moe_load_max - ref.load_max[s])});
      }
      const double err = std::abs(loss - ref.losses[s]) / std::abs(ref.losses[s]);
      worst_loss = std::max(worst_loss, err);
      char line[128];
      std::snprintf(line, sizeof line, "\n  step %2lld loss %.3e grad norm %.3e (ref %.6f)",
                    static_cast<long long>(s + 1), err,
                    std::abs(norm - ref.grad_norms[s]) / ref.grad_norms[s], ref.grad_norms[s]);
      per_step += line;
    }
  });
  EXPECT_LE(worst_grad, 1e-5) << l.name() << ": " << worst_name;
  EXPECT_LE(worst_loss, 1e-5) << l.name() << per_step;
  EXPECT_LE(worst_moe, 1e-5) << l.name() << ": MoE aux loss / expert loads";
  if (config.model.moe_experts > 0) EXPECT_EQ(moe_steps, kParitySteps) << l.name();
  // Expert parallelism really split the experts (else the run is the EP = 1 one).
  if (config.parallel.expert > 1) EXPECT_GT(expert_tensors, 0) << l.name();
  worst_grad = max_over_world(worst_grad);
  worst_loss = max_over_world(worst_loss);
  worst_moe = max_over_world(worst_moe);
  if (world_rank == 0 && config.model.moe_experts > 0)
    std::printf("[ measured ] %s MoE: aux loss and expert load shares of %lld steps worst "
                "error %.3e (final aux loss %.6f)\n",
                l.name().c_str(), static_cast<long long>(kParitySteps), worst_moe,
                ref.aux_losses.back());
  if (world_rank == 0)
    std::printf("[ measured ] %s on %s: gradients after step 1 worst relative error %.3e; "
                "losses of %lld steps worst relative error %.3e (final loss %.6f)\n",
                l.name().c_str(), data_name(data), worst_grad,
                static_cast<long long>(kParitySteps), worst_loss, ref.losses.back());
}

}  // namespace trident::test

#pragma once
// Helpers for parity tests on several ranks: a shared scratch corpus, a reference run on one
// rank, and the comparison of sharded gradients with the single-rank (global) ones.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "app_fixture.hpp"
#include "comm/comm.hpp"
#include "config/config.hpp"
#include "grid/process_grid.hpp"
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
    Trainer trainer(config, TrainerGroups::from_grid(grid));
    body(trainer, grid);
  }
  MPI_Comm_free(&sub);
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
};

inline Reference reference_run(Config config, int64_t steps, int64_t grads_step = 0) {
  config.parallel.tensor = config.parallel.pipeline = config.parallel.data = 1;
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
    ref.grad_norms.push_back(t.apply_update(s, loss).grad_norm);
    ref.losses.push_back(loss);
  }
  return ref;
}

// Relative error ||g - g_ref|| / ||g_ref|| of every parameter, this rank's shard mapped to
// global indices and the sums completed over the tensor group (and, under ZeRO-1, where each
// data-parallel rank holds the averaged gradients of its slices only, over the data group).
// Returns the worst; `compared` (if given) gets the count of this rank's elements compared.
inline double worst_grad_error(Trainer& t, const Reference& ref, ProcessGrid& grid,
                               std::string* worst_name = nullptr, int64_t* compared = nullptr) {
  const StageModel& model = t.model();
  const std::vector<float> grads = t.host_grads();
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
      const double d = static_cast<double>(grads[p.offset + i]) - global[*gi];
      sums[0] += d * d;
      sums[1] += static_cast<double>(global[*gi]) * global[*gi];
    }
    if (p.split_dim >= 0) grid.tensor().all_reduce_sum(sums, 2);
    if (sync.zero()) grid.data().all_reduce_sum(sums, 2);
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

// `steps` straight, against `save_at` steps, a checkpoint, and the rest in a fresh trainer that
// loads it: every loss bit for bit.
inline void expect_bitwise_resume(const Config& config, int64_t steps, int64_t save_at) {
  std::vector<double> straight, resumed;
  on_layout(config, [&](Trainer& t, ProcessGrid&) { straight = train_steps(t, 0, steps); });
  std::string path;
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    resumed = train_steps(t, 0, save_at);
    path = t.save_checkpoint(save_at);
  });
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    t.load_checkpoint(path);
    ASSERT_EQ(t.start_step(), save_at);
    const auto rest = train_steps(t, save_at, steps);
    resumed.insert(resumed.end(), rest.begin(), rest.end());
  });
  ASSERT_EQ(straight.size(), static_cast<size_t>(steps));
  EXPECT_EQ(straight, resumed);  // every loss bit for bit
}

// The layouts of the parity tests: tiny_config with 4 layers, vocab 250, 20 steps.
constexpr int64_t kParitySteps = 20;

struct ParityLayout {
  int tp = 1, pp = 1, dp = 1;
  std::string name() const {
    return "TP=" + std::to_string(tp) + " PP=" + std::to_string(pp) + " DP=" + std::to_string(dp);
  }
};

inline Config parity_config(const std::filesystem::path& dir, const ParityLayout& l,
                     std::vector<std::string> extra = {},
                     ParityData data = ParityData::Shards) {
  std::vector<std::string> overrides = {
      "train.steps=20", "eval.interval=0", "model.vocab_size=250", "model.layers=4",
      "parallel.tensor=" + std::to_string(l.tp), "parallel.pipeline=" + std::to_string(l.pp),
      "parallel.data=" + std::to_string(l.dp), "log.dir=" + (dir / "run").string()};
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
  double worst_grad = 0.0, worst_loss = 0.0;
  std::string worst_name, per_step;  // per-step loss and gradient-norm errors, shown on failure
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    for (int64_t s = 0; s < kParitySteps; ++s) {
      const double loss = t.forward_backward(s);
      if (s == 0) worst_grad = worst_grad_error(t, ref, grid, &worst_name);
      const double norm = t.apply_update(s, loss).grad_norm;
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
  worst_grad = max_over_world(worst_grad);
  worst_loss = max_over_world(worst_loss);
  if (world_rank == 0)
    std::printf("[ measured ] %s on %s: gradients after step 1 worst relative error %.3e; "
                "losses of %lld steps worst relative error %.3e (final loss %.6f)\n",
                l.name().c_str(), data_name(data), worst_grad,
                static_cast<long long>(kParitySteps), worst_loss, ref.losses.back());
}

}  // namespace trident::test

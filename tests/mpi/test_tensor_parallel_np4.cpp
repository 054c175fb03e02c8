// Tensor parallelism on 4 ranks: TP = 4, and TP = 2 (two independent 2-rank groups), against
// the single-rank run on the same data and seed. Losses of 20 steps and every gradient after
// step 1 within 1e-5 relative; the tensor group's collective pattern is exactly Megatron's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include "grid/process_grid.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 20;

Config parity_config(const std::filesystem::path& dir, int tp) {
  Config c = parse_config(tiny_config(dir), "parity.toml",
                          {"train.steps=20", "eval.interval=0", "model.vocab_size=250",
                           "parallel.tensor=" + std::to_string(tp), "log.dir=" +
                           (dir / ("run_tp" + std::to_string(tp))).string()});
  return c;
}

void check_tensor_parallel(int tp) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const auto dir = shared_corpus("tp" + std::to_string(tp));
  const Config config = parity_config(dir, tp);
  const Reference ref = reference_run(config, kSteps);

  MPI_Comm sub;  // independent groups of `tp` ranks, each a whole job of its own
  MPI_Comm_split(MPI_COMM_WORLD, world_rank / tp, world_rank, &sub);
  {
    ProcessGrid grid(sub, config);
    Trainer t(config, {grid.world(), grid.tensor(), grid.data(), grid.model(), grid.coord().tp,
                       tp, 0, 1});
    grid.tensor().stats().reset();
    double worst_loss = 0.0;
    for (int64_t s = 0; s < kSteps; ++s) {
      const double loss = t.forward_backward(s);
      if (s == 0) {
        // Megatron's pattern per micro-batch in the tensor group: 2 all-reduces of [N,C] per
        // layer forward and 2 backward, plus the embedding lookup's and the LM head input
        // gradient's [N,C], and the cross-entropy's max [N] and [sum-exp | target] [2N].
        const CommStats& st = grid.tensor().stats();
        const int64_t L = config.model.layers, M = config.num_microbatches();
        const int64_t N = config.train.micro_batch * config.model.seq_len;
        const int64_t NC = N * config.model.width;
        EXPECT_EQ(st.calls("all_reduce"), M * (4 * L + 4));
        const auto& counts = st.all_reduce_counts;
        EXPECT_EQ(std::count(counts.begin(), counts.end(), NC), M * (4 * L + 2));
        EXPECT_EQ(std::count(counts.begin(), counts.end(), N), M);
        EXPECT_EQ(std::count(counts.begin(), counts.end(), 2 * N), M);
        EXPECT_EQ(st.calls("all_gather") + st.calls("reduce_scatter") + st.calls("broadcast"), 0);
        std::string name;
        const double worst = worst_grad_error(t.model(), ref, grid.tensor(), &name);
        EXPECT_LE(worst, 1e-5) << name;
        if (world_rank == 0)
          std::printf("[ measured ] TP=%d gradients after step 1: worst relative error %.3e (%s)\n",
                      tp, worst, name.c_str());
      }
      t.apply_update(s, loss);
      const double rel = std::abs(loss - ref.losses[s]) / std::abs(ref.losses[s]);
      EXPECT_LE(rel, 1e-5) << "step " << s + 1 << ": " << loss << " vs " << ref.losses[s];
      worst_loss = std::max(worst_loss, rel);
    }
    if (world_rank == 0)
      std::printf("[ measured ] TP=%d losses over %lld steps: worst relative error %.3e "
                  "(final loss %.6f)\n",
                  tp, static_cast<long long>(kSteps), worst_loss, ref.losses.back());
  }
  MPI_Comm_free(&sub);
}

}  // namespace

TEST(TensorParallel, Tp2MatchesSingleRank) { check_tensor_parallel(2); }
TEST(TensorParallel, Tp4MatchesSingleRank) { check_tensor_parallel(4); }

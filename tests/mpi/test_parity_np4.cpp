// Every parallel layout of up to 4 ranks against the single-rank run on the same data and seed:
// per-step losses of 20 steps and every gradient after step 1 within 1e-5 relative. Smaller
// layouts run as independent groups of the 4 ranks. Also: the tensor group's collective
// pattern is exactly Megatron's, and 1F1B holds fewer activations than GPipe.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "grid/process_grid.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 20;

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  std::string name() const {
    return "TP=" + std::to_string(tp) + " PP=" + std::to_string(pp) + " DP=" + std::to_string(dp);
  }
};

Config layout_config(const std::filesystem::path& dir, const Layout& l,
                     std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "train.steps=20", "eval.interval=0", "model.vocab_size=250", "model.layers=4",
      "parallel.tensor=" + std::to_string(l.tp), "parallel.pipeline=" + std::to_string(l.pp),
      "parallel.data=" + std::to_string(l.dp), "log.dir=" + (dir / "run").string()};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return parse_config(tiny_config(dir), "parity.toml", overrides);
}

void check_parity(const Layout& l, std::vector<std::string> extra = {}) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const auto dir = shared_corpus("parity");
  const Config config = layout_config(dir, l, extra);
  const Reference ref = reference_run(config, kSteps);
  double worst_grad = 0.0, worst_loss = 0.0;
  std::string worst_name;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    for (int64_t s = 0; s < kSteps; ++s) {
      const double loss = t.forward_backward(s);
      if (s == 0) worst_grad = worst_grad_error(t, ref, grid, &worst_name);
      t.apply_update(s, loss);
      worst_loss = std::max(worst_loss, std::abs(loss - ref.losses[s]) / std::abs(ref.losses[s]));
    }
  });
  EXPECT_LE(worst_grad, 1e-5) << l.name() << ": " << worst_name;
  EXPECT_LE(worst_loss, 1e-5) << l.name();
  worst_grad = max_over_world(worst_grad);
  worst_loss = max_over_world(worst_loss);
  if (world_rank == 0)
    std::printf("[ measured ] %s: gradients after step 1 worst relative error %.3e; losses of "
                "%lld steps worst relative error %.3e (final loss %.6f)\n",
                l.name().c_str(), worst_grad, static_cast<long long>(kSteps), worst_loss,
                ref.losses.back());
}

}  // namespace

TEST(Parity, Tp2) { check_parity({2, 1, 1}); }
TEST(Parity, Tp4) { check_parity({4, 1, 1}); }
TEST(Parity, Pp2) { check_parity({1, 2, 1}); }
TEST(Parity, Pp4) { check_parity({1, 4, 1}); }
TEST(Parity, Tp2Pp2) { check_parity({2, 2, 1}); }

// Sequence parallelism: the same numbers as the single-rank run (LayerNorm gradients summed over
// the tensor group; the data-parallel reduction then runs after the backward).
const std::vector<std::string> kSp = {"parallel.sequence_parallel=true"};
TEST(Parity, Tp2SequenceParallel) { check_parity({2, 1, 1}, kSp); }
TEST(Parity, Tp4SequenceParallel) { check_parity({4, 1, 1}, kSp); }
TEST(Parity, Tp2Pp2SequenceParallel) { check_parity({2, 2, 1}, kSp); }
TEST(Parity, Tp2Dp2SequenceParallelZero) {
  check_parity({2, 1, 2}, {"parallel.sequence_parallel=true", "optim.zero_stage=1"});
}

TEST(TensorParallel, SequenceParallelTradesAllReducesForGathersAndScatters) {
  const auto dir = shared_corpus("collectives_sp");
  const Layout l{4, 1, 1};
  const Config config = layout_config(dir, l, kSp);
  const Config plain = layout_config(dir, l);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    grid.tensor().stats().reset();
    t.forward_backward(0);
    // Per micro-batch, in place of the [N,C] all-reduces: a reduce-scatter after each
    // row-parallel matmul and the embedding lookup (2 per layer and 1), one after each
    // column-parallel input gradient (2 per layer and the LM head's); an all-gather before each
    // column-parallel matmul (2 per layer, the LM head) and of the stream gradient before each
    // row-parallel backward (2 per layer, the embedding). The cross-entropy keeps its two
    // all-reduces; once per step the LayerNorm gradients are summed (4 per layer, final LN 2).
    const CommStats& st = grid.tensor().stats();
    const int64_t L = config.model.layers, M = config.num_microbatches();
    const int64_t N = config.train.micro_batch * config.model.seq_len;
    const int64_t rows_c = N / 4 * config.model.width;
    EXPECT_EQ(st.calls("all_gather"), M * (4 * L + 2));
    EXPECT_EQ(st.calls("reduce_scatter"), M * (4 * L + 2));
    EXPECT_EQ(st.ops.at("all_gather").bytes, M * (4 * L + 2) * rows_c * 4);
    EXPECT_EQ(st.ops.at("reduce_scatter").bytes, M * (4 * L + 2) * rows_c * 4);
    EXPECT_EQ(st.calls("all_reduce"), 2 * M + 4 * L + 2);
    const auto& counts = st.all_reduce_counts;
    EXPECT_EQ(std::count(counts.begin(), counts.end(), N), M);
    EXPECT_EQ(std::count(counts.begin(), counts.end(), 2 * N), M);
    // Activations per micro-batch shrink: the stream, residuals and LayerNorm statistics are
    // a quarter.
    const int64_t with_sp = t.model().activation_bytes(config.train.micro_batch);
    const ModelShard& s = t.model().shard();
    ModelShard no_sp = s;
    no_sp.sequence_parallel = false;
    auto self = make_self_communicator("tensor");
    const int64_t without =
        Gpt<float>(plain.model, no_sp, *self).activation_bytes(config.train.micro_batch);
    EXPECT_LT(with_sp, without);
    if (grid.rank() == 0)
      std::printf("[ measured ] TP=4 activations per micro-batch: %lld bytes with sequence "
                  "parallelism, %lld without\n",
                  static_cast<long long>(with_sp), static_cast<long long>(without));
  });
}

TEST(TensorParallel, CollectivesPerStepAreMegatrons) {
  const auto dir = shared_corpus("collectives");
  const Layout l{4, 1, 1};
  const Config config = layout_config(dir, l);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    grid.tensor().stats().reset();
    t.forward_backward(0);
    // Per micro-batch: 2 all-reduces of [N,C] per layer forward and 2 backward, the embedding
    // lookup's and the LM head input gradient's [N,C], the cross-entropy's max [N] and
    // [sum-exp | target logit] [2N]. Nothing else in the tensor group.
    const CommStats& st = grid.tensor().stats();
    const int64_t L = config.model.layers, M = config.num_microbatches();
    const int64_t N = config.train.micro_batch * config.model.seq_len;
    const int64_t NC = N * config.model.width;
    EXPECT_EQ(st.calls("all_reduce"), M * (4 * L + 4));
    const auto& counts = st.all_reduce_counts;
    EXPECT_EQ(std::count(counts.begin(), counts.end(), NC), M * (4 * L + 2));
    EXPECT_EQ(std::count(counts.begin(), counts.end(), N), M);
    EXPECT_EQ(std::count(counts.begin(), counts.end(), 2 * N), M);
    int64_t other = 0;
    for (const auto& [op, s] : st.ops)
      if (op != "all_reduce") other += s.calls;
    EXPECT_EQ(other, 0);
  });
}

TEST(Pipeline, OneFOneBHoldsStagesMinusStageMicroBatchesGPipeHoldsAll) {
  const auto dir = shared_corpus("memory");
  const Layout l{1, 4, 1};
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    // 16 sequences in micro-batches of 2: 8 micro-batches per step.
    const Config config = layout_config(
        dir, l, {"parallel.schedule=" + schedule, "train.global_batch=16", "train.steps=2"});
    on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
      t.apply_update(0, t.forward_backward(0));
      const int stage = grid.coord().pp;
      const int64_t held = t.pipeline().stats().peak_in_flight;
      const int64_t expected = schedule == "gpipe" ? 8 : std::min<int64_t>(4 - stage, 8);
      EXPECT_EQ(held, expected) << schedule << " stage " << stage;
    });
  }
}

// A non-finite gradient on one rank makes every rank skip the step (weights, moments and the
// update count untouched); training goes on, and the weights equal those of a run that simply
// left that step's update out.
TEST(DataParallel, NonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  const auto dir = shared_corpus("nan");
  for (const std::string zero : {"0", "1"}) {
    const Layout l{2, 1, 2};
    const Config config = layout_config(dir, l, {"optim.zero_stage=" + zero, "train.steps=4"});
    std::vector<float> skipped_weights, reference_weights;
    std::vector<double> losses_a, losses_b;
    on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
      t.set_gradient_test_hook([&](int64_t step, float* grads) {
        if (step == 2 && grid.rank() == 1) grads[0] = std::nanf("");
      });
      for (int64_t s = 0; s < 4; ++s) {
        const StepMetrics m = t.apply_update(s, t.forward_backward(s));
        EXPECT_EQ(std::isfinite(m.grad_norm), s != 2) << "step " << s;
        losses_a.push_back(m.loss);
      }
      EXPECT_EQ(t.skipped_steps(), 1);
      EXPECT_EQ(t.optimizer().updates(), 3);
      skipped_weights = t.host_weights();
    });
    on_layout(config, [&](Trainer& t, ProcessGrid&) {
      for (int64_t s = 0; s < 4; ++s) {
        const double loss = t.forward_backward(s);
        if (s != 2) t.apply_update(s, loss);  // step 2's update left out
        losses_b.push_back(loss);
      }
      reference_weights = t.host_weights();
    });
    EXPECT_EQ(losses_a, losses_b) << "zero_stage " << zero;
    EXPECT_TRUE(skipped_weights == reference_weights) << "zero_stage " << zero;
    for (float w : skipped_weights) ASSERT_TRUE(std::isfinite(w));
  }
}

TEST(Parity, Dp2Zero1) { check_parity({1, 1, 2}, {"optim.zero_stage=1"}); }
TEST(Parity, Tp2Dp2) { check_parity({2, 1, 2}); }

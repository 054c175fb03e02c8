// Every parallel layout of up to 4 ranks against the single-rank run on the same data and seed:
// per-step losses of 20 steps and every gradient after step 1 within 1e-5 relative. Smaller
// layouts run as independent groups of the 4 ranks. Also: the tensor group's collective
// pattern is exactly Megatron's (per step; by pass: test_tp_collectives_np4.cpp), and 1F1B
// holds fewer activations than GPipe.
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

}  // namespace

TEST(Parity, Tp2) { check_parity({2, 1, 1}); }
TEST(Parity, Tp4) { check_parity({4, 1, 1}); }
TEST(Parity, Pp2) { check_parity({1, 2, 1}); }
TEST(Parity, Pp4) { check_parity({1, 4, 1}); }
TEST(Parity, Tp2Pp2) { check_parity({2, 2, 1}); }

TEST(TensorParallel, CollectivesPerStepAreMegatrons) {
  const auto dir = shared_corpus("collectives");
  const ParityLayout l{4, 1, 1};
  const Config config = parity_config(dir, l);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    grid.tensor().stats().reset();
    grid.tensor().stats().keep_all_reduce_counts = true;
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
  const ParityLayout l{1, 4, 1};
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    // 16 sequences in micro-batches of 2: 8 micro-batches per step.
    const Config config = parity_config(
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
    const ParityLayout l{2, 1, 2};
    const Config config = parity_config(dir, l, {"optim.zero_stage=" + zero, "train.steps=4"});
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

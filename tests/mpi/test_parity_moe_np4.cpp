// Mixture of experts (docs/moe.md) on the parallel layouts of up to 4 ranks against the
// single-rank run (parity.hpp): per-step losses of 20 steps, every gradient after step 1
// (routers and stacked experts included) within 1e-5 relative, and the per-sequence
// load-balancing loss and the expert load shares of every step within 1e-5 whatever TP, PP,
// DP, ZeRO-1 or sequence parallelism. gpt2 with token dropping and a z-loss, llama dropless
// with every other layer a MoE layer.
#include <gtest/gtest.h>

#include "moe_configs.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

TEST(MoeParity, Tp2) { check_parity({2, 1, 1}, gpt2_moe()); }
TEST(MoeParity, Pp2) { check_parity({1, 2, 1}, gpt2_moe()); }
TEST(MoeParity, Tp2Pp2) { check_parity({2, 2, 1}, gpt2_moe()); }
TEST(MoeParity, Dp2Zero1) { check_parity({1, 1, 2}, gpt2_moe({"optim.zero_stage=1"})); }
TEST(MoeParity, LlamaTp2SequenceParallel) {
  check_parity({2, 1, 1}, llama_moe({"parallel.sequence_parallel=true"}));
}
TEST(MoeParity, LlamaDp4) { check_parity({1, 1, 4}, llama_moe()); }
TEST(MoeParity, LlamaTp2) { check_parity({2, 1, 1}, llama_moe()); }
TEST(MoeParity, Tp2SequenceParallel) {
  check_parity({2, 1, 1}, gpt2_moe({"parallel.sequence_parallel=true"}));
}

// The classic MoE bug, tested across layouts: the load-balancing loss and its gradient do not
// depend on the micro-batch size or the replicas. DP2 with micro-batches of 1 sequence against
// the single rank's micro-batches of 2: losses, aux losses, loads and step-1 gradients.
TEST(MoeParity, AuxLossIndependentOfMicroBatchSize) {
  const auto dir = shared_corpus("parity");
  const Config ref_config = parity_config(dir, {1, 1, 1}, gpt2_moe());
  const Config config = parity_config(dir, {1, 1, 2}, gpt2_moe({"train.micro_batch=1"}));
  ASSERT_EQ(ref_config.train.micro_batch, 2);
  const Reference ref = reference_run(ref_config, kParitySteps);
  double worst_grad = 0.0, worst_loss = 0.0, worst_moe = 0.0;
  int64_t steps = 0;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    for (int64_t s = 0; s < kParitySteps; ++s, ++steps) {
      const double loss = t.forward_backward(s);
      if (s == 0) worst_grad = worst_grad_error(t, ref, grid);
      const StepMetrics m = t.apply_update(s, loss);
      worst_loss = std::max(worst_loss, std::abs(loss - ref.losses[s]) / ref.losses[s]);
      worst_moe = std::max({worst_moe,
                            std::abs(m.moe_aux_loss - ref.aux_losses[s]) / ref.aux_losses[s],
                            std::abs(m.moe_load_min - ref.load_min[s]),
                            std::abs(m.moe_load_max - ref.load_max[s])});
    }
  });
  EXPECT_EQ(steps, kParitySteps);
  EXPECT_LE(worst_grad, 1e-5);
  EXPECT_LE(worst_loss, 1e-5);
  EXPECT_LE(worst_moe, 1e-5);
  worst_grad = max_over_world(worst_grad);
  worst_loss = max_over_world(worst_loss);
  worst_moe = max_over_world(worst_moe);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] MoE DP=2 micro-batch 1 vs 1 rank micro-batch 2: step-1 gradients "
                "%.3e, losses %.3e, aux loss and loads %.3e worst relative error over %lld "
                "steps\n",
                worst_grad, worst_loss, worst_moe, static_cast<long long>(kParitySteps));
}


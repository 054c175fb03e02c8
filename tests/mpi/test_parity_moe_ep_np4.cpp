// Expert parallelism (parallel.expert; docs/moe.md) against the single-rank run holding every
// expert (parity.hpp): the experts split over EP ranks taken from inside the data-parallel
// dimension, tokens exchanged by all-to-all, each expert's gradient reduced over its
// expert-data group. Per-step losses of 20 steps, every step-1 gradient (routers and every
// expert) within 1e-5 relative, and the aux losses and loads of every step, with token dropping
// (gpt2_moe) and dropless; and the dispatch volume in the communication counters.
#include <gtest/gtest.h>

#include "moe_configs.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

// Expert parallelism (parallel.expert; docs/moe.md): the experts split over EP ranks taken
// from inside the data-parallel dimension, tokens exchanged by all-to-all, each expert's
// gradient reduced over its expert-data group. Against the single rank holding every expert:
// losses, step-1 gradients (routers and every expert), aux losses and loads, with token
// dropping (gpt2_moe) and dropless.
TEST(MoeExpertParity, Ep2) { check_parity({1, 1, 2}, gpt2_moe({"parallel.expert=2"})); }
TEST(MoeExpertParity, Ep2Dropless) {
  check_parity({1, 1, 2}, gpt2_moe({"model.moe_capacity_factor=0", "parallel.expert=2"}));
}
TEST(MoeExpertParity, Ep4) { check_parity({1, 1, 4}, gpt2_moe({"parallel.expert=4"})); }
TEST(MoeExpertParity, Ep2Tp2) { check_parity({2, 1, 2}, gpt2_moe({"parallel.expert=2"})); }
TEST(MoeExpertParity, Ep2Pp2) { check_parity({1, 2, 2}, gpt2_moe({"parallel.expert=2"})); }
TEST(MoeExpertParity, Ep2Zero1) {
  check_parity({1, 1, 2}, gpt2_moe({"parallel.expert=2", "optim.zero_stage=1"}));
}
// Two replicas of each expert: the experts' gradients and ZeRO-1 slices over an expert-data
// group of 2 while the rest is reduced over all 4 ranks.
TEST(MoeExpertParity, Ep2Dp4Zero1) {
  check_parity({1, 1, 4}, gpt2_moe({"parallel.expert=2", "optim.zero_stage=1"}));
}
TEST(MoeExpertParity, LlamaEp2Tp2SequenceParallel) {
  check_parity({2, 1, 2}, llama_moe({"model.moe_experts=4", "parallel.expert=2",
                                     "parallel.sequence_parallel=true"}));
}

// The dispatch volume in the expert group's counters: per MoE layer and micro-batch each rank
// sends its routed rows (C floats each) to the experts' ranks and gets them back, forward and
// backward (4 exchanges of rows), plus the plan's E row counts (int64). Dropless, every one of
// the N * top_k assignments travels: over the job, tokens x top_k x width x 4 bytes x 4.
TEST(MoeExpertParity, DispatchVolumeIsTokensTimesTopKTimesWidth) {
  const auto dir = shared_corpus("parity");
  const Config config = parity_config(
      dir, {1, 1, 2}, gpt2_moe({"model.moe_capacity_factor=0", "parallel.expert=2"}));
  const ModelConfig& m = config.model;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < m.layers; ++l) moe_layers += m.is_moe_layer(l) ? 1 : 0;
  const int64_t tokens = config.train.global_batch * m.seq_len;  // one step, the whole job
  const double rows_bytes =
      4.0 * static_cast<double>(moe_layers * tokens * m.moe_top_k * m.width * 4);
  const double plan_bytes = static_cast<double>(moe_layers * config.num_microbatches() *
                                                config.parallel.data * m.moe_experts * 8);
  double bytes = 0.0, calls = 0.0;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    ASSERT_NE(grid.expert(), nullptr);
    t.apply_update(0, t.forward_backward(0));
    grid.expert()->stats().reset();
    t.apply_update(1, t.forward_backward(1));
    double v[2] = {static_cast<double>(grid.expert()->stats().bytes(kAllToAll)),
                   static_cast<double>(grid.expert()->stats().calls(kAllToAll))};
    grid.world().all_reduce_sum(v, 2);
    bytes = v[0];
    calls = v[1];
  });
  EXPECT_GT(moe_layers, 0);
  EXPECT_EQ(bytes, rows_bytes + plan_bytes) << "calls " << calls;
  // 5 exchanges per MoE layer and micro-batch on each rank (the plan, 2 forward, 2 backward).
  EXPECT_EQ(calls, static_cast<double>(5 * moe_layers * config.num_microbatches() *
                                       config.parallel.data));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] EP=2 dispatch: %.0f all-to-all bytes in one step over the job = "
                "4 x %lld tokens x top-%lld x width %lld x 4 B x %lld MoE layers + %.0f B of "
                "row counts\n",
                bytes, static_cast<long long>(tokens), static_cast<long long>(m.moe_top_k),
                static_cast<long long>(m.width), static_cast<long long>(moe_layers),
                plan_bytes);
}

// No per-step device allocation (issue: "no per-step allocation"): once the first steps have
// made every buffer (activations, scratch, the collectives' staging), further training steps
// allocate no device memory, on the layouts a run uses: one rank, TP2xPP2 with sequence
// parallelism, PP2 interleaved and zero-bubble, DP2 ZeRO-1, full recomputation, and a mixture
// of experts with expert parallelism. Counted with Device::allocation_count().
#include <gtest/gtest.h>

#include <cstdio>

#include "moe_configs.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

void expect_no_step_allocation(const ParityLayout& l, std::vector<std::string> extra,
                               const std::string& label) {
  const auto dir = shared_corpus("step_alloc");
  const Config config = parity_config(dir, l, extra);
  int64_t warm = -1, after = -1, steps = 0;
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    train_steps(t, 0, 2);  // the buffers are made on first use
    warm = t.device().allocation_count();
    steps = static_cast<int64_t>(train_steps(t, 2, 5).size());
    after = t.device().allocation_count();
  });
  EXPECT_EQ(steps, 3) << label;
  EXPECT_GT(warm, 0) << label << ": nothing counted";
  EXPECT_EQ(after, warm) << label << ": " << after - warm << " device allocations in 3 steps";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] %s: %lld device allocations after 2 steps, %lld more in the next 3\n",
                label.c_str(), static_cast<long long>(warm),
                static_cast<long long>(after - warm));
}

}  // namespace

TEST(StepAllocations, OneRank) { expect_no_step_allocation({1, 1, 1}, {}, "1 rank"); }
TEST(StepAllocations, Tp2Pp2SequenceParallel) {
  expect_no_step_allocation({2, 2, 1}, {"parallel.sequence_parallel=true"}, "TP2xPP2 SP");
}
TEST(StepAllocations, Pp2InterleavedDp2Zero1) {
  expect_no_step_allocation({1, 2, 2},
                            {"parallel.schedule=interleaved", "parallel.virtual_stages=2",
                             "optim.zero_stage=1"},
                            "PP2 interleaved x DP2 ZeRO-1");
}
TEST(StepAllocations, Pp2ZeroBubbleFullRecompute) {
  expect_no_step_allocation({1, 2, 1}, {"parallel.schedule=zb-h1", "train.recompute=full"},
                            "PP2 zb-h1 full recompute");
}
TEST(StepAllocations, MoeExpertParallelTp2) {
  expect_no_step_allocation({2, 1, 2}, gpt2_moe({"parallel.expert=2"}), "MoE EP2xTP2");
}

// gpt2 under sequence parallelism at TP 4 with grouped-query attention (8 query heads; kv_heads
// = 2 * tensor and = tensor) against the single-rank run, apart from test_sequence_parallel_np4
// and test_parity_np4 so that no binary runs more than two 4-rank tensor groups (each ~30 s of
// busy-polling collectives on 2 cores) inside its 120 s timeout.
#include <gtest/gtest.h>

#include "parity.hpp"

using namespace trident::test;

TEST(Gpt2Parity, Tp4KvHeadsTwiceTensorSequenceParallel) {  // 8 heads: two per tensor rank
  check_parity({4, 1, 1}, {"parallel.sequence_parallel=true", "model.heads=8", "model.kv_heads=8",
                           "optim.lr=3e-3"});
}

// 8 query heads in 4 kv groups, one group per tensor rank, under sequence parallelism; lr 3e-3:
// see test_parity_gqa_np4 (the single-rank run spikes at 1e-2 with 4 kv groups).
TEST(Gpt2Parity, Tp4KvHeadsEqualTensorSequenceParallel) {
  check_parity({4, 1, 1}, {"model.heads=8", "model.kv_heads=4", "optim.lr=3e-3",
                           "parallel.sequence_parallel=true"});
}

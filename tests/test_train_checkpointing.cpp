// Checkpoint runs: which global elements of a dataset a rank's shard (or a ZeRO slice of it)
// covers. Checked element by element against the shard map, for every sub-range.
#include <gtest/gtest.h>

#include "train/checkpointing.hpp"

using namespace trident;

// The checkpoint runs of a shard agree element by element with the shard map.

TEST(CheckpointRuns, RunsOfAShardMatchItsGlobalIndices) {
  auto check = [](const ParamInfo& p, int64_t begin, int64_t end) {
    std::vector<int64_t> expected(p.numel(), -1);
    for (int64_t i = begin; i < end; ++i)
      if (auto g = p.global_index(i)) expected[i] = *g;
    std::vector<int64_t> got(p.numel(), -1);
    for (const trident::Run& r : param_runs(p, begin, end, 100))
      for (int64_t k = 0; k < r.length; ++k) {
        const int64_t i = r.local_offset - 100 + begin + k;
        ASSERT_EQ(got[i], -1) << "element covered twice";
        got[i] = r.global_offset + k;
      }
    EXPECT_EQ(got, expected);
  };
  ParamInfo col;  // a column-split matrix [4, 6], this rank holding columns [3, 6)
  col.global_shape = {4, 6};
  col.local_shape = {4, 3};
  col.split_dim = 1;
  col.blocks = {{3, 0, 3}};
  ParamInfo qkv;  // rows of q, k and v of one head out of two: three blocks
  qkv.global_shape = {12, 2};
  qkv.local_shape = {6, 2};
  qkv.split_dim = 0;
  qkv.blocks = qkv_blocks(4, 1, 2);
  ParamInfo vocab;  // padded rows at the end
  vocab.global_shape = {5, 2};
  vocab.local_shape = {4, 2};
  vocab.split_dim = 0;
  vocab.blocks = {{4, 0, 1}};
  ParamInfo replicated;
  replicated.global_shape = replicated.local_shape = {7};
  for (const ParamInfo* p : {&col, &qkv, &vocab, &replicated})
    for (int64_t b = 0; b <= p->numel(); ++b)
      for (int64_t e = b; e <= p->numel(); ++e) check(*p, b, e);
}

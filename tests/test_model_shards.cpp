// The shard maps are pure functions: check that the tensor ranks' blocks partition each global
// extent exactly, with the layouts Megatron-style TP needs.
#include <gtest/gtest.h>

#include "model/params.hpp"

using namespace trident;

namespace {

// Each global index in [0, extent) is owned by exactly one rank; local indices are dense.
void expect_partition(int64_t extent, int tp,
                      const std::function<std::vector<ShardBlock>(int)>& blocks_of) {
  std::vector<int> owners(extent, 0);
  for (int r = 0; r < tp; ++r) {
    int64_t next_local = 0;
    for (const ShardBlock& b : blocks_of(r)) {
      EXPECT_EQ(b.local_begin, next_local);
      next_local += b.length;
      for (int64_t i = b.global_begin; i < b.global_begin + b.length; ++i) {
        ASSERT_GE(i, 0);
        ASSERT_LT(i, extent);
        ++owners[i];
      }
    }
  }
  for (int64_t i = 0; i < extent; ++i) EXPECT_EQ(owners[i], 1) << "global index " << i;
}

}  // namespace

TEST(ShardBlocks, ContiguousPartitions) {
  for (int tp : {1, 2, 4, 8})
    expect_partition(64, tp, [&](int r) { return contiguous_blocks(64, r, tp); });
  EXPECT_EQ(contiguous_blocks(12, 1, 3), (std::vector<ShardBlock>{{4, 0, 4}}));
  EXPECT_THROW(contiguous_blocks(10, 0, 4), std::exception);
}

TEST(ShardBlocks, QkvTakesEachRanksHeadsFromQKAndV) {
  for (int tp : {1, 2, 4})
    expect_partition(3 * 32, tp, [&](int r) { return qkv_blocks(32, r, tp); });
  // width 8 over 2 ranks: rank 1 holds q[4,8), k[12,16), v[20,24) at local [0,4),[4,8),[8,12)
  EXPECT_EQ(qkv_blocks(8, 1, 2),
            (std::vector<ShardBlock>{{4, 0, 4}, {12, 4, 4}, {20, 8, 4}}));
}

TEST(ShardBlocks, VocabRowsArePaddedAndTheRealOnesPartitioned) {
  for (int tp : {1, 2, 4}) {
    const int64_t padded = 56;  // 50 rounded up to a multiple of 8
    expect_partition(50, tp, [&](int r) { return vocab_blocks(50, padded, r, tp); });
  }
  // 50 rows padded to 56 over 4 ranks of 14: the last rank holds 8 real rows and 6 padding.
  EXPECT_EQ(vocab_blocks(50, 56, 3, 4), (std::vector<ShardBlock>{{42, 0, 8}}));
  EXPECT_TRUE(vocab_blocks(4, 16, 3, 4).empty());  // only padding on the last rank
}

TEST(ShardBlocks, GlobalIndexOfColumnSplitAndPadding) {
  ParamInfo p;
  p.global_shape = {4, 6};
  p.local_shape = {4, 3};
  p.split_dim = 1;
  p.blocks = {{3, 0, 3}};
  EXPECT_EQ(p.global_index(0), 3);      // row 0, col 0 -> global col 3
  EXPECT_EQ(p.global_index(5), 6 + 5);  // row 1, col 2 -> (1, 5)
  ParamInfo v;
  v.global_shape = {5, 2};
  v.local_shape = {4, 2};
  v.split_dim = 0;
  v.blocks = {{4, 0, 1}};  // one real row (global 4), three padding rows
  EXPECT_EQ(v.global_index(1), 9);
  EXPECT_FALSE(v.global_index(2).has_value());
}


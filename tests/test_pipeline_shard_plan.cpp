// Shard planning (lib/pipeline/shard_plan.hpp): the part of the model a rank holds, from the
// config and its grid coordinates alone (no ranks, no model built).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "pipeline/shard_plan.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

Config tiny(const std::vector<std::string>& sets = {}) {
  return parse_config(
      "[model]\nlayers = 8\nheads = 4\nwidth = 64\nvocab_size = 256\nseq_len = 64\n"
      "[train]\nmicro_batch = 2\nglobal_batch = 8\n[data]\ntrain = \"x.bin\"\n",
      "tiny.toml", sets);
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

}  // namespace

TEST(ShardPlan, OneRankHoldsTheWholeModel) {
  const ModelShard s = plan_model_shard(tiny(), {});
  EXPECT_EQ(s.layer_begin, 0);
  EXPECT_EQ(s.layer_end, 8);
  EXPECT_TRUE(s.has_embedding);
  EXPECT_TRUE(s.has_head);
  EXPECT_TRUE(s.chunks.empty());
  EXPECT_FALSE(s.sequence_parallel);
  EXPECT_EQ(s.tp_rank, 0);
  EXPECT_EQ(s.tp_size, 1);
}

TEST(ShardPlan, PipelineStagesSplitTheLayersEmbeddingFirstHeadLast) {
  const Config c = tiny();
  const Ranges expected = {{0, 3}, {3, 6}, {6, 8}};  // 8 layers over 3 stages: no extra on the last
  for (int stage = 0; stage < 3; ++stage) {
    const ModelShard s = plan_model_shard(c, {.pp_rank = stage, .pp_size = 3});
    EXPECT_EQ(std::make_pair(s.layer_begin, s.layer_end), expected[stage]) << "stage " << stage;
    EXPECT_EQ(s.has_embedding, stage == 0);
    EXPECT_EQ(s.has_head, stage == 2);
  }
}

TEST(ShardPlan, ExplicitPipelineLayersWin) {
  Config c = tiny();
  c.parallel.pipeline_layers = {5, 3};
  EXPECT_EQ(plan_model_shard(c, {.pp_rank = 0, .pp_size = 2}).layer_end, 5);
  const ModelShard last = plan_model_shard(c, {.pp_rank = 1, .pp_size = 2});
  EXPECT_EQ(std::make_pair(last.layer_begin, last.layer_end), std::make_pair(int64_t{5}, int64_t{8}));
}

TEST(ShardPlan, InterleavedStagesHoldEveryOtherChunk) {
  Config c = tiny();
  c.parallel.schedule = "interleaved";
  c.parallel.virtual_stages = 2;
  EXPECT_EQ(plan_model_shard(c, {.pp_rank = 0, .pp_size = 2}).chunks, (Ranges{{0, 2}, {4, 6}}));
  EXPECT_EQ(plan_model_shard(c, {.pp_rank = 1, .pp_size = 2}).chunks, (Ranges{{2, 4}, {6, 8}}));
  c.parallel.virtual_stages = 3;  // 8 layers do not cut into 2 x 3 chunks
  EXPECT_THROW(plan_model_shard(c, {.pp_rank = 0, .pp_size = 2}), Error);
}

TEST(ShardPlan, CoordinatesAndRunKeysReachTheShard) {
  Config c = tiny();
  c.train.recompute = "selective";
  c.train.lm_head_chunk_rows = 16;
  c.parallel.tp_overlap = true;
  const ModelShard s = plan_model_shard(c, {1, 2, 0, 1, 3, 4});
  EXPECT_EQ(s.tp_rank, 1);
  EXPECT_EQ(s.tp_size, 2);
  EXPECT_EQ(s.ep_rank, 3);
  EXPECT_EQ(s.ep_size, 4);
  EXPECT_EQ(s.recompute, Recompute::Selective);
  EXPECT_EQ(s.lm_head_chunk_rows, 16);
  EXPECT_TRUE(s.tp_overlap);
}

TEST(ShardPlan, SequenceParallelismNeedsTensorRanksAndEvenRows) {
  Config c = tiny();
  c.parallel.sequence_parallel = true;
  EXPECT_FALSE(plan_model_shard(c, {}).sequence_parallel) << "no tensor parallelism: off";
  EXPECT_TRUE(plan_model_shard(c, {.tp_rank = 1, .tp_size = 2}).sequence_parallel);
  c.model.seq_len = 63;
  c.train.micro_batch = 1;  // 63 rows over 2 tensor ranks
  try {
    plan_model_shard(c, {.tp_rank = 0, .tp_size = 2});
    ADD_FAILURE() << "63 rows cut over 2 tensor ranks";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tiny.toml: parallel.sequence_parallel = true needs train.micro_batch * "
              "model.seq_len (63) divisible by parallel.tensor (2)");
  }
}

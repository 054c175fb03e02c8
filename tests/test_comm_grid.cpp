// Pure tests of the process grid (no MPI): the rank map, group membership, layout validation,
// vocabulary padding, the self communicator, GPU selection (select_device), each rank's share of
// its machine's cores (share_cores) and the host bf16 conversions that the MPI BF16 reductions
// use.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "grid/core_share.hpp"
#include "grid/device_select.hpp"
#include "grid/grid.hpp"
#include "util/bf16.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

std::vector<GridShape> shapes() {
  std::vector<GridShape> v;
  for (int tp : {1, 2, 3, 4, 8})
    for (int pp : {1, 2, 3, 4})
      for (int dp : {1, 2, 3, 5}) v.push_back({tp, pp, dp});
  return v;
}

std::string str(const GridShape& s) {
  return "TP=" + std::to_string(s.tp) + " PP=" + std::to_string(s.pp) +
         " DP=" + std::to_string(s.dp);
}

TEST(comm_grid, RankOfIsTheDocumentedFormula) {
  GridShape s{2, 3, 2};
  EXPECT_EQ(rank_of(s, {0, 0, 0}), 0);
  EXPECT_EQ(rank_of(s, {1, 0, 0}), 1);
  EXPECT_EQ(rank_of(s, {0, 1, 0}), 2);
  EXPECT_EQ(rank_of(s, {1, 2, 0}), 5);
  EXPECT_EQ(rank_of(s, {0, 0, 1}), 6);
  EXPECT_EQ(rank_of(s, {1, 2, 1}), 11);
  EXPECT_EQ(coord_of(s, 9), (GridCoord{1, 1, 1}));
}

TEST(comm_grid, RankOfAndCoordOfAreInverse) {
  for (const GridShape& s : shapes()) {
    SCOPED_TRACE(str(s));
    for (int r = 0; r < s.world(); ++r) {
      GridCoord c = coord_of(s, r);
      ASSERT_EQ(c.tp, r % s.tp);
      ASSERT_EQ(rank_of(s, c), r);
    }
    for (int d = 0; d < s.dp; ++d)
      for (int p = 0; p < s.pp; ++p)
        for (int t = 0; t < s.tp; ++t)
          ASSERT_EQ(coord_of(s, rank_of(s, {t, p, d})), (GridCoord{t, p, d}));
  }
}

TEST(comm_grid, OutOfRangeThrows) {
  GridShape s{2, 2, 1};
  EXPECT_THROW(coord_of(s, 4), Error);
  EXPECT_THROW(coord_of(s, -1), Error);
  EXPECT_THROW(rank_of(s, {2, 0, 0}), Error);
  EXPECT_THROW(rank_of(s, {0, 0, 1}), Error);
  EXPECT_THROW(coord_of(GridShape{0, 1, 1}, 0), Error);
}

// `group(shape, r)` must: contain r, have the expected size, be the same list for each of its
// members, be ordered by the coordinate `dim` (group rank i has that coordinate = i) with the
// other coordinates equal to r's, and the distinct groups must partition the world.
template <typename GroupFn, typename Key>
void check_partition(const GridShape& s, GroupFn group, int size, Key order_key) {
  std::vector<int> seen(s.world(), 0);
  for (int r = 0; r < s.world(); ++r) {
    std::vector<int> g = group(s, r);
    ASSERT_EQ(static_cast<int>(g.size()), size) << "rank " << r;
    ASSERT_NE(std::find(g.begin(), g.end(), r), g.end()) << "rank " << r;
    for (int i = 0; i < size; ++i) {
      ASSERT_EQ(order_key(s, r, g[i]), i) << "rank " << r << " member " << i;
      ASSERT_EQ(group(s, g[i]), g) << "rank " << r << " member " << g[i];
    }
    if (g[0] == r) {
      for (int m : g) seen[m] += 1;  // count each group once (from its first member)
    }
  }
  for (int r = 0; r < s.world(); ++r) ASSERT_EQ(seen[r], 1) << "rank " << r;
}

TEST(comm_grid, TensorGroupsPartitionTheWorld) {
  for (const GridShape& s : shapes()) {
    SCOPED_TRACE(str(s));
    check_partition(s, tensor_group, s.tp, [](const GridShape& sh, int r, int m) {
      GridCoord a = coord_of(sh, r), b = coord_of(sh, m);
      return (a.pp == b.pp && a.dp == b.dp) ? b.tp : -1;
    });
    // Contiguous and aligned: a tensor group sits inside any node holding a multiple of TP.
    for (int r = 0; r < s.world(); ++r) {
      std::vector<int> g = tensor_group(s, r);
      for (int i = 0; i < s.tp; ++i) ASSERT_EQ(g[i], r - r % s.tp + i);
    }
  }
}

TEST(comm_grid, PipelineGroupsPartitionTheWorld) {
  for (const GridShape& s : shapes()) {
    SCOPED_TRACE(str(s));
    check_partition(s, pipeline_group, s.pp, [](const GridShape& sh, int r, int m) {
      GridCoord a = coord_of(sh, r), b = coord_of(sh, m);
      return (a.tp == b.tp && a.dp == b.dp) ? b.pp : -1;
    });
  }
}

TEST(comm_grid, DataGroupsPartitionTheWorld) {
  for (const GridShape& s : shapes()) {
    SCOPED_TRACE(str(s));
    check_partition(s, data_group, s.dp, [](const GridShape& sh, int r, int m) {
      GridCoord a = coord_of(sh, r), b = coord_of(sh, m);
      return (a.tp == b.tp && a.pp == b.pp) ? b.dp : -1;
    });
  }
}

// Expert parallelism: expert groups are EP consecutive data ranks of one (tp, pp) column, the
// expert-data groups the column's ranks of one expert rank; each partitions the world, and an
// expert group and an expert-data group meet in exactly one rank.
TEST(comm_grid, ExpertGroupsPartitionTheWorld) {
  int64_t checked = 0;
  for (const GridShape& s : shapes()) {
    for (int ep = 1; ep <= s.dp; ++ep) {
      if (s.dp % ep != 0) continue;
      SCOPED_TRACE(str(s) + " EP=" + std::to_string(ep));
      auto experts = [ep](const GridShape& sh, int r) { return expert_group(sh, ep, r); };
      auto expert_data = [ep](const GridShape& sh, int r) { return expert_data_group(sh, ep, r); };
      check_partition(s, experts, ep, [ep](const GridShape& sh, int r, int m) {
        GridCoord a = coord_of(sh, r), b = coord_of(sh, m);
        return (a.tp == b.tp && a.pp == b.pp && a.dp / ep == b.dp / ep) ? b.dp % ep : -1;
      });
      check_partition(s, expert_data, s.dp / ep, [ep](const GridShape& sh, int r, int m) {
        GridCoord a = coord_of(sh, r), b = coord_of(sh, m);
        return (a.tp == b.tp && a.pp == b.pp && a.dp % ep == b.dp % ep) ? b.dp / ep : -1;
      });
      for (int r = 0; r < s.world(); ++r) {
        const std::vector<int> e = expert_group(s, ep, r), d = expert_data_group(s, ep, r);
        int common = 0;
        for (int m : e) common += static_cast<int>(std::count(d.begin(), d.end(), m));
        ASSERT_EQ(common, 1) << "rank " << r;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
  // (TP=2, PP=1, DP=4, EP=2): ranks 0,2 | 4,6 exchange tokens; 0,4 | 2,6 share experts.
  EXPECT_EQ(expert_group({2, 1, 4}, 2, 4), (std::vector<int>{4, 6}));
  EXPECT_EQ(expert_data_group({2, 1, 4}, 2, 4), (std::vector<int>{0, 4}));
  try {
    expert_group({1, 1, 4}, 3, 0);
    ADD_FAILURE() << "EP 3 accepted with DP 4";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "parallel.expert (3) must divide parallel.data (4)");
  }
}

TEST(comm_grid, ModelGroupsPartitionTheWorld) {
  for (const GridShape& s : shapes()) {
    SCOPED_TRACE(str(s));
    check_partition(s, model_group, s.tp * s.pp, [](const GridShape& sh, int r, int m) {
      GridCoord a = coord_of(sh, r), b = coord_of(sh, m);
      return a.dp == b.dp ? b.pp * sh.tp + b.tp : -1;
    });
    for (int r = 0; r < s.world(); ++r) {
      std::vector<int> g = model_group(s, r);
      const int base = coord_of(s, r).dp * s.tp * s.pp;
      for (int i = 0; i < s.tp * s.pp; ++i) ASSERT_EQ(g[i], base + i);
    }
  }
}

TEST(comm_grid, EmbeddingGroupIsFirstAndLastStage) {
  for (const GridShape& s : shapes()) {
    SCOPED_TRACE(str(s));
    std::vector<int> seen(s.world(), 0);
    for (int r = 0; r < s.world(); ++r) {
      GridCoord c = coord_of(s, r);
      std::vector<int> g = embedding_group(s, r);
      std::vector<int> want{rank_of(s, {c.tp, 0, c.dp})};
      if (s.pp > 1) want.push_back(rank_of(s, {c.tp, s.pp - 1, c.dp}));
      ASSERT_EQ(g, want) << "rank " << r;
      const bool member = c.pp == 0 || c.pp == s.pp - 1;
      ASSERT_EQ(std::find(g.begin(), g.end(), r) != g.end(), member) << "rank " << r;
      if (member) {
        for (int m : g) ASSERT_EQ(embedding_group(s, m), g);
        if (g[0] == r) for (int m : g) seen[m] += 1;
      }
    }
    // The groups partition exactly the first- and last-stage ranks.
    for (int r = 0; r < s.world(); ++r) {
      GridCoord c = coord_of(s, r);
      ASSERT_EQ(seen[r], (c.pp == 0 || c.pp == s.pp - 1) ? 1 : 0) << "rank " << r;
    }
  }
}

TEST(comm_grid, GroupsOfOneRankGrid) {
  GridShape s{1, 1, 1};
  EXPECT_EQ(tensor_group(s, 0), std::vector<int>{0});
  EXPECT_EQ(pipeline_group(s, 0), std::vector<int>{0});
  EXPECT_EQ(data_group(s, 0), std::vector<int>{0});
  EXPECT_EQ(model_group(s, 0), std::vector<int>{0});
  EXPECT_EQ(embedding_group(s, 0), std::vector<int>{0});
}

TEST(comm_grid, GroupsOf222Explicit) {
  GridShape s{2, 2, 2};
  EXPECT_EQ(tensor_group(s, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(pipeline_group(s, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(data_group(s, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(model_group(s, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(embedding_group(s, 5), (std::vector<int>{5, 7}));
}

TEST(comm_grid, PaddedVocab) {
  EXPECT_EQ(padded_vocab(256, 1, 1), 256);
  EXPECT_EQ(padded_vocab(256, 1, 3), 258);
  EXPECT_EQ(padded_vocab(50257, 1, 4), 50260);
  EXPECT_EQ(padded_vocab(50257, 128, 2), 50432);
  EXPECT_EQ(padded_vocab(50304, 64, 1), 50304);
  EXPECT_EQ(padded_vocab(3, 1, 8), 8);
  EXPECT_THROW(padded_vocab(0, 1, 1), Error);
  EXPECT_THROW(padded_vocab(10, 0, 1), Error);
  EXPECT_THROW(padded_vocab(10, 1, 0), Error);
}

std::string layout_error(const GridShape& s, int world, int rpn, const ModelConfig& m) {
  try {
    validate_layout(s, world, rpn, m);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(comm_grid, ValidLayoutsPass) {
  ModelConfig m;  // layers 2, heads 4, width 64, vocab 256
  EXPECT_NO_THROW(validate_layout({1, 1, 1}, 1, 0, m));
  EXPECT_NO_THROW(validate_layout({2, 2, 2}, 8, 4, m));
  EXPECT_NO_THROW(validate_layout({4, 1, 1}, 4, 0, m));
  EXPECT_NO_THROW(validate_layout({4, 2, 3}, 24, 8, m));
  m.vocab_size = 50257;
  m.vocab_multiple = 128;
  EXPECT_NO_THROW(validate_layout({4, 2, 1}, 8, 4, m));
}

TEST(comm_grid, LayoutErrorsNameTheSettingAndValues) {
  ModelConfig m;
  EXPECT_EQ(layout_error({2, 2, 1}, 8, 0, m),
            "parallel.tensor * parallel.pipeline * parallel.data = 2*2*1 = 4 but the job has 8 "
            "ranks");
  EXPECT_EQ(layout_error({0, 2, 1}, 8, 0, m),
            "parallel.tensor, parallel.pipeline and parallel.data must be >= 1 (got 0, 2, 1)");

  ModelConfig heads = m;
  heads.heads = 6;
  EXPECT_EQ(layout_error({4, 1, 1}, 4, 0, heads),
            "model.heads = 6 is not divisible by parallel.tensor = 4 (each tensor rank holds "
            "heads/TP whole attention heads)");

  ModelConfig width = m;
  width.heads = 8;
  width.width = 68;
  EXPECT_EQ(layout_error({8, 1, 1}, 8, 0, width),
            "model.width = 68 is not divisible by parallel.tensor = 8");

  EXPECT_EQ(layout_error({4, 1, 1}, 4, 2, m),
            "parallel.tensor = 4 does not divide the 2 ranks per node: a tensor-parallel group "
            "must not cross a node");
  EXPECT_EQ(layout_error({2, 1, 3}, 6, 3, m),
            "parallel.tensor = 2 does not divide the 3 ranks per node: a tensor-parallel group "
            "must not cross a node");

  EXPECT_EQ(layout_error({1, 4, 1}, 4, 0, m),
            "parallel.pipeline = 4 is more than model.layers = 2: every pipeline stage needs at "
            "least one layer");

  ModelConfig vocab = m;
  vocab.vocab_multiple = 0;
  EXPECT_EQ(layout_error({2, 1, 1}, 2, 0, vocab),
            "cannot pad the vocabulary: model.vocab_size = 256 and model.vocab_multiple = 0 must "
            "both be >= 1");

  ModelConfig zero = m;
  zero.heads = 0;
  EXPECT_EQ(layout_error({1, 1, 1}, 1, 0, zero),
            "model.heads = 0, model.width = 64 and model.layers = 2 must all be >= 1");
}

TEST(comm_grid, KeyValueHeadsAndMlpSplitOverTensorRanks) {
  ModelConfig m;  // heads 4, width 64
  m.arch = "llama";
  m.kv_heads = 2;
  EXPECT_NO_THROW(validate_layout({2, 1, 1}, 2, 0, m));
  EXPECT_EQ(layout_error({4, 1, 1}, 4, 0, m),
            "model.kv_heads = 2 is not divisible by parallel.tensor = 4 (each tensor rank "
            "holds kv_heads/TP whole key/value heads)");
  m.kv_heads = 0;  // = heads
  EXPECT_NO_THROW(validate_layout({4, 1, 1}, 4, 0, m));

  ModelConfig ffn;
  ffn.heads = 2;
  ffn.width = 64;
  ffn.ffn_width = 100;
  EXPECT_NO_THROW(validate_layout({2, 1, 1}, 2, 0, ffn));
  EXPECT_EQ(layout_error({4, 1, 1}, 4, 0, {.heads = 4, .width = 64, .ffn_width = 102}),
            "the MLP size 102 (model.ffn_width) is not divisible by parallel.tensor = 4");
  // The default size of the architecture: gpt2 4 * 24 = 96, llama 8/3 * 24 -> 256.
  ModelConfig odd{.heads = 3, .width = 24};
  EXPECT_NO_THROW(validate_layout({3, 1, 1}, 3, 0, odd));
  odd.arch = "llama";
  EXPECT_EQ(layout_error({3, 1, 1}, 3, 0, odd),
            "the MLP size 256 (model.ffn_width = 0: the default for model.arch = llama) is not "
            "divisible by parallel.tensor = 3");
}

// configs/tiny.toml runs on every layout of up to 8 ranks; configs/llama_tiny.toml runs on
// every one of them too (heads 16, kv_heads 8, ffn_width 352 all split over TP 1, 2, 4, 8).
TEST(comm_grid, LlamaTinyRunsWhereTinyRuns) {
  const std::string dir = std::string(TRIDENT_SOURCE_DIR) + "/configs/";
  int layouts = 0;
  for (int tp : {1, 2, 4, 8})
    for (int pp : {1, 2, 4, 8})
      for (int dp : {1, 2, 4, 8}) {
        if (tp * pp * dp > 8) continue;
        const std::vector<std::string> sets = {"parallel.tensor=" + std::to_string(tp),
                                               "parallel.pipeline=" + std::to_string(pp),
                                               "parallel.data=" + std::to_string(dp)};
        SCOPED_TRACE(sets[0] + " " + sets[1] + " " + sets[2]);
        const Config tiny = load_config(dir + "tiny.toml", sets);
        EXPECT_NO_THROW(validate_layout({tp, pp, dp}, tp * pp * dp, 8, tiny.model));
        Config llama;
        ASSERT_NO_THROW(llama = load_config(dir + "llama_tiny.toml", sets));
        EXPECT_NO_THROW(validate_layout({tp, pp, dp}, tp * pp * dp, 8, llama.model));
        ++layouts;
      }
  EXPECT_EQ(layouts, 20);
}

TEST(comm_grid, ClusterConfigsFitTheirLayouts) {
  const std::string dir = std::string(TRIDENT_SOURCE_DIR) + "/configs/";
  for (const char* name : {"llama_3.2_1b.toml", "llama_3.1_8b.toml", "gpu_124m.toml"}) {
    SCOPED_TRACE(name);
    const Config c = load_config(dir + name);
    const GridShape s{static_cast<int>(c.parallel.tensor), static_cast<int>(c.parallel.pipeline),
                      static_cast<int>(c.parallel.data)};
    EXPECT_NO_THROW(validate_layout(s, static_cast<int>(c.parallel.world_size()), 8, c.model));
  }
}

TEST(comm_grid, LayoutErrorsAreOneLine) {
  ModelConfig m;
  m.heads = 3;
  for (auto [s, world, rpn] : std::vector<std::tuple<GridShape, int, int>>{
           {{2, 2, 1}, 8, 0}, {{2, 1, 1}, 2, 0}, {{4, 1, 1}, 4, 2}, {{1, 3, 1}, 3, 0}}) {
    std::string e = layout_error(s, world, rpn, m);
    EXPECT_FALSE(e.empty());
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(comm_grid, RanksPerNodeZeroSkipsTheNodeCheck) {
  ModelConfig m;
  EXPECT_NO_THROW(validate_layout({4, 1, 1}, 4, 0, m));
  EXPECT_NO_THROW(validate_layout({4, 1, 1}, 4, -1, m));
  EXPECT_NO_THROW(validate_layout({4, 1, 1}, 4, 8, m));  // a node larger than the job is fine
}

// ---- the self communicator ----

TEST(comm_self, DtypeBytes) {
  EXPECT_EQ(dtype_bytes(DType::F32), 4u);
  EXPECT_EQ(dtype_bytes(DType::F64), 8u);
  EXPECT_EQ(dtype_bytes(DType::I32), 4u);
  EXPECT_EQ(dtype_bytes(DType::I64), 8u);
  EXPECT_EQ(dtype_bytes(DType::BF16), 2u);
}

TEST(comm_self, CollectivesAreIdentityAndCounted) {
  auto c = make_self_communicator("tensor");
  c->stats().keep_all_reduce_counts = true;
  EXPECT_EQ(c->name(), "tensor");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);

  std::vector<float> x{1, 2, 3};
  c->all_reduce_sum(x.data(), 3);
  c->all_reduce_max(x.data(), 2);
  std::vector<double> d{4, 5};
  c->all_reduce_sum(d.data(), 2);
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(d, (std::vector<double>{4, 5}));

  std::vector<int64_t> a{7, 8}, b(2, 0);
  c->all_gather(a.data(), b.data(), 2, DType::I64);
  EXPECT_EQ(b, a);
  std::vector<int32_t> e{9, 10, 11}, f(3, 0);
  c->reduce_scatter(e.data(), f.data(), 3, DType::I32);
  EXPECT_EQ(f, e);
  c->broadcast(x.data(), 3, DType::F32, 0);
  EXPECT_THROW(c->broadcast(x.data(), 3, DType::F32, 1), Error);
  c->barrier();

  const CommStats& st = c->stats();
  EXPECT_EQ(st.calls("all_reduce"), 3);
  EXPECT_EQ(st.ops.at("all_reduce").bytes, 3 * 4 + 2 * 4 + 2 * 8);
  EXPECT_EQ(st.all_reduce_counts, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(st.calls("all_gather"), 1);
  EXPECT_EQ(st.ops.at("all_gather").bytes, 16);
  EXPECT_EQ(st.calls("reduce_scatter"), 1);
  EXPECT_EQ(st.ops.at("reduce_scatter").bytes, 12);
  EXPECT_EQ(st.calls("broadcast"), 1);
  EXPECT_EQ(st.ops.at("broadcast").bytes, 12);
  EXPECT_EQ(st.calls("barrier"), 1);
  EXPECT_EQ(st.calls("send"), 0);

  c->stats().reset();
  EXPECT_EQ(c->stats().calls("all_reduce"), 0);
  EXPECT_TRUE(c->stats().all_reduce_counts.empty());
  EXPECT_TRUE(c->stats().keep_all_reduce_counts);  // a reset keeps the setting
}

// comm.hpp's ProgressHelper with scripted requests (no MPI): the kept helper thread calls
// test() until the request reports completion, then the caller's wait() runs; the same helper
// serves request after request; an error of test() reaches during()'s caller, as does the
// work's, and the helper serves the next request after either.
class ScriptedRequest final : public CommRequest {
 public:
  explicit ScriptedRequest(int complete_at, bool fail = false)
      : complete_at_(complete_at), fail_(fail) {}
  bool test() override {
    const int n = ++tests;
    if (fail_) throw Error("scripted request failed");
    return n >= complete_at_;
  }
  void wait() override { waited = true; }
  std::atomic<int> tests{0};
  bool waited = false;

 private:
  int complete_at_;
  bool fail_;
};

// Blocks (at most 30 s) until the helper has called test() `n` times.
void wait_for_tests(const ScriptedRequest& r, int n) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (r.tests.load() < n && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

TEST(ProgressHelper, DrivesEachRequestToCompletionAndServesTheNext) {
  ProgressHelper helper(std::chrono::microseconds(10));
  for (int round = 0; round < 3; ++round) {
    ScriptedRequest request(5);
    helper.during(request, [&] { wait_for_tests(request, 5); });
    EXPECT_EQ(request.tests.load(), 5) << "round " << round << ": tested after completing";
    EXPECT_TRUE(request.waited) << "round " << round;
  }
}

TEST(ProgressHelper, ErrorsOfTheRequestAndOfTheWorkReachTheCaller) {
  ProgressHelper helper(std::chrono::microseconds(10));
  ScriptedRequest failing(1, /*fail=*/true);
  EXPECT_THROW(helper.during(failing, [&] { wait_for_tests(failing, 1); }), Error);
  EXPECT_FALSE(failing.waited);
  ScriptedRequest never(1 << 30);
  EXPECT_THROW(helper.during(never, [] { throw std::runtime_error("work failed"); }),
               std::runtime_error);
  ScriptedRequest next(2);
  helper.during(next, [&] { wait_for_tests(next, 2); });
  EXPECT_EQ(next.tests.load(), 2);
  EXPECT_TRUE(next.waited);
}

// The caller never waits out the helper's poll: with a poll of 30 s, during() of a request that
// never completes returns as soon as its work does, while the helper sleeps in its poll.
TEST(ProgressHelper, TakingBackDoesNotWaitForThePoll) {
  ProgressHelper helper(std::chrono::seconds(30));
  const auto start = std::chrono::steady_clock::now();
  ScriptedRequest first(1 << 30);
  helper.during(first, [&] { wait_for_tests(first, 1); });  // the helper is now in its poll
  EXPECT_EQ(first.tests.load(), 1);
  EXPECT_TRUE(first.waited);
  ScriptedRequest never(1 << 30);
  helper.during(never, [] {});
  helper.during(never, [] {});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "during() waited for the helper's 30 s poll";
  EXPECT_TRUE(never.waited);
}

// A run's communicators keep no list of all-reduce sizes (it would grow with every step).
TEST(comm_self, AllReduceSizesAreNotKeptUnlessAsked) {
  auto c = make_self_communicator("data");
  std::vector<float> x(3, 1.0f);
  c->all_reduce(x.data(), 3, DType::F32, ReduceOp::Sum);
  c->iall_reduce(x.data(), 2, DType::F32, ReduceOp::Sum)->wait();
  EXPECT_EQ(c->stats().calls("all_reduce"), 2);
  EXPECT_TRUE(c->stats().all_reduce_counts.empty());
}

TEST(comm_self, SendToSelfIsDelivered) {
  auto c = make_self_communicator("pipeline");
  std::vector<float> s1{1, 2, 3}, s2{4, 5, 6}, r1(3), r2(3);
  // send before receive, and receive before send; tags match independently.
  auto a = c->isend(s1.data(), 3, DType::F32, 0, 7);
  auto b = c->irecv(r2.data(), 3, DType::F32, 0, 8);
  auto d = c->irecv(r1.data(), 3, DType::F32, 0, 7);
  auto e = c->isend(s2.data(), 3, DType::F32, 0, 8);
  a->wait();
  b->wait();
  d->wait();
  e->wait();
  e->wait();  // a second wait is harmless
  EXPECT_EQ(r1, s1);
  EXPECT_EQ(r2, s2);
  EXPECT_EQ(c->stats().calls("send"), 2);
  EXPECT_EQ(c->stats().calls("recv"), 2);
  EXPECT_EQ(c->stats().ops.at("send").bytes, 24);
  EXPECT_EQ(c->stats().ops.at("recv").bytes, 24);

  EXPECT_THROW(c->isend(s1.data(), 3, DType::F32, 1, 0), Error);
  auto orphan = c->irecv(r1.data(), 3, DType::F32, 0, 99);
  EXPECT_THROW(orphan->wait(), Error);  // nothing will ever match: an error, not a hang
}

TEST(comm_self, AllToAllVCopiesTheOneBlockAndCountsIt) {
  auto c = make_self_communicator("expert");
  std::vector<float> send{1, 2, 3, 4, 5}, recv(5, -1);
  c->all_to_all_v(send.data(), {5}, recv.data(), {5}, DType::F32);
  EXPECT_EQ(recv, send);
  std::vector<int64_t> none;
  c->all_to_all_v(none.data(), {0}, none.data(), {0}, DType::I64);  // an empty exchange
  EXPECT_EQ(c->stats().calls("all_to_all"), 2);
  EXPECT_EQ(c->stats().ops.at("all_to_all").bytes, 5 * 4);
  // Counts that cannot describe a one-rank exchange are refused before anything is counted.
  EXPECT_THROW(c->all_to_all_v(send.data(), {5, 0}, recv.data(), {5, 0}, DType::F32), Error);
  EXPECT_THROW(c->all_to_all_v(send.data(), {5}, recv.data(), {4}, DType::F32), Error);
  EXPECT_THROW(c->all_to_all_v(send.data(), {-1}, recv.data(), {-1}, DType::F32), Error);
  EXPECT_EQ(c->stats().calls("all_to_all"), 2);
}

// A one-rank group over device memory (the GPU backend's, for every group of one rank): each
// copy a collective makes goes through the device's copy, with its bytes; the all-reduce and
// broadcast copy nothing; point-to-point to itself is refused in one line naming the group. The
// host self communicator handed device pointers to MPI (a segfault of `trident generate` at
// TP 1 on the H200, 2026-12-04).
TEST(comm_self, DeviceSelfCommunicatorCopiesOnTheDevice) {
  struct Copy {
    void* dst;
    const void* src;
    int64_t bytes;
  };
  std::vector<Copy> copies;
  auto c = make_device_self_communicator("tensor", [&](void* dst, const void* src, int64_t n) {
    copies.push_back({dst, src, n});
    std::memcpy(dst, src, static_cast<size_t>(n));
  });
  EXPECT_EQ(c->size(), 1);
  std::vector<float> send{1, 2, 3}, recv(3, 0);
  c->all_gather(send.data(), recv.data(), 3, DType::F32);
  EXPECT_EQ(recv, send);
  c->reduce_scatter(send.data(), recv.data(), 2, DType::BF16);
  c->all_to_all_v(send.data(), {3}, recv.data(), {3}, DType::F32);
  c->all_gather(recv.data(), recv.data(), 3, DType::F32);  // in place: nothing to copy
  c->all_reduce(send.data(), 3, DType::F32, ReduceOp::Sum);
  c->broadcast(send.data(), 3, DType::F32, 0);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0].dst, recv.data());
  EXPECT_EQ(copies[0].src, send.data());
  EXPECT_EQ(copies[0].bytes, 12);
  EXPECT_EQ(copies[1].bytes, 4);  // two bf16
  EXPECT_EQ(copies[2].bytes, 12);
  EXPECT_EQ(c->stats().calls("all_gather"), 2);
  for (auto op : {+[](Communicator& x, float* p) { x.isend(p, 1, DType::F32, 0, 5); },
                  +[](Communicator& x, float* p) { x.irecv(p, 1, DType::F32, 0, 5); }}) {
    try {
      op(*c, send.data());
      ADD_FAILURE() << "point-to-point to itself over device memory was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("communicator 'tensor' (one rank, device memory)"),
                std::string::npos)
          << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_THROW(make_device_self_communicator("tensor", DeviceCopy{}), Error);
}

// A backend without an all-to-all (MPI, NCCL, staged and one-rank communicators have one; a
// backend that does not override it gets this default): one line naming the group, never a
// silent no-op.
TEST(comm_self, AllToAllVWithoutABackendThrowsNamingTheGroup) {
  struct NoAllToAll final : Communicator {
    NoAllToAll() : Communicator("expert") {}
    int rank() const override { return 0; }
    int size() const override { return 2; }
    void all_reduce(void*, int64_t, DType, ReduceOp) override {}
    std::unique_ptr<CommRequest> iall_reduce(void*, int64_t, DType, ReduceOp) override {
      return nullptr;
    }
    void all_gather(const void*, void*, int64_t, DType) override {}
    void reduce_scatter(const void*, void*, int64_t, DType) override {}
    void broadcast(void*, int64_t, DType, int) override {}
    std::unique_ptr<CommRequest> isend(const void*, int64_t, DType, int, int) override {
      return nullptr;
    }
    std::unique_ptr<CommRequest> irecv(void*, int64_t, DType, int, int) override {
      return nullptr;
    }
    void barrier() override {}
  } c;
  float x = 0;
  try {
    c.all_to_all_v(&x, {1, 0}, &x, {1, 0}, DType::F32);
    ADD_FAILURE() << "all_to_all_v did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("communicator 'expert'"), std::string::npos) << what;
    EXPECT_NE(what.find("all_to_all_v is not implemented"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// ---- GPU selection ----
// The choice (select_device: node-local rank modulo the GPUs a rank sees) and the check
// (check_gpu_sharing: the identities every rank reports), composed as the GPU backend does on a
// simulated job: each rank is (host, node-local rank, ranks on its node, the UUIDs it sees).

std::string select_error(int local_rank, int local_size, int visible) {
  try {
    select_device(local_rank, local_size, visible);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct SimRank {
  std::string host;
  int local_rank, local_size;
  std::vector<std::string> visible;  // UUIDs, in the order CUDA numbers them for this rank
};

std::vector<GpuClaim> claims_of(const std::vector<SimRank>& ranks) {
  std::vector<GpuClaim> claims;
  for (const SimRank& r : ranks) {
    const int ordinal = select_device(r.local_rank, r.local_size,
                                      static_cast<int>(r.visible.size()));
    claims.push_back({r.host, r.visible[ordinal], "", ordinal,
                      static_cast<int>(r.visible.size())});
  }
  return claims;
}

std::string sharing_error(const std::vector<SimRank>& ranks, bool nccl) {
  try {
    check_gpu_sharing(claims_of(ranks), nccl);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Node n's GPU g.
std::string uuid(int node, int gpu) {
  return "GPU-" + std::to_string(node) + std::to_string(gpu) + "000000-0000-0000-0000-000000000000";
}

TEST(comm_device_select, OneRankPerGpuIsTheIdentity) {
  for (int r = 0; r < 8; ++r) EXPECT_EQ(select_device(r, 8, 8), r);
  EXPECT_EQ(select_device(0, 1, 1), 0);
}

TEST(comm_device_select, OneVisibleGpuIsAlwaysTheOne) {
  // srun --gpus-per-task=1 / --gpu-bind=single:1 / a per-rank CUDA_VISIBLE_DEVICES.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(select_device(r, 4, 1), 0);
}

TEST(comm_device_select, SharedGpusAreRoundRobinByLocalRank) {
  // 8 ranks on 3 GPUs: 0 1 2 0 1 2 0 1 (3, 3 and 2 ranks per GPU).
  const std::vector<int> expect{0, 1, 2, 0, 1, 2, 0, 1};
  std::vector<int> got;
  for (int r = 0; r < 8; ++r) got.push_back(select_device(r, 8, 3));
  EXPECT_EQ(got, expect);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(select_device(r, 4, 2), r % 2);
}

TEST(comm_device_select, NoGpuThrows) {
  std::string e = select_error(0, 1, 0);
  EXPECT_EQ(e.rfind("no CUDA device visible to this rank", 0), 0u) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(comm_device_select, ArgumentsOutOfRangeThrow) {
  EXPECT_EQ(select_error(2, 2, 4), "select_device: node-local rank 2 is not in [0, 2)");
  EXPECT_NE(select_error(-1, 2, 4), "");
  EXPECT_NE(select_error(0, 0, 4), "");
  EXPECT_EQ(select_error(0, 1, -1), "select_device: device count -1 is negative");
}

TEST(comm_device_select, UuidFormat) {
  unsigned char b[16];
  for (int i = 0; i < 16; ++i) b[i] = static_cast<unsigned char>(0x10 * (i % 16) + i);
  EXPECT_EQ(format_gpu_uuid(b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
  unsigned char zero[16] = {};
  EXPECT_EQ(format_gpu_uuid(zero), "");
  // No UUID: the PCI bus id, qualified by the host (bus ids repeat across nodes).
  EXPECT_EQ(gpu_identity({"n1", "", "0000:17:00.0", 0, 1}), "n1/pci:0000:17:00.0");
  EXPECT_EQ(gpu_identity({"n1", "GPU-x", "0000:17:00.0", 0, 1}), "GPU-x");
}

TEST(comm_device_select, OneGpuPerTaskPassesUnderNccl) {
  // 2 nodes x 4 ranks, each rank bound to one GPU: every rank sees 1 GPU, all distinct. The old
  // count rule refused this ("4 ranks on this node but only 1 GPUs").
  std::vector<SimRank> ranks;
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 4; ++l) ranks.push_back({"node" + std::to_string(n), l, 4, {uuid(n, l)}});
  for (bool nccl : {true, false}) {
    const GpuSharing s = check_gpu_sharing(claims_of(ranks), nccl);
    EXPECT_EQ(s.gpus, 8);
    EXPECT_EQ(s.max_ranks_per_gpu, 1);
    for (int r = 0; r < 8; ++r) EXPECT_EQ(s.describe(r), "own GPU");
  }
  for (const GpuClaim& c : claims_of(ranks)) EXPECT_EQ(c.ordinal, 0);
}

TEST(comm_device_select, AllGpusVisiblePassesUnderNccl) {
  // Every rank of a node sees the node's 4 GPUs: rank l takes GPU l.
  std::vector<SimRank> ranks;
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 4; ++l)
      ranks.push_back({"node" + std::to_string(n), l, 4,
                       {uuid(n, 0), uuid(n, 1), uuid(n, 2), uuid(n, 3)}});
  const std::vector<GpuClaim> claims = claims_of(ranks);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(claims[r].ordinal, r % 4);
  const GpuSharing s = check_gpu_sharing(claims, true);
  EXPECT_EQ(s.gpus, 8);
  EXPECT_EQ(s.max_ranks_per_gpu, 1);
  // Fewer ranks than GPUs: the first ones.
  const GpuSharing two = check_gpu_sharing(
      claims_of({{"n", 0, 2, {uuid(0, 0), uuid(0, 1), uuid(0, 2)}},
                 {"n", 1, 2, {uuid(0, 0), uuid(0, 1), uuid(0, 2)}}}),
      true);
  EXPECT_EQ(two.gpus, 2);
}

TEST(comm_device_select, SharedGpusPassWithMpiStaging) {
  // 4 ranks, one GPU visible to all (the H200 check: CUDA_VISIBLE_DEVICES=0 on every rank).
  std::vector<SimRank> ranks;
  for (int l = 0; l < 4; ++l) ranks.push_back({"h200", l, 4, {uuid(0, 0)}});
  const GpuSharing s = check_gpu_sharing(claims_of(ranks), false);
  EXPECT_EQ(s.gpus, 1);
  EXPECT_EQ(s.max_ranks_per_gpu, 4);
  EXPECT_EQ(s.sharers[2], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(s.describe(2),
            "shared by ranks 0, 1, 2, 3 (parallel.comm = \"mpi\": staged through host memory)");
  // Two GPUs, 4 ranks seeing both: two per GPU.
  std::vector<SimRank> pairs;
  for (int l = 0; l < 4; ++l) pairs.push_back({"n", l, 4, {uuid(0, 0), uuid(0, 1)}});
  const GpuSharing p = check_gpu_sharing(claims_of(pairs), false);
  EXPECT_EQ(p.gpus, 2);
  EXPECT_EQ(p.sharers[1], (std::vector<int>{1, 3}));
}

TEST(comm_device_select, RealDuplicateIsRefusedUnderNcclInOneLine) {
  // Ranks 0 and 2 on one GPU, ranks 1 and 3 on another (4 ranks seeing 2 GPUs).
  std::vector<SimRank> ranks;
  for (int l = 0; l < 4; ++l) ranks.push_back({"gpu07", l, 4, {uuid(0, 0), uuid(0, 1)}});
  const std::string e = sharing_error(ranks, true);
  EXPECT_EQ(e,
            "parallel.comm = \"nccl\": ranks 0 and 2 (host gpu07) both use GPU " + uuid(0, 0) +
                ", and 1 more GPUs are shared: NCCL needs a GPU of its own for every rank; bind "
                "one GPU per rank (srun --gpus-per-task=1, --gpu-bind or CUDA_VISIBLE_DEVICES; "
                "docs/gpu.md) or use parallel.comm = \"mpi\" to share GPUs");
  EXPECT_EQ(e.find('\n'), std::string::npos);
  std::printf("NCCL refusal: %s\n", e.c_str());
  // A binding mistake: two tasks given the same GPU although each sees only one.
  const std::string bound = sharing_error(
      {{"n", 0, 3, {uuid(0, 0)}}, {"n", 1, 3, {uuid(0, 1)}}, {"n", 2, 3, {uuid(0, 1)}}}, true);
  EXPECT_EQ(bound.rfind("parallel.comm = \"nccl\": ranks 1 and 2 (host n) both use GPU " +
                            uuid(0, 1) + ": NCCL needs",
                        0),
            0u)
      << bound;
  // Three on one: "ranks 0, 1 and 2 ... all use".
  const std::string three =
      sharing_error({{"n", 0, 3, {uuid(0, 0)}}, {"n", 1, 3, {uuid(0, 0)}},
                     {"n", 2, 3, {uuid(0, 0)}}},
                    true);
  EXPECT_NE(three.find("ranks 0, 1 and 2 (host n) all use GPU"), std::string::npos) << three;
  // Without UUIDs the PCI bus id decides, per host: the same bus id on two hosts is two GPUs.
  EXPECT_NO_THROW(check_gpu_sharing(
      {{"a", "", "0000:17:00.0", 0, 1}, {"b", "", "0000:17:00.0", 0, 1}}, true));
  EXPECT_THROW(check_gpu_sharing(
                   {{"a", "", "0000:17:00.0", 0, 1}, {"a", "", "0000:17:00.0", 0, 1}}, true),
               Error);
  EXPECT_THROW(check_gpu_sharing({{"a", "", "", 0, 1}}, false), Error);  // no identity
}

TEST(comm_device_select, RanksPerNodeSimulation) {
  // parallel.ranks_per_node = 2 on ONE machine with 2 GPUs, 4 ranks: the grid gives local
  // ranks 0 1 0 1, so ranks 0 and 2 (and 1 and 3) choose the same physical GPU. The identity
  // check sees it (the UUIDs are the machine's): refused under NCCL, shared under MPI.
  std::vector<SimRank> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back({"box", r % 2, 2, {uuid(0, 0), uuid(0, 1)}});
  const std::vector<GpuClaim> claims = claims_of(ranks);
  EXPECT_EQ(claims[2].ordinal, 0);
  EXPECT_EQ(claims[3].ordinal, 1);
  EXPECT_NE(sharing_error(ranks, true).find("ranks 0 and 2 (host box) both use GPU"),
            std::string::npos);
  EXPECT_EQ(check_gpu_sharing(claims, false).max_ranks_per_gpu, 2);
  // The same simulation on a machine where each rank is bound to its own GPU: accepted.
  std::vector<SimRank> bound;
  for (int r = 0; r < 4; ++r) bound.push_back({"box", r % 2, 2, {uuid(0, r)}});
  EXPECT_EQ(check_gpu_sharing(claims_of(bound), true).gpus, 4);
}

// ---- host bf16 conversion ----

TEST(comm_bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.00390625f, 65280.0f}) {
    const float r = bf16_to_float(float_to_bf16(f));
    EXPECT_EQ(r, f) << f;
    EXPECT_EQ(std::signbit(r), std::signbit(f)) << f;
  }
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  // Every bf16 bit pattern that is not NaN converts to float and back unchanged.
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h) << h;
  }
}

TEST(comm_bf16, RoundsToNearestEven) {
  // bf16 keeps 7 fraction bits: around 1 the spacing is 2^-7 = 0.0078125.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.00390625f)), 1.0f);         // tie -> even (down)
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.01171875f)), 1.015625f);    // tie -> even (up)
  const float tie = 1.00390625f;
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::nextafter(tie, 2.0f))), 1.0078125f);  // above: up
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::nextafter(tie, 0.0f))), 1.0f);  // below: down
  EXPECT_EQ(bf16_to_float(float_to_bf16(-1.01171875f)), -1.015625f);  // symmetric in sign
  // The largest float rounds up to infinity; the largest bf16 stays.
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max())),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(float_to_bf16(bf16_to_float(0x7f7f)), 0x7f7f);
}

TEST(comm_bf16, InfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16(inf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-inf), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // A NaN whose payload is only in the low 16 bits must not become infinity.
  uint32_t bits = 0x7f800001u;
  float low_nan;
  std::memcpy(&low_nan, &bits, sizeof low_nan);
  ASSERT_TRUE(std::isnan(low_nan));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  bits = 0xffffffffu;  // all ones: the rounding carry would overflow the exponent
  std::memcpy(&low_nan, &bits, sizeof low_nan);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  EXPECT_TRUE(std::signbit(bf16_to_float(float_to_bf16(low_nan))));
}

// ---- Each rank's share of its machine's cores (grid/core_share.hpp)

// Cores [first, first + n) of a machine without SMT (each CPU a core of its own).
CoreSet cores_from(int first, int n) {
  std::vector<int> cpus(n);
  std::iota(cpus.begin(), cpus.end(), first);
  return cores_of_cpus(cpus, [](int cpu) { return cpu; });
}

// Every rank of `host` (cpus CPUs in each mask) gets the same share.
void expect_every_rank_shares(const std::vector<CoreSet>& host, int cpus, int sharers, int threads,
                              const std::string& described) {
  for (size_t r = 0; r < host.size(); ++r) {
    const CoreShare s = share_cores(host, r, cpus);
    EXPECT_EQ(s.sharers, sharers) << "rank " << r;
    EXPECT_EQ(s.threads, threads) << "rank " << r;
    EXPECT_EQ(s.describe(), described) << "rank " << r;
  }
}

TEST(comm_core_share, UnboundRanksDivideTheNodeAmongThem) {
  // mpiexec without binding: 8 ranks, each may run on all 128 cores.
  expect_every_rank_shares(std::vector<CoreSet>(8, cores_from(0, 128)), 128, 8, 16,
                           "128 cores shared by 8 ranks");
}

TEST(comm_core_share, BoundRanksKeepTheirOwnCores) {
  // srun --ntasks-per-node=8 --cpus-per-task=16 under task/affinity: rank r on cores 16r..16r+15.
  // Dividing each rank's 16 cores by the node's 8 ranks again would leave it 2 threads.
  std::vector<CoreSet> host;
  for (int r = 0; r < 8; ++r) host.push_back(cores_from(16 * r, 16));
  expect_every_rank_shares(host, 16, 1, 16, "16 cores of its own");
}

TEST(comm_core_share, RanksBoundPerSocketShareTheirSocket) {
  // mpiexec -bind-to socket, 4 ranks on 2 sockets of 64 cores: two ranks on each socket.
  expect_every_rank_shares({cores_from(0, 64), cores_from(64, 64), cores_from(0, 64),
                            cores_from(64, 64)},
                           64, 2, 32, "64 cores shared by 2 ranks");
}

TEST(comm_core_share, MoreRanksThanCoresRunOneThreadEach) {
  const std::vector<CoreSet> host(4, cores_from(0, 2));
  const CoreShare s = share_cores(host, 3, 2);
  EXPECT_EQ(s.sharers, 4);
  EXPECT_EQ(s.threads, 1);
}

TEST(comm_core_share, HyperThreadsOfOneCoreCountOnce) {
  // 4 cores with 2 hardware threads each, siblings numbered as Linux does: cpu c and c + 4.
  auto first_sibling = [](int cpu) { return cpu % 4; };
  const CoreSet all = cores_of_cpus({0, 1, 2, 3, 4, 5, 6, 7}, first_sibling);
  EXPECT_EQ(all.count(), 4);
  CoreShare s = share_cores({all}, 0, 8);
  EXPECT_EQ(s.threads, 4);
  EXPECT_EQ(s.describe(), "4 cores (8 CPUs) of its own");
  // Two ranks bound to the two hardware threads of the same cores share those cores.
  const CoreSet low = cores_of_cpus({0, 1, 2, 3}, first_sibling);
  const CoreSet high = cores_of_cpus({4, 5, 6, 7}, first_sibling);
  EXPECT_TRUE(low.overlaps(high));
  s = share_cores({low, high}, 1, 4);
  EXPECT_EQ(s.sharers, 2);
  EXPECT_EQ(s.threads, 2);
}

TEST(comm_core_share, SetsHoldCoresUpToTheLastCpuId) {
  CoreSet s;
  for (int core : {0, 63, 64, kMaxCpus - 1, kMaxCpus, -1}) s.add(core);
  EXPECT_EQ(s.count(), 4);
  EXPECT_TRUE(s.has(63) && s.has(64) && s.has(kMaxCpus - 1));
  EXPECT_FALSE(s.has(1) || s.has(kMaxCpus) || s.has(-1));
  CoreSet other;
  other.add(kMaxCpus - 1);
  EXPECT_TRUE(s.overlaps(other));
  EXPECT_FALSE(other.overlaps(cores_from(0, 64)));
}

TEST(comm_core_share, ThisProcessRunsOnTheCoresOfItsMask) {
  const ProcessCpus mine = this_process_cpus();
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  EXPECT_EQ(mine.cpus, CPU_COUNT(&mask));
  EXPECT_GE(mine.cores.count(), 1);
  EXPECT_LE(mine.cores.count(), mine.cpus);
}

}  // namespace
}  // namespace trident

// Dataset blends (lib/data/blend.hpp, docs/data.md "Blends"): the entry syntax, Megatron's
// blending rule, its realised shares, the per-dataset orders, and the Python re-implementation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "data/blend.hpp"
#include "expect_error.hpp"
#include "run_util.hpp"
#include "temp_dir.hpp"
#include "util/error.hpp"

using trident::BatchSampler;
using trident::BlendComponent;
using trident::BlendedDataset;
using trident::BlendedSampler;
using trident::BlendSchedule;
using trident::Error;
using trident::normalised_weights;
using trident::parse_blend;
using trident::test::error_of;
using trident::test::expect_one_line_with;

namespace {

// An independent re-implementation of Megatron's build_blending_indices (not sharing code).
std::vector<int> reference_choices(const std::vector<double>& w, int64_t n) {
  std::vector<int64_t> count(w.size(), 0);
  std::vector<int> out;
  for (int64_t p = 0; p < n; ++p) {
    const double x = std::max(static_cast<double>(p), 1.0);
    int best = 0;
    for (size_t d = 1; d < w.size(); ++d) {
      const volatile double e = w[d] * x;  // no fused multiply-add: two roundings
      const volatile double b = w[static_cast<size_t>(best)] * x;
      if (e - static_cast<double>(count[d]) >
          b - static_cast<double>(count[static_cast<size_t>(best)]))
        best = static_cast<int>(d);
    }
    out.push_back(best);
    ++count[static_cast<size_t>(best)];
  }
  return out;
}

}  // namespace

TEST(BlendParse, EntriesWeightsAndThePlainForm) {
  auto c = parse_blend({"0.7:data/web/part", "0.3:data/code/train_*.bin"}, "data.train");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].weight, 0.7);
  EXPECT_EQ(c[0].source, "data/web/part");
  EXPECT_EQ(c[1].source, "data/code/train_*.bin");
  const auto w = normalised_weights(c);
  EXPECT_DOUBLE_EQ(w[0] + w[1], 1.0);
  EXPECT_EQ(w[0], 0.7 / (0.7 + 0.3));
  // A single entry without a weight is today's plain form, weight 1; a colon later in the path
  // is part of it.
  c = parse_blend({"data/a:b/x_*.bin"}, "data.train");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].source, "data/a:b/x_*.bin");
  EXPECT_EQ(c[0].weight, 1.0);
  c = parse_blend({"3:x.bin"}, "data.train");
  EXPECT_EQ(c[0].source, "x.bin");
  EXPECT_EQ(normalised_weights(c), std::vector<double>{1.0});
  EXPECT_TRUE(parse_blend({}, "data.val").empty());
  c = parse_blend({"2:a", "1e-3:b", "5:c:d"}, "data.train");
  EXPECT_EQ(c[1].weight, 1e-3);
  EXPECT_EQ(c[2].source, "c:d");
}

TEST(BlendParse, BadEntriesNameTheKeyAndTheEntry) {
  struct Case {
    std::vector<std::string> entries;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"0.7:a", "b"}, "data.train[1] = \"b\": expected WEIGHT:PATH"},
      {{"0.7:a", "x:b"}, "data.train[1] = \"x:b\": expected WEIGHT:PATH"},
      {{"0:a", "1:b"}, "data.train[0] = \"0:a\": the weight must be > 0"},
      {{"-1:a", "1:b"}, "data.train[0] = \"-1:a\": the weight must be > 0"},
      {{"1:a", "inf:b"}, "data.train[1] = \"inf:b\": the weight is not a finite number"},
      {{"1:a", "nan:b"}, "data.train[1] = \"nan:b\": the weight is not a finite number"},
      {{"1:a", "1e999:b"}, "data.train[1] = \"1e999:b\": the weight is not a finite number"},
      {{"1:a", "2:"}, "data.train[1] = \"2:\": no dataset after the weight"},
      {{"1:a", "2:a"}, "data.train[1] = \"2:a\": the dataset 'a' is already in the blend"},
      {{"1:a", " 2:b"}, "data.train[1] = \" 2:b\": expected WEIGHT:PATH"},
      {{""}, "data.train[0] = \"\": empty entry"},
  };
  for (const Case& c : cases)
    expect_one_line_with(error_of([&] { parse_blend(c.entries, "data.train"); }), {c.want});
  expect_one_line_with(error_of([&] { parse_blend({"1e308:a", "1e308:b"}, "data.val"); }),
                       {"data.val: the weights' sum overflows a double"});
}

// Megatron's greedy rule keeps every dataset within one sample of its share from above:
// e_d(n) = w_d n - c_d(n) > -1 for all d and n. Proof: e_d(0) = 0. A dataset not chosen at
// position p gains w_d > 0. The chosen one has the largest w_d max(p,1) - c_d(p); for p >= 1
// these errors sum to 0 (sum w = 1, sum c = p), so the largest is >= 0 and after the draw
// e_d(p+1) = (that error) + w_d - 1 > -1; at p = 0 every error is w_d > 0. Hence
// c_d - w_d n < 1; and as the e_d sum to 0, e_d < (K - 1) * 1: the bound from below is K - 1
// (1 for two datasets, where e_0 = -e_1). Asserted with a small slack for the rounding of the
// normalised weights (|sum w - 1| <= K ulp, times n <= 10^4).
TEST(BlendSchedule, RealisedSharesStayWithinTheProvenBoundOver10000Samples) {
  const std::vector<std::vector<double>> blends = {
      {0.7, 0.3}, {1, 1}, {0.5, 0.25, 0.25}, {0.6, 0.3, 0.1}, {1, 2, 3, 4, 5},
      {0.999, 0.001}, {1.0 / 3, 1.0 / 3, 1.0 / 3}, {0.2, 0.8}};
  constexpr int64_t kSamples = 10000;
  for (const auto& raw : blends) {
    std::vector<BlendComponent> comps;
    for (size_t d = 0; d < raw.size(); ++d) comps.push_back({raw[d], "d" + std::to_string(d)});
    const std::vector<double> w = normalised_weights(comps);
    const double K = static_cast<double>(w.size());
    BlendSchedule schedule(w, 64);
    std::vector<int64_t> counts(w.size(), 0);
    double worst_above = 0, worst_below = 0;
    int64_t compared = 0;
    for (int64_t p = 0; p < kSamples; ++p) {
      const auto draw = schedule.draw(p);
      ASSERT_EQ(draw.index, counts[static_cast<size_t>(draw.dataset)]);  // its own k-th sample
      ++counts[static_cast<size_t>(draw.dataset)];
      for (size_t d = 0; d < w.size(); ++d) {
        const double e = w[d] * static_cast<double>(p + 1) - static_cast<double>(counts[d]);
        worst_above = std::max(worst_above, -e);
        worst_below = std::max(worst_below, e);
        ++compared;
      }
    }
    EXPECT_LT(worst_above, 1.0 + 1e-9) << "weights " << ::testing::PrintToString(raw);
    EXPECT_LT(worst_below, K - 1 + 1e-9) << "weights " << ::testing::PrintToString(raw);
    if (w.size() == 2) {
      EXPECT_LT(worst_below, 1.0 + 1e-9);
    }
    EXPECT_EQ(compared, kSamples * static_cast<int64_t>(w.size()));
    EXPECT_EQ(schedule.counts_before(kSamples), counts);
    std::printf("[ blend    ] weights %s: max over n <= %lld of c_d - w_d n = %.4f, "
                "w_d n - c_d = %.4f (proved: < 1 and < K-1 = %.0f)\n",
                ::testing::PrintToString(raw).c_str(), static_cast<long long>(kSamples),
                worst_above, worst_below, K - 1);
  }
}

TEST(BlendSchedule, IsMegatronsRuleAndIndependentOfTheQueryOrder) {
  const std::vector<double> w = {0.5, 0.3, 0.2};
  const auto want = reference_choices(w, 5000);
  BlendSchedule in_order(w, 16);
  std::vector<int64_t> counts(3, 0);
  for (int64_t p = 0; p < 5000; ++p) {
    const auto d = in_order.draw(p);
    ASSERT_EQ(d.dataset, want[static_cast<size_t>(p)]) << "position " << p;
    ASSERT_EQ(d.index, counts[static_cast<size_t>(d.dataset)]);
    ++counts[static_cast<size_t>(d.dataset)];
  }
  // Megatron's first draws for 0.7/0.3: 0, 1 (max(p,1) = 1 at p = 0 and 1), 0, 0, 1, ...
  EXPECT_EQ(reference_choices({0.7, 0.3}, 5), (std::vector<int>{0, 1, 0, 0, 1}));
  // Random access (a resumed run, another rank's block, going back) gives the same draws.
  BlendSchedule jumping(w, 16);
  int64_t checked = 0;
  for (int64_t p : {4999, 17, 16, 15, 4000, 4001, 0, 2500, 2499, 3}) {
    std::vector<int64_t> before(3, 0);
    for (int64_t q = 0; q < p; ++q) ++before[static_cast<size_t>(want[static_cast<size_t>(q)])];
    const auto d = jumping.draw(p);
    EXPECT_EQ(d.dataset, want[static_cast<size_t>(p)]) << "position " << p;
    EXPECT_EQ(d.index, before[static_cast<size_t>(d.dataset)]) << "position " << p;
    EXPECT_EQ(jumping.counts_before(p), before);
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

// One dataset is the unblended order exactly (so a plain data.train and old checkpoints keep
// their order); dataset d of a blend follows BatchSampler with blend_dataset_seed(seed, d).
TEST(BlendedSampler, OneDatasetIsTheUnblendedOrderAndEachDatasetKeepsItsOwnOrder) {
  for (bool shuffle : {false, true}) {
    BlendedSampler one({37}, {1.0}, 8, shuffle, 1234);
    BatchSampler plain(37, 8, shuffle, 1234);
    for (int64_t step = 0; step < 20; ++step)
      for (int64_t i = 0; i < 8; ++i) {
        const auto s = one.sample(step, i);
        EXPECT_EQ(s.dataset, 0);
        EXPECT_EQ(s.window, plain.window_id(step, i));
      }
  }
  EXPECT_EQ(trident::blend_dataset_seed(1234, 0), 1234u);
  EXPECT_EQ(trident::blend_dataset_seed(1234, 1), 1234u ^ 0xD1B54A32D192ED03ULL);
  const std::vector<int64_t> windows = {13, 7, 29};
  const std::vector<double> w = {0.5, 0.2, 0.3};
  BlendedSampler blend(windows, w, 6, true, 99);
  std::vector<BatchSampler> own;
  for (size_t d = 0; d < 3; ++d)
    own.emplace_back(windows[d], 1, true, trident::blend_dataset_seed(99, static_cast<int64_t>(d)));
  const auto choices = reference_choices(w, 600);
  std::vector<int64_t> k(3, 0);
  for (int64_t p = 0; p < 600; ++p) {
    const auto s = blend.sample(p / 6, p % 6);
    const auto d = static_cast<size_t>(choices[static_cast<size_t>(p)]);
    ASSERT_EQ(s.dataset, static_cast<int64_t>(d));
    ASSERT_EQ(s.window, own[d].window_at(k[d]++)) << "position " << p;
  }
  EXPECT_EQ(k[0] + k[1] + k[2], 600);
}

// docs/data.md's check values (computed there from the spec by data_tools/inspect_shard.py).
TEST(BlendedSampler, KnownAnswers) {
  BlendedSampler s({10, 5}, {0.7, 0.3}, 8, true, 1234);
  const std::vector<std::string> want = {"0:4 1:2 0:6 0:5 1:1 0:2 0:7 1:4",
                                         "0:0 0:1 0:8 1:3 0:9 0:3 1:0 0:4"};
  for (int64_t step = 0; step < 2; ++step) {
    std::string got;
    for (int64_t i = 0; i < 8; ++i) {
      const auto x = s.sample(step, i);
      got += (i ? " " : "") + std::to_string(x.dataset) + ":" + std::to_string(x.window);
    }
    EXPECT_EQ(got, want[static_cast<size_t>(step)]) << "step " << step;
  }
}

// The resume cost the header states: positions are advanced one by one, O(K) each.
TEST(BlendSchedule, ResumeAtALateStepIsCheap) {
  const int64_t late = int64_t{50} * 1000 * 1000;  // e.g. step 97 656 at global_batch 512
  BlendSchedule schedule({0.7, 0.3}, 512);
  const auto t0 = std::chrono::steady_clock::now();
  const auto counts = schedule.counts_before(late);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ blend    ] resume at position %lld (K = 2): %.3f s, %.2f ns per position\n",
              static_cast<long long>(late), seconds, 1e9 * seconds / static_cast<double>(late));
  EXPECT_LE(std::llabs(counts[0] - 35000000), 1);
  EXPECT_EQ(counts[0] + counts[1], late);
  EXPECT_LT(seconds, 10.0);  // generous: a loaded 2-core machine
}

TEST(BlendedDataset, ReadsEachSampleFromItsDataset) {
  trident::test::TempDir dir("trident_blend");
  std::vector<uint16_t> a(81), b(41);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i % 50);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(100 + i % 50);
  trident::write_shard(dir.file("a.bin"), a);
  trident::write_indexed_dataset(dir.file("b"), {std::vector<int32_t>(b.begin(), b.end())},
                                 trident::kIndexDTypeUInt16);
  const auto comps = parse_blend({"3:" + dir.file("a.bin"), "1:" + dir.file("b")}, "data.train");
  BlendedDataset data(comps, 8, 256, 4, true, 5);
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data.dataset(0).num_windows(), 10);
  EXPECT_EQ(data.dataset(1).num_windows(), 5);
  std::vector<int32_t> in(8), tg(8);
  int64_t from_b = 0;
  for (int64_t step = 0; step < 10; ++step)
    for (int64_t i = 0; i < 4; ++i) {
      data.window(step, i, in.data(), tg.data());
      const auto s = data.sampler().sample(step, i);
      EXPECT_EQ(in[0], s.dataset == 0 ? (s.window * 8) % 50 : 100 + (s.window * 8) % 50);
      from_b += s.dataset;
    }
  EXPECT_EQ(from_b, 10);  // a quarter of 40
  EXPECT_EQ(data.describe_counts(40),
            "[0] 30 (75.00%, target 75.00%), [1] 10 (25.00%, target 25.00%)");
  EXPECT_NE(data.describe("data.train").find("data.train [1] '" + dir.file("b") +
                                             "': weight 1, share 25.00%, 5 windows"),
            std::string::npos)
      << data.describe("data.train");
}

// data_tools/inspect_shard.py --order --weights reproduces BlendedSampler exactly.
TEST(BlendedSampler, MatchesPythonInspectShard) {
  const char* python = "/usr/bin/python3";
  const std::string tool = std::string(TRIDENT_SOURCE_DIR) + "/data_tools/inspect_shard.py";
  if (::access(python, X_OK) != 0 || ::access(tool.c_str(), R_OK) != 0)
    GTEST_SKIP() << "needs " << python << " and " << tool;
  struct Case {
    std::vector<std::string> weights;
    std::vector<int64_t> windows;
    int64_t G, start, steps;
    bool shuffle;
    uint64_t seed;
    std::string seed_arg;
  };
  const std::vector<Case> cases = {
      {{"0.7", "0.3"}, {10, 5}, 8, 0, 12, true, 1234, "1234"},
      {{"1", "1", "1"}, {7, 11, 13}, 6, 3, 15, true, 7, "7"},  // ties every few positions
      {{"0.5", "0.25", "0.125", "0.125"}, {97, 3, 50, 20}, 16, 40, 10, true,
       0xFFFFFFFFFFFFFFFFULL, "-1"},
      {{"2", "1e-2"}, {40, 40}, 10, 0, 30, false, 1, "1"},
      {{"1"}, {37}, 8, 5, 5, true, 42, "42"},
  };
  int64_t compared = 0;
  for (const Case& c : cases) {
    std::string cmd = std::string(python) + " " + tool + " --order --weights";
    for (const auto& w : c.weights) cmd += " " + w;
    cmd += " --num-windows";
    for (int64_t n : c.windows) cmd += " " + std::to_string(n);
    cmd += " --global-batch " + std::to_string(c.G) + " --start-step " + std::to_string(c.start) +
           " --steps " + std::to_string(c.steps) + " --seed " + c.seed_arg +
           (c.shuffle ? " --shuffle" : "");
    auto [status, out] = trident::test::run_command(cmd, 120, /*merge_stderr=*/false);
    ASSERT_EQ(status, 0) << cmd << "\n" << out;
    std::vector<BlendComponent> comps;
    for (size_t d = 0; d < c.weights.size(); ++d)
      comps.push_back({std::stod(c.weights[d]), "d" + std::to_string(d)});
    BlendedSampler sampler(c.windows, normalised_weights(comps), c.G, c.shuffle, c.seed);
    std::istringstream lines(out);
    std::string line;
    int64_t step = c.start;
    while (std::getline(lines, line)) {
      std::string want = "step " + std::to_string(step) + ":";
      for (int64_t i = 0; i < c.G; ++i) {
        const auto s = sampler.sample(step, i);
        want += " " + std::to_string(s.dataset) + ":" + std::to_string(s.window);
        ++compared;
      }
      EXPECT_EQ(line, want) << cmd;
      ++step;
    }
    EXPECT_EQ(step, c.start + c.steps) << cmd << "\n" << out;
  }
  EXPECT_EQ(compared, 8 * 12 + 6 * 15 + 16 * 10 + 10 * 30 + 8 * 5);
}

// The divergence guard's verdicts and the skip list's step -> batch mapping, without a model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "expect_error.hpp"
#include "train/divergence_guard.hpp"
#include "train/rollback_plan.hpp"

using namespace trident;

TEST(DivergenceGuard, NonFiniteNormIsBadWhateverTheSettings) {
  const DivergenceGuard off({0, 4, 0});
  EXPECT_TRUE(off.is_bad(2.0, std::numeric_limits<double>::quiet_NaN()));
  EXPECT_TRUE(off.is_bad(2.0, std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(off.is_bad(1e9, 1.0)) << "spike_factor 0: losses are not checked";
}

TEST(DivergenceGuard, SpikeAgainstTheMedianOfAFullWindow) {
  DivergenceGuard g({3.0, 4, 2});
  for (double loss : {5.0, 4.0, 6.0}) {
    EXPECT_FALSE(g.is_bad(1000.0, 1.0)) << "window not full yet: no reference";
    g.record(loss, false);
  }
  g.record(5.5, false);
  EXPECT_DOUBLE_EQ(g.median(), 5.25);  // of 4, 5, 5.5, 6
  EXPECT_FALSE(g.is_bad(15.75, 1.0)) << "equal to 3 x the median is not above it";
  EXPECT_TRUE(g.is_bad(15.76, 1.0));
  EXPECT_TRUE(g.is_bad(std::numeric_limits<double>::quiet_NaN(), 1.0));
  // The window slides over good steps only: the oldest (5) leaves.
  g.record(2.0, false);
  EXPECT_DOUBLE_EQ(g.median(), 4.75);  // of 2, 4, 5.5, 6
}

TEST(DivergenceGuard, ConsecutiveBadStepsAskForARollback) {
  DivergenceGuard g({3.0, 1, 2});
  g.record(1.0, true);
  EXPECT_FALSE(g.rollback_due());
  g.record(1.0, false);  // a good step ends the streak
  EXPECT_EQ(g.bad_streak(), 0);
  g.record(1.0, true);
  g.record(1.0, true);
  EXPECT_TRUE(g.rollback_due());
  g.clear_streak();
  EXPECT_FALSE(g.rollback_due());
  DivergenceGuard never({3.0, 1, 0});
  for (int i = 0; i < 100; ++i) never.record(1.0, true);
  EXPECT_FALSE(never.rollback_due()) << "max_bad_steps 0: no rollback";
}

TEST(SkipList, StepReadsTheStepthBatchNotSkipped) {
  const std::vector<int64_t> none, skips = {0, 7, 8, 20};
  for (int64_t s = 0; s < 30; ++s) EXPECT_EQ(batch_of_step(s, none), s);
  const int64_t expected[] = {1, 2, 3, 4, 5, 6, 9, 10};  // steps 0..7
  for (int64_t s = 0; s < 8; ++s) EXPECT_EQ(batch_of_step(s, skips), expected[s]) << s;
  EXPECT_EQ(batch_of_step(16, skips), 19);
  EXPECT_EQ(batch_of_step(17, skips), 21);
  // Every batch is read once, and never a skipped one.
  std::vector<int64_t> read;
  for (int64_t s = 0; s < 26; ++s) read.push_back(batch_of_step(s, skips));
  for (size_t i = 1; i < read.size(); ++i) EXPECT_LT(read[i - 1], read[i]);
  for (int64_t b : read)
    EXPECT_EQ(std::count(skips.begin(), skips.end(), b), 0) << "batch " << b;
  EXPECT_EQ(read.back(), 29);
}

TEST(SkipList, MergeBelowTextAndParse) {
  EXPECT_EQ(merged_skip_list({8, 3}, {3, 1}), (std::vector<int64_t>{1, 3, 8}));
  EXPECT_EQ(skips_below({1, 3, 8}, 3), (std::vector<int64_t>{1}));
  EXPECT_EQ(skip_list_text({}), "[]");
  EXPECT_EQ(skip_list_text({7, 8}), "[7, 8]");
  EXPECT_EQ(parse_skip_list("[]", "x"), std::vector<int64_t>{});
  EXPECT_EQ(parse_skip_list("[8, 7,7]", "x"), (std::vector<int64_t>{7, 8}));
  for (const char* bad : {"", "7", "[", "[-1]", "[1,]", "[1 2]", "[a]", "[99999999999999999999]"})
    trident::test::expect_one_line_with(
        trident::test::error_of([&] { parse_skip_list(bad, "skipped_batches"); }),
        {"skipped_batches = \"" + std::string(bad) +
         "\" is not a list of non-negative integers like [7, 8]"});
  // The text comes from a file: control characters are escaped and a long text is cut, so the
  // error stays one line (found by fuzz_checkpoint: a skipped_batches attribute with a newline).
  trident::test::expect_one_line_with(
      trident::test::error_of([&] { parse_skip_list("[7,\n8x]", "skipped_batches"); }),
      {"skipped_batches = \"[7,\\n8x]\" is not a list"});
  trident::test::expect_one_line_with(
      trident::test::error_of([&] { parse_skip_list("[" + std::string(200, '1'), "s"); }),
      {"(cut) is not a list"});
}

// The guard's state a checkpoint carries (issue 56, item 8): restored, the window checks the
// first step after a resume; a longer recorded window keeps its newest losses; a streak goes
// on counting.
TEST(DivergenceGuard, RestoredWindowChecksTheFirstStep) {
  DivergenceGuard before({3.0, 4, 3});
  for (double loss : {5.0, 4.0, 6.0, 5.5}) before.record(loss, false);
  before.record(100.0, true);
  DivergenceGuard resumed({3.0, 3, 3});
  EXPECT_FALSE(resumed.is_bad(1000.0, 1.0)) << "an empty window: no reference";
  resumed.restore(before.losses(), before.bad_streak());
  EXPECT_EQ(resumed.losses(), (std::vector<double>{4.0, 6.0, 5.5}));
  EXPECT_TRUE(resumed.is_bad(1000.0, 1.0));
  EXPECT_EQ(resumed.bad_streak(), 1);
  resumed.record(1000.0, true);
  resumed.record(1000.0, true);
  EXPECT_TRUE(resumed.rollback_due());
}

TEST(DivergenceGuard, NonFiniteLossNeverEntersTheWindow) {
  DivergenceGuard off({0, 2, 0});  // spike_factor 0: such a step is not bad, yet no reference
  off.record(std::numeric_limits<double>::quiet_NaN(), false);
  off.record(std::numeric_limits<double>::infinity(), false);
  off.record(2.0, false);
  EXPECT_EQ(off.losses(), std::vector<double>{2.0});
}

TEST(LossList, TextRoundTripsAndBadTextIsOneLine) {
  const std::vector<double> losses = {3.9155480000000001, 0.1, 1e-300, 4.0};
  EXPECT_EQ(parse_loss_list(loss_list_text(losses), "x"), losses);
  EXPECT_EQ(parse_loss_list("[]", "x"), std::vector<double>{});
  for (const char* bad : {"", "[", "[1,]", "[a]", "[null]", "[true]", "{}", "[1e999]", "3"})
    trident::test::expect_one_line_with(
        trident::test::error_of([&] { parse_loss_list(bad, "guard_losses"); }),
        {"guard_losses = \"" + std::string(bad) +
         "\" is not a list of finite numbers like [3.25, 3.5]"});
}

// The rollback's decisions (train/rollback_plan.hpp): the streak's batches through the skip
// list, the newest step it may go back to, and the pass-over of a checkpoint that led straight
// into bad steps again.
TEST(RollbackPlan, TargetStepBatchesAndPassOver) {
  const std::vector<int64_t> skipped = {3};  // batch 3 already left out
  const auto batch_of = [&](int64_t s) { return batch_of_step(s, skipped); };
  const RollbackPlan p = plan_rollback(/*step=*/9, /*streak=*/3, /*rolled_back_to=*/-1, 3, batch_of);
  EXPECT_EQ(p.first_bad, 7);
  EXPECT_EQ(p.max_step, 7);
  EXPECT_FALSE(p.passes_over);
  EXPECT_EQ(p.bad_batches, (std::vector<int64_t>{8, 9, 10}));
  EXPECT_EQ(p.what, "3 bad steps in a row (steps 8 to 10, global batches [8, 9, 10]; "
                    "train.max_bad_steps = 3)");
  EXPECT_EQ(rollback_refusal(p, 0, 2, "ck/step_00000007.h5", "ck"), "");
  EXPECT_EQ(rollback_refusal(p, 2, 2, "ck/step_00000007.h5", "ck"),
            "train.max_rollbacks = 2 rollbacks taken");
  EXPECT_EQ(rollback_refusal(p, 0, 2, "", "ck"),
            "no committed checkpoint in checkpoint.dir 'ck' at or before step 7");
  // The streak began where the last rollback went back to: that checkpoint is passed over.
  const RollbackPlan again = plan_rollback(9, 3, 7, 3, batch_of);
  EXPECT_TRUE(again.passes_over);
  EXPECT_EQ(again.max_step, 6);
  EXPECT_EQ(rollback_refusal(again, 0, 2, "", "ck"),
            "no committed checkpoint in checkpoint.dir 'ck' at or before step 6; passed over "
            "step 7, whose first step was bad again after the last rollback to it");
  EXPECT_EQ(rollback_line(again, 1, 2, "ck/step_00000005.h5", 5),
            "rollback 1 of at most 2: " + again.what +
                "; back to ck/step_00000005.h5 (step 5; passed over step 7, whose first step "
                "was bad again after the last rollback to it), skipping global batches "
                "[8, 9, 10] from now on");
  EXPECT_EQ(diverged_record(p, "r", 1, "").count("rollback_save"), 0u);
  EXPECT_EQ(diverged_record(p, "r", 1, "ck/step_00000007.h5")["rollback_save"],
            "ck/step_00000007.h5");
}

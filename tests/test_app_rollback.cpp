// The divergence guard through the trident binary on one rank: a loss spike (test-only
// TRIDENT_TEST_CORRUPT_BATCHES) rolls the run back to its last checkpoint, with one log line
// and one metrics.jsonl record, and the run completes; with no rollback left it ends with exit
// code 77 after one line and one record; a rollback needs checkpoint.dir.
#include <gtest/gtest.h>

#include <map>

#include "app_fixture.hpp"

using namespace trident::test;
namespace fs = std::filesystem;

namespace {

class Rollback : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = make_tiny_run(dir_);
  }
  RunResult train(const std::string& sets) const {
    return run_command("TRIDENT_TEST_CORRUPT_BATCHES=7,8 " +
                           trident_cmd("train --config " + config_.string() +
                                       " --set train.steps=12 --set eval.interval=0"
                                       " --set train.spike_factor=3 --set train.spike_window=4"
                                       " --set train.max_bad_steps=2 --set checkpoint.interval=2"
                                       " --set log.dir=" + (dir_ / "run").string() + " " + sets),
                       120);
  }
  std::vector<nlohmann::json> events() const {
    std::vector<nlohmann::json> out;
    for (const auto& row : read_metrics(dir_ / "run"))
      if (row.contains("event")) out.push_back(row);
    return out;
  }
  std::string ckpt() const { return "--set checkpoint.dir=" + (dir_ / "ckpt").string(); }
  fs::path dir_, config_;
};

}  // namespace

TEST_F(Rollback, SpikeRollsBackAndTheRunCompletes) {
  const auto r = train(ckpt());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rollback 1 of at most 3: 2 bad steps in a row (steps 8 to 9, global "
                          "batches [7, 8]; train.max_bad_steps = 2); back to " +
                          (dir_ / "ckpt" / "step_00000006.h5").string() +
                          " (step 6), skipping global batches [7, 8] from now on"),
            std::string::npos)
      << r.output;
  const auto ev = events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["type"], "event");
  EXPECT_EQ(ev[0]["event"], "rollback");
  EXPECT_EQ(ev[0]["step"], 9);
  EXPECT_EQ(ev[0]["to_step"], 6);
  EXPECT_EQ(ev[0]["bad_batches"], nlohmann::json({7, 8}));
  EXPECT_EQ(ev[0]["rollbacks"], 1);
  EXPECT_EQ(read_metrics(dir_ / "run").back()["step"], 12);
  EXPECT_EQ(read_metrics(dir_ / "run").back()["skipped_steps"], 0);
}

TEST_F(Rollback, NoRollbackLeftExits77) {
  const auto r = train(ckpt() + " --set train.max_rollbacks=0");
  EXPECT_EQ(r.exit_code, 77) << r.output;
  EXPECT_NE(r.output.find("training diverged: 2 bad steps in a row (steps 8 to 9, global "
                          "batches [7, 8]; train.max_bad_steps = 2), and no rollback: "
                          "train.max_rollbacks = 0 rollbacks taken; exit code 77"),
            std::string::npos)
      << r.output;
  const auto ev = events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["event"], "diverged");
  // No checkpoint yet when the spike comes: the same exit, naming why.
  const auto none = train(ckpt() + "2 --set checkpoint.interval=100");
  EXPECT_EQ(none.exit_code, 77) << none.output;
  EXPECT_NE(none.output.find("and no rollback: no committed checkpoint in checkpoint.dir"),
            std::string::npos)
      << none.output;
}

TEST_F(Rollback, NeedsACheckpointDir) {
  const auto r = train("");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train.max_bad_steps rolls back to the last checkpoint, which needs "
                          "checkpoint.dir (empty: nothing to roll back to)"),
            std::string::npos)
      << r.output;
}

TEST_F(Rollback, ResumeRefusesASkipBelowTheCheckpointsPosition) {
  // A run that rolled back (skip list [7, 8], checkpoint of step 12 at batch 14) resumes with
  // skips above its position, but not with one below it: that would change what the steps
  // before the checkpoint read.
  ASSERT_EQ(train(ckpt()).exit_code, 0);
  const auto ok = train(ckpt() + " --set train.steps=14 --set train.skip_batches=[20] "
                        "--resume auto");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const auto refused = train(ckpt() + " --set train.steps=16 --set train.skip_batches=[3] "
                             "--resume auto");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("step_00000014.h5' is at global batch 16 with skipped_batches "
                                "[7, 8, 20], but train.skip_batches in " + config_.string() +
                                " skips [3, 7, 8] below it: resuming would not continue where "
                                "it stopped; set checkpoint.allow_data_change = true to resume "
                                "anyway"),
            std::string::npos)
      << refused.output;
}

TEST_F(Rollback, LearningRateScaledPerRollback) {
  // train.rollback_lr_scale = 0.5: the steps after the rollback train at half the schedule's
  // rate; the same steps before it (7 and 8, replayed from the checkpoint of step 6) at the
  // full rate.
  ASSERT_EQ(train(ckpt() + " --set train.rollback_lr_scale=0.5").exit_code, 0);
  std::map<int64_t, std::vector<double>> lr_by_step;
  for (const auto& row : read_metrics(dir_ / "run"))
    if (!row.contains("event")) lr_by_step[row["step"].get<int64_t>()].push_back(row["lr"]);
  int compared = 0;
  for (int64_t step : {7, 8}) {
    ASSERT_EQ(lr_by_step[step].size(), 2u) << "step " << step << " before and after";
    EXPECT_EQ(lr_by_step[step][1], 0.5 * lr_by_step[step][0]) << "step " << step;
    ++compared;
  }
  EXPECT_EQ(compared, 2);
}

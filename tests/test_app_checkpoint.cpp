// Checkpoints through the trident binary: resume is bitwise on one rank, a job killed while
// writing leaves the previous checkpoint selected, corruption and bad files are reported
// naming the file (and dataset), and outside tools (h5py) read the global datasets.
#include <gtest/gtest.h>

#include <fstream>

#include "app_fixture.hpp"

using namespace trident::test;
namespace fs = std::filesystem;

namespace {

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = make_tiny_run(dir_);
  }
  std::string train(const std::string& extra, const std::string& env = "") const {
    return env + " " + trident_cmd("train --config " + config_.string() +
                                   " --set train.steps=20 --set eval.interval=0 "
                                   "--set checkpoint.dir=" + (dir_ / "ckpt").string() + " " +
                                   extra);
  }
  std::vector<std::string> losses(const fs::path& run) const {
    std::vector<std::string> out;
    for (const auto& row : read_metrics(run)) out.push_back(row["loss"].dump());
    return out;
  }
  fs::path checkpoint(int step) const {
    char name[64];
    std::snprintf(name, sizeof name, "step_%08d.h5", step);
    return dir_ / "ckpt" / name;
  }
  void expect_error(const RunResult& r, const std::string& needle) const {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_LT(r.exit_code, 124) << r.output;
    const auto pos = r.output.find("trident: error: ");
    ASSERT_NE(pos, std::string::npos) << r.output;
    const std::string line = r.output.substr(pos, r.output.find('\n', pos) - pos);
    EXPECT_NE(line.find(needle), std::string::npos) << line;
  }
  fs::path dir_, config_;
};

}  // namespace

TEST_F(Checkpoint, ResumeOnOneRankIsBitwiseIdentical) {
  auto r = run_command(train("--set checkpoint.dir= --set log.dir=" + (dir_ / "a").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 10 steps, checkpoint, exit 75 ("please requeue"); then resume and train on.
  r = run_command(train("--set train.exit_interval=10 --set log.dir=" + (dir_ / "b").string() +
                        " --resume auto"));
  ASSERT_EQ(r.exit_code, 75) << r.output;
  EXPECT_TRUE(fs::exists(checkpoint(10)));
  r = run_command(train("--set log.dir=" + (dir_ / "b").string() + " --resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + checkpoint(10).string() + " at step 10"),
            std::string::npos) << r.output;
  EXPECT_EQ(losses(dir_ / "a").size(), 20u);
  EXPECT_EQ(losses(dir_ / "a"), losses(dir_ / "b"));
}

TEST_F(Checkpoint, KilledWhileWritingLeavesThePreviousOneSelected) {
  // Checkpoint every 5 steps, each dataset write slowed down; SIGKILL the job as soon as the
  // second checkpoint's temporary file appears.
  const std::string run = train("--set checkpoint.interval=5 --set log.dir=" +
                                    (dir_ / "run").string(),
                                "TRIDENT_TEST_SLOW_CHECKPOINT_MS=40");
  const std::string ck = (dir_ / "ckpt").string();
  const auto r = run_command(
      "( " + run + " > " + (dir_ / "log").string() + " 2>&1 & echo $! > " +
          (dir_ / "pid").string() + " ); "
          "for i in $(seq 600); do "
          "  if [ -f " + checkpoint(5).string() + " ] && ls " + ck + "/step_00000010.h5.tmp* "
          "     >/dev/null 2>&1; then kill -9 $(cat " + (dir_ / "pid").string() + "); echo killed; break; fi; "
          "  sleep 0.05; done; sleep 0.5; ls " + ck,
      90);
  ASSERT_NE(r.output.find("killed"), std::string::npos) << r.output << read_file(dir_ / "log");
  EXPECT_NE(r.output.find(".tmp"), std::string::npos) << "a partial file stays behind";
  EXPECT_FALSE(fs::exists(checkpoint(10)));
  EXPECT_EQ(read_file(dir_ / "ckpt" / "latest"), "step_00000005.h5\n");
  const auto resumed = run_command(train("--set log.dir=" + (dir_ / "run2").string() +
                                         " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 5"), std::string::npos) << resumed.output;
  EXPECT_EQ(read_metrics(dir_ / "run2").back()["step"], 20);
}

TEST_F(Checkpoint, OutsideToolsReadTheGlobalDatasets) {
  auto r = run_command(train("--set train.steps=2 --set log.dir=" + (dir_ / "run").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command("/usr/bin/python3 " + std::string(TRIDENT_SOURCE_DIR) +
                  "/tests/checkpoint_h5py.py check " + checkpoint(2).string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("84 datasets checked, 0 problems"), std::string::npos) << r.output;
  r = run_command(trident_cmd("ckpt info --verify " + checkpoint(2).string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("/model/layers/001/mlp/fc1/weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all 84 datasets verified"), std::string::npos) << r.output;
}

TEST_F(Checkpoint, CorruptByteIsReportedWithTheDataset) {
  auto r = run_command(train("--set train.steps=2 --set log.dir=" + (dir_ / "run").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string dataset = "/model/layers/001/mlp/fc1/weight";
  r = run_command("/usr/bin/python3 " + std::string(TRIDENT_SOURCE_DIR) +
                  "/tests/checkpoint_h5py.py offset " + checkpoint(2).string() + " " + dataset);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const long offset = std::stol(r.output) + 1234;
  {
    std::fstream f(checkpoint(2), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x10;
    f.seekp(offset);
    f.write(&byte, 1);
  }
  r = run_command(train("--set log.dir=" + (dir_ / "run2").string() + " --resume auto"));
  expect_error(r, dataset);
  EXPECT_NE(r.output.find("corrupt"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(checkpoint(2))) << "a failed resume deletes nothing";
}

TEST_F(Checkpoint, BadFilesAndMismatchesAreClearErrors) {
  auto r = run_command(train("--set train.steps=2 --set log.dir=" + (dir_ / "run").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_error(run_command(train("--resume " + (dir_ / "absent.h5").string())), "absent.h5");
  fs::copy_file(checkpoint(2), dir_ / "truncated.h5");
  fs::resize_file(dir_ / "truncated.h5", fs::file_size(checkpoint(2)) / 2);
  expect_error(run_command(train("--resume " + (dir_ / "truncated.h5").string())),
               "truncated.h5");
  expect_error(run_command(train("--set model.width=64 --resume " + checkpoint(2).string())),
               "model.width");
  // A checkpoint directory that cannot be created: below a regular file.
  expect_error(run_command(train("--set checkpoint.dir=" + (dir_ / "config.toml" / "ck").string())),
               "config.toml/ck");
  EXPECT_EQ(read_file(dir_ / "ckpt" / "latest"), "step_00000002.h5\n");
}

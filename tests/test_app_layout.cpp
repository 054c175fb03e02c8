// Invalid parallel layouts, launched for real under mpiexec: one clear error line, a non-zero
// exit, and every rank gone within seconds (never a hang).
#include <gtest/gtest.h>

#include <chrono>

#include "app_fixture.hpp"
#include "tmpfs_mount.hpp"

using namespace trident::test;

namespace {

class BadLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = make_tiny_run(dir_);
  }
  // Returns the run's output.
  std::string expect_layout_error(int ranks, const std::string& sets, const std::string& needle,
                                  const std::string& env = "") {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = run_command(env + " " + std::string(TRIDENT_MPIEXEC) + " -n " +
                                   std::to_string(ranks) + " " +
                                   trident_cmd("train --config " + config_.string() + " " + sets),
                               60);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "hung: " << r.output;
    EXPECT_LT(seconds, 20.0) << r.output;
    size_t errors = 0;
    for (size_t p = r.output.find("trident: error"); p != std::string::npos;
         p = r.output.find("trident: error", p + 1))
      ++errors;
    EXPECT_EQ(errors, 1u) << "printed by one rank only: " << r.output;
    const auto pos = r.output.find("trident: error: ");
    EXPECT_NE(pos, std::string::npos) << r.output;
    if (pos == std::string::npos) return r.output;
    const std::string line = r.output.substr(pos, r.output.find('\n', pos) - pos);
    EXPECT_NE(line.find(needle), std::string::npos) << line;
    return r.output;
  }
  std::filesystem::path dir_, config_;
};

}  // namespace

TEST_F(BadLayout, WorldSizeIsNotTheProductOfTheGrid) {
  expect_layout_error(2, "--set parallel.tensor=1", "but the job has 2 ranks");
}

TEST_F(BadLayout, HeadsNotDivisibleByTensor) {
  expect_layout_error(2, "--set parallel.tensor=2 --set model.heads=1", "model.heads");
}

TEST_F(BadLayout, TensorGroupWouldCrossANode) {
  expect_layout_error(4, "--set parallel.tensor=4", "must not cross a node",
                      "TRIDENT_RANKS_PER_NODE=2");
}

TEST_F(BadLayout, MorePipelineStagesThanLayers) {
  expect_layout_error(4, "--set parallel.pipeline=4 --set model.layers=2", "model.layers");
}

TEST_F(BadLayout, PipelineLayersDoNotAddUp) {
  expect_layout_error(2, "--set parallel.pipeline=2 --set parallel.pipeline_layers=[1,2]",
                      "parallel.pipeline_layers");
}

// The interleaved schedule's chunks: tiny_config's 2 layers cannot make 2 stages x 2 chunks.
TEST_F(BadLayout, InterleavedChunksDoNotDivideTheLayers) {
  expect_layout_error(2,
                      "--set parallel.pipeline=2 --set parallel.schedule=interleaved "
                      "--set parallel.virtual_stages=2",
                      "model.layers (2) must be divisible by parallel.pipeline * "
                      "parallel.virtual_stages (2 * 2 = 4)");
}

TEST_F(BadLayout, SequenceParallelRowsNotDivisibleByTensor) {
  // micro_batch 1 x seq_len 33 = 33 rows cannot be split over 2 tensor ranks.
  expect_layout_error(2,
                      "--set parallel.tensor=2 --set parallel.sequence_parallel=true "
                      "--set train.micro_batch=1 --set model.seq_len=33",
                      "parallel.sequence_parallel");
}

TEST_F(BadLayout, FewerSequencesThanOneMicroBatchPerReplica) {
  expect_layout_error(2, "--set parallel.data=2 --set train.global_batch=2", "train.global_batch");
}

// Context parallelism (issue 49 item 7): the chunk rule, the ranks, and what CP does not run
// with yet, each before any work.
TEST_F(BadLayout, ContextSequenceNotDivisibleByTwiceTheContext) {
  // seq_len 32 cannot be cut into 2 * 3 = 6 equal chunks.
  expect_layout_error(3, "--set parallel.context=3 --set eval.sample_interval=0",
                      "model.seq_len (32) must be divisible by 2 * parallel.context (3)");
}

TEST_F(BadLayout, ContextTimesTheOthersIsNotTheWorld) {
  expect_layout_error(2, "--set parallel.context=2 --set parallel.tensor=2",
                      "parallel.tensor * parallel.context * parallel.pipeline * parallel.data = "
                      "2*2*1*1 = 4 but the job has 2 ranks");
}

TEST_F(BadLayout, ContextWithSequenceParallelRowsNotDivisibleByTensor) {
  // micro_batch 1 x 32 / CP 2 = 16 rows per context rank cannot be split over 3 tensor ranks.
  expect_layout_error(6,
                      "--set parallel.context=2 --set parallel.tensor=3 --set model.heads=3 "
                      "--set model.width=48 --set parallel.sequence_parallel=true "
                      "--set train.micro_batch=1",
                      "must be divisible by parallel.tensor (3) under parallel.sequence_parallel");
}

TEST_F(BadLayout, ContextWithUnsupportedFeatures) {
  expect_layout_error(2,
                      "--set parallel.context=2 --set model.moe_experts=4 "
                      "--set model.moe_capacity_factor=1.0",
                      "parallel.context (2) > 1 with model.moe_capacity_factor (1.0) > 0");
  expect_layout_error(2, "--set parallel.context=2 --set eval.sample_interval=5",
                      "parallel.context (2) > 1 with eval.sample_interval (5) > 0");
}

// Issue 22 item 8: a checkpoint.dir that is not a directory, or one in which no file can be
// created, was found only at the first save, after training up to it. Now it is found at start,
// before the model is built, with one line naming checkpoint.dir, on every rank count.
TEST_F(BadLayout, UnusableCheckpointDirIsFoundAtStartOnEveryRankCount) {
  const auto file = dir_ / "a_file";
  trident::test::write_file(file, "not a directory\n");
  trident::test::TmpfsMount read_only(dir_ / "read_only", "size=64k,ro");
  if (!read_only.mounted() && ::geteuid() != 0)
    std::filesystem::permissions(read_only.dir(), std::filesystem::perms::owner_read |
                                                      std::filesystem::perms::owner_exec);
  const bool unwritable = read_only.mounted() || ::geteuid() != 0;
  const std::pair<int, std::string> layouts[] = {
      {1, ""}, {2, "--set parallel.data=2"}, {4, "--set parallel.data=2 --set parallel.pipeline=2"}};
  for (const auto& [ranks, layout] : layouts) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    std::string out = expect_layout_error(
        ranks, layout + " --set checkpoint.dir=" + file.string(),
        "trident: error: checkpoint.dir '" + file.string() + "' is not a directory");
    EXPECT_EQ(out.find("\nstep "), std::string::npos) << "trained before failing: " << out;
    out = expect_layout_error(ranks, layout + " --set checkpoint.dir=" + (file / "sub").string(),
                              "trident: error: checkpoint.dir '" + (file / "sub").string() +
                                  "': cannot create: Not a directory");
    if (!unwritable) continue;
    out = expect_layout_error(ranks, layout + " --set checkpoint.dir=" + read_only.dir().string(),
                              "trident: error: checkpoint.dir '" + read_only.dir().string() +
                                  "' is not writable: ");
    EXPECT_EQ(out.find("\nstep "), std::string::npos) << "trained before failing: " << out;
  }
  if (!unwritable) GTEST_SKIP() << "root without a tmpfs mount: the read-only case was not run";
}

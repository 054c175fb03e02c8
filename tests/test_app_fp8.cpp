// `trident train` with train.precision = "fp8" on the CPU (the FP8 reference, current scaling;
// model/fp8_linear.hpp): it tracks fp32, every layout stays within the bound of one rank, a
// resume is bitwise, and what it cannot run yet is refused naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "app_fixture.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {

// A small Llama (4 layers: 2 of them in FP8 with the default first and last kept) on the tiny
// corpus.
std::string fp8_args(const fs::path& dir, const std::string& extra) {
  return "train --config " + make_tiny_run(dir).string() +
         " --set model.arch=\\\"llama\\\" --set model.layers=4 --set model.kv_heads=2"
         " --set log.interval=1 " + extra;
}

struct Losses {
  std::vector<double> loss, val, grad_norm;
};

Losses read_run(const fs::path& log) {
  Losses r;
  for (const auto& row : read_metrics(log)) {
    r.loss.push_back(row["loss"].get<double>());
    r.grad_norm.push_back(row["grad_norm"].get<double>());
    if (row.contains("val_loss")) r.val.push_back(row["val_loss"].get<double>());
  }
  return r;
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

}  // namespace

// 30 steps of fp8 beside fp32 from the same weights and data: the training and validation
// losses within 1 % at every evaluation (the bound for the CPU reference), and not equal
// (the FP8 path ran).
TEST(Fp8App, TracksFp32) {
  const auto dir = scratch_dir("fp8_tracks");
  const std::string common = fp8_args(dir, "--set train.steps=30 --set eval.interval=10");
  const auto a = run_command(trident_cmd(common + " --set log.dir=" + (dir / "fp32").string()));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto b = run_command(trident_cmd(common + " --set train.precision=\\\"fp8\\\"" +
                                         " --set log.dir=" + (dir / "fp8").string()));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("precision fp8"), std::string::npos) << b.output;
  const Losses x = read_run(dir / "fp32"), y = read_run(dir / "fp8");
  ASSERT_EQ(x.loss.size(), 30u);
  ASSERT_EQ(y.loss.size(), 30u);
  ASSERT_EQ(x.val.size(), 3u);
  ASSERT_EQ(y.val.size(), 3u);
  double worst = 0, differ = 0;
  for (size_t i = 0; i < x.val.size(); ++i) worst = std::max(worst, rel(y.val[i], x.val[i]));
  for (size_t i = 0; i < x.loss.size(); ++i) differ = std::max(differ, rel(y.loss[i], x.loss[i]));
  EXPECT_LE(worst, 0.01);
  EXPECT_LE(rel(y.loss.back(), x.loss.back()), 0.01);
  EXPECT_GT(differ, 1e-7) << "fp8 gave fp32's losses: the FP8 path did not run";
  EXPECT_LT(y.loss.back(), y.loss.front() - 0.5);
  std::printf("[fp8] 30 steps: validation loss within %.2e of fp32 (last %.6f vs %.6f); "
              "largest step difference %.2e\n",
              worst, y.val.back(), x.val.back(), differ);
}

// Layouts against one rank, fp8, 8 steps. Every rank quantises with the whole tensor's scales,
// so the first step (before any update) is one rank's to rounding: loss and gradient norm
// within 1e-6 (measured: 1e-8 at most; with each rank's own amax as its scale instead, tried
// once, TP 2 missed by 2.4e-5 in the loss and 1.1e-4 in the gradient norm, CP 2 by 1.6e-5 and
// 1.2e-3). After it, an fp32 rounding difference between layouts can move a value across a
// rounding boundary of the FP8 grid (a step of 2^-4 of it for E4M3), so later steps drift
// further apart than fp32 ones: 2.7e-4 at most over 8 steps measured (TP 2); bound 2e-3.
TEST(Fp8App, EveryLayoutWithinTheBoundOfOneRank) {
  const auto dir = scratch_dir("fp8_layouts");
  const std::string common =
      fp8_args(dir, "--set train.steps=8 --set eval.interval=0 --set train.precision=\\\"fp8\\\"");
  const auto one = run_command(trident_cmd(common + " --set log.dir=" + (dir / "one").string()));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Losses ref = read_run(dir / "one");
  ASSERT_EQ(ref.loss.size(), 8u);
  for (const std::string layout :
       {"--set parallel.tensor=2 --set parallel.sequence_parallel=true",
        "--set parallel.pipeline=2", "--set parallel.context=2",
        "--set parallel.data=2 --set optim.zero_stage=1"}) {
    const fs::path log = dir / ("run_" + std::to_string(layout.size()));
    const std::string args = common + " " + layout + " --set log.dir=" + log.string();
    const auto r = run_command(std::string(TRIDENT_MPIEXEC) + " -n 2 " + trident_cmd(args));
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    const Losses got = read_run(log);
    ASSERT_EQ(got.loss.size(), 8u) << layout;
    EXPECT_LE(rel(got.loss[0], ref.loss[0]), 1e-6) << layout << ": step 1's loss";
    EXPECT_LE(rel(got.grad_norm[0], ref.grad_norm[0]), 1e-6) << layout << ": step 1's gradient";
    double worst = 0;
    for (size_t i = 0; i < 8; ++i) worst = std::max(worst, rel(got.loss[i], ref.loss[i]));
    EXPECT_LE(worst, 2e-3) << layout;
    std::printf("[fp8] %s: step 1 loss %.1e, gradient norm %.1e; worst over 8 steps %.1e\n",
                layout.c_str(), rel(got.loss[0], ref.loss[0]),
                rel(got.grad_norm[0], ref.grad_norm[0]), worst);
  }
}

// Current scaling keeps no state: a stop and a resume give the straight run's losses to the bit.
TEST(Fp8App, ResumeIsBitwiseIdentical) {
  const auto dir = scratch_dir("fp8_resume");
  const std::string common = fp8_args(dir, "--set train.steps=6 --set eval.interval=0 "
                                           "--set train.precision=\\\"fp8\\\"");
  const auto a = run_command(trident_cmd(common + " --set log.dir=" + (dir / "a").string()));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string b = common + " --set checkpoint.dir=" + (dir / "ckpt").string() +
                        " --set log.dir=" + (dir / "b").string() + " --resume auto";
  auto r = run_command(trident_cmd(b + " --set train.exit_interval=3"));
  ASSERT_EQ(r.exit_code, 75) << r.output;
  r = run_command(trident_cmd(b));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Losses x = read_run(dir / "a"), y = read_run(dir / "b");
  ASSERT_EQ(x.loss.size(), 6u);
  EXPECT_EQ(x.loss, y.loss);
}

TEST(Fp8App, WhatIsNotBuiltIsRefusedNamingTheKey) {
  const auto dir = scratch_dir("fp8_bad");
  const auto cuda = run_command(trident_cmd(fp8_args(
      dir, "--set train.precision=\\\"fp8\\\" --set train.device=\\\"cuda\\\"")));
  EXPECT_NE(cuda.exit_code, 0) << cuda.output;
  EXPECT_NE(cuda.output.find("train.precision = \"fp8\" with train.device = \"cuda\""),
            std::string::npos)
      << cuda.output;
  const auto moe = run_command(
      trident_cmd(fp8_args(dir, "--set train.precision=\\\"fp8\\\" --set model.moe_experts=2")));
  EXPECT_NE(moe.exit_code, 0) << moe.output;
  EXPECT_NE(moe.output.find("train.precision = \"fp8\" with model.moe_experts (2)"),
            std::string::npos)
      << moe.output;
  const auto format = run_command(
      trident_cmd(fp8_args(dir, "--set train.fp8_grad_format=\\\"e3m4\\\"")));
  EXPECT_NE(format.exit_code, 0) << format.output;
  EXPECT_NE(format.output.find("train.fp8_grad_format"), std::string::npos) << format.output;
}

// `trident train` with train.precision = "fp8" on the CPU (the FP8 reference;
// model/fp8_linear.hpp), with either scaling recipe: it tracks fp32, every layout stays within
// the bound of one rank, a resume is bitwise (the delayed recipe's state saved and restored,
// from any layout, and across precisions), and what the GPU cannot run is refused naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "app_fixture.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {

double rel(double a, double b) { return relative_difference(a, b); }

// fp8 with the recipe under test; the delayed recipe with a history of 2 steps, so that the
// history wraps within every test's steps (and across a resume).
std::string fp8_on(const std::string& recipe) {
  return " --set train.precision=\\\"fp8\\\" --set train.fp8_recipe=\\\"" + recipe +
         "\\\"" + (recipe == "delayed" ? " --set train.fp8_amax_history=2" : "");
}

class Fp8Recipe : public ::testing::TestWithParam<std::string> {};

// A layout's 8 steps against one rank's: step 1's loss and gradient norm within 1e-6 (every rank
// quantises with the whole tensors' scales, so one rank's to rounding), every step's loss
// within 2e-3 (later steps drift: see EveryLayoutWithinTheBoundOfOneRank); printed after `tag`.
void expect_within_the_bound_of_one_rank(const std::string& tag, const std::string& layout,
                                         const RunLosses& got, const RunLosses& ref) {
  ASSERT_EQ(got.loss.size(), 8u) << layout;
  EXPECT_LE(rel(got.loss[0], ref.loss[0]), 1e-6) << layout << ": step 1's loss";
  EXPECT_LE(rel(got.grad_norm[0], ref.grad_norm[0]), 1e-6) << layout << ": step 1's gradient";
  double worst = 0;
  for (size_t i = 0; i < 8; ++i) worst = std::max(worst, rel(got.loss[i], ref.loss[i]));
  EXPECT_LE(worst, 2e-3) << layout;
  std::printf("[%s] %s: step 1 loss %.1e, gradient norm %.1e; worst over 8 steps %.1e\n",
              tag.c_str(), layout.c_str(), rel(got.loss[0], ref.loss[0]),
              rel(got.grad_norm[0], ref.grad_norm[0]), worst);
}

// The delayed recipe's state in checkpoints a and b, value by value within 1e-5 (the
// independent h5py reader, tests/checkpoint_h5py.py); its summary line printed after `tag`.
void expect_same_fp8_state(const std::string& tag, const std::string& layout,
                           const std::string& a, const std::string& b) {
  const auto same = run_command("/usr/bin/python3 " + std::string(TRIDENT_SOURCE_DIR) +
                                "/tests/checkpoint_h5py.py same-fp8-state " + a + " " + b +
                                " 1e-5");
  EXPECT_EQ(same.exit_code, 0) << layout << "\n" << same.output;
  const size_t line = same.output.find("same FP8 state");
  std::printf("[%s] %s: %s", tag.c_str(), layout.c_str(),
              line == std::string::npos ? "\n" : same.output.substr(line).c_str());
}

}  // namespace

// 30 steps of fp8 beside fp32 from the same weights and data: the training and validation
// losses within 1 % at every evaluation (the bound for the CPU reference), and not equal
// (the FP8 path ran).
TEST_P(Fp8Recipe, TracksFp32) {
  const auto dir = scratch_dir("fp8_tracks_" + GetParam());
  const std::string common = small_llama_args(dir, "--set train.steps=30 --set eval.interval=10");
  const auto a = run_command(trident_cmd(common + " --set log.dir=" + (dir / "fp32").string()));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto b = run_command(
      trident_cmd(common + fp8_on(GetParam()) + " --set log.dir=" + (dir / "fp8").string()));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("precision fp8"), std::string::npos) << b.output;
  const RunLosses x = read_losses(dir / "fp32"), y = read_losses(dir / "fp8");
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
  std::printf("[fp8 %s] 30 steps: validation loss within %.2e of fp32 (last %.6f vs %.6f); "
              "largest step difference %.2e\n",
              GetParam().c_str(), worst, y.val.back(), x.val.back(), differ);
}

// Layouts against one rank, fp8, 8 steps (TP + SP, PP, CP, DP with ZeRO-1, ZeRO-3 with full
// recomputation, ZB-H1 (the split backward), TP with selective recomputation). Every rank
// quantises with the whole tensor's scales, so the first step (before any update) is one
// rank's to rounding: loss and gradient norm
// within 1e-6 (measured: 1e-8 at most; with each rank's own amax as its scale instead, tried
// once, TP 2 missed by 2.4e-5 in the loss and 1.1e-4 in the gradient norm, CP 2 by 1.6e-5 and
// 1.2e-3). After it, an fp32 rounding difference between layouts can move a value across a
// rounding boundary of the FP8 grid (a step of 2^-4 of it for E4M3), so later steps drift
// further apart than fp32 ones: 2.7e-4 at most over 8 steps measured (TP 2); bound 2e-3.
// The delayed recipe's first step scales as the current one does; its later scales come from
// the history of amaxes reduced over the tensor, context and data ranks, one rank's maxima.
// Each run checkpoints every 2 steps (all four kept): with the delayed recipe, every layout's
// saved state (two steps' amaxes and the scales) is one rank's within 1e-5 of each value (the
// amaxes of values within rounding of one rank's; a maximum over each rank's own part instead,
// tried once without the reduction over the data x context ranks, missed by 0.11 under CP 2
// and 0.42 under DP 2).
TEST_P(Fp8Recipe, EveryLayoutWithinTheBoundOfOneRank) {
  const auto dir = scratch_dir("fp8_layouts_" + GetParam());
  const std::string common =
      small_llama_args(dir, "--set train.steps=8 --set eval.interval=0 --set checkpoint.interval=2 "
                    "--set checkpoint.keep=4" + fp8_on(GetParam()));
  auto step2 = [](const fs::path& log) { return (log / "ck" / "step_00000002.h5").string(); };
  const auto one =
      run_command(trident_cmd(common + " --set log.dir=" + (dir / "one").string() +
                              " --set checkpoint.dir=" + (dir / "one" / "ck").string()));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const RunLosses ref = read_losses(dir / "one");
  ASSERT_EQ(ref.loss.size(), 8u);
  for (const std::string layout :
       {"--set parallel.tensor=2 --set parallel.sequence_parallel=true",
        "--set parallel.pipeline=2", "--set parallel.context=2",
        "--set parallel.data=2 --set optim.zero_stage=1",
        "--set parallel.data=2 --set optim.zero_stage=3 --set train.recompute=\\\"full\\\"",
        "--set parallel.pipeline=2 --set parallel.schedule=\\\"zb-h1\\\"",
        "--set parallel.tensor=2 --set train.recompute=\\\"selective\\\""}) {
    const fs::path log = dir / ("run_" + std::to_string(std::hash<std::string>{}(layout)));
    const std::string args = common + " " + layout + " --set log.dir=" + log.string() +
                             " --set checkpoint.dir=" + (log / "ck").string();
    const auto r = run_command(std::string(TRIDENT_MPIEXEC) + " -n 2 " + trident_cmd(args));
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    expect_within_the_bound_of_one_rank("fp8 " + GetParam(), layout, read_losses(log), ref);
    if (GetParam() == "delayed")
      expect_same_fp8_state("fp8 delayed", layout, step2(log), step2(dir / "one"));
  }
}

// A stop and a resume give the straight run's losses to the bit: current scaling keeps no
// state; the delayed recipe's histories and scales come back from the checkpoint (the history
// of 2 steps wraps across the stop at step 3). An evaluation at step 3 runs forwards between
// the steps: their amaxes must not enter the history.
TEST_P(Fp8Recipe, ResumeIsBitwiseIdentical) {
  const auto dir = scratch_dir("fp8_resume_" + GetParam());
  const std::string common =
      small_llama_args(dir, "--set train.steps=6 --set eval.interval=3" + fp8_on(GetParam()));
  const auto a = run_command(trident_cmd(common + " --set log.dir=" + (dir / "a").string()));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string b = common + " --set checkpoint.dir=" + (dir / "ckpt").string() +
                        " --set log.dir=" + (dir / "b").string() + " --resume auto";
  auto r = run_command(trident_cmd(b + " --set train.exit_interval=3"));
  ASSERT_EQ(r.exit_code, 75) << r.output;
  r = run_command(trident_cmd(b));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const RunLosses x = read_losses(dir / "a"), y = read_losses(dir / "b");
  ASSERT_EQ(x.loss.size(), 6u);
  EXPECT_EQ(x.loss, y.loss);
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8Recipe, ::testing::Values("current", "delayed"),
                         [](const auto& info) { return info.param; });

// The delayed recipe's state is the global tensors' (amaxes reduced over every rank that holds
// a part): a checkpoint one rank wrote at step 3 resumes on TP 2 + SP and on PP 2 (each stage
// reads its layers' state) with step 4 within 1e-6 of the straight run's (the same weights
// and scales, TP's rounding; starting the state afresh instead, tried once, scales step 4 by
// its current amaxes and misses by 3.9e-5); `ckpt info --verify` checks the state's datasets;
// and a checkpoint moves between precisions: fp32's resumes in fp8 with a fresh state, saying
// so, fp8's resumes in fp32.
TEST(Fp8Delayed, StateResumesOnAnyLayoutAndMovesBetweenPrecisions) {
  const auto dir = scratch_dir("fp8_delayed_moves");
  const std::string common = small_llama_args(dir, "--set train.steps=6 --set eval.interval=0");
  const std::string fp8 = fp8_on("delayed");
  auto run = [&](const std::string& args, int ranks = 1) {
    return run_command(ranks == 1 ? trident_cmd(args)
                                  : std::string(TRIDENT_MPIEXEC) + " -n " +
                                        std::to_string(ranks) + " " + trident_cmd(args));
  };
  auto step3 = [&](const std::string& name) { return dir / name / "step_00000003.h5"; };
  auto r = run(common + fp8 + " --set log.dir=" + (dir / "straight").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const RunLosses straight = read_losses(dir / "straight");
  ASSERT_EQ(straight.loss.size(), 6u);
  r = run(common + fp8 + " --set checkpoint.dir=" + (dir / "ck_fp8").string() +
          " --set train.exit_interval=3 --set log.dir=" + (dir / "first").string());
  ASSERT_EQ(r.exit_code, 75) << r.output;
  ASSERT_TRUE(fs::exists(step3("ck_fp8"))) << r.output;
  r = run_command(trident_cmd("ckpt info --verify " + step3("ck_fp8").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const std::string layout :
       {"--set parallel.tensor=2 --set parallel.sequence_parallel=true",
        "--set parallel.pipeline=2"}) {
    const fs::path log = dir / ("resumed_" + std::to_string(layout.size()));
    r = run(common + fp8 + " " + layout + " --resume " + step3("ck_fp8").string() +
                " --set checkpoint.dir=" + (log / "ck").string() + " --set log.dir=" + log.string(),
            2);
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    EXPECT_EQ(r.output.find("holds no FP8 scaling state"), std::string::npos) << r.output;
    const RunLosses got = read_losses(log);
    ASSERT_EQ(got.loss.size(), 3u) << layout;
    EXPECT_LE(rel(got.loss[0], straight.loss[3]), 1e-6) << layout << ": step 4";
    std::printf("[fp8 delayed] resumed at step 3 on %s: step 4 loss within %.1e\n",
                layout.c_str(), rel(got.loss[0], straight.loss[3]));
  }
  // fp32's checkpoint in fp8: the state starts afresh (both FP8 layers), and says so.
  r = run(common + " --set checkpoint.dir=" + (dir / "ck_fp32").string() +
          " --set train.exit_interval=3 --set log.dir=" + (dir / "fp32").string());
  ASSERT_EQ(r.exit_code, 75) << r.output;
  r = run(common + fp8 + " --resume " + step3("ck_fp32").string() + " --set checkpoint.dir=" +
          (dir / "ck_to_fp8").string() + " --set log.dir=" + (dir / "to_fp8").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("holds no FP8 scaling state for 2 of the 2 FP8 layers"),
            std::string::npos)
      << r.output;
  // fp8's checkpoint in fp32: the master weights are fp32; the state is not needed.
  r = run(common + " --resume " + step3("ck_fp8").string() + " --set checkpoint.dir=" +
          (dir / "ck_to_fp32").string() + " --set log.dir=" + (dir / "to_fp32").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_losses(dir / "to_fp32").loss.size(), 3u);
}

// A mixture of experts in fp8 (every layer but the first and the last, so two MoE layers of
// four), with either recipe. Current scaling quantises each expert's rows from each micro-batch
// apart (Fp8Linear::experts_forward); the delayed recipe keeps a state per expert, every
// expert's on every rank, reduced over the data x context ranks; either way every layout
// quantises as one rank does. 8 steps on one rank track fp32 within 1 % (and differ from it);
// the layouts (EP 2, where an expert's rank multiplies the rows of two micro-batches; TP 2 +
// SP; CP 2; PP 2; DP 2 with ZeRO-1 and full recomputation) give one rank's first step within
// 1e-6 and 8 steps within 2e-3, the dense layers' bounds for the same reasons
// (EveryLayoutWithinTheBoundOfOneRank). Measured: 1e-9 at most on step 1. With one scale per
// expert over all its rows instead, tried once under current scaling, EP 2 missed by 7.1e-6 in
// the loss and 3.9e-4 in the gradient norm. The delayed recipe's state saved after step 1 (its
// amaxes: every expert's, reduced over the ranks) is one rank's within 1e-5 on every layout
// (after it, the layouts' weights differ by rounding and a value crossing an FP8 rounding
// boundary, or a token that changes experts, moves a later amax by more: 2.3e-2 at step 2
// under CP 2, measured); and EP 2 stopped at step 3 and resumed gives its straight run's losses
// to the bit.
class Fp8MoeRecipe : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8MoeRecipe, TracksFp32AndEveryLayoutWithinTheBoundOfOneRank) {
  const auto dir = scratch_dir("fp8_moe_" + GetParam());
  const bool delayed = GetParam() == "delayed";
  const std::string common = small_llama_args(
      dir, "--set train.steps=8 --set eval.interval=0 --set model.moe_experts=4 "
           "--set model.moe_top_k=2 --set checkpoint.interval=1 --set checkpoint.keep=8");
  auto logged = [](const fs::path& log) {
    return " --set log.dir=" + log.string() + " --set checkpoint.dir=" + (log / "ck").string();
  };
  auto step1 = [](const fs::path& log) { return (log / "ck" / "step_00000001.h5").string(); };
  const auto fp32 = run_command(trident_cmd(common + logged(dir / "fp32")));
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const auto one = run_command(trident_cmd(common + fp8_on(GetParam()) + logged(dir / "one")));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const RunLosses ref = read_losses(dir / "one"), base = read_losses(dir / "fp32");
  ASSERT_EQ(ref.loss.size(), 8u);
  ASSERT_EQ(base.loss.size(), 8u);
  double tracks = 0;
  for (size_t i = 0; i < 8; ++i) tracks = std::max(tracks, rel(ref.loss[i], base.loss[i]));
  EXPECT_LE(tracks, 0.01);
  EXPECT_GT(tracks, 1e-7) << "fp8 gave fp32's losses: the FP8 path did not run";
  std::printf("[fp8 moe %s] one rank: within %.1e of fp32 over 8 steps\n", GetParam().c_str(),
              tracks);
  const std::string ep2 = "--set parallel.data=2 --set parallel.expert=2";
  for (const std::string layout :
       {ep2, std::string("--set parallel.tensor=2 --set parallel.sequence_parallel=true"),
        std::string("--set parallel.context=2"), std::string("--set parallel.pipeline=2"),
        std::string("--set parallel.data=2 --set optim.zero_stage=1 "
                    "--set train.recompute=\\\"full\\\"")}) {
    const fs::path log = dir / ("run_" + std::to_string(std::hash<std::string>{}(layout)));
    const auto r = run_command(
        trident_cmd_on(2, common + fp8_on(GetParam()) + " " + layout + logged(log)));
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    const RunLosses got = read_losses(log);
    expect_within_the_bound_of_one_rank("fp8 moe " + GetParam(), layout, got, ref);
    if (delayed) expect_same_fp8_state("fp8 moe delayed", layout, step1(log), step1(dir / "one"));
    if (layout != ep2) continue;
    // The same layout stopped after step 3 and resumed from its checkpoint.
    const fs::path resumed = dir / "ep2_resumed";
    const std::string args = common + fp8_on(GetParam()) + " " + layout + logged(resumed) +
                             " --set checkpoint.interval=3 --resume auto";
    auto stop = run_command(trident_cmd_on(2, args + " --set train.exit_interval=3"));
    ASSERT_EQ(stop.exit_code, 75) << stop.output;
    auto rest = run_command(trident_cmd_on(2, args));
    ASSERT_EQ(rest.exit_code, 0) << rest.output;
    EXPECT_EQ(read_losses(resumed).loss, got.loss) << "EP 2 resumed at step 3";
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8MoeRecipe, ::testing::Values("current", "delayed"),
                         [](const auto& info) { return info.param; });

TEST(Fp8App, WhatIsNotBuiltIsRefusedNamingTheKey) {
  const auto dir = scratch_dir("fp8_bad");
  // On the GPU each FP8 GEMM's contraction must be a multiple of 16 (here a micro-batch's 40
  // rows, the weight gradient's), and a mixture of experts is fp32 only: both refused when the
  // config loads, with or without a GPU.
  const std::string on_gpu = "--set train.precision=\\\"fp8\\\" --set train.device=\\\"cuda\\\" ";
  const std::pair<std::string, std::string> cases[] = {
      {on_gpu + "--set model.seq_len=20",
       "train.micro_batch x model.seq_len / parallel.context = 40 must be a multiple of 16"},
      {on_gpu + "--set model.moe_experts=2",
       "model.moe_experts (2) > 0 with train.device = \"cuda\" needs train.precision = "
       "\"fp32\""},
      {"--set train.fp8_grad_format=\\\"e3m4\\\"", "train.fp8_grad_format"}};
  for (const auto& [args, message] : cases) {
    const auto r = run_command(trident_cmd(small_llama_args(dir, args)));
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
}

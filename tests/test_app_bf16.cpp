// `trident train` with train.precision = "bf16" on the CPU (model/cpu_bf16_kernels.hpp, the
// reference of the GPU's bf16 path): it tracks fp32, every layout family stays within the bound
// of one bf16 rank, a resume is bitwise, a checkpoint moves between precisions, both GEMM
// engines agree, and an engine the core cannot run is refused naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "app_fixture.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {

const std::string kBf16 = " --set train.precision=\\\"bf16\\\"";

double rel(double a, double b) { return relative_difference(a, b); }

}  // namespace

// 30 steps of bf16 beside fp32 from the same weights and data: every step's loss and every
// evaluation within 1 % (the bound for bf16 against fp32; bf16 keeps 8 bits of
// mantissa, a relative rounding of up to 2^-9 = 2e-3 per stored value), and not equal (the
// bf16 path ran: its losses differ from fp32's from the first step).
TEST(Bf16App, TracksFp32) {
  const auto dir = scratch_dir("bf16_tracks");
  const std::string common = small_llama_args(dir, "--set train.steps=30 --set eval.interval=10");
  const auto a = run_command(trident_cmd(common + " --set log.dir=" + (dir / "fp32").string()));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto b =
      run_command(trident_cmd(common + kBf16 + " --set log.dir=" + (dir / "bf16").string()));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("precision bf16"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("gemm: bf16 products: "), std::string::npos) << b.output;
  const RunLosses x = read_losses(dir / "fp32"), y = read_losses(dir / "bf16");
  ASSERT_EQ(x.loss.size(), 30u);
  ASSERT_EQ(y.loss.size(), 30u);
  ASSERT_EQ(x.val.size(), 3u);
  ASSERT_EQ(y.val.size(), 3u);
  double worst_val = 0, worst_step = 0;
  for (size_t i = 0; i < x.val.size(); ++i) worst_val = std::max(worst_val, rel(y.val[i], x.val[i]));
  for (size_t i = 0; i < x.loss.size(); ++i)
    worst_step = std::max(worst_step, rel(y.loss[i], x.loss[i]));
  EXPECT_LE(worst_val, 1e-2);
  EXPECT_LE(worst_step, 1e-2);
  EXPECT_GT(rel(y.loss[0], x.loss[0]), 1e-7) << "bf16 gave fp32's first loss: bf16 did not run";
  EXPECT_LT(y.loss.back(), y.loss.front() - 0.5);
  std::printf("[bf16] 30 steps: validation loss within %.2e of fp32 (last %.6f vs %.6f); "
              "largest step difference %.2e; step 1 differs by %.2e\n",
              worst_val, y.val.back(), x.val.back(), worst_step, rel(y.loss[0], x.loss[0]));
}

// Every layout family against one bf16 rank, 6 steps: TP 2 + SP, PP 2, CP 2, DP 2 with ZeRO-1,
// DP 2 with ZeRO-3 and full recomputation, PP 2 with ZB-H1 (the split backward), TP 2 with
// selective recomputation, and a mixture of experts on one rank and over EP 2. A layout sums
// in another order (the tensor group's partial products, the ring's blocks) before the values
// are rounded to bf16, so a stored value can land one bf16 step (2^-8 relative) away from one
// rank's; the bounds are those of bf16 against fp32 (TracksFp32): each step's loss within 1e-2
// of one bf16 rank and within 1e-2 of one fp32 rank.
TEST(Bf16App, EveryLayoutFamilyWithinTheBoundOfOneRank) {
  const auto dir = scratch_dir("bf16_layouts");
  const std::string common = small_llama_args(dir, "--set train.steps=6 --set eval.interval=0");
  struct Case {
    std::string layout;
    bool moe;
  };
  const std::string moe = " --set model.moe_experts=4 --set model.moe_top_k=2";
  std::map<bool, RunLosses> one_bf16, one_fp32;
  for (const bool m : {false, true}) {
    const std::string args = common + (m ? moe : "");
    const fs::path a = dir / (m ? "one_moe" : "one"), b = dir / (m ? "fp32_moe" : "fp32");
    auto r = run_command(trident_cmd(args + kBf16 + " --set log.dir=" + a.string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_command(trident_cmd(args + " --set log.dir=" + b.string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    one_bf16[m] = read_losses(a);
    one_fp32[m] = read_losses(b);
    ASSERT_EQ(one_bf16[m].loss.size(), 6u);
  }
  const std::vector<Case> cases = {
      {"--set parallel.tensor=2 --set parallel.sequence_parallel=true", false},
      {"--set parallel.pipeline=2", false},
      {"--set parallel.context=2", false},
      {"--set parallel.data=2 --set optim.zero_stage=1", false},
      {"--set parallel.data=2 --set optim.zero_stage=3 --set train.recompute=\\\"full\\\"", false},
      {"--set parallel.pipeline=2 --set parallel.schedule=\\\"zb-h1\\\"", false},
      {"--set parallel.tensor=2 --set train.recompute=\\\"selective\\\"", false},
      {"--set parallel.data=2 --set parallel.expert=2", true},
      {"--set parallel.tensor=2 --set parallel.sequence_parallel=true", true}};
  for (const Case& c : cases) {
    const fs::path log = dir / ("run_" + std::to_string(std::hash<std::string>{}(
                                             c.layout + (c.moe ? "moe" : ""))));
    const std::string args =
        common + (c.moe ? moe : "") + kBf16 + " " + c.layout + " --set log.dir=" + log.string();
    const auto r = run_command(trident_cmd_on(2, args));
    const std::string name = c.layout + (c.moe ? " (MoE)" : "");
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    const RunLosses got = read_losses(log);
    ASSERT_EQ(got.loss.size(), 6u) << name;
    double worst = 0, worst_fp32 = 0;
    for (size_t i = 0; i < 6; ++i) {
      worst = std::max(worst, rel(got.loss[i], one_bf16[c.moe].loss[i]));
      worst_fp32 = std::max(worst_fp32, rel(got.loss[i], one_fp32[c.moe].loss[i]));
    }
    EXPECT_LE(worst, 1e-2) << name;
    EXPECT_LE(worst_fp32, 1e-2) << name;
    std::printf("[bf16] %s: worst over 6 steps %.1e of one bf16 rank, %.1e of one fp32 rank "
                "(step 1: %.1e)\n",
                name.c_str(), worst, worst_fp32, rel(got.loss[0], one_bf16[c.moe].loss[0]));
  }
}

// A stop and a resume give the straight run's losses to the bit, and the final checkpoints
// the same weights and moments (the compute copy is the rounded master weights, rebuilt on
// load). Over TP 2 + SP too, whose sums are rounded after the reduction.
TEST(Bf16App, ResumeIsBitwiseIdentical) {
  const auto dir = scratch_dir("bf16_resume");
  for (const int ranks : {1, 2}) {
    const std::string layout =
        ranks == 1 ? "" : " --set parallel.tensor=2 --set parallel.sequence_parallel=true";
    const fs::path run = dir / std::to_string(ranks);
    fs::create_directories(run);
    const std::string common =
        small_llama_args(run, "--set train.steps=6 --set eval.interval=3" + kBf16 + layout);
    auto r = run_command(trident_cmd_on(ranks, common + " --set checkpoint.dir=" +
                                              (run / "ck_a").string() +
                                              " --set log.dir=" + (run / "a").string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string b = common + " --set checkpoint.dir=" + (run / "ck_b").string() +
                          " --set log.dir=" + (run / "b").string() + " --resume auto";
    r = run_command(trident_cmd_on(ranks, b + " --set train.exit_interval=3"));
    ASSERT_EQ(r.exit_code, 75) << r.output;
    r = run_command(trident_cmd_on(ranks, b));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const RunLosses x = read_losses(run / "a"), y = read_losses(run / "b");
    ASSERT_EQ(x.loss.size(), 6u);
    EXPECT_EQ(x.loss, y.loss) << ranks << " ranks";
    const auto same = run_command(
        "/usr/bin/python3 " + std::string(TRIDENT_SOURCE_DIR) + "/tests/checkpoint_h5py.py "
        "same-values " + (run / "ck_a" / "step_00000006.h5").string() + " " +
        (run / "ck_b" / "step_00000006.h5").string() + " 0");
    EXPECT_EQ(same.exit_code, 0) << same.output;
  }
}

// A checkpoint moves between precisions (its master weights and moments are fp32): bf16's
// resumes in fp32 and fp32's in bf16, each step 4 within the bf16 bound of the straight run.
TEST(Bf16App, CheckpointsMoveBetweenPrecisions) {
  const auto dir = scratch_dir("bf16_moves");
  const std::string common = small_llama_args(dir, "--set train.steps=6 --set eval.interval=0");
  auto step3 = [&](const std::string& name) {
    return (dir / name / "step_00000003.h5").string();
  };
  for (const bool from_bf16 : {true, false}) {
    const std::string from = from_bf16 ? kBf16 : "", to = from_bf16 ? "" : kBf16;
    const std::string tag = from_bf16 ? "bf16" : "fp32";
    auto r = run_command(trident_cmd(common + from + " --set log.dir=" +
                                     (dir / ("straight_" + tag)).string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_command(trident_cmd(common + from + " --set checkpoint.dir=" +
                                (dir / ("ck_" + tag)).string() +
                                " --set train.exit_interval=3 --set log.dir=" +
                                (dir / ("first_" + tag)).string()));
    ASSERT_EQ(r.exit_code, 75) << r.output;
    const fs::path log = dir / ("moved_" + tag);
    r = run_command(trident_cmd(common + to + " --resume " + step3("ck_" + tag) +
                                " --set log.dir=" + log.string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const RunLosses straight = read_losses(dir / ("straight_" + tag)), moved = read_losses(log);
    ASSERT_EQ(moved.loss.size(), 3u);
    EXPECT_LE(rel(moved.loss[0], straight.loss[3]), 1e-2) << tag;
    EXPECT_NE(moved.loss[0], straight.loss[3]) << tag << ": the other precision did not run";
    std::printf("[bf16] a %s checkpoint resumed in the other precision: step 4 within %.1e\n",
                tag.c_str(), rel(moved.loss[0], straight.loss[3]));
  }
}

// Both engines of the linear layers' products (fp32 FMAs on the bf16 values, oneDNN's bf16
// matmul) compute bf16 products with fp32 sums: the same run within the bf16 bound, and not
// to the bit (another order of the sums). Where oneDNN has no bf16 matmul (a core without
// AVX512-BF16 or AMX, or oneDNN held below them by ONEDNN_MAX_CPU_ISA), "onednn" is refused in
// one line naming the key, and "auto" runs the FMA engine.
TEST(Bf16App, BothGemmEnginesAgreeAndAMissingOneIsRefused) {
  const auto dir = scratch_dir("bf16_engines");
  const std::string common =
      small_llama_args(dir, "--set train.steps=6 --set eval.interval=0") + kBf16;
  const auto fma = run_command(trident_cmd(common + " --set train.cpu_bf16_gemm=\\\"fma\\\"" +
                                           " --set log.dir=" + (dir / "fma").string()));
  ASSERT_EQ(fma.exit_code, 0) << fma.output;
  EXPECT_NE(fma.output.find("fp32 FMA GEMMs on bf16 values"), std::string::npos) << fma.output;
  const auto probe = run_command(trident_cmd(
      common + " --set train.cpu_bf16_gemm=\\\"onednn\\\" --set log.dir=" +
      (dir / "onednn").string()));
  if (probe.output.find("oneDNN has no bf16 matmul on this core") != std::string::npos) {
    EXPECT_NE(probe.exit_code, 0);
    GTEST_SKIP() << "this core has no AVX512-BF16 or AMX: the oneDNN engine cannot run here";
  }
  ASSERT_EQ(probe.exit_code, 0) << probe.output;
  EXPECT_NE(probe.output.find("bf16 products: bf16 oneDNN"), std::string::npos) << probe.output;
  const RunLosses x = read_losses(dir / "fma"), y = read_losses(dir / "onednn");
  ASSERT_EQ(x.loss.size(), 6u);
  ASSERT_EQ(y.loss.size(), 6u);
  double worst = 0;
  for (size_t i = 0; i < 6; ++i) worst = std::max(worst, rel(y.loss[i], x.loss[i]));
  EXPECT_LE(worst, 1e-2);
  EXPECT_NE(x.loss, y.loss) << "the oneDNN engine gave the FMA engine's bits: did it run?";
  std::printf("[bf16] oneDNN engine against the FMA engine: worst over 6 steps %.1e\n", worst);

  // "auto" on this core: oneDNN on AMX, else as the dot products' measured lead over the FMAs
  // says (cpu::kBf16DotLead), and the line gives the rate it decided on.
  const auto automatic = run_command(trident_cmd(
      common + " --set train.steps=1 --set log.dir=" + (dir / "auto_here").string()));
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  const bool onednn = automatic.output.find("bf16 products: bf16 oneDNN") != std::string::npos;
  const size_t at = automatic.output.find("its dot products at ");
  if (automatic.output.find("(AMX)") != std::string::npos) {
    EXPECT_TRUE(onednn) << automatic.output;
  } else {
    ASSERT_NE(at, std::string::npos) << automatic.output;
    const double lead = std::stod(automatic.output.substr(at + 20));
    EXPECT_EQ(onednn, lead >= 1.3) << automatic.output;
    std::printf("[bf16] auto: dot products at %.2fx the FMAs: %s\n", lead,
                onednn ? "onednn" : "fma");
  }

  const std::string held = "ONEDNN_MAX_CPU_ISA=AVX512_CORE ";
  const auto refused = run_command(held + trident_cmd(
      common + " --set train.cpu_bf16_gemm=\\\"onednn\\\" --set log.dir=" +
      (dir / "refused").string()));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("train.cpu_bf16_gemm = \"onednn\", but oneDNN has no bf16 "
                                "matmul on this core"),
            std::string::npos)
      << refused.output;
  const auto fallback = run_command(held + trident_cmd(
      common + " --set train.steps=1 --set log.dir=" + (dir / "auto").string()));
  EXPECT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("fp32 FMA GEMMs on bf16 values (train.cpu_bf16_gemm = "
                                 "\"auto\""),
            std::string::npos)
      << fallback.output;
}

// train.cpu_bf16_gemm = "auto" is one engine for the whole job. Where the ranks' cores disagree
// (TRIDENT_TEST_BF16_SLOW_RANK=1 makes rank 1's say its bf16 matmul is no faster), every rank
// runs the FMA engine and the start-up says so: the losses are those of "fma" on every rank, to
// the bit, not those of oneDNN on rank 0 beside the FMAs on rank 1. Where they agree, no note.
TEST(Bf16App, AutoIsOneEngineForTheWholeJob) {
  const auto dir = scratch_dir("bf16_auto_agreed");
  const std::string common =
      small_llama_args(dir, "--set train.steps=3 --set eval.interval=0 --set parallel.data=2") +
      kBf16;
  const auto agreed =
      run_command(trident_cmd_on(2, common + " --set log.dir=" + (dir / "auto").string()));
  ASSERT_EQ(agreed.exit_code, 0) << agreed.output;
  if (agreed.output.find("bf16 products: bf16 oneDNN") == std::string::npos)
    GTEST_SKIP() << "\"auto\" runs the FMA engine on this core: no disagreement to make";
  const std::string note = "note: train.cpu_bf16_gemm = \"auto\": oneDNN's bf16 matmul outruns "
                           "the FMAs on 1 of 2 ranks' cores; every rank runs the FMA engine";
  EXPECT_EQ(agreed.output.find("ranks' cores; every rank runs"), std::string::npos)
      << agreed.output;
  const auto fma = run_command(trident_cmd_on(
      2, common + " --set train.cpu_bf16_gemm=\\\"fma\\\" --set log.dir=" + (dir / "fma").string()));
  ASSERT_EQ(fma.exit_code, 0) << fma.output;
  const auto split = run_command(
      "TRIDENT_TEST_BF16_SLOW_RANK=1 " +
      trident_cmd_on(2, common + " --set log.dir=" + (dir / "split").string()));
  ASSERT_EQ(split.exit_code, 0) << split.output;
  EXPECT_NE(split.output.find(note), std::string::npos) << split.output;
  EXPECT_NE(split.output.find("fp32 FMA GEMMs on bf16 values (train.cpu_bf16_gemm = \"fma\""),
            std::string::npos)
      << split.output;
  const RunLosses s = read_losses(dir / "split"), f = read_losses(dir / "fma"),
                  o = read_losses(dir / "auto");
  ASSERT_EQ(s.loss.size(), 3u);
  ASSERT_EQ(f.loss.size(), 3u);
  ASSERT_EQ(o.loss.size(), 3u);
  EXPECT_EQ(s.loss, f.loss);
  EXPECT_NE(o.loss, f.loss) << "oneDNN gave the FMA engine's bits: the comparison tells nothing";
}

// A bf16 checkpoint generates and evaluates in bf16 (the decoding path's kernels: rotary
// embeddings at positions, the key/value cache's attention): the prompt's loss within 1e-2 of
// the same checkpoint's in fp32, and not equal (bf16 ran).
TEST(Bf16App, GenerationAndEvaluationRunInBf16) {
  const auto dir = scratch_dir("bf16_generate");
  const auto r = run_command(trident_cmd(
      small_llama_args(dir,
                       "--set train.steps=4 --set eval.interval=0 --set checkpoint.interval=4") +
      kBf16 + " --set checkpoint.dir=" + (dir / "ck").string() +
      " --set log.dir=" + (dir / "log").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = (dir / "ck" / "step_00000004.h5").string();
  auto prompt_loss = [&](const std::string& precision) {
    const auto g = run_command(trident_cmd(
        "generate --ckpt " + ckpt + " --prompt 'Hello there' --max-new-tokens 8 --seed 1 "
        "--prompt-loss --set train.precision=\\\"" + precision + "\\\""));
    EXPECT_EQ(g.exit_code, 0) << g.output;
    const size_t at = g.output.find("prompt loss ");
    EXPECT_NE(at, std::string::npos) << g.output;
    return at == std::string::npos ? 0.0 : std::stod(g.output.substr(at + 12));
  };
  const double fp32 = prompt_loss("fp32"), bf16 = prompt_loss("bf16");
  ASSERT_GT(fp32, 0.0);
  EXPECT_LE(rel(bf16, fp32), 1e-2);
  EXPECT_NE(bf16, fp32);
  const auto e = run_command(trident_cmd("eval --ckpt " + ckpt + " --data " +
                                         (dir / "val.bin").string() +
                                         " --steps 1 --set train.precision=\\\"bf16\\\""));
  EXPECT_EQ(e.exit_code, 0) << e.output;
  std::printf("[bf16] generate's prompt loss %.6f against fp32's %.6f (%.1e)\n", bf16, fp32,
              rel(bf16, fp32));
}

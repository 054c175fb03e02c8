// `trident plan` and `trident bench-hw` from the built binary: a plan's table and --set line,
// JSON, one given layout, and the one-line errors (bad hardware file, impossible node count or
// layout, a model that fits no layout).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "app_fixture.hpp"
#include "plan/hardware.hpp"
#include "sanitizer.hpp"

using namespace trident::test;

namespace {

std::string source(const std::string& path) { return std::string(TRIDENT_SOURCE_DIR) + "/" + path; }

RunResult plan(const std::string& args) { return run_command(trident_cmd("plan " + args), 120); }

const std::string kLlama7bOnH100 = "--config " + source("configs/llama_2_7b.toml") +
                                   " --hardware " + source("configs/hardware/h100_dgx.toml");

void expect_one_error_line(const RunResult& r, const std::string& part) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("trident: error: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  EXPECT_NE(line.find(part), std::string::npos) << r.output;
}

}  // namespace

TEST(AppPlan, Llama7bOnEightH100NodesPrintsTableAndOverrides) {
  const RunResult r = plan(kLlama7bOnH100 + " --nodes 8 --top 5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cluster: NVIDIA DGX H100, 8x NDR InfiniBand: 8 node(s) x 8 = 64 "
                          "devices"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("global batch: 1024 sequences (4194304 tokens)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("best layout:\n  --set parallel.tensor="), std::string::npos)
      << r.output;
  // Five table rows: "   1 " .. "   5 ".
  for (const char* row : {"\n   1 ", "\n   5 "})
    EXPECT_NE(r.output.find(row), std::string::npos) << row << r.output;
  EXPECT_EQ(r.output.find("\n   6 "), std::string::npos) << r.output;
}

TEST(AppPlan, JsonAndOneGivenLayout) {
  const RunResult r = run_command(
      trident_cmd("plan " + kLlama7bOnH100 +
                  " --nodes 8 --json --layout tensor=2,pipeline=4,data=8,micro_batch=1,"
                  "schedule=1f1b,zero=1,sequence_parallel=1,recompute=selective,"
                  "pipeline_balance=flops"),
      120, false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["layouts"], 1);
  ASSERT_EQ(j["best"].size(), 1u);
  const nlohmann::json& best = j["best"][0];
  EXPECT_EQ(best["layout"]["tensor"], 2);
  EXPECT_EQ(best["layout"]["pipeline"], 4);
  EXPECT_EQ(best["layout"]["recompute"], "selective");
  EXPECT_EQ(best["layout"]["pipeline_balance"], "flops");
  EXPECT_EQ(best["set"].back(), "parallel.pipeline_balance=flops");
  const double step = best["step_seconds"];
  double parts = 0;
  for (const auto& [k, v] : best["time"].items()) parts += v.get<double>();
  EXPECT_NEAR(parts, step, 1e-9 * step);
  EXPECT_GT(best["mfu"].get<double>(), 0.0);
  EXPECT_LT(best["mfu"].get<double>(), 1.0);
  EXPECT_EQ(best["set"][0], "parallel.tensor=2");
}

TEST(AppPlan, BadInputIsOneErrorLine) {
  const auto dir = scratch_dir("app_plan");
  std::string hw = read_file(source("configs/hardware/h100_dgx.toml"));
  hw.replace(hw.find("memory_bandwidth_gbs"), 20, "memory_bandwdth_gbs");
  write_file(dir / "bad.toml", hw);
  expect_one_error_line(plan("--config " + source("configs/llama_2_7b.toml") + " --hardware " +
                             (dir / "bad.toml").string() + " --nodes 1"),
                        "bad.toml: device.memory_bandwdth_gbs is not a hardware key");
  expect_one_error_line(plan(kLlama7bOnH100 + " --nodes 0"), "--nodes = 0 must be >= 1");
  // 0 sequences is no batch (not "the config's": leaving the option out says that).
  expect_one_error_line(plan(kLlama7bOnH100 + " --nodes 1 --global-batch 0"),
                        "--global-batch: must be a whole number >= 1, got 0");
  // 24 devices, a batch of 1001 (DP 1 only) and 2 layers (PP <= 2): TP would be 12 > 8.
  expect_one_error_line(plan(kLlama7bOnH100 + " --set model.layers=2 --nodes 3 "
                                              "--global-batch 1001"),
                        "no valid layout on 3 node(s) x 8 devices = 24 devices");
  expect_one_error_line(plan(kLlama7bOnH100 + " --nodes 1 --layout tensor=3,pipeline=1,data=1,"
                                              "micro_batch=1"),
                        "no valid layout");
  expect_one_error_line(plan(kLlama7bOnH100 + " --nodes 1 --layout colour=red"),
                        "--layout: unknown key \"colour\"");
  expect_one_error_line(plan(kLlama7bOnH100 + " --nodes 1 --layout tensor=8,zero=4"),
                        "--layout: zero = \"4\" must be 0, 1, 2 or 3 (the ZeRO stage)");
  // A 7B model on one 2-core CPU machine (fp32, 16 bytes a parameter at least): short by GiB.
  expect_one_error_line(plan("--config " + source("configs/llama_2_7b.toml") +
                             " --set train.precision=fp32 --set train.device=cpu --hardware " +
                             source("configs/hardware/cpu_2core.toml") + " --nodes 1"),
                        "no layout fits");
  std::filesystem::remove_all(dir);
}

// Issue 56: values that made the plan search for minutes printing nothing (every count up to a
// global batch of 2^62; a 100000-stage pipeline simulated; a node count whose devices
// overflowed to "-8 devices") answer within seconds, each with one line naming the option and
// the bound; a plan that reaches the pipeline cap says so, and every plan how long it took.
TEST(AppPlan, HugeValuesAnswerWithinSeconds) {
  const std::string tiny = "--config " + source("configs/tiny.toml") + " --hardware " +
                           source("configs/hardware/h100_dgx.toml");
  const std::pair<std::string, std::string> cases[] = {
      {kLlama7bOnH100 + " --nodes 1 --global-batch 4611686018427387904",
       "plan --global-batch = 4611686018427387904 is past the 16777216 sequences per step a "
       "plan models"},
      {kLlama7bOnH100 + " --nodes 1 --set train.global_batch=1073741824",
       "plan train.global_batch = 1073741824 is past the 16777216 sequences"},
      {tiny + " --nodes 100000 --set model.layers=100000",
       "8 devices = 800000 devices (TP must divide the devices per node, model.heads and "
       "model.kv_heads; TP x CP x PP x DP = the devices; 2 x CP must divide model.seq_len; "
       "micro-batch x DP must divide the global batch 16; pipelines deeper than 128 stages are "
       "not modelled (model.layers = 100000))"},
      {tiny + " --nodes 9223372036854775807",
       "plan --nodes = 9223372036854775807 is past the 131072 nodes of 8 devices a plan models"},
      // Past 64 bits: the command line's own check (app/cli_numbers.hpp) names the text.
      {tiny + " --nodes 99999999999999999999",
       "--nodes: must be a whole number, got 99999999999999999999 (beyond 64 bits)"},
      {tiny + " --nodes 1 --set model.layers=1000 --layout pipeline=1000",
       "plan --layout pipeline = 1000 is past the 128 pipeline stages a plan models"}};
  for (const auto& [args, error] : cases) {
    const auto start = std::chrono::steady_clock::now();
    const RunResult r = run_command(trident_cmd("plan " + args), 60);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(r.exit_code, 124) << "still searching after 60 s: " << args;
    EXPECT_LT(seconds, 15.0) << args;
    expect_one_error_line(r, error);
  }
  const RunResult capped = plan(tiny + " --set model.layers=256 --nodes 17 --top 1");
  EXPECT_EQ(capped.exit_code, 0) << capped.output;
  EXPECT_NE(capped.output.find("\npipelines deeper than 128 stages are not modelled "
                               "(model.layers = 256)\nplanned in "),
            std::string::npos)
      << capped.output;
}

// Issue 56 item 2: --hardware /dev/zero was read until killed, a FIFO blocked; both are refused
// before reading, as a config file is (plan's and train --plan auto's reader). Bounded in time
// and, but under AddressSanitizer, in memory.
TEST(AppPlan, HardwareFileThatIsNoRegularFileIsRefusedUnread) {
  const auto dir = scratch_dir("app_plan_hw_files");
  const std::string fifo = (dir / "hw.toml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string limit = kUnderAddressSanitizer ? "" : "ulimit -v 4000000; ";
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    const auto r = run_command(limit + trident_cmd("plan --config " +
                                                   source("configs/llama_2_7b.toml") +
                                                   " --hardware " + path + " --nodes 1"),
                               20);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    expect_one_error_line(r, path + ": not a regular file (");
    expect_one_error_line(r, "): --hardware needs a TOML file");
  }
  std::filesystem::remove_all(dir);
}

// Issue 56 (cosmetic): bench-hw --out in a missing directory failed only after the whole
// benchmark (a minute); the file is checked first.
TEST(AppBenchHw, OutputThatCannotBeWrittenIsRefusedBeforeMeasuring) {
  const auto r = run_command(trident_cmd("bench-hw --out /nonexistent/hw.toml"), 20);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  expect_one_error_line(r, "bench-hw --out /nonexistent/hw.toml: cannot write: No such file or "
                           "directory");
  const auto dir = scratch_dir("app_bench_hw_out");
  const auto d = run_command(trident_cmd("bench-hw --out " + dir.string()), 20);
  EXPECT_EQ(d.exit_code, 1) << d.output;
  expect_one_error_line(d, "bench-hw --out " + dir.string() + ": not a regular file");
  const auto s = run_command(trident_cmd("bench-hw --out " + (dir / "hw.toml").string() +
                                         " --storage-dir /nonexistent/ck"), 20);
  EXPECT_EQ(s.exit_code, 1) << s.output;
  expect_one_error_line(s, "bench-hw --storage-dir /nonexistent/ck: No such file or directory");
  const auto e = run_command(trident_cmd("bench-hw --out " + (dir / "hw.toml").string() +
                                         " --storage-dir ''"), 20);
  EXPECT_NE(e.exit_code, 0) << e.output;
  expect_one_error_line(e, "--storage-dir: must name a directory");
  std::filesystem::remove_all(dir);
}

TEST(AppBenchHw, OneRankWritesAFileThePlanReads) {
  const auto dir = scratch_dir("app_bench_hw");
  const auto out = dir / "cpu.toml";
  RunResult r = run_command(trident_cmd("bench-hw --out " + out.string() + " --ranks 2 " +
                                         "--storage-dir " + dir.string()), 240);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(out);
  EXPECT_NE(text.find("devices_per_node = 2"), std::string::npos) << text;
  EXPECT_NE(text.find("links: NOT measured (1 rank)"), std::string::npos) << text;
  // The device bandwidth is the trainer's elementwise kernels' streaming rate; the copy's is
  // kept beside it in the comment.
  EXPECT_NE(text.find("bandwidth: the trainer's GELU forward + backward"), std::string::npos)
      << text;
  EXPECT_NE(text.find("(a 256 MiB memcpy: "), std::string::npos) << text;
  EXPECT_NE(text.find("attention_efficiency = [[64.0, "), std::string::npos) << text;
  EXPECT_NE(text.find("optimizer_bandwidth_gbs = [[262144.0, "), std::string::npos) << text;
  // The shape grid: 4 x 4 x 4 points, the plan reads them (a full grid, or it refuses).
  EXPECT_NE(text.find("gemm_efficiency_shapes = [\n  [64.0, 64.0, 64.0, "), std::string::npos)
      << text;
  // Points of a grid: its lines up to its closing "]]" (the first "]\n" after its key).
  auto grid_points = [&](const std::string& key) {
    const size_t grid = text.find("\n" + key + " = [");
    if (grid == std::string::npos) return -1;
    const size_t end = text.find("]\n", grid);
    int points = 0;
    for (size_t at = text.find("\n  [", grid); at != std::string::npos && at < end;
         at = text.find("\n  [", at + 1))
      ++points;
    return points;
  };
  EXPECT_EQ(grid_points("gemm_efficiency_shapes"), 64) << text;
  // The bf16 engine's own grid, and a bf16 peak above fp32's, where "auto" runs that engine
  // here (the file's comment says which); else neither.
  const bool onednn = text.find("train.cpu_bf16_gemm = \"auto\" runs \"onednn\" here") !=
                      std::string::npos;
  EXPECT_NE(onednn, text.find("train.cpu_bf16_gemm = \"auto\" runs \"fma\" on this core") !=
                        std::string::npos)
      << text;
  EXPECT_EQ(grid_points("gemm_efficiency_shapes_bf16"), onednn ? 64 : -1) << text;
  EXPECT_EQ(text.find("attention_efficiency_bf16 = [[64.0, ") != std::string::npos, onednn)
      << text;
  // Each attention curve with its forward's measured shares of the time, at the same sizes.
  EXPECT_NE(text.find("attention_forward_share = [[64.0, "), std::string::npos) << text;
  EXPECT_EQ(text.find("attention_forward_share_bf16 = [[64.0, ") != std::string::npos, onednn)
      << text;
  // The bf16 peak is the better of the sgemm's best and the bf16 matmul's (the comment's
  // figure), where that engine is measured; fp32's where it is not. Whether the matmul outran
  // the sgemm in this run is printed, not asserted: auto's choice rests on the core's rates
  // (cpu::bf16_dot_rate), and a slow spell of a shared machine during the bf16 rounds lowers
  // only them.
  const trident::HardwareSpec measured = trident::load_hardware(out.string());
  EXPECT_EQ(measured.device.attention_forward_share.size(),
            measured.device.attention_efficiency.size());
  for (const auto& [size, share] : measured.device.attention_forward_share) {
    EXPECT_GE(share, 0.05) << size;  // the clamp's ends: a forward is neither free nor all
    EXPECT_LE(share, 0.95) << size;
  }
  const double fp32_peak = measured.device.peak_tflops_fp32;
  double bf16_matmul = 0.0;  // TFLOP/s, the comment's "best X GFLOP/s"
  const std::string bf16_best = "# bf16 = oneDNN's bf16 matmul on the cubes n = 512-1536, best ";
  const size_t best_at = text.find(bf16_best);
  EXPECT_EQ(best_at != std::string::npos, onednn) << text;
  if (best_at != std::string::npos) {
    bf16_matmul = std::strtod(text.c_str() + best_at + bf16_best.size(), nullptr) / 1e3;
    EXPECT_GT(bf16_matmul, 0.0) << text;
  }
  EXPECT_NEAR(measured.device.peak_tflops_bf16, std::max(fp32_peak, bf16_matmul), 1e-4) << text;
  std::printf("[bench-hw] bf16: %s (peak %.3f against fp32's %.3f TFLOP/s%s)\n",
              onednn ? "oneDNN engine, its own grid" : "the FMA engine, fp32's grid",
              measured.device.peak_tflops_bf16, fp32_peak,
              onednn && bf16_matmul <= fp32_peak
                  ? "; NOTE: the bf16 matmul did not outrun the sgemm in this run"
                  : "");
  r = plan("--config " + source("configs/tiny.toml") + " --hardware " + out.string() +
           " --nodes 1 --top 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("best layout:"), std::string::npos) << r.output;
  // --storage-dir: the checkpoint writer's rate and a dataset's cost there, which the plan
  // prices a config's periodic saves at (nothing of the measurement left in the directory).
  EXPECT_NE(text.find("[storage]\nwrite_gbs = "), std::string::npos) << text;
  EXPECT_NE(text.find("dataset_ms = "), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(dir / "trident-bench-hw-storage.tmp"));
  const std::string saves = " --set checkpoint.dir='\"" + dir.string() +
                            "/ck\"' --set checkpoint.interval=10";
  r = plan("--config " + source("configs/tiny.toml") + " --hardware " + out.string() +
           " --nodes 1 --top 3" + saves);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoints: a save every 10 steps (synchronous): "),
            std::string::npos)
      << r.output;
  // A file without the storage's figures: said, not guessed.
  r = plan("--config " + source("configs/tiny.toml") + " --hardware " +
           source("configs/hardware/cpu_2core.toml") + " --nodes 1 --top 3" + saves);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoints: a save every 10 steps is not modelled: "),
            std::string::npos)
      << r.output;
  expect_one_error_line(run_command(trident_cmd("bench-hw --out " + out.string() +
                                                " --device tpu"), 60),
                        "bench-hw --device \"tpu\" must be cpu or cuda");
  std::filesystem::remove_all(dir);
}

// The cores are those of the affinity mask, as `train.threads = 0` counts them: under a cpuset
// of one core (Slurm's --cpus-per-task, mpiexec's binding; here taskset) one thread is measured,
// not one per core of the machine.
TEST(AppBenchHw, CountsTheCoresOfItsAffinityMask) {
  if (run_command("command -v taskset").exit_code != 0) GTEST_SKIP() << "no taskset here";
  const cpu_set_t mask = affinity_mask();
  int cpu = 0;
  while (!CPU_ISSET(cpu, &mask)) ++cpu;  // the first core this test may run on
  const auto dir = scratch_dir("app_bench_hw_affinity");
  const auto out = dir / "cpu.toml";
  const RunResult r = run_command(
      "env -u OMP_NUM_THREADS taskset -c " + std::to_string(cpu) + " " +
          trident_cmd("bench-hw --out " + out.string()),
      240);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(out);
  EXPECT_NE(text.find(" 1 rank(s) x 1 thread(s) (rank 0: 1 core of its own)."),
            std::string::npos)
      << text;
  std::filesystem::remove_all(dir);
}

// --device cuda goes through the GPU module: without a GPU (this project's CI) one error line
// naming what is missing; with one, a file of kind "gpu" that the plan reads.
TEST(AppBenchHw, CudaMeasuresTheGpuOrSaysWhatIsMissing) {
  const auto dir = scratch_dir("app_bench_hw_cuda");
  const auto out = dir / "gpu.toml";
  const RunResult r =
      run_command(trident_cmd("bench-hw --device cuda --out " + out.string()), 300);
  if (r.exit_code != 0) {
    const bool no_gpu = r.output.find("no CUDA device is visible") != std::string::npos;
    const bool no_cuda = r.output.find("built without CUDA") != std::string::npos;
    EXPECT_TRUE(no_gpu || no_cuda) << r.output;
    expect_one_error_line(r, no_gpu ? "bench-hw --device cuda: no CUDA device is visible"
                                    : "this trident was built without CUDA");
  } else {
    const std::string text = read_file(out);
    EXPECT_NE(text.find("kind = \"gpu\""), std::string::npos) << text;
    EXPECT_NE(text.find("links: NOT measured (1 rank)"), std::string::npos) << text;
    // The curves as on the CPU: training GEMMs from s = 256, attention from T = 256, HS = 32
    // (cube root 128), the optimizer pass from 1 Mi parameters.
    EXPECT_NE(text.find("gemm_efficiency = [[256.0, "), std::string::npos) << text;
    EXPECT_NE(text.find("attention_efficiency = [[128.0, "), std::string::npos) << text;
    EXPECT_NE(text.find("attention_forward_share = [[128.0, "), std::string::npos) << text;
    EXPECT_NE(text.find("optimizer_bandwidth_gbs = [[1048576.0, "), std::string::npos) << text;
    EXPECT_EQ(plan("--config " + source("configs/gpu_124m.toml") + " --hardware " +
                   out.string() + " --nodes 1 --top 1")
                  .exit_code,
              0);
  }
  std::filesystem::remove_all(dir);
}

// trident train --plan auto: under mpiexec on 2 ranks with this machine's hardware file, the
// run prints the chosen layout and the next two with their predictions, trains with the chosen
// one (its resolved config says so), and each misuse is one error line.
TEST(AppPlan, TrainPlanAutoChoosesALayoutForTheRanksAndSaysWhy) {
  const auto dir = scratch_dir("plan_auto");
  const auto config = make_tiny_run(dir);
  const std::string hw = " --hardware " + source("configs/hardware/cpu_2core.toml");
  const std::string train = "train --config " + config.string() + " --set train.steps=2 ";
  const RunResult r = run_command(std::string(TRIDENT_MPIEXEC) + " -n 2 " +
                                      trident_cmd(train + "--plan auto" + hw),
                                  120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("plan auto: 2 rank(s) as 1 node(s) x 2 devices of "), std::string::npos)
      << r.output;
  const size_t chosen = r.output.find("\n  chosen tensor=");
  ASSERT_NE(chosen, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\n  next   tensor=", chosen), r.output.find("\n  next   ")) << r.output;
  EXPECT_NE(r.output.find("predicted "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step      2/2 | loss "), std::string::npos) << r.output;
  // The layout trained is the one chosen: its parallel.* values in the resolved config.
  const std::string line = r.output.substr(chosen + 3, r.output.find('\n', chosen + 1) - chosen - 3);
  const auto value = [&](const std::string& key) {
    const size_t at = line.find(key + "=");
    return at == std::string::npos ? std::string() : line.substr(at + key.size() + 1, 1);
  };
  std::ifstream resolved(dir / "run" / "config.toml");
  const std::string text((std::istreambuf_iterator<char>(resolved)), {});
  for (const auto& [plan_key, config_key] :
       {std::pair<std::string, std::string>{"tensor", "tensor = "}, {"pipeline", "pipeline = "},
        {"data", "data = "}}) {
    ASSERT_FALSE(value(plan_key).empty()) << line;
    EXPECT_NE(text.find("\n" + config_key + value(plan_key)), std::string::npos)
        << plan_key << "\n" << text;
  }

  expect_one_error_line(run_command(std::string(TRIDENT_MPIEXEC) + " -n 3 " +
                                        trident_cmd(train + "--plan auto" + hw),
                                    120),
                        "3 ranks are not whole nodes of 2 devices");
  expect_one_error_line(run_command(trident_cmd(train + "--plan auto"), 60),
                        "train --plan auto needs --hardware FILE");
  expect_one_error_line(run_command(trident_cmd(train + hw.substr(1)), 60),
                        "is only read with --plan auto");
}

// A mixture of experts: the plan lists expert-parallel layouts (EP dividing DP and the experts)
// with their all-to-alls, the table gets its EP and ep columns, the overrides parallel.expert;
// --precision models another precision than the config's (Mixtral-like on H100s in bf16).
TEST(AppPlan, MixtureOfExpertsListsExpertParallelLayouts) {
  const std::string moe = "--config " + source("configs/moe_tiny.toml") + " --hardware " +
                          source("configs/hardware/cpu_2core.toml") + " --nodes 1";
  const RunResult j = run_command(trident_cmd("plan " + moe + " --json --top 1000"), 120, false);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  const nlohmann::json out = nlohmann::json::parse(j.output);
  int with_ep = 0, compared = 0;
  for (const nlohmann::json& best : out["best"]) {
    const int64_t ep = best["layout"]["expert"];
    EXPECT_EQ(best["layout"]["data"].get<int64_t>() % ep, 0);
    const std::vector<std::string> set = best["set"];
    EXPECT_NE(std::find(set.begin(), set.end(), "parallel.expert=" + std::to_string(ep)),
              set.end());
    if (ep > 1) {
      ++with_ep;
      EXPECT_GT(best["time"]["ep_comm"].get<double>(), 0.0);
    } else {
      EXPECT_EQ(best["time"]["ep_comm"].get<double>(), 0.0);
    }
    ++compared;
  }
  EXPECT_EQ(compared, out["layouts"].get<int>());
  EXPECT_GT(with_ep, 0);
  const RunResult t = plan(moe + " --top 3");
  EXPECT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("mixture of experts: 4 of 8 layers with 8 experts, top-2"),
            std::string::npos)
      << t.output;
  EXPECT_NE(t.output.find("  DP  EP  mb"), std::string::npos) << t.output;

  const RunResult mixtral = plan("--config " + source("configs/plan/mixtral_8x7b.toml") +
                                 " --hardware " + source("configs/hardware/h100_dgx.toml") +
                                 " --nodes 2 --precision bf16 --top 1");
  EXPECT_EQ(mixtral.exit_code, 0) << mixtral.output;
  EXPECT_NE(mixtral.output.find("peak 989.4 TFLOP/s bf16"), std::string::npos) << mixtral.output;
}

// Issue 54 item 3 ("honest at scale"): the default table fits 120 columns, --wide prints every
// column; both tables carry the warn column.
namespace {

// The table's lines: from its header ("   #  TP") to the line before "warnings" or "best layout:".
std::vector<std::string> table_lines(const std::string& output) {
  std::vector<std::string> lines;
  const size_t start = output.find("\n   #  TP");
  if (start == std::string::npos) return lines;
  std::istringstream in(output.substr(start + 1));
  std::string line;
  while (std::getline(in, line) && line.rfind("warnings", 0) != 0 &&
         line.rfind("best layout:", 0) != 0)
    lines.push_back(line);
  return lines;
}

size_t widest(const std::vector<std::string>& lines) {
  size_t w = 0;
  for (const std::string& l : lines) w = std::max(w, l.size());
  return w;
}

const std::string kLlama8bOnH100 = "--config " + source("configs/llama_3.1_8b.toml") +
                                   " --hardware " + source("configs/hardware/h100_dgx.toml");

}  // namespace

TEST(AppPlan, DefaultTableFitsOneHundredTwentyColumnsAndWideHasEveryColumn) {
  const std::string moe = "--config " + source("configs/moe_tiny.toml") + " --hardware " +
                          source("configs/hardware/cpu_2core.toml") + " --nodes 1 --top 10";
  for (const std::string& args : {kLlama8bOnH100 + " --nodes 8 --top 10", moe}) {
    const RunResult r = plan(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::string> table = table_lines(r.output);
    ASSERT_EQ(table.size(), 11u) << r.output;  // the header and 10 rows
    EXPECT_LE(widest(table), 120u) << r.output;
    EXPECT_NE(table[0].find(" step s comp% comm%  bub%  opt%  mem GiB   MFU% warn"),
              std::string::npos)
        << table[0];
    const RunResult w = plan(args + " --wide");
    ASSERT_EQ(w.exit_code, 0) << w.output;
    const std::vector<std::string> wide = table_lines(w.output);
    ASSERT_EQ(wide.size(), 11u) << w.output;
    EXPECT_GT(widest(wide), 120u) << w.output;
    for (const char* column : {" compute ", " tp ", " bubble ", " pp ", " dp ", " optim ",
                               " mem GiB ", " wts ", " grads ", " opt ", " acts ", " bufs ",
                               " tokens/s ", " TFLOP/s ", " MFU ", " warn"})
      EXPECT_NE(wide[0].find(column), std::string::npos) << column << "\n" << wide[0];
  }
}

// The cases: 256 sequences on 64 nodes of 8 GPUs is planned with a word about the
// batch; on 8 nodes every listed layout's warnings are exactly those its own numbers call for
// (JSON), and the best one's are printed in full.
TEST(AppPlan, WarningsSayWhatTheNumbersHide) {
  const RunResult big = plan(kLlama8bOnH100 + " --nodes 64 --top 3");
  ASSERT_EQ(big.exit_code, 0) << big.output;
  EXPECT_NE(big.output.find("\n  every layout: batch: the global batch of 256 sequences is fewer "
                            "than the 512 devices"),
            std::string::npos)
      << big.output;
  const RunResult bj = run_command(trident_cmd("plan " + kLlama8bOnH100 + " --nodes 64 --top 1 "
                                                                          "--json"),
                                   120, false);
  ASSERT_EQ(bj.exit_code, 0) << bj.output;
  const nlohmann::json big_json = nlohmann::json::parse(bj.output);
  ASSERT_EQ(big_json["warnings"].size(), 1u) << bj.output;
  EXPECT_EQ(big_json["warnings"][0]["kind"], "batch");

  const RunResult j = run_command(trident_cmd("plan " + kLlama8bOnH100 + " --nodes 8 --top 10 "
                                                                         "--json"),
                                  120, false);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  const nlohmann::json out = nlohmann::json::parse(j.output);
  EXPECT_TRUE(out["warnings"].empty()) << "256 sequences on 64 devices";
  const double capacity = out["device_memory_gib"].get<double>() * 1024 * 1024 * 1024;
  std::set<std::string> seen;
  for (const nlohmann::json& best : out["best"]) {
    std::set<std::string> kinds;
    for (const nlohmann::json& w : best["warnings"]) kinds.insert(w["kind"].get<std::string>());
    const int64_t pp = best["layout"]["pipeline"];
    const double step = best["step_seconds"];
    const bool microbatches = pp > 1 && best["microbatches"].get<int64_t>() < 2 * pp;
    const bool headroom =
        best["fits"].get<bool>() && best["memory_bytes"]["total"].get<double>() > 0.9 * capacity;
    const bool bubble = best["time"]["bubble"].get<double>() > 0.2 * step;
    const bool overlap = best["dp_reduction"]["assumed_hidden_seconds"].get<double>() > 0.0;
    EXPECT_EQ(kinds.count("microbatches") == 1, microbatches) << best.dump();
    EXPECT_EQ(kinds.count("headroom") == 1, headroom) << best.dump();
    EXPECT_EQ(kinds.count("bubble") == 1, bubble) << best.dump();
    EXPECT_EQ(kinds.count("overlap") == 1, overlap) << best.dump();
    seen.insert(kinds.begin(), kinds.end());
  }
  EXPECT_FALSE(seen.empty()) << "a plan whose ten best layouts hide nothing: " << j.output;
  // The text prints the best layout's in full.
  const RunResult t = plan(kLlama8bOnH100 + " --nodes 8 --top 10");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  for (const nlohmann::json& w : out["best"][0]["warnings"])
    EXPECT_NE(t.output.find("\n  layout 1: " + w["kind"].get<std::string>() + ": "),
              std::string::npos)
        << w.dump() << "\n" << t.output;
}

// trident train --plan auto says the chosen layout's warnings with its reasons: one sequence a
// step on two ranks.
TEST(AppPlan, TrainPlanAutoSaysTheChosenLayoutsWarnings) {
  const auto dir = scratch_dir("plan_auto_warnings");
  const auto config = make_tiny_run(dir);
  const RunResult r = run_command(
      std::string(TRIDENT_MPIEXEC) + " -n 2 " +
          trident_cmd("train --config " + config.string() +
                      " --set train.steps=1 --set train.global_batch=1 --set train.micro_batch=1 "
                      "--plan auto --hardware " + source("configs/hardware/cpu_2core.toml")),
      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\n  warning: batch: the global batch of 1 sequence is fewer than the "
                          "2 devices"),
            std::string::npos)
      << r.output;
  std::filesystem::remove_all(dir);
}

// Errors are exactly one line, on one process or several: no MPI abort lines after it.
TEST(AppPlan, ErrorsAreExactlyOneLine) {
  const std::string cpu_7b = "--config " + source("configs/llama_2_7b.toml") +
                             " --set train.precision=fp32 --set train.device=cpu --hardware " +
                             source("configs/hardware/cpu_2core.toml") + " --nodes 1";
  const std::pair<std::string, std::string> cases[] = {
      {kLlama7bOnH100 + " --nodes 0", "trident: error: plan --nodes = 0 must be >= 1"},
      {kLlama7bOnH100 + " --nodes 1 --layout colour=red",
       "trident: error: --layout: unknown key \"colour\""},
      {cpu_7b, "trident: error: no layout fits: "}};
  for (const std::string launcher : {std::string(), std::string(TRIDENT_MPIEXEC) + " -n 2 "})
    for (const auto& [args, start] : cases) {
      const RunResult r = run_command(launcher + trident_cmd("plan " + args), 60);
      EXPECT_EQ(r.exit_code, 1) << launcher << args << "\n" << r.output;
      EXPECT_EQ(r.output.rfind(start, 0), 0u) << launcher << args << "\n" << r.output;
      EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1)
          << launcher << args << "\n" << r.output;
    }
}

// Issue 49 item 6: Llama 3.1 8B at 128K tokens a sequence on 8 DGX H100 nodes: the plan lists
// context-parallel layouts and the best one that fits splits the sequence (CP > 1 in the table
// and the --set line); a CP the sequence cannot be cut by is refused with the reason.
TEST(AppPlan, LongSequencePlansContextParallelism) {
  const RunResult r = plan(kLlama8bOnH100 + " --set model.seq_len=131072 --nodes 8 --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> table = table_lines(r.output);
  ASSERT_EQ(table.size(), 4u) << r.output;
  EXPECT_NE(table[0].find("   #  TP  CP  PP   DP"), std::string::npos) << table[0];
  // Row 1: "   1  TP  CP ..." and its memory without the '!' of a layout that does not fit.
  std::istringstream row(table[1]);
  int64_t rank = 0, tp = 0, cp = 0;
  row >> rank >> tp >> cp;
  EXPECT_EQ(rank, 1);
  EXPECT_GT(cp, 1) << r.output;
  EXPECT_EQ(table[1].find('!'), std::string::npos) << table[1];
  EXPECT_NE(r.output.find("--set parallel.context=" + std::to_string(cp) + " "),
            std::string::npos)
      << r.output;
  expect_one_error_line(plan(kLlama8bOnH100 + " --set model.seq_len=131072 --nodes 3 "
                                              "--global-batch 1 --layout tensor=8,context=3,"
                                              "pipeline=1,data=1,micro_batch=1"),
                        "model.seq_len = 131072 is not divisible by 2 * parallel.context = 6");
}

// trident train --plan auto trains a context-parallel layout where the plan predicts it
// fastest, and skips, saying so, the layouts the trainer refuses with the config's other keys.
// One 4096-token sequence a step on two ranks (DP 1; the validation shard is shorter than one
// sequence: a training shard stands in): CP 2 is predicted ~1.5 % faster than TP 2 (its all-reduces) and PP 2 (half the
// step idle). With eval.sample_interval > 0 the trainer
// refuses CP > 1 (sampling decodes the whole sequence on one rank), so a CP-free layout runs.
TEST(AppPlan, TrainPlanAutoRunsContextParallelismOrSkipsWhatTheConfigRefuses) {
  const auto dir = scratch_dir("plan_auto_context");
  const auto config = make_tiny_run(dir);
  const std::string train =
      std::string(TRIDENT_MPIEXEC) + " -n 2 " +
      trident_cmd("train --config " + config.string() +
                  " --set model.seq_len=4096 --set train.steps=1 --set train.global_batch=1 "
                  "--set train.micro_batch=1 --set data.val=" + (dir / "train_001.bin").string() +
                  " --plan auto --hardware " +
                  source("configs/hardware/cpu_2core.toml"));
  const auto chosen_line = [](const std::string& output) {
    const size_t at = output.find("\n  chosen ");
    return at == std::string::npos ? std::string()
                                   : output.substr(at + 1, output.find('\n', at + 1) - at - 1);
  };
  const RunResult r = run_command(train, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(chosen_line(r.output).rfind("  chosen tensor=1,context=2,", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find("skipped "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step      1/1 | loss "), std::string::npos) << r.output;
  const RunResult s = run_command(train + " --set eval.sample_interval=1000", 120);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("\n  skipped "), std::string::npos) << s.output;
  EXPECT_NE(s.output.find(" faster layout(s) the trainer refuses with this config, the fastest "
                          "tensor=1,context=2,"),
            std::string::npos)
      << s.output;
  EXPECT_NE(s.output.find("eval.sample_interval"), std::string::npos) << s.output;
  EXPECT_EQ(chosen_line(s.output).find("context="), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("step      1/1 | loss "), std::string::npos) << s.output;
  std::filesystem::remove_all(dir);
}

// train.precision = "fp8" (docs/plan.md "FP8"): Llama 3.1 8B on one DGX H100 node, one layout
// planned in bf16 and in fp8 (--precision): the fp8 step is faster, by less than the 2x of the
// GEMMs' rates (the rest stays bf16, the quantisation passes cost); the JSON says what it
// modelled (layers covered, the FP8 GEMMs', the passes' and the amax all-reduces' figures, the
// quantised copies' scratch) and that MFU is against the bf16 peak. The config's own
// train.precision = "fp8" and train.fp8_skip_* are planned alike; an H100 without its FP8 rate
// is one error line naming the file and the key, and the trainer's refusal of fp8 on a GPU is
// said beside the best layout.
TEST(AppPlan, Fp8OnH100IsFasterThanBf16AndSaysWhatItModelled) {
  const std::string one = kLlama8bOnH100 + " --nodes 1 --json --layout tensor=1,pipeline=1,"
                                           "data=8,micro_batch=8,zero=3,recompute=none";
  auto best_of = [](const std::string& args) {
    const RunResult r = run_command(trident_cmd("plan " + args), 120, false);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json();
  };
  const nlohmann::json bf16 = best_of(one), fp8 = best_of(one + " --precision fp8");
  ASSERT_EQ(fp8["best"].size(), 1u);
  EXPECT_EQ(fp8["precision"], "fp8");
  EXPECT_EQ(fp8["mfu_peak_precision"], "bf16");
  EXPECT_DOUBLE_EQ(fp8["mfu_peak_tflops"].get<double>(), 989.4);
  const nlohmann::json &b = bf16["best"][0], &f = fp8["best"][0];
  const double b_step = b["step_seconds"], f_step = f["step_seconds"];
  EXPECT_LT(f_step, b_step);
  EXPECT_GT(f_step, b_step / 2.0);
  double parts = 0;
  for (const auto& [k, v] : f["time"].items()) parts += v.get<double>();
  EXPECT_NEAR(parts, f_step, 1e-9 * f_step);
  EXPECT_EQ(f["fp8"]["layers"], 30);  // 32 less the first and the last
  EXPECT_EQ(b["fp8"]["layers"], 0);
  EXPECT_GT(f["fp8"]["gemm_seconds"].get<double>(), 0.0);
  EXPECT_LT(f["fp8"]["gemm_seconds"].get<double>(), f["time"]["compute"].get<double>());
  EXPECT_GT(f["fp8"]["quantise_bytes"].get<double>(), 0.0);
  EXPECT_GT(f["fp8"]["quantise_seconds"].get<double>(), 0.0);
  EXPECT_EQ(f["fp8"]["amax_all_reduces"].get<double>(), 0.0) << "TP 1: no group to reduce over";
  const double scratch = f["fp8"]["scratch_bytes"];
  EXPECT_GT(scratch, 0.0);
  EXPECT_NEAR(f["memory_bytes"]["total"].get<double>() - b["memory_bytes"]["total"].get<double>(),
              scratch, 1e-9 * scratch);
  // No recomputation: hardware FLOPs = model FLOPs, so MFU = TFLOP/s over the bf16 peak.
  EXPECT_NEAR(f["mfu"].get<double>(), f["tflops_per_device"].get<double>() / 989.4, 1e-9);

  // The config's train.precision.
  const nlohmann::json config = best_of(one + " --set train.device=cpu --set train.precision=fp8 "
                                              "--set train.fp8_skip_first_layers=2");
  EXPECT_EQ(config["precision"], "fp8");
  EXPECT_EQ(config["best"][0]["fp8"]["layers"], 29);

  const RunResult table = plan(kLlama8bOnH100 + " --nodes 1 --top 1 --precision fp8");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  for (const char* text : {"peak 989.4 TFLOP/s bf16\nfp8: the linear GEMMs of 30 of 32 layers "
                           "at 1979 TFLOP/s",
                           "MFU against the bf16 peak (bf16-equivalent)"})
    EXPECT_NE(table.output.find(text), std::string::npos) << text << "\n" << table.output;
  // The GPU trainer takes fp8 (cuBLASLt's FP8 GEMMs): no refusal under the best layout.
  EXPECT_EQ(table.output.find("the trainer refuses it"), std::string::npos) << table.output;
  expect_one_error_line(plan("--config " + source("configs/llama_3.1_8b.toml") + " --hardware " +
                             source("configs/hardware/a100_80gb_dgx.toml") +
                             " --nodes 1 --precision fp8"),
                        "a100_80gb_dgx.toml: device.peak_tflops_fp8 is missing: train.precision "
                        "= \"fp8\" needs the device's dense FP8 tensor-core rate");
}

// trident train --plan auto with train.precision = "fp8" (the CPU reference; cpu_2core.toml
// models its FP8 GEMMs at the fp32 rate): plans, chooses and trains.
TEST(AppPlan, TrainPlanAutoPlansAndTrainsFp8) {
  const auto dir = scratch_dir("plan_auto_fp8");
  const auto config = make_tiny_run(dir);
  const RunResult r = run_command(
      std::string(TRIDENT_MPIEXEC) + " -n 2 " +
          trident_cmd("train --config " + config.string() +
                      " --set train.steps=2 --set model.layers=4 --set train.precision=fp8 "
                      "--plan auto --hardware " + source("configs/hardware/cpu_2core.toml")),
      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\n  chosen tensor="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step      2/2 | loss "), std::string::npos) << r.output;
  std::ifstream resolved(dir / "run" / "config.toml");
  const std::string text((std::istreambuf_iterator<char>(resolved)), {});
  EXPECT_NE(text.find("precision = \"fp8\""), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

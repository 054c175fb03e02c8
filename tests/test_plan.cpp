// The cost model of `trident plan` (lib/plan) on cases with a closed-form answer: a flat GEMM
// efficiency and an unlimited memory bandwidth make compute = FLOPs / peak; the 1F1B bubble is
// (p-1)(f+b); ring collectives cost factor * (n-1)/n * bytes / bandwidth + steps * latency;
// memory is the trainer's flat buffers and stash.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "model/architecture.hpp"
#include "model/cpu_model.hpp"
#include "model/model_stats.hpp"
#include "plan/cost_model.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/shard_plan.hpp"
#include "plan/hardware.hpp"
#include "train/startup_checks.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

// A device with efficiency 1 at every size, memory traffic that costs nothing, links of
// 10 GB/s and 2 us.
// A number as a TOML float with every digit it needs.
std::string toml_number(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  std::string s = b;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string ideal_hardware_text(int devices_per_node = 8) {
  return "name = \"ideal\"\ndevices_per_node = " + std::to_string(devices_per_node) +
         "\n[device]\nkind = \"gpu\"\npeak_tflops_fp32 = 10.0\npeak_tflops_bf16 = 100.0\n"
         "gemm_efficiency = [[64, 1.0], [4096, 1.0]]\nmemory_gib = 80.0\nreserved_gib = 1.0\n"
         "memory_bandwidth_gbs = 1e12\n"
         "[intra_node]\nbandwidth_gbs = 10.0\nefficiency = 1.0\nlatency_us = 2.0\n"
         "[inter_node]\nbandwidth_gbs = 5.0\nefficiency = 1.0\nlatency_us = 4.0\n"
         "[collectives]\nall_reduce = 2.0\nall_gather = 1.0\nreduce_scatter = 1.0\n"
         "send_recv = 1.0\n";
}

ModelConfig small_gpt() {
  ModelConfig m;
  m.arch = "gpt2";
  m.layers = 8;
  m.heads = 4;
  m.width = 64;
  m.vocab_size = 64;
  m.seq_len = 16;
  return m;
}

PlanProblem problem(const ModelConfig& m, int64_t nodes = 1, int64_t global_batch = 32) {
  PlanProblem p;
  p.model = m;
  p.global_batch = global_batch;
  p.precision = "fp32";
  p.hw = parse_hardware(ideal_hardware_text(), "ideal.toml");
  p.nodes = nodes;
  return p;
}

Layout layout(int64_t tp, int64_t pp, int64_t dp, int64_t mb = 1,
              ScheduleKind kind = ScheduleKind::OneFOneB) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.micro_batch = mb;
  l.schedule = kind;
  return l;
}

void expect_error(const std::string& text, const std::string& part) {
  try {
    parse_hardware(text, "hw.toml");
    ADD_FAILURE() << "no error; expected: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

}  // namespace

TEST(PlanHardware, EfficiencyIsInterpolatedInLogSizeAndFlatBeyondTheEnds) {
  const HardwareSpec hw = parse_hardware(
      replace(ideal_hardware_text(), "[[64, 1.0], [4096, 1.0]]", "[[100, 0.2], [1000, 0.8]]"),
      "hw.toml");
  EXPECT_DOUBLE_EQ(hw.gemm_efficiency(10, 10, 10), 0.2);
  EXPECT_DOUBLE_EQ(hw.gemm_efficiency(5000, 5000, 5000), 0.8);
  // Geometric middle of 100 and 1000: halfway.
  const double mid = std::sqrt(100.0 * 1000.0);
  EXPECT_NEAR(hw.gemm_efficiency(mid, mid, mid), 0.5, 1e-12);
  // The size is the cube root of m*n*k.
  EXPECT_NEAR(hw.gemm_efficiency(100, 1000, 1000), hw.gemm_efficiency(464.158883, 464.158883,
                                                                      464.158883), 1e-6);
}

// `trident bench-hw --name` writes any text as the file's name, and its comment lines may hold a
// device's name: the file it writes reads back with the same name, one comment line each.
TEST(PlanHardware, NameAndCommentsOfAnyTextReadBack) {
  HardwareSpec hw = parse_hardware(ideal_hardware_text(), "hw.toml");
  hw.name = "a \"quoted\" \\ name\nwith a newline\t\x01 and \u00fc";
  const std::string text = hardware_to_toml(hw, {"measured on\nan odd \"device\""});
  const HardwareSpec again = parse_hardware(text, "again.toml");
  EXPECT_EQ(again.name, hw.name);
  EXPECT_EQ(text.rfind("# measured on\\nan odd \"device\"\n", 0), 0u) << text;
}

// device.attention_efficiency is optional: absent, attention reaches the GEMM curve at
// T x HS x T; present, its own curve at cbrt(T*T*HS), interpolated the same way; it is written
// back by hardware_to_toml, and checked as the GEMM curve is.
TEST(PlanHardware, AttentionCurveIsOptionalAndReadLikeTheGemmCurve) {
  const std::string curves =
      replace(ideal_hardware_text(), "[[64, 1.0], [4096, 1.0]]", "[[100, 0.2], [1000, 0.8]]");
  const HardwareSpec without = parse_hardware(curves, "hw.toml");
  EXPECT_TRUE(without.device.attention_efficiency.empty());
  EXPECT_DOUBLE_EQ(without.attention_efficiency(1024, 64), without.gemm_efficiency(1024, 64, 1024));
  const std::string text = replace(curves, "memory_gib = 80.0",
                                   "attention_efficiency = [[64, 0.1], [512, 0.9]]\n"
                                   "memory_gib = 80.0");
  const HardwareSpec with = parse_hardware(text, "hw.toml");
  ASSERT_EQ(with.device.attention_efficiency.size(), 2u);
  EXPECT_DOUBLE_EQ(with.attention_efficiency(16, 16), 0.1);     // below the first size
  EXPECT_DOUBLE_EQ(with.attention_efficiency(4096, 128), 0.9);  // beyond the last
  // cbrt(T*T*HS) = sqrt(64 * 512), the geometric middle: halfway.
  const double mid = std::sqrt(64.0 * 512.0);
  EXPECT_NEAR(with.attention_efficiency(mid, mid), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(with.gemm_efficiency(10, 10, 10), 0.2);  // the GEMM curve untouched
  const HardwareSpec again = parse_hardware(hardware_to_toml(with, {}), "again.toml");
  EXPECT_EQ(again.device.attention_efficiency, with.device.attention_efficiency);
  expect_error(replace(text, "[[64, 0.1], [512, 0.9]]", "[[64, 0.1], [512, 1.9]]"),
               "device.attention_efficiency point [512, 1.9]");
}

// device.attention_forward_share (and _bf16) are optional: absent, the forward takes 1/3 of the
// attention's time (its share of the counted FLOPs); present, the curve at cbrt(T*T*HS),
// interpolated as the efficiency curves are; the bf16 curve goes with the bf16 efficiency
// curve (a bf16 plan without that curve reads the fp32 one's shares); written back; a share
// of 1 or more, or of 0, is refused with one line naming the key.
TEST(PlanHardware, AttentionForwardShareIsOptionalAndGoesWithItsEfficiencyCurve) {
  const std::string base = ideal_hardware_text();
  const HardwareSpec without = parse_hardware(base, "hw.toml");
  EXPECT_TRUE(without.device.attention_forward_share.empty());
  EXPECT_DOUBLE_EQ(without.attention_forward_share(1024, 64), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(without.attention_forward_share(1024, 64, "bf16"), 1.0 / 3.0);
  const std::string text =
      replace(base, "memory_gib = 80.0",
              "attention_efficiency = [[64, 0.4], [512, 0.8]]\n"
              "attention_forward_share = [[64, 0.45], [512, 0.3]]\nmemory_gib = 80.0");
  const HardwareSpec with = parse_hardware(text, "hw.toml");
  EXPECT_DOUBLE_EQ(with.attention_forward_share(16, 16), 0.45);     // below the first size
  EXPECT_DOUBLE_EQ(with.attention_forward_share(4096, 128), 0.3);   // beyond the last
  const double mid = std::sqrt(64.0 * 512.0);
  EXPECT_NEAR(with.attention_forward_share(mid, mid), 0.375, 1e-12);
  // No bf16 efficiency curve: a bf16 plan's attention is the fp32 curve's, and so its shares.
  EXPECT_DOUBLE_EQ(with.attention_forward_share(16, 16, "bf16"), 0.45);
  const std::string bf16 =
      replace(text, "memory_gib = 80.0",
              "attention_efficiency_bf16 = [[64, 0.2], [512, 0.5]]\n"
              "attention_forward_share_bf16 = [[64, 0.5], [512, 0.4]]\nmemory_gib = 80.0");
  const HardwareSpec both = parse_hardware(bf16, "hw.toml");
  EXPECT_DOUBLE_EQ(both.attention_forward_share(16, 16, "bf16"), 0.5);
  EXPECT_DOUBLE_EQ(both.attention_forward_share(16, 16, "fp32"), 0.45);
  // A bf16 efficiency curve without its shares: the bf16 attention's split is not the fp32
  // kernel's, so it takes the FLOPs' third rather than another kernel's measurement.
  const HardwareSpec bf16_only = parse_hardware(
      replace(text, "memory_gib = 80.0",
              "attention_efficiency_bf16 = [[64, 0.2], [512, 0.5]]\nmemory_gib = 80.0"),
      "hw.toml");
  EXPECT_DOUBLE_EQ(bf16_only.attention_forward_share(16, 16, "bf16"), 1.0 / 3.0);
  const HardwareSpec again = parse_hardware(hardware_to_toml(both, {}), "again.toml");
  EXPECT_EQ(again.device.attention_forward_share, both.device.attention_forward_share);
  EXPECT_EQ(again.device.attention_forward_share_bf16, both.device.attention_forward_share_bf16);
  expect_error(replace(text, "[[64, 0.45], [512, 0.3]]", "[[64, 0.45], [512, 1.0]]"),
               "device.attention_forward_share point [512, 1]: a forward's share");
  expect_error(replace(text, "[[64, 0.45], [512, 0.3]]", "[[64, 0.0], [512, 0.3]]"),
               "device.attention_forward_share point [64, 0]");
  expect_error(replace(text, "[[64, 0.45], [512, 0.3]]", "[[64, 0.45], [32, 0.3]]"),
               "device.attention_forward_share sizes must increase");
}

// attention_share_curve: each point's measured share at the attention curve's sizes, clamped to
// [0.05, 0.95]; none at all where a point was not measured.
TEST(PlanHardware, AttentionShareCurveOfMeasuredPoints) {
  const auto curve = attention_share_curve({{128, 16, 100.0, 0.45}, {1024, 64, 300.0, 0.99}});
  ASSERT_EQ(curve.size(), 2u);
  EXPECT_NEAR(curve[0].first, std::cbrt(128.0 * 128.0 * 16.0), 1e-9);
  EXPECT_DOUBLE_EQ(curve[0].second, 0.45);
  EXPECT_DOUBLE_EQ(curve[1].second, 0.95);
  EXPECT_TRUE(attention_share_curve({{128, 16, 100.0, 0.45}, {1024, 64, 300.0, 0.0}}).empty());
}

// device.gemm_efficiency_shapes is optional: absent, the volume curve; present, a full grid of
// [rows, in, out, fraction] that gemm_efficiency interpolates trilinearly in the logs of the
// sizes (exact at the points, flat beyond the ends), in place of the curve; written back and
// checked (a missing grid point, a duplicate, a fraction over 1: one line naming the key).
TEST(PlanHardware, ShapeGridTakesThePlaceOfTheVolumeCurve) {
  const std::string curve =
      replace(ideal_hardware_text(), "[[64, 1.0], [4096, 1.0]]", "[[100, 0.2], [1000, 0.8]]");
  std::string grid = "gemm_efficiency_shapes = [";
  int points = 0;
  // fraction = 0.1 + 0.1 log2(rows / 64) + 0.05 log2(in / 64) + 0.025 log2(out / 64): linear in
  // the logs, so the trilinear interpolation is exact everywhere inside.
  auto f = [](double r, double i, double o) {
    return 0.1 + 0.1 * std::log2(r / 64) + 0.05 * std::log2(i / 64) + 0.025 * std::log2(o / 64);
  };
  for (double r : {64.0, 256.0})
    for (double i : {64.0, 512.0})
      for (double o : {64.0, 128.0, 1024.0}) {
        grid += (points++ ? ", [" : "[") + toml_number(r) + ", " + toml_number(i) + ", " +
                toml_number(o) + ", " + toml_number(f(r, i, o)) + "]";
      }
  grid += "]\n";
  const std::string text = replace(curve, "memory_gib = 80.0", grid + "memory_gib = 80.0");
  const HardwareSpec hw = parse_hardware(text, "hw.toml");
  ASSERT_EQ(hw.device.gemm_efficiency_shapes.size(), 12u);
  int compared = 0;
  for (const auto& [r, i, o] : {std::tuple{64.0, 64.0, 64.0}, {256.0, 512.0, 1024.0},
                                 {128.0, 200.0, 300.0}, {100.0, 64.0, 700.0}}) {
    EXPECT_NEAR(hw.gemm_efficiency(r, i, o), f(r, i, o), 1e-12) << r << " " << i << " " << o;
    ++compared;
  }
  EXPECT_EQ(compared, 4);
  // Beyond the grid: its edge.
  EXPECT_NEAR(hw.gemm_efficiency(16, 4096, 8192), f(64, 512, 1024), 1e-12);
  // Without the grid, the volume curve: cbrt(100 * 100 * 100) = 100.
  EXPECT_DOUBLE_EQ(parse_hardware(curve, "hw.toml").gemm_efficiency(100, 100, 100), 0.2);
  const HardwareSpec again = parse_hardware(hardware_to_toml(hw, {}), "again.toml");
  ASSERT_EQ(again.device.gemm_efficiency_shapes.size(), 12u);
  for (size_t p = 0; p < 12; ++p)  // the file keeps six digits of a measured fraction
    for (int d = 0; d < 4; ++d)
      EXPECT_NEAR(again.device.gemm_efficiency_shapes[p][d], hw.device.gemm_efficiency_shapes[p][d],
                  1e-6 * hw.device.gemm_efficiency_shapes[p][d]);
  const std::string first = "[64.0, 64.0, 64.0, " + toml_number(f(64, 64, 64)) + "]";
  ASSERT_NE(text.find(first), std::string::npos);
  expect_error(replace(text, first + ", ", ""), "device.gemm_efficiency_shapes is not a full grid");
  expect_error(replace(text, first, first + ", " + first), "twice");
  expect_error(replace(text, first, "[64.0, 64.0, 64.0, 1.5]"), "a fraction of 1.5");
  expect_error(replace(text, first, "[64.0, 64.0, 64.0]"), "[rows, in, out, fraction]");
}

// device.gemm_efficiency_shapes_bf16 is optional: the products train.precision = "bf16" runs
// on the CPU's oneDNN engine have their own grid. gemm_efficiency(..., "bf16") reads it where
// present and the fp32 grid where not; every other precision reads the fp32 grid. Written
// back, and checked as the fp32 grid is (one line naming its own key).
TEST(PlanHardware, Bf16ShapeGridServesBf16Only) {
  auto grid_text = [](const std::string& key, double fraction) {
    std::string g = key + " = [";
    int points = 0;
    for (double r : {64.0, 256.0})
      for (double i : {64.0, 512.0})
        for (double o : {64.0, 1024.0})
          g += (points++ ? ", [" : "[") + toml_number(r) + ", " + toml_number(i) + ", " +
               toml_number(o) + ", " + toml_number(fraction * (r == 64.0 ? 1.0 : 1.5)) + "]";
    return g + "]\n";
  };
  const std::string fp32_grid = grid_text("gemm_efficiency_shapes", 0.5);
  const std::string both = replace(ideal_hardware_text(), "memory_gib = 80.0",
                                   fp32_grid + grid_text("gemm_efficiency_shapes_bf16", 0.25) +
                                       "memory_gib = 80.0");
  const HardwareSpec hw = parse_hardware(both, "hw.toml");
  ASSERT_EQ(hw.device.gemm_efficiency_shapes_bf16.size(), 8u);
  int compared = 0;
  for (const auto& [r, i, o] : {std::tuple{64.0, 64.0, 64.0}, {256.0, 512.0, 1024.0}}) {
    const double scale = r == 64.0 ? 1.0 : 1.5;
    EXPECT_DOUBLE_EQ(hw.gemm_efficiency(r, i, o, "bf16"), 0.25 * scale);
    EXPECT_DOUBLE_EQ(hw.gemm_efficiency(r, i, o, "fp32"), 0.5 * scale);
    EXPECT_DOUBLE_EQ(hw.gemm_efficiency(r, i, o), 0.5 * scale);
    EXPECT_DOUBLE_EQ(hw.gemm_efficiency(r, i, o, "fp8"), 0.5 * scale);
    ++compared;
  }
  EXPECT_EQ(compared, 2);
  // Without the bf16 grid, bf16 reads the fp32 one.
  const HardwareSpec fp32_only = parse_hardware(
      replace(ideal_hardware_text(), "memory_gib = 80.0", fp32_grid + "memory_gib = 80.0"),
      "hw.toml");
  EXPECT_TRUE(fp32_only.device.gemm_efficiency_shapes_bf16.empty());
  EXPECT_DOUBLE_EQ(fp32_only.gemm_efficiency(64, 64, 64, "bf16"), 0.5);
  const HardwareSpec again = parse_hardware(hardware_to_toml(hw, {}), "again.toml");
  EXPECT_EQ(again.device.gemm_efficiency_shapes_bf16, hw.device.gemm_efficiency_shapes_bf16);
  EXPECT_EQ(again.device.gemm_efficiency_shapes, hw.device.gemm_efficiency_shapes);
  const std::string first = "gemm_efficiency_shapes_bf16 = [[64.0, 64.0, 64.0, 0.25], ";
  ASSERT_NE(both.find(first), std::string::npos);
  expect_error(replace(both, first, "gemm_efficiency_shapes_bf16 = ["),
               "device.gemm_efficiency_shapes_bf16 is not a full grid");
  expect_error(replace(both, first, "gemm_efficiency_shapes_bf16 = [[64.0, 64.0, 64.0, 2.5], "),
               "device.gemm_efficiency_shapes_bf16 holds a fraction of 2.5");

  // The attention's bf16 curve likewise: bf16 reads it, the rest the fp32 curve.
  const std::string curves =
      replace(both, "memory_gib = 80.0",
              "attention_efficiency = [[64, 0.4], [512, 0.8]]\n"
              "attention_efficiency_bf16 = [[64, 0.1], [512, 0.5]]\nmemory_gib = 80.0");
  const HardwareSpec att = parse_hardware(curves, "hw.toml");
  EXPECT_DOUBLE_EQ(att.attention_efficiency(64, 64, "bf16"), 0.1);  // cbrt(64^3) = 64
  EXPECT_DOUBLE_EQ(att.attention_efficiency(512, 512, "bf16"), 0.5);
  EXPECT_DOUBLE_EQ(att.attention_efficiency(64, 64, "fp32"), 0.4);
  EXPECT_DOUBLE_EQ(att.attention_efficiency(64, 64), 0.4);
  const HardwareSpec att_again = parse_hardware(hardware_to_toml(att, {}), "again.toml");
  EXPECT_EQ(att_again.device.attention_efficiency_bf16, att.device.attention_efficiency_bf16);
  expect_error(replace(curves, "[[64, 0.1], [512, 0.5]]", "[[64, 0.1], [512, 1.5]]"),
               "device.attention_efficiency_bf16 point [512, 1.5]");
}

// device.optimizer_bandwidth_gbs is optional: absent, the optimizer pass streams at the memory
// bandwidth; present, at its curve over the parameters a rank owns (interpolated in
// log(parameters), flat beyond the ends), in GB/s, not a fraction; written back and checked.
TEST(PlanHardware, OptimizerCurveIsOptionalInGigabytesPerSecond) {
  const std::string base = replace(ideal_hardware_text(), "memory_bandwidth_gbs = 1e12",
                                   "memory_bandwidth_gbs = 100.0");
  const HardwareSpec without = parse_hardware(base, "hw.toml");
  EXPECT_TRUE(without.device.optimizer_bandwidth_gbs.empty());
  EXPECT_DOUBLE_EQ(without.optimizer_bytes_per_s(1e9), 100e9);
  const std::string text =
      replace(base, "memory_bandwidth_gbs = 100.0",
              "memory_bandwidth_gbs = 100.0\noptimizer_bandwidth_gbs = [[1e6, 40.0], [1e8, 20]]");
  const HardwareSpec with = parse_hardware(text, "hw.toml");
  ASSERT_EQ(with.device.optimizer_bandwidth_gbs.size(), 2u);
  EXPECT_DOUBLE_EQ(with.optimizer_bytes_per_s(1e3), 40e9);   // below the first size
  EXPECT_DOUBLE_EQ(with.optimizer_bytes_per_s(1e10), 20e9);  // beyond the last
  EXPECT_NEAR(with.optimizer_bytes_per_s(1e7), 30e9, 1e-3);  // the geometric middle: halfway
  const HardwareSpec again = parse_hardware(hardware_to_toml(with, {}), "again.toml");
  EXPECT_EQ(again.device.optimizer_bandwidth_gbs, with.device.optimizer_bandwidth_gbs);
  expect_error(replace(text, "[1e8, 20]", "[1e8, 0]"),
               "device.optimizer_bandwidth_gbs point [1e+08, 0]: parameters and GB/s must be > 0");
  expect_error(replace(text, "[1e8, 20]", "[1e5, 20]"),
               "device.optimizer_bandwidth_gbs sizes must increase");
}

// device.memory_efficiency: the share of the datasheet bandwidth the trainer's memory-bound
// kernels reach. Absent it is 1 (a measured file's bandwidth is the trainer's own kernel's);
// given, every memory-bound pass (the layers' activation traffic, the optimizer's pass where no
// curve was measured) takes 1 / efficiency as long, and nothing else changes.
TEST(PlanHardware, MemoryEfficiencyIsOptionalAndScalesEveryMemoryBoundPass) {
  const std::string base = replace(ideal_hardware_text(), "memory_bandwidth_gbs = 1e12",
                                   "memory_bandwidth_gbs = 1.0");
  const HardwareSpec without = parse_hardware(base, "hw.toml");
  EXPECT_EQ(without.device.memory_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(without.memory_bytes_per_s(), 1e9);
  EXPECT_EQ(hardware_to_toml(without, {}).find("memory_efficiency"), std::string::npos);
  const std::string text =
      replace(base, "memory_bandwidth_gbs = 1.0",
              "memory_bandwidth_gbs = 1.0\nmemory_efficiency = 0.5");
  const HardwareSpec half = parse_hardware(text, "hw.toml");
  EXPECT_EQ(half.device.memory_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(half.memory_bytes_per_s(), 0.5e9);
  EXPECT_DOUBLE_EQ(half.optimizer_bytes_per_s(1e6), 0.5e9);
  EXPECT_EQ(parse_hardware(hardware_to_toml(half, {}), "again.toml").device.memory_efficiency,
            0.5);
  // A measured optimizer curve is the pass's own rate: not scaled again.
  const HardwareSpec curve = parse_hardware(
      replace(text, "memory_efficiency = 0.5",
              "memory_efficiency = 0.5\noptimizer_bandwidth_gbs = [[1e6, 40.0]]"),
      "hw.toml");
  EXPECT_DOUBLE_EQ(curve.optimizer_bytes_per_s(1e6), 40e9);
  for (const char* bad : {"0.0", "1.5", "-0.5", "\"x\""})
    expect_error(
        replace(text, "memory_efficiency = 0.5", std::string("memory_efficiency = ") + bad),
        "device.memory_efficiency");

  // The step: GEMMs at the peak (the ideal file) plus the memory-bound time M at 1 GB/s; at
  // efficiency 0.5 the same GEMMs plus 2 M, the optimizer's pass twice as long.
  const ModelConfig m = small_gpt();
  PlanProblem free_memory = problem(m), one = free_memory;
  free_memory.hw.devices_per_node = one.hw.devices_per_node = 1;
  one.hw.device.memory_bandwidth_gbs = 1.0;
  PlanProblem slow = one;
  slow.hw.device.memory_efficiency = 0.5;
  int compared = 0;
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    Layout l = layout(1, 1, 1, 4);
    l.recompute = rc;
    const Prediction g = predict(free_memory, l), a = predict(one, l), b = predict(slow, l);
    const double memory = a.time.compute - g.time.compute;
    EXPECT_GT(memory, 0.0) << to_string(rc);
    EXPECT_NEAR(b.time.compute - g.time.compute, 2.0 * memory, 1e-9 * b.time.compute)
        << to_string(rc);
    EXPECT_NEAR(b.time.optimizer, 2.0 * a.time.optimizer, 1e-12 + 1e-9 * b.time.optimizer)
        << to_string(rc);
    EXPECT_GT(a.time.optimizer, 0.0);
    ++compared;
  }
  EXPECT_EQ(compared, 3);
}

// bench-hw's measured rates become the device's curves the same way on both devices: GEMM and
// attention rates as fractions of the peak (clamped to [1e-3, 1]; attention at the cube root of
// T T HS), the optimizer's bytes per second in GB/s; the old curves are replaced, not appended.
TEST(PlanHardware, MeasuredCurvesAreFractionsOfThePeakAndTheOptimizersRates) {
  DeviceSpec d;
  d.gemm_efficiency = {{1.0, 0.5}};
  set_measured_curves(d, 200.0, {{64, 20.0}, {512, 150.0}, {4096, 260.0}, {8192, 0.01}},
                      {{128, 16, 50.0}}, {{1 << 20, 3.0e10}});
  const std::vector<std::pair<double, double>> gemm = {
      {64, 0.1}, {512, 0.75}, {4096, 1.0}, {8192, 1e-3}};
  EXPECT_EQ(d.gemm_efficiency, gemm);
  ASSERT_EQ(d.attention_efficiency.size(), 1u);
  EXPECT_NEAR(d.attention_efficiency[0].first, 64.0, 1e-9);  // cbrt(128 * 128 * 16)
  EXPECT_DOUBLE_EQ(d.attention_efficiency[0].second, 0.25);
  const std::vector<std::pair<double, double>> optimizer = {{1048576.0, 30.0}};
  EXPECT_EQ(d.optimizer_bandwidth_gbs, optimizer);
  set_measured_curves(d, 200.0, {{64, 20.0}}, {}, {});
  EXPECT_EQ(d.gemm_efficiency.size(), 1u);
  EXPECT_TRUE(d.attention_efficiency.empty());
  EXPECT_TRUE(d.optimizer_bandwidth_gbs.empty());
}

// The optimizer's time: kOptimizerBytesPerParam bytes per owned parameter (fp32) at the
// optimizer curve's rate for that count; ZeRO-1 owns half over DP 2, at the curve's rate there.
TEST(PlanPredict, OptimizerTimeIsItsBytesAtTheCurvesRateForTheOwnedParameters) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 2;
  const double flat = static_cast<double>(parameter_layout(m, ModelShard::whole(m)).flat_size);
  p.hw.device.memory_bandwidth_gbs = 100.0;
  EXPECT_NEAR(predict(p, layout(1, 1, 2, 2)).time.optimizer,
              36.0 * flat / 100e9, 1e-15);
  p.hw.device.optimizer_bandwidth_gbs = {{flat / 2, 10.0}, {flat, 40.0}};
  EXPECT_NEAR(predict(p, layout(1, 1, 2, 2)).time.optimizer, 36.0 * flat / 40e9, 1e-15);
  Layout z = layout(1, 1, 2, 2);
  z.zero_stage = 1;
  const double owned = std::ceil(flat / 2);
  EXPECT_NEAR(predict(p, z).time.optimizer,
              36.0 * owned / p.hw.optimizer_bytes_per_s(owned), 1e-15);
  EXPECT_NEAR(p.hw.optimizer_bytes_per_s(flat / 2), 10e9, 1e-3);
}

TEST(PlanHardware, RingCollectivesAndSendRecv) {
  const HardwareSpec hw = parse_hardware(ideal_hardware_text(), "hw.toml");
  const double bytes = 1e8, bw = 10e9, lat = 2e-6;
  EXPECT_NEAR(collective_seconds(hw, hw.intra_node, Collective::AllReduce, 4, bytes),
              2.0 * 3 * lat + 2.0 * 0.75 * bytes / bw, 1e-12);
  EXPECT_NEAR(collective_seconds(hw, hw.intra_node, Collective::AllGather, 4, bytes),
              3 * lat + 0.75 * bytes / bw, 1e-12);
  EXPECT_NEAR(collective_seconds(hw, hw.intra_node, Collective::SendRecv, 2, bytes),
              lat + bytes / bw, 1e-12);
  EXPECT_EQ(collective_seconds(hw, hw.intra_node, Collective::AllReduce, 1, bytes), 0.0);
}

TEST(PlanHardware, BadFilesAreOneLineNamingFileAndKey) {
  const std::string good = ideal_hardware_text();
  expect_error(replace(good, "memory_gib = 80.0\n", ""), "hw.toml: device.memory_gib is missing");
  expect_error(replace(good, "latency_us = 2.0", "latency_us = \"fast\""),
               "intra_node.latency_us must be a number");
  expect_error(replace(good, "kind = \"gpu\"", "kind = \"tpu\""), "device.kind = \"tpu\"");
  expect_error(replace(good, "efficiency = 1.0\nlatency_us = 4.0", "efficiency = 1.5\nlatency_us = 4.0"),
               "inter_node.efficiency = 1.5 must be in (0, 1]");
  expect_error(replace(good, "[[64, 1.0], [4096, 1.0]]", "[[64, 1.0], [32, 1.0]]"),
               "device.gemm_efficiency sizes must increase");
  expect_error(good + "[extra]\nfoo = 1\n", "extra.foo is not a hardware key");
  expect_error(replace(good, "devices_per_node = 8", "devices_per_node = 0"),
               "devices_per_node = 0 must be greater than 0");
  expect_error("name = ", "hw.toml: TOML syntax error at line 1");
  // Nesting deeper than the parser's recursion takes (a segfault before the bound), after the
  // good text's 23 lines.
  std::string deep = "[a";
  for (int i = 0; i < 50000; ++i) deep += ".a";
  expect_error(good + deep + "]\n",
               "hardware file hw.toml: line 24: a key of more than 128 dotted parts");
  EXPECT_THROW(load_hardware("/nonexistent/hw.toml"), Error);
}

TEST(PlanHardware, ShippedFilesLoad) {
  for (const char* name : {"a100_80gb_dgx", "h100_dgx", "h200_dgx", "cpu_2core"}) {
    const HardwareSpec hw =
        load_hardware(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware/" + name + ".toml");
    EXPECT_GE(hw.devices_per_node, 1) << name;
    EXPECT_GT(hw.peak_flops("fp32"), 0.0) << name;
  }
}

TEST(PlanFlops, PartsSumToTheTrainersCount) {
  for (const char* arch : {"gpt2", "llama"}) {
    ModelConfig m = small_gpt();
    m.arch = arch;
    m.kv_heads = m.is_llama() ? 2 : 0;
    const TrainingFlopsParts parts = training_flops_parts(m, 64);
    EXPECT_EQ(static_cast<double>(m.layers) * (parts.layer_linear + parts.layer_attention) +
                  parts.head,
              training_flops_per_token(m, 64))
        << arch;
  }
}

TEST(PlanActivations, LayerStashClosedForm) {
  // gpt2, C 64, T 16, 4 heads, one sequence (N = 16 rows), fp32, CPU (probabilities kept):
  //   input + residual 2*16*64*4 = 8192, norm stats 2*16*2*4 = 256, qkv 16*192*4 = 12288 +
  //   attention output 16*64*4 = 4096, fc1 16*256*4 = 16384, probabilities 16*4*16*4 = 4096:
  //   45312. Not kept (recomputed in backward): both norm outputs and gelu, 8192 + 16384.
  const ModelConfig m = small_gpt();
  const bool cpu = true, gpu = false;  // materialized attention (--attention materialized) or fused
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, cpu, 1, 1, false, Recompute::None, 4.0), 45312.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, cpu, 1, 1, false, Recompute::Selective, 4.0),
                   45312.0 - 4096.0);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, cpu, 1, 1, false, Recompute::Full, 4.0), 4096.0);
  // GPU: attention keeps one logsumexp per row and head: 16*4*4 = 256.
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, gpu, 1, 1, false, Recompute::None, 4.0),
                   45312.0 - 4096.0 + 256.0);
  // TP 2 with SP: the stream and stats halve (4096 + 128), the rest halves (8192 + 8192 +
  // 2048).
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, cpu, 1, 2, true, Recompute::None, 4.0),
                   4096.0 + 128.0 + 8192.0 + 8192.0 + 2048.0);
}

TEST(PlanPredict, OneDeviceComputeIsFlopsOverPeak) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m);
  p.hw.devices_per_node = 1;
  const Prediction r = predict(p, layout(1, 1, 1, 4));
  const double flops = training_flops_per_token(m, 64) * 32 * 16;
  // Nothing more: the LM head's logits are computed once (the training forward forms its
  // gradients while they are there).
  EXPECT_NEAR(r.time.compute, flops / 10e12, 1e-6 * r.time.compute);
  EXPECT_NEAR(r.hardware_flops_per_step, flops, 1.0);
  EXPECT_EQ(r.time.tp_comm, 0.0);
  EXPECT_EQ(r.time.bubble, 0.0);
  EXPECT_EQ(r.time.dp_exposed, 0.0);
  EXPECT_NEAR(r.mfu, flops / 10e12 / r.step_seconds, 1e-9);
  EXPECT_EQ(r.microbatches, 8);

  // Full recomputation adds one forward of every layer (a third of its training FLOPs).
  const TrainingFlopsParts parts = training_flops_parts(m, 64);
  Layout full = layout(1, 1, 1, 4);
  full.recompute = Recompute::Full;
  const Prediction f = predict(p, full);
  const double extra = 8.0 * (parts.layer_linear + parts.layer_attention) / 3.0 * 32 * 16;
  EXPECT_NEAR(f.time.compute - r.time.compute, extra / 10e12, 1e-6 * r.time.compute);
  EXPECT_NEAR(f.hardware_flops_per_step, flops + extra, 1.0);
  EXPECT_DOUBLE_EQ(f.model_flops_per_step, flops);
}

// Memory-bound work at a finite bandwidth (1 GB/s, efficiency 1 elsewhere): materialized
// attention costs, per layer and micro-batch, its larger stash's three passes (written in
// forward, read twice in backward) plus three passes of its scores [N, NH, T] fp32 (read by
// the softmax; dP read and dS written by its backward). Selective recomputation adds the
// attention core's forward: its FLOPs and two score passes (scores read, probabilities written).
TEST(PlanPredict, MaterializedAttentionScorePassesAtMemoryBandwidth) {
  const ModelConfig m = small_gpt();
  PlanProblem fused = problem(m);
  fused.hw.devices_per_node = 1;
  fused.hw.device.memory_bandwidth_gbs = 1.0;
  fused.attention = "fused";
  PlanProblem materialized = fused;
  materialized.attention = "materialized";
  const int64_t mb = 4, micro = 32 / mb, N = mb * 16;
  const double bw = 1e9, scores = N * 4.0 * 16 * 4;  // N rows x 4 heads x T 16 x fp32
  const double stash_diff =
      layer_activation_bytes(m, true, mb, 1, false, Recompute::None, 4.0) -
      layer_activation_bytes(m, false, mb, 1, false, Recompute::None, 4.0);
  EXPECT_DOUBLE_EQ(stash_diff, N * 4.0 * (16 - 1) * 4);  // probabilities minus logsumexp
  const Prediction f = predict(fused, layout(1, 1, 1, mb));
  const Prediction r = predict(materialized, layout(1, 1, 1, mb));
  EXPECT_NEAR(r.time.compute - f.time.compute, 8.0 * micro * 3.0 * (stash_diff + scores) / bw,
              1e-9 * r.time.compute);
  Layout selective = layout(1, 1, 1, mb);
  selective.recompute = Recompute::Selective;
  const TrainingFlopsParts parts = training_flops_parts(m, 64);
  const double attention_forward = parts.layer_attention / 3.0 * N / 10e12;
  EXPECT_NEAR(predict(materialized, selective).time.compute - r.time.compute,
              8.0 * micro * (attention_forward + 2.0 * scores / bw), 1e-9 * r.time.compute);
  EXPECT_NEAR(predict(fused, selective).time.compute - f.time.compute,
              8.0 * micro * attention_forward, 1e-9 * f.time.compute);
}

// The attention's forward share of its time (device.attention_forward_share): a layer's
// attention seconds are split forward : backward as the share says, so recomputation, which
// reruns the forward, adds the share's part of them (selective: the core's forward; full: the
// whole forward), not a third; the step without recomputation is the same whatever the split.
TEST(PlanPredict, RecomputationRerunsTheAttentionsMeasuredForwardShare) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m);
  p.hw.devices_per_node = 1;
  p.hw.device.attention_efficiency = {{1.0, 0.5}, {1e5, 0.5}};
  const Layout none = layout(1, 1, 1, 4);
  Layout selective = none, full = none;
  selective.recompute = Recompute::Selective;
  full.recompute = Recompute::Full;
  const Prediction third = predict(p, none), third_selective = predict(p, selective);
  EXPECT_NEAR(third_selective.compute_attention_seconds,
              third.compute_attention_seconds * 4.0 / 3.0, 1e-12 * third.time.compute);
  PlanProblem half = p;
  half.hw.device.attention_forward_share = {{1.0, 0.5}, {1e5, 0.5}};
  const Prediction h = predict(half, none);
  EXPECT_NEAR(h.time.compute, third.time.compute, 1e-12 * third.time.compute);
  const double attention = h.compute_attention_seconds;
  const Prediction hs = predict(half, selective), hf = predict(half, full);
  EXPECT_NEAR(hs.compute_attention_seconds, 1.5 * attention, 1e-12 * attention);
  EXPECT_NEAR(hs.time.compute - h.time.compute, 0.5 * attention, 1e-9 * h.time.compute);
  EXPECT_NEAR(hf.compute_attention_seconds, 1.5 * attention, 1e-12 * attention);
  // Full: the selective difference (the attention's forward) plus the rest of the forward.
  const Prediction tf = predict(p, full);
  EXPECT_NEAR((hf.time.compute - h.time.compute) - (tf.time.compute - third.time.compute),
              (0.5 - 1.0 / 3.0) * attention, 1e-9 * h.time.compute);
  // bf16 takes the bf16 curve's shares where the file has the bf16 attention curve.
  half.precision = "bf16";
  half.hw.device.attention_efficiency_bf16 = {{1.0, 0.5}, {1e5, 0.5}};
  half.hw.device.attention_forward_share_bf16 = {{1.0, 0.25}, {1e5, 0.25}};
  const Prediction b = predict(half, none), bs = predict(half, selective);
  EXPECT_NEAR(bs.compute_attention_seconds, 1.25 * b.compute_attention_seconds,
              1e-12 * b.compute_attention_seconds);
}

// Another system's dropout on the materialized probabilities (Megatron-LM's attention
// dropout, plan --attention-dropout): per layer and micro-batch (2 e + 1) bytes per element of
// [N, NH, T] in forward (probabilities read, dropped ones and mask written) and as many in
// backward (gradient and mask read, gradient written), at the memory bandwidth; full
// recomputation reruns forward's. Fused attention has no probabilities to drop.
TEST(PlanPredict, AttentionDropoutPassesAtMemoryBandwidth) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m);
  p.hw.devices_per_node = 1;
  p.hw.device.memory_bandwidth_gbs = 1.0;
  p.attention = "materialized";
  PlanProblem dropout = p;
  dropout.attention_dropout = true;
  const int64_t mb = 4, micro = 32 / mb, N = mb * 16;
  const double elements = N * 4.0 * 16, per_pass = elements * (2 * 4.0 + 1) / 1e9;
  int compared = 0;
  for (Recompute rc : {Recompute::None, Recompute::Full}) {
    Layout l = layout(1, 1, 1, mb);
    l.recompute = rc;
    const double passes = rc == Recompute::Full ? 3.0 : 2.0;
    const double base = predict(p, l).time.compute;
    EXPECT_NEAR(predict(dropout, l).time.compute - base, 8.0 * micro * passes * per_pass,
                1e-9 * base)
        << to_string(rc);
    ++compared;
  }
  EXPECT_EQ(compared, 2);
  dropout.attention = p.attention = "fused";
  EXPECT_EQ(predict(dropout, layout(1, 1, 1, mb)).time.compute,
            predict(p, layout(1, 1, 1, mb)).time.compute);
}

TEST(PlanPredict, OneFOneBBubbleIsStagesMinusOneOps) {
  // Four stages of two layers, each stage at its own cost t_s per micro-batch (the first with
  // the embedding, the last with the head (vocab 64), the slowest). A flow line whose last
  // stage is the bottleneck has the makespan sum(t_s) + (M - 1) t_last under 1F1B and GPipe,
  // so the bubble is sum(t_s) - t_last: the one-stage run's work per micro-batch minus the
  // last stage's. With equal stages that is the (p - 1)/M of the busy time of the textbook.
  PlanProblem p = problem(small_gpt(), 1, 16);
  p.hw.devices_per_node = 1;
  const Prediction one = predict(p, layout(1, 1, 1, 1));  // one device
  p.hw.devices_per_node = 4;
  const double all_stages = (one.time.compute + one.time.tp_comm) / 16.0;  // sum(t_s)
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::GPipe}) {
    const Prediction r = predict(p, layout(1, 4, 1, 1, kind));
    EXPECT_EQ(r.microbatches, 16);
    const double last = (r.time.compute + r.time.tp_comm) / 16.0;  // t_last: the busiest
    EXPECT_NEAR(r.time.bubble, all_stages - last, 1e-9 * r.step_seconds) << to_string(kind);
    EXPECT_NEAR(r.time.bubble / (r.time.compute + r.time.tp_comm), 3.0 / 16.0, 0.02)
        << to_string(kind) << ": near the equal-stage bubble (the head and embedding are small)";
  }
  // ZB-H1 fills part of it.
  const Prediction zb = predict(p, layout(1, 4, 1, 1, ScheduleKind::ZeroBubbleH1));
  const Prediction ob = predict(p, layout(1, 4, 1, 1));
  EXPECT_LT(zb.time.bubble, ob.time.bubble);
  // Transfers: each send costs latency + bytes / bandwidth (16 rows x 64 x 4 bytes).
  EXPECT_GT(ob.time.pp_transfer, 0.0);
}

TEST(PlanPredict, TensorParallelCommunicationClosedForm) {
  // TP 2, one micro-batch per step: per layer 2 all-reduces of the [16, 64] fp32 stream in
  // forward and 2 in backward; the embedding sums once, the head's input gradient once, the
  // loss 3 all-reduces of 16 floats.
  PlanProblem p = problem(small_gpt(), 1, 1);
  p.hw.devices_per_node = 2;
  const Prediction r = predict(p, layout(2, 1, 1, 1));
  const double lat = 2e-6, bw = 10e9;
  auto ar = [&](double bytes) { return 2.0 * lat + 2.0 * 0.5 * bytes / bw; };
  const double stream = 16 * 64 * 4;
  EXPECT_NEAR(r.time.tp_comm, 8 * 4 * ar(stream) + ar(stream) + ar(stream) + 3 * ar(16 * 4),
              1e-12);
  // Sequence parallelism: each layer all-reduce becomes an all-gather + reduce-scatter pair
  // (the same bytes and steps), the embedding's sum a reduce-scatter, the head's input is
  // gathered and its gradient reduce-scattered; backward gathers each layer's two norm
  // outputs again (recomputed, not stashed).
  Layout sp = layout(2, 1, 1, 1);
  sp.sequence_parallel = true;
  auto half = [&](double bytes) { return lat + 0.5 * bytes / bw; };  // AG or RS over 2
  EXPECT_NEAR(predict(p, sp).time.tp_comm,
              8 * (4 * 2 + 2) * half(stream) + half(stream) + 2 * half(stream) + 3 * ar(16 * 4),
              1e-12);
}

TEST(PlanPredict, MemoryIsTheTrainersFlatBuffersAndTheScheduleBound) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 2;
  // DP 2 without and with ZeRO-1.
  const Prediction plain = predict(p, layout(1, 1, 2, 2));
  const double flat = static_cast<double>(parameter_layout(m, ModelShard::whole(m)).flat_size);
  EXPECT_DOUBLE_EQ(plain.memory.weights, flat * 4);
  EXPECT_DOUBLE_EQ(plain.memory.gradients, flat * 4);
  EXPECT_DOUBLE_EQ(plain.memory.optimizer, flat * 8);
  Layout z = layout(1, 1, 2, 2);
  z.zero_stage = 1;
  EXPECT_DOUBLE_EQ(predict(p, z).memory.optimizer, std::ceil(flat / 2) * 8);
  // ZeRO-1 adds its reduce-scatter staging (grad_sync.cpp): the largest bucket (here the whole
  // buffer, under 25 MiB) padded to a multiple of DP, and its slice, fp32.
  const double slice = std::ceil(flat / 2);
  EXPECT_DOUBLE_EQ(predict(p, z).memory.buffers - plain.memory.buffers, 4 * (2 * slice + slice));
  // DP exposed: a bucket as large as all gradients cannot overlap: one whole all-reduce.
  p.dp_bucket_mb = 1e6;
  const Prediction whole = predict(p, layout(1, 1, 2, 2));
  const double all_reduce =
      collective_seconds(p.hw, p.hw.intra_node, Collective::AllReduce, 2, flat * 4);
  EXPECT_NEAR(whole.time.dp_exposed, all_reduce, 1e-15);
  // A backward far longer than the reduction (1 GFLOP/s) hides all of it but the last bucket
  // (1 KiB here); without overlap (another system) none of it.
  {
    PlanProblem slow = p;
    slow.hw.device.peak_tflops_fp32 = 1e-3;
    slow.dp_bucket_mb = 1.0 / 1024;
    EXPECT_NEAR(predict(slow, layout(1, 1, 2, 2)).time.dp_exposed,
                all_reduce * 1024.0 / (flat * 4), 1e-15);
    slow.dp_overlap = false;
    EXPECT_NEAR(predict(slow, layout(1, 1, 2, 2)).time.dp_exposed, all_reduce, 1e-15);
  }
  p.dp_bucket_mb = 25;
  // Materialized attention keeps the probabilities [N, NH, T] fp32 per layer instead of one
  // logsumexp per row and head: 8 layers x 16 x 4 x (16 - 1) x 4 bytes more per stash.
  PlanProblem materialized = p;
  materialized.attention = "materialized";
  EXPECT_DOUBLE_EQ(predict(materialized, layout(1, 1, 2, 2)).memory.activations -
                       predict(p, layout(1, 1, 2, 2)).memory.activations,
                   8 * 2 * 16 * 4 * 15 * 4.0);

  // Pipeline of 4 stages of 2 layers, 32 micro-batches of one sequence (N = 16 rows, fp32,
  // GPU attention stash): a layer keeps 41472 bytes (PlanActivations); stage 0 a stash of
  // 2 layers + its output [16, 64] + tokens and targets = 87168 bytes, the last stage also
  // the final norm output and statistics and the loss statistics: 87168 + 4096 + 4 x (2 x 16
  // + 4 x 16) = 91648 bytes (the logits are not kept: one chunk of them is a buffer, held
  // once).
  // 1F1B: stage 0 holds min(4, 32) = 4 stashes and is the fullest; GPipe: every stage holds
  // all 32, and the last is the fullest.
  p.hw.devices_per_node = 4;
  const Prediction o = predict(p, layout(1, 4, 1, 1));
  EXPECT_EQ(o.fullest_stage, 0);
  EXPECT_DOUBLE_EQ(o.memory.activations, 4 * 87168.0);
  const Prediction g = predict(p, layout(1, 4, 1, 1, ScheduleKind::GPipe));
  EXPECT_EQ(g.fullest_stage, 3);
  EXPECT_DOUBLE_EQ(g.memory.activations, 32 * 91648.0);
}

// The interleaved executor keeps each chunk's stash slots once made, so a stage holds every
// chunk's own peak at once (sum over its chunks), counted from the stage's whole op list here;
// the plan counts them on min(M, 4 PP) micro-batches, which must give the same for long steps.
TEST(PlanPredict, InterleavedStashIsEveryChunksOwnPeak) {
  const ModelConfig m = small_gpt();  // 8 layers of 41472 bytes per micro-batch (N = 16)
  int64_t compared = 0;
  for (int64_t pp : {2, 4}) {
    for (int64_t micro : {pp, 2 * pp, 4 * pp, 8 * pp, 12 * pp}) {
      PlanProblem p = problem(m, 1, micro);
      p.hw.devices_per_node = pp;
      Layout l = layout(1, pp, 1, 1, ScheduleKind::Interleaved);
      l.virtual_stages = 2;
      const Prediction r = predict(p, l);
      // Stage 0's chunks: local chunk 0 (virtual stage 0, with the embedding) and 1.
      std::vector<int64_t> now(2, 0), peak(2, 0);
      for (const PipeOp& op : pipeline_schedule(ScheduleKind::Interleaved, 0,
                                                static_cast<int>(pp), micro, 2)) {
        if (op.kind == PipeOpKind::Forward) peak[op.chunk] = std::max(peak[op.chunk], ++now[op.chunk]);
        if (op.kind == PipeOpKind::Backward) --now[op.chunk];
      }
      EXPECT_GE(peak[0] + peak[1], peak_in_flight(pipeline_schedule(
                                       ScheduleKind::Interleaved, 0, static_cast<int>(pp), micro, 2)));
      // A chunk of 8 / (2 pp) layers + its output [16, 64] fp32; the first also tokens, targets.
      const double layers = 8.0 / static_cast<double>(2 * pp);
      const double chunk = layers * 41472 + 16 * 64 * 4;
      const double expected = peak[0] * (chunk + 2 * 16 * 4) + peak[1] * chunk;
      if (r.fullest_stage == 0) {
        EXPECT_DOUBLE_EQ(r.memory.activations, expected) << "pp " << pp << " micro " << micro;
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 8);
}

TEST(PlanEnumerate, EveryLayoutIsValidAndFiltersHold) {
  ModelConfig m = small_gpt();
  m.heads = 2;  // TP 4 and 8 are impossible
  PlanProblem p = problem(m, 1, 32);
  const std::vector<Layout> all = enumerate_layouts(p, {});
  ASSERT_FALSE(all.empty());
  std::set<int64_t> tps;
  for (const Layout& l : all) {
    EXPECT_EQ(layout_problem(p, l), "") << to_string(l);
    EXPECT_EQ(l.devices(), 8);
    tps.insert(l.tp);
  }
  EXPECT_EQ(tps, (std::set<int64_t>{1, 2}));
  const std::vector<Layout> some = enumerate_layouts(p, parse_layout_filter(
                                                            "tensor=2,pipeline=2,recompute=full"));
  ASSERT_FALSE(some.empty());
  for (const Layout& l : some) {
    EXPECT_EQ(l.tp, 2);
    EXPECT_EQ(l.pp, 2);
    EXPECT_EQ(l.dp, 2);
    EXPECT_EQ(l.recompute, Recompute::Full);
  }
  EXPECT_NE(layout_problem(p, layout(4, 1, 2)).find("model.heads"), std::string::npos);
  EXPECT_NE(layout_problem(p, layout(1, 1, 4)).find("8 devices"), std::string::npos);
  EXPECT_THROW(parse_layout_filter("tensor=two"), Error);
  EXPECT_THROW(parse_layout_filter("colour=red"), Error);
  // Ranked: fitting first, then by step time.
  const std::vector<Prediction> ranked = rank_layouts(p, all);
  for (size_t i = 1; i < ranked.size(); ++i)
    if (ranked[i].fits == ranked[i - 1].fits) {
      EXPECT_LE(ranked[i - 1].step_seconds, ranked[i].step_seconds);
    }
}

// Issue 56: the enumeration walked every count up to the global batch (2^62 looped for ever)
// and every PP up to model.layers (a 100000-stage pipeline simulated for minutes). It walks
// divisors now, refuses a problem past the plan's bounds in one line, and lists PP up to
// kPlanMaxPipeline, saying when that left one out.
TEST(PlanEnumerate, BoundedProblemsAndPipelinesUpToTheCap) {
  ModelConfig m = small_gpt();
  m.heads = 1;  // TP 1 only
  PlanProblem p = problem(m, 1, kPlanMaxGlobalBatch);
  p.hw.devices_per_node = 1;
  EXPECT_EQ(plan_size_problem(p, "--global-batch"), "");
  // Every micro-batch dividing 2^24: the 25 powers of two.
  const std::vector<Layout> all = enumerate_layouts(p, parse_layout_filter("recompute=none"));
  EXPECT_EQ(all.size(), 25u);
  p.global_batch = kPlanMaxGlobalBatch + 1;
  EXPECT_EQ(plan_size_problem(p, "--global-batch"),
            "--global-batch = 16777217 is past the 16777216 sequences per step a plan models "
            "(1 to 16777216)");
  EXPECT_THROW(enumerate_layouts(p, {}), Error);
  p.global_batch = 1;
  p.hw.devices_per_node = 8;
  p.nodes = kPlanMaxDevices / 8 + 1;
  EXPECT_NE(plan_size_problem(p, "").find("131073 node(s) x 8 devices per node are past the "
                                          "1048576 devices a plan models"),
            std::string::npos);
  // 256 layers on 256 devices, two sequences a step: PP 256 (DP 1) is valid for the trainer,
  // left out; PP 128 (DP 2) listed.
  m.layers = 256;
  p = problem(m, 32, 2);
  p.hw.devices_per_node = 8;
  const std::vector<Layout> capped = enumerate_layouts(p, parse_layout_filter("recompute=none"));
  ASSERT_FALSE(capped.empty());
  int64_t deepest = 0;
  for (const Layout& l : capped) deepest = std::max(deepest, l.pp);
  EXPECT_EQ(deepest, kPlanMaxPipeline);
  EXPECT_TRUE(pipeline_cap_excludes(p, {}));
  EXPECT_FALSE(pipeline_cap_excludes(p, parse_layout_filter("pipeline=2")));
  m.layers = 128;
  p.model = m;
  EXPECT_FALSE(pipeline_cap_excludes(p, {}));
}

// parallel.pipeline_balance is a layout dimension: both splits where they differ (PP > 1, one
// chunk per stage), "even" alone elsewhere; with a heavy LM head the FLOPs split moves layers off
// the last stage and the slowest stage computes less.
TEST(PlanEnumerate, BothPipelineSplitsWhereTheyDiffer) {
  ModelConfig m = small_gpt();
  m.vocab_size = 4096;  // the head's FLOPs ~ 5 layers'
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 2;
  const std::string fixed = "tensor=1,micro_batch=1,recompute=none,zero=0,sequence_parallel=0";
  const std::vector<Layout> two =
      enumerate_layouts(p, parse_layout_filter(fixed + ",pipeline=2,schedule=1f1b"));
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].balance, "even");
  EXPECT_EQ(two[1].balance, "flops");
  EXPECT_EQ(to_string(two[1]).substr(to_string(two[1]).rfind(',') + 1), "pipeline_balance=flops");
  EXPECT_EQ(layout_overrides(two[1], 32).back(), "parallel.pipeline_balance=flops");
  EXPECT_LT(predict(p, two[1]).time.compute, predict(p, two[0]).time.compute);
  EXPECT_EQ(enumerate_layouts(p, parse_layout_filter(fixed + ",pipeline=1")).size(), 1u);
  for (const Layout& l : enumerate_layouts(p, parse_layout_filter(fixed + ",schedule=interleaved")))
    EXPECT_EQ(l.balance, "even") << to_string(l);
  Layout one = layout(1, 1, 2);
  one.balance = "flops";
  EXPECT_NE(layout_problem(p, one).find("pipeline_balance flops needs pipeline >= 2"),
            std::string::npos);
  EXPECT_THROW(parse_layout_filter("pipeline_balance=diagonal"), Error);
}

TEST(PlanPipeline, ExtendedSimulationEqualsTheWholeOne) {
  PipeSimCosts costs;
  costs.forward = 1.3;
  costs.backward = 2.9;
  costs.weight = 1.1;
  int compared = 0;
  for (double comm : {0.0, 0.4}) {
    costs.comm = comm;
    for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::GPipe,
                              ScheduleKind::ZeroBubbleH1, ScheduleKind::Interleaved}) {
      Layout l;
      l.pp = 4;
      l.schedule = kind;
      l.virtual_stages = kind == ScheduleKind::Interleaved ? 2 : 1;
      for (int64_t m : {28, 64, 100}) {
        const PipeSimResult whole = simulate_pipeline(kind, 4, m, costs,
                                                      static_cast<int>(l.virtual_stages));
        ASSERT_TRUE(whole.ok) << whole.error;
        EXPECT_NEAR(pipeline_makespan(l, m, costs), whole.makespan, 1e-9 * whole.makespan)
            << to_string(kind) << " M=" << m << " comm=" << comm;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 24);
}

// ---- Mixture of experts (docs/plan.md "Mixture of experts") ----

namespace {

// small_gpt with 4 experts, top-2, in every other layer (layers 0, 2, 4, 6), dropless.
ModelConfig small_moe() {
  ModelConfig m = small_gpt();
  m.moe_experts = 4;
  m.moe_top_k = 2;
  m.moe_layer_interval = 2;
  m.moe_capacity_factor = 0.0;
  return m;
}

// One MoE layer's experts on one tensor rank, by hand: E x (fc1 F*C + F + fc2 C*F + C) with
// C 64, F 256, E 4: 4 x 33088.
constexpr double kExpertsPerMoeLayer = 4.0 * (256 * 64 + 256 + 64 * 256 + 64);

}  // namespace

// Per layer kind: dense layers 12 C^2 + 13 C = 49984 elements; MoE layers the attention and
// norms (49984 - 33088 = 16896), the router E C = 256 and E experts (132352): 149504. With the
// embedding 64 x 64, the positions 16 x 64 and the final norm 128: 803200, the trainer's flat
// buffer (not 8 MoE layers, as a per-layer average of layer 0 would give).
TEST(PlanMoe, ParametersPerLayerKindAndExpertsSplitByExpertParallelism) {
  const ModelConfig m = small_moe();
  const double flat = static_cast<double>(parameter_layout(m, ModelShard::whole(m)).flat_size);
  EXPECT_EQ(flat, 4096 + 1024 + 4 * 49984 + 4 * 149504 + 128);
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 1;
  const Prediction one = predict(p, layout(1, 1, 1, 2));
  EXPECT_DOUBLE_EQ(one.memory.weights, flat * 4);
  EXPECT_DOUBLE_EQ(one.memory.gradients, flat * 4);
  EXPECT_DOUBLE_EQ(one.memory.optimizer, flat * 8);
  // Two stages of 4 layers: each holds 2 MoE and 2 dense layers (the trainer's shards).
  p.hw.devices_per_node = 2;
  const Prediction pp = predict(p, layout(1, 2, 1, 2));
  for (int stage = 0; stage < 2; ++stage) {
    ModelShard s;
    s.layer_begin = 4 * stage;
    s.layer_end = 4 * stage + 4;
    s.has_embedding = stage == 0;
    s.has_head = stage == 1;
    const double stage_flat = static_cast<double>(parameter_layout(m, s).flat_size);
    if (stage == pp.fullest_stage) EXPECT_DOUBLE_EQ(pp.memory.weights, stage_flat * 4);
  }
  // DP 2 with EP 2: a rank holds half of every MoE layer's experts (4 x 66176 fewer
  // elements); ZeRO-1 splits the rest's moments over DP 2 and the experts' over DP / EP = 1.
  Layout ep = layout(1, 1, 2, 2);
  ep.ep = 2;
  ep.zero_stage = 1;
  const Prediction e = predict(p, ep);
  const double experts_local = 4 * kExpertsPerMoeLayer / 2;
  const double local = flat - experts_local;
  EXPECT_DOUBLE_EQ(e.memory.weights, local * 4);
  EXPECT_DOUBLE_EQ(e.memory.gradients, local * 4);
  EXPECT_DOUBLE_EQ(e.memory.optimizer,
                   (std::ceil((local - experts_local) / 2) + experts_local) * 8);
}

// Compute: a MoE layer computes top_k experts per token plus the router (model_stats' count,
// at TP 1 exactly the trainer's FLOPs), whatever E is; the capacity drops assignments.
TEST(PlanMoe, ComputeIsTopKExpertsAndTheCapacityCapsIt) {
  ModelConfig m = small_moe();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 1;
  const Prediction r = predict(p, layout(1, 1, 1, 4));
  const double tokens = 32 * 16;
  const double flops = training_flops_per_token(m, 64) * tokens;
  EXPECT_NEAR(r.time.compute, flops / 10e12, 1e-9 * r.time.compute);
  EXPECT_EQ(r.time.ep_comm, 0.0);
  // Per token and MoE layer, top-2 experts' fc1 and fc2: 3 x 2 x 2 x C F x 2 = 393216 FLOPs,
  // and the router 3 x 2 x C E = 1536: against one dense MLP's 196608.
  ModelConfig dense = m;
  dense.moe_experts = 0;
  PlanProblem pd = problem(dense, 1, 32);
  pd.hw.devices_per_node = 1;
  EXPECT_NEAR(r.time.compute - predict(pd, layout(1, 1, 1, 4)).time.compute,
              4 * (393216.0 - 196608.0 + 1536.0) * tokens / 10e12, 1e-9 * r.time.compute);
  // Capacity factor 0.5: each expert takes ceil(0.5 x 16 x 2 / 4) = 4 of a sequence's 32
  // assignments, 16 of them in all: half the experts' work.
  EXPECT_DOUBLE_EQ(moe_routed_rows(m, 4), 4 * 32.0);
  m.moe_capacity_factor = 0.5;
  EXPECT_DOUBLE_EQ(moe_routed_rows(m, 4), 4 * 16.0);
  m.moe_capacity_factor = 1.25;  // ceil(10) x 4 = 40 > 32: nothing dropped
  EXPECT_DOUBLE_EQ(moe_routed_rows(m, 4), 4 * 32.0);
  m.moe_capacity_factor = 0.5;
  p.model = m;
  EXPECT_NEAR(r.time.compute - predict(p, layout(1, 1, 1, 4)).time.compute,
              4 * 393216.0 / 2 * tokens / 10e12, 1e-9 * r.time.compute);
}

// Expert parallelism: per MoE layer and micro-batch two all-to-alls forward (rows to the
// experts' owners, outputs back) and two backward, each of the rank's N top_k rows of C
// elements with (EP-1)/EP of them leaving, plus the row counts (E int64); the links' closed
// form: (EP-1) latency + (EP-1)/EP bytes / bandwidth. The experts' FLOPs stay the same.
TEST(PlanMoe, ExpertParallelAllToAllsClosedForm) {
  const ModelConfig m = small_moe();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 2;
  Layout l = layout(1, 1, 2, 2);
  const Prediction plain = predict(p, l);
  l.ep = 2;
  const Prediction ep = predict(p, l);
  const double lat = 2e-6, bw = 10e9;
  const double rows = 2 * 16 * 2;  // micro-batch 2 x T 16 x top-2
  const double a2a = lat + 0.5 * rows * 64 * 4 / bw, counts = lat + 0.5 * 8 * 4 / bw;
  const double microbatches = 32 / (2 * 2);
  EXPECT_NEAR(ep.time.ep_comm, microbatches * 4 * (4 * a2a + counts), 1e-15);
  EXPECT_EQ(plain.time.ep_comm, 0.0);
  EXPECT_NEAR(ep.time.compute, plain.time.compute, 1e-12 * plain.time.compute);
  // Full recomputation reruns forward's exchanges in backward.
  l.recompute = Recompute::Full;
  EXPECT_NEAR(predict(p, l).time.ep_comm, microbatches * 4 * (6 * a2a + 2 * counts), 1e-15);
  // Across nodes when TP x PP x EP exceeds a node.
  PlanProblem two_nodes = problem(m, 2, 32);
  two_nodes.hw.devices_per_node = 1;
  l.recompute = Recompute::None;
  const double a2a_ib = 4e-6 + 0.5 * rows * 64 * 4 / 5e9, counts_ib = 4e-6 + 0.5 * 8 * 4 / 5e9;
  EXPECT_NEAR(predict(two_nodes, l).time.ep_comm, microbatches * 4 * (4 * a2a_ib + counts_ib),
              1e-15);
}

// Activations: a MoE layer keeps, beyond a dense layer's stash, moe_layer_extra_bytes: with
// N 16, E 4, K 2 (NK 32), C 64, F 256, fp32: 4 x (2 N E + NK + NK (2C + 2F)) = 82560, the
// chosen experts 4 NK = 128, the dispatch plan 8 (2 NK + E + 1) = 552, the aux and z losses 8:
// 83248 per MoE layer and micro-batch. Under EP the expert-side rows are sized N K EP.
TEST(PlanMoe, ActivationsCountEveryMoeLayersRows) {
  const ModelConfig m = small_moe();
  ActivationShape s;
  s.micro_batch = 1;
  EXPECT_EQ(moe_layer_extra_bytes(m, s), 83248);
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 1;
  ModelConfig dense = m;
  dense.moe_experts = 0;
  PlanProblem pd = problem(dense, 1, 32);
  pd.hw.devices_per_node = 1;
  EXPECT_DOUBLE_EQ(predict(p, layout(1, 1, 1, 1)).memory.activations -
                       predict(pd, layout(1, 1, 1, 1)).memory.activations,
                   4 * 83248.0);
  // The MoE block's buffers, once per rank (model/moe.hpp's backward scratch): fp32 x
  // (2 NK C 4096 + NK (F + F) 16384 + NK 32 + 2 N E 128 + 2 N C 2048) + the aux losses' 4 bytes.
  EXPECT_DOUBLE_EQ(predict(p, layout(1, 1, 1, 1)).memory.buffers -
                       predict(pd, layout(1, 1, 1, 1)).memory.buffers,
                   4 * (4096 + 16384 + 32 + 128 + 2048) + 4.0);
  p.hw.devices_per_node = 2;
  Layout l = layout(1, 1, 2, 1);
  const double one = predict(p, l).memory.activations;
  l.ep = 2;
  EXPECT_DOUBLE_EQ(predict(p, l).memory.activations - one, 4 * 4.0 * 32 * (2 * 64 + 2 * 256));
}

TEST(PlanMoe, ExpertParallelLayoutsAreEnumeratedWhereTheyDivide) {
  ModelConfig m = small_moe();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 4;
  std::set<std::pair<int64_t, int64_t>> dp_ep;
  for (const Layout& l : enumerate_layouts(p, parse_layout_filter("recompute=none,zero=0"))) {
    EXPECT_EQ(layout_problem(p, l), "") << to_string(l);
    dp_ep.insert({l.dp, l.ep});
  }
  EXPECT_EQ(dp_ep, (std::set<std::pair<int64_t, int64_t>>{
                       {1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {4, 4}}));
  EXPECT_EQ(enumerate_layouts(p, parse_layout_filter("expert=4")).front().ep, 4);
  Layout l = layout(1, 1, 4, 1);
  l.ep = 3;
  EXPECT_NE(layout_problem(p, l).find("expert (3) must divide data (4)"), std::string::npos);
  EXPECT_NE(to_string(l).find(",expert=3"), std::string::npos);
  m.moe_experts = 0;
  p.model = m;
  l.ep = 2;
  EXPECT_NE(layout_problem(p, l).find("needs a mixture of experts"), std::string::npos);
  for (const Layout& d : enumerate_layouts(p, {})) EXPECT_EQ(d.ep, 1);
}

// Issue 54 item 3: what a plan's numbers may hide is said beside them (docs/plan.md
// "Warnings"), each warning exactly where its condition holds.
namespace {

const PlanWarning* find_warning(const std::vector<PlanWarning>& warnings, const std::string& kind) {
  for (const PlanWarning& w : warnings)
    if (w.kind == kind) return &w;
  return nullptr;
}

bool warns(const PlanProblem& p, const Prediction& r, const std::string& kind) {
  const std::vector<PlanWarning> warnings = layout_warnings(p, r);
  return find_warning(warnings, kind) != nullptr;
}

bool warns(const PlanProblem& p, const Layout& l, const std::string& kind) {
  return warns(p, predict(p, l), kind);
}

}  // namespace

// M = global batch / (DP x micro-batch) micro-batches a step: PP > 1 and M < 2 PP warns.
TEST(PlanWarnings, FewerThanTwoMicrobatchesPerPipelineStage) {
  PlanProblem p = problem(small_gpt(), 1, 8);
  p.hw.devices_per_node = 4;
  EXPECT_FALSE(warns(p, layout(1, 4, 1, 1), "microbatches"));  // M = 8 = 2 PP
  p.global_batch = 7;
  const Prediction r = predict(p, layout(1, 4, 1, 1));
  EXPECT_EQ(r.microbatches, 7);
  const std::vector<PlanWarning> warnings = layout_warnings(p, r);
  const PlanWarning* w = find_warning(warnings, "microbatches");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->code, 'm');
  EXPECT_NE(w->text.find("7 micro-batches a step (global batch 7 / (DP 1 x micro-batch 1)) for 4 "
                         "pipeline stages, fewer than 2 per stage"),
            std::string::npos)
      << w->text;
  EXPECT_EQ(w->text.find('\n'), std::string::npos);
  // DP and the micro-batch count: 24 / (2 x 2) = 6 < 8 on 4 stages; 32 / (2 x 2) = 8 is not.
  p.hw.devices_per_node = 8;
  p.global_batch = 24;
  EXPECT_TRUE(warns(p, layout(1, 4, 2, 2), "microbatches"));
  p.global_batch = 32;
  EXPECT_FALSE(warns(p, layout(1, 4, 2, 2), "microbatches"));
  // One stage has no pipeline to fill: one micro-batch a step is no warning.
  p.hw.devices_per_node = 1;
  p.global_batch = 1;
  EXPECT_FALSE(warns(p, layout(1, 1, 1, 1), "microbatches"));
}

// Fewer sequences a step than devices: DP (which divides the global batch) cannot reach the
// devices, so every layout splits the model; the plan says so once, for all of them.
TEST(PlanWarnings, FewerSequencesThanDevices) {
  PlanProblem p = problem(small_gpt(), 1, 8);  // 8 devices
  EXPECT_TRUE(problem_warnings(p).empty());
  p.global_batch = 7;
  std::vector<PlanWarning> w = problem_warnings(p);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].kind, "batch");
  EXPECT_NE(w[0].text.find("the global batch of 7 sequences is fewer than the 8 devices"),
            std::string::npos)
      << w[0].text;
  EXPECT_NE(w[0].text.find("TP x CP x PP >= 2 devices"), std::string::npos) << w[0].text;
  // 2 nodes: 256 sequences on 512 devices is the issue's 64-node case in small.
  p.nodes = 2;
  p.global_batch = 8;
  w = problem_warnings(p);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].text.find("8 sequences is fewer than the 16 devices"), std::string::npos)
      << w[0].text;
  p.global_batch = 16;
  EXPECT_TRUE(problem_warnings(p).empty());
}

// A fitting layout with under 10 % of memory_gib left warns; one that does not fit is marked
// as such instead.
TEST(PlanWarnings, MemoryHeadroomUnderTenPercent) {
  PlanProblem p = problem(small_gpt(), 1, 32);
  p.hw.devices_per_node = 1;
  const double used = predict(p, layout(1, 1, 1, 1)).memory.total();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  p.hw.device.memory_gib = used / 0.95 / gib;  // 5 % left
  const Prediction tight = predict(p, layout(1, 1, 1, 1));
  ASSERT_TRUE(tight.fits);
  const std::vector<PlanWarning> warnings = layout_warnings(p, tight);
  const PlanWarning* w = find_warning(warnings, "headroom");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->code, 'h');
  EXPECT_NE(w->text.find("5.0 % left, under 10 %"), std::string::npos) << w->text;
  p.hw.device.memory_gib = used / 0.91 / gib;  // 9 % left
  EXPECT_TRUE(warns(p, layout(1, 1, 1, 1), "headroom"));
  p.hw.device.memory_gib = used / 0.89 / gib;  // 11 % left
  EXPECT_FALSE(warns(p, layout(1, 1, 1, 1), "headroom"));
  p.hw.device.memory_gib = used / 2.0 / gib;  // does not fit
  EXPECT_FALSE(predict(p, layout(1, 1, 1, 1)).fits);
  EXPECT_FALSE(warns(p, layout(1, 1, 1, 1), "headroom"));
}

// The bubble over 20 % of the step warns: 1F1B on 4 stages idles ~(p - 1)/(M + p - 1) of it,
// 3/7 with 4 micro-batches, 3/19 with 16.
TEST(PlanWarnings, BubbleOverTwentyPercentOfTheStep) {
  PlanProblem p = problem(small_gpt(), 1, 4);
  p.hw.devices_per_node = 4;
  p.hw.device.peak_tflops_fp32 = 1e-3;  // compute far above the transfers' latencies
  const Prediction few = predict(p, layout(1, 4, 1, 1));
  EXPECT_GT(few.time.bubble / few.step_seconds, 0.35);
  const std::vector<PlanWarning> warnings = layout_warnings(p, few);
  const PlanWarning* w = find_warning(warnings, "bubble");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->code, 'b');
  EXPECT_NE(w->text.find("over 20 %) idle in the pipeline's fill and drain"), std::string::npos)
      << w->text;
  p.global_batch = 16;
  const Prediction many = predict(p, layout(1, 4, 1, 1));
  EXPECT_GT(many.time.bubble / many.step_seconds, 0.1);
  EXPECT_LT(many.time.bubble / many.step_seconds, 0.2);
  EXPECT_FALSE(warns(p, many, "bubble"));
  // No pipeline, no bubble.
  p.hw.devices_per_node = 1;
  EXPECT_FALSE(warns(p, layout(1, 1, 1, 1), "bubble"));
}

// The DP reduction's part counted as hidden behind the last backward is an assumption of the
// model (the simulator never schedules the buckets): every layout that hides some says how much.
TEST(PlanWarnings, DataParallelOverlapIsAssumedNotScheduled) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 2;
  p.hw.device.peak_tflops_fp32 = 1e-3;  // a backward far longer than the reduction
  p.dp_bucket_mb = 1.0 / 1024;          // the last bucket, 1 KiB, exposed; the rest hidden
  const double grads = 4.0 * static_cast<double>(parameter_layout(m, ModelShard::whole(m)).flat_size);
  const double all_reduce =
      collective_seconds(p.hw, p.hw.intra_node, Collective::AllReduce, 2, grads);
  const Prediction r = predict(p, layout(1, 1, 2, 2));
  EXPECT_DOUBLE_EQ(r.dp_gradient_bytes, grads);
  EXPECT_DOUBLE_EQ(r.dp_reduce_seconds, all_reduce);
  EXPECT_GT(r.dp_window_seconds, all_reduce);
  EXPECT_NEAR(r.dp_hidden_seconds, all_reduce * (1.0 - 1024.0 / grads), 1e-15);
  EXPECT_NEAR(r.dp_hidden_seconds + r.time.dp_exposed, all_reduce, 1e-15);
  const std::vector<PlanWarning> warnings = layout_warnings(p, r);
  const PlanWarning* w = find_warning(warnings, "overlap");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->code, 'o');
  EXPECT_NE(w->text.find("data-parallel gradient reduction ("), std::string::npos) << w->text;
  EXPECT_NE(w->text.find("over DP 2, within a node) counted as hidden behind the last "
                         "micro-batch's backward"),
            std::string::npos)
      << w->text;
  EXPECT_NE(w->text.find("assumed, not scheduled"), std::string::npos) << w->text;
  // Nothing hidden, nothing said: the reduction started after backward (another system's), one
  // bucket holding every gradient, or no data parallelism.
  PlanProblem after = p;
  after.dp_overlap = false;
  EXPECT_EQ(predict(after, layout(1, 1, 2, 2)).dp_hidden_seconds, 0.0);
  EXPECT_FALSE(warns(after, layout(1, 1, 2, 2), "overlap"));
  PlanProblem whole = p;
  whole.dp_bucket_mb = 1e6;
  EXPECT_FALSE(warns(whole, layout(1, 1, 2, 2), "overlap"));
  EXPECT_FALSE(warns(p, layout(2, 1, 1, 2), "overlap"));
}

// Context parallelism (parallel.context = CP, docs/plan.md "Context parallelism"): each
// sequence split over CP ranks, attention by a ring of K/V blocks over them.
namespace {

// A small Llama with grouped-query attention (8 query heads sharing 2 K/V heads of size 16) and
// a sequence long enough for the plan to list CP (seq_len / kPlanMinContextTokens).
ModelConfig long_llama(int64_t seq_len) {
  ModelConfig m;
  m.arch = "llama";
  m.layers = 4;
  m.heads = 8;
  m.kv_heads = 2;
  m.width = 128;
  m.vocab_size = 64;
  m.seq_len = seq_len;
  return m;
}

Layout context_layout(int64_t tp, int64_t cp, int64_t pp, int64_t dp, int64_t mb = 1) {
  Layout l = layout(tp, pp, dp, mb);
  l.cp = cp;
  return l;
}

}  // namespace

// Everything a rank keeps for backward is per token, and a context rank holds T/CP tokens of
// each sequence (attention fused: no T x T state), so the activations fall as 1/CP; the weights
// are replicated as under DP, and ZeRO-1 shards the moments over data x context.
TEST(PlanContext, ActivationMemoryFallsAsOneOverContext) {
  const ModelConfig m = long_llama(4096);
  PlanProblem p = problem(m, 1, 8);
  p.hw.devices_per_node = 4;
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    Layout one = context_layout(1, 1, 1, 4);
    one.recompute = rc;
    const Prediction base = predict(p, one);
    for (int64_t cp : {2, 4}) {
      Layout l = context_layout(1, cp, 1, 4 / cp);
      l.recompute = rc;
      const Prediction r = predict(p, l);
      EXPECT_NEAR(r.memory.activations * static_cast<double>(cp), base.memory.activations,
                  1e-12 * base.memory.activations)
          << to_string(l);
      EXPECT_EQ(r.memory.weights, base.memory.weights) << to_string(l);
      EXPECT_EQ(r.memory.gradients, base.memory.gradients) << to_string(l);
      EXPECT_LT(r.memory.total(), base.memory.total()) << to_string(l);
    }
  }
  Layout sharded = context_layout(1, 2, 1, 2);
  sharded.zero_stage = 1;
  Layout over_data = context_layout(1, 1, 1, 4);
  over_data.zero_stage = 1;
  EXPECT_EQ(predict(p, sharded).memory.optimizer, predict(p, over_data).memory.optimizer);
  EXPECT_LT(predict(p, sharded).memory.optimizer,
            predict(p, context_layout(1, 2, 1, 2)).memory.optimizer / 3.0);
}

// The ring's block is the rank's tokens' k and v of its KV heads: B x T/CP x 2 x KVH/TP x HS
// elements, sent CP - 1 times a layer in forward. Its time is hidden behind a ring step's
// attention where that covers it: with attention free, every transfer is exposed (forward
// CP - 1 blocks; backward CP - 1 steps of two blocks, K/V and dK/dV, and the last dK/dV); with
// attention slow, only the last dK/dV, which has no step left to hide behind.
TEST(PlanContext, RingBytesAndTheExcessOverAttention) {
  const ModelConfig m = long_llama(4096);
  PlanProblem p = problem(m, 1, 8);
  p.precision = "bf16";
  const int64_t tp = 2, cp = 4, mb = 2;
  const Layout l = context_layout(tp, cp, 1, 1, mb);  // 8 devices in one node
  const double block = static_cast<double>(mb) * (4096.0 / cp) * 2.0 * (2.0 / tp) * 16.0 * 2.0;
  const Prediction r = predict(p, l);
  EXPECT_DOUBLE_EQ(r.cp_block_bytes, block);
  EXPECT_DOUBLE_EQ(r.cp_forward_bytes_per_layer, block * (cp - 1));
  const double x = collective_seconds(p.hw, p.hw.intra_node, Collective::SendRecv, 2, block);
  const double layers_steps = 4.0 * 4.0;  // 4 layers x 4 micro-batches (8 / (DP 1 x mb 2))
  p.hw.device.peak_tflops_bf16 = 1e12;    // attention takes no time
  const Prediction fast = predict(p, l);
  const double all = (cp - 1) * x + (cp - 1) * 2.0 * x + x;
  EXPECT_NEAR(fast.time.cp_comm, layers_steps * all, 1e-9 * fast.time.cp_comm);
  EXPECT_NEAR(fast.cp_ring_seconds, fast.time.cp_comm, 1e-9 * fast.time.cp_comm);
  // Recomputing the attention reruns its forward ring in backward.
  Layout full = l;
  full.recompute = Recompute::Full;
  EXPECT_NEAR(predict(p, full).time.cp_comm, layers_steps * (all + (cp - 1) * x),
              1e-9 * fast.time.cp_comm);
  p.hw.device.peak_tflops_bf16 = 1e-3;  // attention far longer than a block's transfer
  const Prediction slow = predict(p, l);
  EXPECT_NEAR(slow.time.cp_comm, layers_steps * x, 1e-9 * slow.time.cp_comm);
  EXPECT_NEAR(slow.cp_ring_seconds, fast.cp_ring_seconds, 1e-9 * fast.cp_ring_seconds);
  // The parts still sum to the step; no ring without CP.
  EXPECT_NEAR(slow.time.total(), slow.step_seconds, 1e-12 * slow.step_seconds);
  const Prediction none = predict(p, context_layout(tp, 1, 1, 4, mb));
  EXPECT_EQ(none.time.cp_comm, 0.0);
  EXPECT_EQ(none.cp_block_bytes, 0.0);
}

// Weight gradients are reduced over data x context: CP 2 with DP 1 still all-reduces them over
// its two ranks (one replica of the weights each, different tokens).
TEST(PlanContext, WeightGradientsAreReducedOverDataAndContext) {
  const ModelConfig m = long_llama(4096);
  PlanProblem p = problem(m, 1, 8);
  p.hw.devices_per_node = 2;
  p.dp_overlap = false;
  const double grads =
      4.0 * static_cast<double>(parameter_layout(m, ModelShard::whole(m)).flat_size);
  const Prediction r = predict(p, context_layout(1, 2, 1, 1));
  EXPECT_DOUBLE_EQ(r.dp_reduce_seconds,
                   collective_seconds(p.hw, p.hw.intra_node, Collective::AllReduce, 2, grads));
  EXPECT_DOUBLE_EQ(r.time.dp_exposed, r.dp_reduce_seconds);
  EXPECT_DOUBLE_EQ(r.dp_reduce_seconds, predict(p, context_layout(1, 1, 1, 2)).dp_reduce_seconds);
}

// Layouts the trainer would refuse are refused with the key and the reason: a sequence not cut
// into 2 CP equal chunks, SP's tokens not divisible by TP, CP with MoE layers; the --layout key
// and the --set line.
TEST(PlanContext, LayoutsTheTrainerRefusesAreRefusedWithAReason) {
  ModelConfig m = long_llama(24);
  m.kv_heads = 4;  // TP 4
  PlanProblem p = problem(m, 1, 8);
  EXPECT_EQ(layout_problem(p, context_layout(1, 4, 1, 2)), "");  // 24 = 8 chunks of 3
  EXPECT_EQ(layout_problem(p, context_layout(1, 8, 1, 1)),
            "model.seq_len = 24 is not divisible by 2 * parallel.context = 16 (each sequence is "
            "cut into 2 * context equal chunks)");
  EXPECT_THROW(predict(p, context_layout(1, 8, 1, 1)), Error);
  EXPECT_TRUE(enumerate_layouts(p, parse_layout_filter("context=8")).empty());
  Layout sp = context_layout(4, 2, 1, 1);  // 24 / 2 = 12 tokens a rank: 3 per tensor rank
  sp.sequence_parallel = true;
  EXPECT_EQ(layout_problem(p, sp), "");
  m.seq_len = 20;  // 10 tokens a context rank, not divisible by TP 4
  p.model = m;
  EXPECT_NE(layout_problem(p, sp).find("micro_batch x model.seq_len / context = 1 x 10 is not "
                                       "divisible by tensor (4) under sequence_parallel"),
            std::string::npos)
      << layout_problem(p, sp);
  m.moe_experts = 4;  // dropless without expert parallelism: the trainer runs it
  m.moe_top_k = 2;
  p.model = m;
  const Layout moe_cp = context_layout(1, 2, 1, 4);
  const std::string dropless = layout_problem(p, moe_cp);
  EXPECT_EQ(dropless.find("mixture of experts"), std::string::npos) << dropless;
  m.moe_capacity_factor = 1.0;  // token dropping: refused as the trainer refuses it
  p.model = m;
  EXPECT_NE(layout_problem(p, moe_cp).find("context (2) > 1 with a mixture of experts that "
                                           "drops tokens"),
            std::string::npos)
      << layout_problem(p, moe_cp);
  EXPECT_EQ(parse_layout_filter("context=4").cp, 4);
  EXPECT_THROW(parse_layout_filter("context=0"), Error);
  const Layout l = context_layout(2, 4, 1, 1);
  EXPECT_EQ(to_string(l).rfind("tensor=2,context=4,pipeline=1,data=1,", 0), 0u) << to_string(l);
  const std::vector<std::string> set = layout_overrides(l, 8);
  EXPECT_NE(std::find(set.begin(), set.end(), "parallel.context=4"), set.end());
  EXPECT_NE(std::find(set.begin(), set.end(), "parallel.tensor=2"), set.end());
}

// The enumeration lists CP in powers of two while each rank keeps kPlanMinContextTokens of a
// sequence, TP x CP x PP x DP = the devices. A long sequence whose one-rank layouts cannot fit
// gets a CP layout that does; a short one, where CP only adds the ring, keeps CP 1.
TEST(PlanContext, LongSequencesPickContextShortOnesDoNot) {
  PlanProblem p = problem(long_llama(16384), 1, 8);
  const std::vector<Layout> all = enumerate_layouts(p, {});
  std::set<int64_t> cps;
  for (const Layout& l : all) {
    cps.insert(l.cp);
    EXPECT_EQ(l.tp * l.cp * l.pp * l.dp, 8) << to_string(l);
  }
  EXPECT_EQ(cps, (std::set<int64_t>{1, 2, 4, 8}));
  // The device holds a little less than the smallest CP 1 layout needs.
  double least = 1e30;
  const std::vector<Layout> one_rank = enumerate_layouts(p, parse_layout_filter("context=1"));
  for (const Prediction& r : rank_layouts(p, one_rank))
    least = std::min(least, r.memory.total());
  p.hw.device.memory_gib = 0.99 * least / (1024.0 * 1024.0 * 1024.0);
  const Prediction best = rank_layouts(p, all).front();
  EXPECT_TRUE(best.fits);
  EXPECT_GT(best.layout.cp, 1) << to_string(best.layout);

  PlanProblem short_p = problem(long_llama(4096), 1, 8);
  const std::vector<Layout> short_all = enumerate_layouts(short_p, {});
  EXPECT_TRUE(std::any_of(short_all.begin(), short_all.end(),
                          [](const Layout& l) { return l.cp == 2; }));
  EXPECT_TRUE(std::none_of(short_all.begin(), short_all.end(),
                           [](const Layout& l) { return l.cp > 2; }));
  const std::vector<Prediction> short_ranked = rank_layouts(short_p, short_all);
  EXPECT_TRUE(short_ranked.front().fits);
  EXPECT_EQ(short_ranked.front().layout.cp, 1) << to_string(short_ranked.front().layout);
  // Not a tie the enumeration's order breaks: the fastest CP 2 layout is slower.
  const auto with_cp = std::find_if(short_ranked.begin(), short_ranked.end(),
                                    [](const Prediction& r) { return r.layout.cp == 2; });
  ASSERT_NE(with_cp, short_ranked.end());
  EXPECT_LT(short_ranked.front().step_seconds, with_cp->step_seconds);
}

// The ring's exposed part over 5 % of the step warns (r), and a context group wider than a node
// (TP x CP > devices per node) says its ring crosses nodes (x).
TEST(PlanContext, WarningsForAnExposedRingAndAGroupAcrossNodes) {
  PlanProblem p = problem(long_llama(4096), 1, 8);
  p.hw.device.peak_tflops_fp32 = 1e9;  // attention hides nothing
  const Prediction exposed = predict(p, context_layout(1, 8, 1, 1));
  ASSERT_GT(exposed.time.cp_comm, 0.05 * exposed.step_seconds);
  const std::vector<PlanWarning> warnings = layout_warnings(p, exposed);
  const PlanWarning* w = find_warning(warnings, "ring");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->code, 'r');
  EXPECT_NE(w->text.find("over 5 %) is the context ring's K/V and dK/dV transfers"),
            std::string::npos)
      << w->text;
  EXPECT_FALSE(warns(p, context_layout(1, 8, 1, 1), "context_nodes"));
  p.hw.device.peak_tflops_fp32 = 1e-3;  // attention hides all but the last dK/dV
  const Prediction hidden = predict(p, context_layout(1, 8, 1, 1));
  EXPECT_LT(hidden.time.cp_comm, 0.05 * hidden.step_seconds);
  EXPECT_FALSE(warns(p, hidden, "ring"));
  p.hw.devices_per_node = 4;
  p.nodes = 2;
  const std::vector<PlanWarning> across =
      layout_warnings(p, predict(p, context_layout(1, 8, 1, 1)));
  w = find_warning(across, "context_nodes");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->code, 'x');
  EXPECT_NE(w->text.find("TP x CP = 8 > 4 devices per node) crosses nodes"), std::string::npos)
      << w->text;
  EXPECT_FALSE(warns(p, context_layout(1, 4, 1, 2), "context_nodes"));
}

// Issue 50 item 6: the ZeRO stages (docs/plan.md "ZeRO stages").
namespace {

// small_gpt's units, by hand: a GPT-2 layer is 12 C^2 + 13 C (qkv C x 3C + 3C, projection
// C x C + C, fc C x 4C + 4C, fc projection 4C x C + C, two layer norms 4C); the embedding
// V C + T C (tied head); the head's unit is then the final layer norm, 2C.
constexpr double kGptLayer = 12.0 * 64 * 64 + 13.0 * 64;
constexpr double kGptEmbedding = 64.0 * 64 + 16.0 * 64;
constexpr double kGptFinalNorm = 2.0 * 64;

Layout zero_layout(int64_t dp, int64_t mb, int stage) {
  Layout l = layout(1, 1, dp, mb);
  l.zero_stage = stage;
  return l;
}

}  // namespace

// Model state by stage against the formula, a parameter's bytes (d = DP): fp32 16 at stage 0;
// 8 + 8/d at 1; 4 + 12/d and two units' gradient windows at 2; 16/d, three units' gather
// buffers (the compute copy, fp32 here) and two gradient windows at 3. bf16 adds the 2-byte
// compute copy to stages 0-2 (18 B/param at stage 0) and gathers 2-byte units at stage 3.
TEST(PlanZero, ModelStatePerStageIsTheFormula) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 4;
  const double flat = static_cast<double>(parameter_layout(m, ModelShard::whole(m)).flat_size);
  ASSERT_EQ(flat, 8 * kGptLayer + kGptEmbedding + kGptFinalNorm);
  const double owned = std::ceil(flat / 4), unit = kGptLayer;  // the largest unit: a layer
  for (const std::string precision : {"fp32", "bf16"}) {
    p.precision = precision;
    const double copy = precision == "bf16" ? 2.0 : 0.0, compute = precision == "bf16" ? 2 : 4;
    const Prediction z0 = predict(p, zero_layout(4, 1, 0));
    const Prediction z1 = predict(p, zero_layout(4, 1, 1));
    const Prediction z2 = predict(p, zero_layout(4, 1, 2));
    const Prediction z3 = predict(p, zero_layout(4, 1, 3));
    auto state = [](const Prediction& r) {
      return r.memory.weights + r.memory.gradients + r.memory.optimizer;
    };
    EXPECT_DOUBLE_EQ(state(z0), flat * (16 + copy)) << precision;
    EXPECT_DOUBLE_EQ(z1.memory.weights, flat * (4 + copy)) << precision;
    EXPECT_DOUBLE_EQ(z1.memory.gradients, flat * 4) << precision;
    EXPECT_DOUBLE_EQ(z1.memory.optimizer, owned * 8) << precision;
    EXPECT_DOUBLE_EQ(z2.memory.weights, flat * (4 + copy)) << precision;
    EXPECT_DOUBLE_EQ(z2.memory.gradients, owned * 4 + 2 * unit * 4) << precision;
    EXPECT_DOUBLE_EQ(z2.memory.optimizer, owned * 8) << precision;
    EXPECT_DOUBLE_EQ(z3.memory.weights, owned * 4 + 3 * unit * compute) << precision;
    EXPECT_DOUBLE_EQ(z3.memory.gradients, owned * 4 + 2 * unit * 4) << precision;
    EXPECT_DOUBLE_EQ(z3.memory.optimizer, owned * 8) << precision;
    // Only stage 1 stages its reduce-scatter in a bucket of its own (the windows are 2 and
    // 3's); the activations do not depend on the stage.
    EXPECT_GT(z1.memory.buffers, z0.memory.buffers) << precision;
    EXPECT_DOUBLE_EQ(z2.memory.buffers, z0.memory.buffers) << precision;
    EXPECT_DOUBLE_EQ(z3.memory.buffers, z0.memory.buffers) << precision;
    EXPECT_DOUBLE_EQ(z3.memory.activations, z0.memory.activations) << precision;
    EXPECT_LT(z3.memory.total(), z2.memory.total()) << precision;
    EXPECT_LT(z2.memory.total(), z1.memory.total()) << precision;
  }
  // The largest unit is the stage's: a pipeline stage of the embedding and 2 layers with a
  // vocabulary of 4096 gathers the embedding ((4096 + 16) x 64 elements), the next stages a
  // layer.
  ModelConfig wide_vocab = m;
  wide_vocab.vocab_size = 4096;
  PlanProblem q = problem(wide_vocab, 1, 32);
  Layout piped = layout(1, 4, 2, 1);
  piped.zero_stage = 3;
  const Prediction r = predict(q, piped);
  EXPECT_EQ(r.fullest_stage, 0);
  const double stage0 = 2 * kGptLayer + (4096.0 + 16) * 64;
  EXPECT_DOUBLE_EQ(r.memory.weights, std::ceil(stage0 / 2) * 4 + 3 * (4096.0 + 16) * 64 * 4);
}

// The data group's traffic a step (message bytes) and its time with nothing hidden
// (--no-dp-overlap): stage 0 all-reduces the gradients once; 1 reduce-scatters them and
// all-gathers the fp32 weights; 2 reduce-scatters them in every micro-batch (M = 8), unit by
// unit (10 units: 8 layers, the embedding, the head: a latency step each); 3 also all-gathers
// the compute copy twice a micro-batch and nothing after the update.
TEST(PlanZero, CollectiveBytesAndTimesPerStage) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 2;
  p.dp_overlap = false;
  const double flat = 8 * kGptLayer + kGptEmbedding + kGptFinalNorm, M = 8, units = 10;
  auto x = [&](Collective c, double bytes) {
    return collective_seconds(p.hw, p.hw.intra_node, c, 2, bytes);
  };
  auto per_unit = [&](Collective c, double bytes) { return x(c, bytes) + (units - 1) * x(c, 0); };
  const Prediction z0 = predict(p, zero_layout(2, 2, 0));
  EXPECT_EQ(z0.microbatches, 8);
  EXPECT_DOUBLE_EQ(z0.dp_reduced_bytes, 4 * flat);
  EXPECT_DOUBLE_EQ(z0.dp_gathered_bytes, 0.0);
  EXPECT_NEAR(z0.time.dp_exposed, x(Collective::AllReduce, 4 * flat), 1e-15);
  const Prediction z1 = predict(p, zero_layout(2, 2, 1));
  EXPECT_DOUBLE_EQ(z1.dp_reduced_bytes, 4 * flat);
  EXPECT_DOUBLE_EQ(z1.dp_gathered_bytes, 4 * flat);
  EXPECT_NEAR(z1.time.dp_exposed,
              x(Collective::ReduceScatter, 4 * flat) + x(Collective::AllGather, 4 * flat), 1e-15);
  const Prediction z2 = predict(p, zero_layout(2, 2, 2));
  EXPECT_DOUBLE_EQ(z2.dp_reduced_bytes, M * 4 * flat);
  EXPECT_DOUBLE_EQ(z2.dp_gathered_bytes, 4 * flat);
  EXPECT_NEAR(z2.time.dp_exposed,
              M * per_unit(Collective::ReduceScatter, 4 * flat) +
                  per_unit(Collective::AllGather, 4 * flat),
              1e-12);
  EXPECT_EQ(z2.dp_hidden_seconds, 0.0);
  for (const std::string precision : {"fp32", "bf16"}) {
    p.precision = precision;
    const double compute = precision == "bf16" ? 2 : 4;
    const Prediction z3 = predict(p, zero_layout(2, 2, 3));
    EXPECT_DOUBLE_EQ(z3.dp_reduced_bytes, M * 4 * flat) << precision;
    EXPECT_DOUBLE_EQ(z3.dp_gathered_bytes, 2 * M * compute * flat) << precision;
    EXPECT_NEAR(z3.time.dp_exposed,
                M * (per_unit(Collective::ReduceScatter, 4 * flat) +
                     2 * per_unit(Collective::AllGather, compute * flat)),
                1e-12)
        << precision;
    EXPECT_NEAR(z3.time.total(), z3.step_seconds, 1e-12 * z3.step_seconds);
  }
}

// Overlapped: with the compute slow (1 GFLOP/s) every unit's collective hides behind the
// compute it overlaps, but for the first unit (the embedding: the forward's first, the
// backward's last): stage 2 exposes the last micro-batch's reduce-scatter of it and the
// all-gather after the update; stage 3 each micro-batch's forward gather of it (nothing before
// it to hide behind) and the last micro-batch's reduce-scatter of it.
TEST(PlanZero, OverlapHidesAllButTheFirstUnits) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m, 1, 32);
  p.hw.devices_per_node = 2;
  p.hw.device.peak_tflops_fp32 = 1e-3;
  const double flat = 8 * kGptLayer + kGptEmbedding + kGptFinalNorm, M = 8, units = 10;
  auto x = [&](Collective c, double bytes) {
    return collective_seconds(p.hw, p.hw.intra_node, c, 2, bytes);
  };
  auto per_unit = [&](Collective c, double bytes) { return x(c, bytes) + (units - 1) * x(c, 0); };
  const double rs_first = x(Collective::ReduceScatter, 4 * kGptEmbedding);
  const Prediction z2 = predict(p, zero_layout(2, 2, 2));
  EXPECT_NEAR(z2.time.dp_exposed, rs_first + per_unit(Collective::AllGather, 4 * flat), 1e-12);
  EXPECT_NEAR(z2.dp_hidden_seconds, M * per_unit(Collective::ReduceScatter, 4 * flat) - rs_first,
              1e-12);
  const Prediction z3 = predict(p, zero_layout(2, 2, 3));
  EXPECT_NEAR(z3.time.dp_exposed, M * x(Collective::AllGather, 4 * kGptEmbedding) + rs_first,
              1e-12);
  const std::vector<PlanWarning> warnings = layout_warnings(p, z3);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].kind, "overlap");
  EXPECT_NE(warnings[0].text.find("ZeRO-3 traffic"), std::string::npos) << warnings[0].text;
  EXPECT_NE(warnings[0].text.find("8 micro-batches"), std::string::npos) << warnings[0].text;
}

// The search takes the stages as any other choice: fitting first, then by step time. Only
// stage 3 fits in a device between its memory and stage 2's: it comes first though slower
// (links of 0.1 GB/s: its gathers exposed); with memory for all and the optimizer slow (1 GB/s)
// stage 1 is fastest (its pass over 1/DP of the parameters, one reduce-scatter and all-gather a
// step against stage 2 and 3's one a micro-batch) and chosen.
TEST(PlanZero, SearchPicksTheStageThatFitsThenTheFastest) {
  const ModelConfig m = small_gpt();
  PlanProblem p = problem(m, 1, 128);
  p.hw.intra_node.bandwidth_gbs = 0.1;
  p.hw.device.optimizer_bandwidth_gbs = {{1.0, 1.0}, {1e9, 1.0}};
  const LayoutFilter f =
      parse_layout_filter("tensor=1,pipeline=1,data=8,micro_batch=1,recompute=none");
  const std::vector<Layout> layouts = enumerate_layouts(p, f);
  ASSERT_EQ(layouts.size(), 4u);
  double memory[4], step[4];
  for (const Layout& l : layouts) {
    const Prediction r = predict(p, l);
    memory[l.zero_stage] = r.memory.total();
    step[l.zero_stage] = r.step_seconds;
  }
  EXPECT_LT(step[1], step[0]);
  EXPECT_LT(step[1], step[2]);
  EXPECT_LT(step[2], step[3]);
  EXPECT_LT(memory[3], memory[2]);
  std::vector<Prediction> ranked = rank_layouts(p, layouts);
  EXPECT_TRUE(ranked.back().fits);
  EXPECT_EQ(ranked.front().layout.zero_stage, 1);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  p.hw.device.memory_gib = (memory[3] + memory[2]) / 2 / kGiB;
  ranked = rank_layouts(p, layouts);
  EXPECT_EQ(ranked.front().layout.zero_stage, 3);
  EXPECT_TRUE(ranked.front().fits);
  EXPECT_FALSE(ranked[1].fits);
  EXPECT_EQ(layout_overrides(ranked.front().layout, 128)[9], "optim.zero_stage=3");
}

// Stages 1-3 are enumerated where they shard something (DP x CP > 1), stage 0 alone elsewhere;
// --layout zero= takes 0 to 3 and refuses anything else in one line naming the key.
TEST(PlanZero, EnumeratedWhereTheyShardAndBadValuesRefused) {
  PlanProblem p = problem(small_gpt(), 1, 32);
  p.hw.devices_per_node = 2;
  std::set<std::pair<int64_t, int>> seen;  // (DP, stage)
  for (const Layout& l : enumerate_layouts(p, parse_layout_filter("micro_batch=1,recompute=none")))
    seen.insert({l.dp, l.zero_stage});
  EXPECT_EQ(seen, (std::set<std::pair<int64_t, int>>{{1, 0}, {2, 0}, {2, 1}, {2, 2}, {2, 3}}));
  for (int stage = 0; stage <= 3; ++stage) {
    const LayoutFilter f = parse_layout_filter("zero=" + std::to_string(stage));
    EXPECT_EQ(f.zero_stage, stage);
    const std::vector<Layout> only = enumerate_layouts(p, f);
    ASSERT_FALSE(only.empty());
    for (const Layout& l : only) EXPECT_EQ(l.zero_stage, stage);
    EXPECT_NE(to_string(only.front()).find(",zero=" + std::to_string(stage) + ","),
              std::string::npos);
  }
  for (const std::string bad : {"4", "-1", "two", "", "1.5", "03"}) {
    try {
      parse_layout_filter("tensor=1,zero=" + bad);
      ADD_FAILURE() << "zero=" << bad << " accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what, "--layout: zero = \"" + bad + "\" must be 0, 1, 2 or 3 (the ZeRO stage)");
    }
  }
}

// rank_layouts simulates a pipeline once for the layouts that differ only in their ZeRO stage:
// every ranked prediction is the layout's own.
TEST(PlanZero, RankingSharesThePipelineSimulationAcrossStagesOnly) {
  PlanProblem p = problem(small_gpt(), 1, 32);
  const std::vector<Layout> layouts =
      enumerate_layouts(p, parse_layout_filter("tensor=1,recompute=none,sequence_parallel=0"));
  std::set<int> stages;
  for (const Prediction& r : rank_layouts(p, layouts)) {
    const Prediction own = predict(p, r.layout);
    EXPECT_EQ(r.step_seconds, own.step_seconds) << to_string(r.layout);
    EXPECT_EQ(r.time.bubble, own.time.bubble) << to_string(r.layout);
    EXPECT_EQ(r.memory.total(), own.memory.total()) << to_string(r.layout);
    if (r.layout.pp > 1) stages.insert(r.layout.zero_stage);
  }
  EXPECT_EQ(stages, (std::set<int>{0, 1, 2, 3}));
}

// train.precision = "fp8" (docs/plan.md "FP8"): the linear GEMMs of the layers between the first
// train.fp8_skip_first_layers and the last train.fp8_skip_last_layers at the FP8 rate, the rest
// in the base precision (bf16 on a GPU, fp32 on a CPU); each GEMM's operands quantised at the
// memory bandwidth; an amax all-reduce per quantised tensor.
namespace {

// The ideal hardware (efficiency 1) with a GPU's FP8 rate, 4x its bf16 one.
PlanProblem fp8_problem(const ModelConfig& m, int64_t global_batch = 32) {
  PlanProblem p = problem(m, 1, global_batch);
  p.precision = "fp8";
  p.hw.device.peak_tflops_fp8 = 400.0;
  return p;
}

PlanProblem with_precision(PlanProblem p, const std::string& precision) {
  p.precision = precision;
  return p;
}

// Elements one FP8 layer quantises per micro-batch of N rows on one tensor rank (TP 1), from
// its four GEMMs' shapes (Cin, OC): forward x [N, Cin] and w [OC, Cin], backward dy [N, OC], x
// and w again.
struct QuantisedElements {
  double forward = 0, backward = 0, dy = 0;
};
QuantisedElements quantised_elements(const ModelConfig& m, double N) {
  const double C = static_cast<double>(m.width), H = static_cast<double>(m.heads * m.head_size());
  const double QKV = static_cast<double>((m.heads + 2 * m.kv_head_count()) * m.head_size());
  const double F = static_cast<double>(m.ffn_size()), U = m.is_llama() ? 2.0 * F : F;
  const double gemms[4][2] = {{C, QKV}, {H, C}, {C, U}, {F, C}};
  QuantisedElements q;
  for (const auto& [in, out] : gemms) {
    q.forward += N * in + out * in;
    q.backward += N * out + N * in + out * in;
    q.dy += N * out;
  }
  return q;
}

std::string predict_error(const PlanProblem& p, const Layout& l) {
  try {
    predict(p, l);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

}  // namespace

// The covered layers' linear FLOPs at the FP8 rate, everything else (the skipped layers'
// GEMMs, attention, the LM head) at the bf16 rate; MFU against the bf16 peak.
TEST(PlanFp8, CoveredLayersGemmsAtTheFp8RateTheRestAtBf16) {
  const ModelConfig m = small_gpt();  // 8 layers
  PlanProblem fp8 = fp8_problem(m);
  fp8.hw.devices_per_node = 1;
  const PlanProblem bf16 = with_precision(fp8, "bf16");
  const Layout l = layout(1, 1, 1, 4);  // 8 micro-batches of 4 sequences
  const double tokens = 32 * 16, linear = training_flops_parts(m, 64).layer_linear;
  const Prediction base = predict(bf16, l);
  int compared = 0;
  for (const auto& [first, last] : {std::pair<int64_t, int64_t>{1, 1}, {0, 0}, {2, 3}}) {
    fp8.fp8_skip_first = first;
    fp8.fp8_skip_last = last;
    const double covered = 8.0 - static_cast<double>(first + last);
    const Prediction r = predict(fp8, l);
    EXPECT_EQ(r.fp8_layers, static_cast<int64_t>(covered));
    EXPECT_NEAR(r.fp8_gemm_seconds, covered * linear * tokens / 400e12, 1e-12 * r.fp8_gemm_seconds);
    // The same step but the covered GEMMs' rate, and their quantisation passes (nearly free at
    // the ideal device's bandwidth).
    EXPECT_NEAR(r.time.compute,
                base.time.compute - covered * linear * tokens * (1 / 100e12 - 1 / 400e12) +
                    r.fp8_quantise_seconds,
                1e-9 * base.time.compute)
        << first << " " << last;
    EXPECT_GT(r.fp8_quantise_seconds, 0.0);
    EXPECT_LT(r.fp8_quantise_seconds, 1e-6 * r.time.compute);
    EXPECT_NEAR(r.mfu, r.model_flops_per_step / r.step_seconds / 100e12, 1e-12);
    EXPECT_GT(r.mfu, base.mfu);
    EXPECT_DOUBLE_EQ(r.model_flops_per_step, base.model_flops_per_step);
    // Activations stay bf16: only the quantised copies' scratch is added (1 byte an element).
    EXPECT_DOUBLE_EQ(r.memory.activations, base.memory.activations);
    EXPECT_DOUBLE_EQ(r.memory.weights, base.memory.weights);  // fp32 master + bf16 copy
    EXPECT_GT(r.fp8_scratch_bytes, 0.0);
    EXPECT_DOUBLE_EQ(r.memory.buffers - base.memory.buffers, r.fp8_scratch_bytes);
    ++compared;
  }
  EXPECT_EQ(compared, 3);
  // Every layer skipped: the bf16 step, to the bit.
  fp8.fp8_skip_first = 8;
  const Prediction none = predict(fp8, l);
  EXPECT_EQ(none.fp8_layers, 0);
  EXPECT_EQ(none.time.compute, base.time.compute);
  EXPECT_EQ(none.memory.total(), base.memory.total());
}

// A stage whose layers are all skipped runs in bf16 and holds no quantised copies (the trainer
// allocates them on a covered layer's first GEMM); the scratch is model_stats.hpp's fp8 count
// at one byte an element: the largest input, weight and output gradient, the last in two
// layouts on a GPU (the backward's operands: the input's and weight's transposed only).
TEST(PlanFp8, SkippedStagesHoldNoScratchAndTheScratchIsTheTrainersCount) {
  const ModelConfig m = small_gpt();  // 8 layers, 4 a stage over PP 2
  PlanProblem fp8 = fp8_problem(m);
  fp8.hw.devices_per_node = 2;
  const PlanProblem bf16 = with_precision(fp8, "bf16");
  const Layout l = layout(1, 2, 1, 1);  // 32 micro-batches: 1F1B's stage 0 is the fullest
  fp8.fp8_skip_first = 4;
  fp8.fp8_skip_last = 0;
  const Prediction late = predict(fp8, l), base = predict(bf16, l);
  EXPECT_EQ(late.fullest_stage, 0);
  EXPECT_EQ(late.fp8_scratch_bytes, 0.0);
  EXPECT_EQ(late.memory.total(), base.memory.total());
  fp8.fp8_skip_first = 0;
  fp8.fp8_skip_last = 4;
  const Prediction early = predict(fp8, l);
  EXPECT_EQ(early.fullest_stage, 0);
  // N = 16 rows; gpt2 C 64: the largest input F = 256, output gradient F = 256 (QKV 192), weight
  // F x C; one byte each, the output gradient's in two layouts (row-major and transposed).
  const double N = 16, C = 64, F = 256;
  EXPECT_DOUBLE_EQ(early.fp8_scratch_bytes, N * F + 2 * N * F + F * C);
  EXPECT_DOUBLE_EQ(early.memory.total() - base.memory.total(), early.fp8_scratch_bytes);
}

// The quantisation passes at the memory bandwidth (1 GB/s; the FP8 rate = the bf16 one, so the
// GEMMs cost the same): each quantised element is read twice (amax, quantise) and written once,
// 2 + 2 + 1 bytes on a GPU, which also writes the output gradient's codes in a second layout
// (1 byte, transposed for dW) where one backward takes both halves; the split backward
// quantises dy twice (once a layout); full recomputation reruns the forward's. On a CPU (kind
// "cpu") the copies are fp32 and the GEMMs run at the fp32 rate: 4 + 4 + 4 bytes, fp8 = fp32
// but for the passes.
TEST(PlanFp8, QuantisationBytesAtTheMemoryBandwidth) {
  const ModelConfig m = small_gpt();
  PlanProblem fp8 = fp8_problem(m);
  fp8.hw.devices_per_node = 1;
  fp8.hw.device.memory_bandwidth_gbs = 1.0;
  fp8.hw.device.peak_tflops_fp8 = fp8.hw.device.peak_tflops_bf16;
  const int64_t mb = 4;
  const double micro = 32 / mb, covered = 6, bw = 1e9;
  const QuantisedElements q = quantised_elements(m, mb * 16.0);
  int compared = 0;
  // The delayed recipe: a GPU takes the amax in the quantisation pass (3 bytes an element);
  // the CPU reference still runs its amax pass (12).
  for (const auto& [cpu, delayed] : {std::pair{false, false}, {true, false}, {false, true},
                                     {true, true}}) {
    PlanProblem p = fp8;
    if (cpu) p.hw.device.kind = "cpu";
    p.fp8_delayed = delayed;
    const PlanProblem base = with_precision(p, cpu ? "fp32" : "bf16");
    const double per_element = cpu ? 12.0 : delayed ? 3.0 : 5.0;
    for (const auto& [schedule, recompute] :
         {std::pair{ScheduleKind::OneFOneB, Recompute::None},
          {ScheduleKind::ZeroBubbleH1, Recompute::None},
          {ScheduleKind::OneFOneB, Recompute::Full}}) {
      Layout l = layout(1, 1, 1, mb, schedule);
      l.recompute = recompute;
      const double elements = q.forward + q.backward +
                              (schedule == ScheduleKind::ZeroBubbleH1 ? q.dy : 0.0) +
                              (recompute == Recompute::Full ? q.forward : 0.0);
      const bool second_layout = !cpu && schedule != ScheduleKind::ZeroBubbleH1;
      const double bytes =
          covered * micro * (per_element * elements + (second_layout ? q.dy : 0.0));
      const Prediction r = predict(p, l), b = predict(base, l);
      EXPECT_DOUBLE_EQ(r.fp8_quantise_bytes, bytes) << cpu << " " << to_string(l);
      EXPECT_NEAR(r.fp8_quantise_seconds, bytes / bw, 1e-12 * bytes / bw);
      EXPECT_NEAR(r.time.compute - b.time.compute, bytes / bw, 1e-9 * b.time.compute)
          << cpu << " " << to_string(l);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 12);
}

// One float all-reduced (MAX) per quantised tensor over the tensor group, activations' and
// gradients' also over the context group: per layer and micro-batch 20 over TP (forward x, w;
// backward dy, x, w; four GEMMs), 12 of them over CP; the split backward adds a dy per GEMM,
// full recomputation the forward's 8 (4).
// The delayed recipe: none (its one reduction a step is not counted).
TEST(PlanFp8, AmaxAllReducesOverTheTensorAndContextGroups) {
  const ModelConfig m = small_gpt();
  PlanProblem fp8 = fp8_problem(m, 1);  // one micro-batch
  fp8.hw.devices_per_node = 2;
  const PlanProblem bf16 = with_precision(fp8, "bf16");
  const double covered = 6;
  const double ar = collective_seconds(fp8.hw, fp8.hw.intra_node, Collective::AllReduce, 2, 4.0);
  int compared = 0;
  for (const auto& [schedule, recompute, count] :
       {std::tuple{ScheduleKind::OneFOneB, Recompute::None, 20.0},
        {ScheduleKind::ZeroBubbleH1, Recompute::None, 24.0},
        {ScheduleKind::OneFOneB, Recompute::Full, 28.0}}) {
    Layout l = layout(2, 1, 1, 1, schedule);
    l.recompute = recompute;
    const Prediction r = predict(fp8, l), b = predict(bf16, l);
    EXPECT_DOUBLE_EQ(r.fp8_amax_reductions, covered * count) << to_string(l);
    EXPECT_NEAR(r.fp8_amax_seconds, covered * count * ar, 1e-15);
    EXPECT_NEAR(r.time.tp_comm - b.time.tp_comm, covered * count * ar, 1e-15) << to_string(l);
    ++compared;
  }
  EXPECT_EQ(compared, 3);
  PlanProblem two = fp8;
  two.global_batch = 2;
  EXPECT_EQ(predict(two, layout(1, 1, 2, 1)).fp8_amax_reductions, 0.0) << "TP 1: no collective";
  PlanProblem delayed = fp8;  // scales fixed before the step: no per-GEMM reduction
  delayed.fp8_delayed = true;
  const Prediction d = predict(delayed, layout(2, 1, 1, 1)), db = predict(bf16, layout(2, 1, 1, 1));
  EXPECT_EQ(d.fp8_amax_reductions, 0.0);
  EXPECT_EQ(d.time.tp_comm, db.time.tp_comm);

  // Context parallelism: CP 2 (TP 1), 4 layers of which 2 covered, 4 micro-batches.
  const ModelConfig lm = long_llama(4096);
  PlanProblem cp = fp8_problem(lm, 4);
  cp.hw.devices_per_node = 2;
  const double cp_ar = collective_seconds(cp.hw, cp.hw.intra_node, Collective::AllReduce, 2, 4.0);
  const Layout l = context_layout(1, 2, 1, 1);
  const Prediction r = predict(cp, l), b = predict(with_precision(cp, "bf16"), l);
  EXPECT_DOUBLE_EQ(r.fp8_amax_reductions, 4 * 2 * 12.0);
  EXPECT_NEAR(r.time.cp_comm - b.time.cp_comm, 4 * 2 * 12.0 * cp_ar, 1e-15);
  EXPECT_EQ(r.time.tp_comm, b.time.tp_comm);
}

// device.peak_tflops_fp8: optional, a GPU's only; planning fp8 on a GPU file without it is one
// line naming the file and the key; on a CPU the FP8 GEMMs run at the fp32 rate; the shipped
// H100 and H200 files have NVIDIA's dense figure, the A100 (no FP8 tensor cores) none.
TEST(PlanFp8, HardwareKeyAndItsErrors) {
  const std::string gpu = ideal_hardware_text();
  const HardwareSpec without = parse_hardware(gpu, "hw.toml");
  EXPECT_EQ(without.device.peak_tflops_fp8, 0.0);
  EXPECT_DOUBLE_EQ(without.peak_flops("fp8"), 100e12) << "fp8's base: bf16 on a GPU";
  try {
    without.fp8_gemm_flops();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "hardware file hw.toml: device.peak_tflops_fp8 is missing: train.precision = "
              "\"fp8\" needs the device's dense FP8 tensor-core rate, 10^12 FLOP/s "
              "(docs/plan.md \"FP8\")");
  }
  PlanProblem p = problem(small_gpt());
  p.precision = "fp8";
  EXPECT_NE(predict_error(p, layout(1, 1, 8, 4))
                .find("ideal.toml: device.peak_tflops_fp8 is missing"),
            std::string::npos);
  const std::string text =
      replace(gpu, "peak_tflops_bf16 = 100.0", "peak_tflops_bf16 = 100.0\npeak_tflops_fp8 = 250");
  const HardwareSpec with = parse_hardware(text, "hw.toml");
  EXPECT_DOUBLE_EQ(with.fp8_gemm_flops(), 250e12);
  EXPECT_DOUBLE_EQ(parse_hardware(hardware_to_toml(with, {}), "again.toml").fp8_gemm_flops(),
                   250e12);
  expect_error(replace(text, "peak_tflops_fp8 = 250", "peak_tflops_fp8 = -1"),
               "hw.toml: device.peak_tflops_fp8 = -1 must be greater than 0");
  const std::string cpu = replace(gpu, "kind = \"gpu\"", "kind = \"cpu\"");
  const HardwareSpec reference = parse_hardware(cpu, "cpu.toml");
  EXPECT_DOUBLE_EQ(reference.fp8_gemm_flops(), 10e12) << "the CPU's fp32 rate";
  EXPECT_DOUBLE_EQ(reference.peak_flops("fp8"), 10e12);
  EXPECT_EQ(reference.fp8_base_precision(), "fp32");
  expect_error(replace(cpu, "peak_tflops_bf16 = 100.0", "peak_tflops_bf16 = 100.0\n"
                                                          "peak_tflops_fp8 = 250"),
               "hw.toml: device.peak_tflops_fp8 is for a GPU");
  for (const auto& [name, fp8] : {std::pair<std::string, double>{"h100_dgx", 1979e12},
                                  {"h200_dgx", 1979e12}, {"cpu_2core", 0.0}}) {
    const HardwareSpec hw =
        load_hardware(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware/" + name + ".toml");
    EXPECT_DOUBLE_EQ(hw.fp8_gemm_flops(), fp8 > 0 ? fp8 : hw.peak_flops("fp32")) << name;
  }
  const HardwareSpec a100 =
      load_hardware(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware/a100_80gb_dgx.toml");
  EXPECT_THROW(a100.fp8_gemm_flops(), Error);
}

// A mixture of experts in FP8 (small_moe: MoE layers 0, 2, 4, 6 of 8; E 4, top 2; every layer
// covered): the attention and expert GEMMs at the FP8 rate, the router's in bf16; the experts
// quantise the rows routed to the rank's experts (N K on average) and their E/EP stacked
// weights; the split backward quantises a second dy for the attention GEMMs only (it never
// defers the experts'); the scratch holds the largest copies, the experts' sized for the most
// rows they may receive (N K EP), the trainer's count. The delayed recipe runs the same GEMMs.
TEST(PlanFp8, MixtureOfExpertsGemmsAtTheFp8RateButTheRouter) {
  const ModelConfig m = small_moe();
  PlanProblem fp8 = fp8_problem(m);
  fp8.hw.devices_per_node = 1;
  fp8.fp8_skip_first = fp8.fp8_skip_last = 0;
  const PlanProblem bf16 = with_precision(fp8, "bf16");
  const double N = 4 * 16, C = 64, F = 256, QKV = 192, H = 64, E = 4, R = 2 * N, micro = 8;
  // Per layer and micro-batch: FLOPs of the FP8 GEMMs, and elements quantised forward,
  // backward and (split backward) as the second dy.
  const double dense_flops = 6 * N * C * (QKV + H + 2 * F);
  const double moe_flops = 6 * N * C * (QKV + H) + 6 * R * 2 * C * F;  // not the router's
  auto gemm = [](double rows, double in, double out, double weights) {
    return std::array<double, 3>{rows * in + weights * out * in,
                                 rows * out + rows * in + weights * out * in, rows * out};
  };
  const std::array<double, 3> qkv = gemm(N, C, QKV, 1), proj = gemm(N, H, C, 1),
                              up = gemm(N, C, F, 1), down = gemm(N, F, C, 1),
                              eup = gemm(R, C, F, E), edown = gemm(R, F, C, E);
  // A GPU's output gradients in a second layout where one backward takes both halves.
  const double dy_both =
      qkv[2] + proj[2] + up[2] + down[2] + qkv[2] + proj[2] + eup[2] + edown[2];
  int compared = 0;
  for (const ScheduleKind schedule : {ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1}) {
    const Layout l = layout(1, 1, 1, 4, schedule);
    const bool split = schedule == ScheduleKind::ZeroBubbleH1;
    const Prediction r = predict(fp8, l), b = predict(bf16, l);
    const double flops = micro * 4 * (dense_flops + moe_flops);
    EXPECT_NEAR(r.fp8_gemm_seconds, flops / 400e12, 1e-12 * r.fp8_gemm_seconds);
    const double dense_elements = qkv[0] + qkv[1] + proj[0] + proj[1] + up[0] + up[1] +
                                  down[0] + down[1] +
                                  (split ? qkv[2] + proj[2] + up[2] + down[2] : 0.0);
    const double moe_elements = qkv[0] + qkv[1] + proj[0] + proj[1] + eup[0] + eup[1] +
                                edown[0] + edown[1] + (split ? qkv[2] + proj[2] : 0.0);
    const double dy_second = split ? 0.0 : dy_both;
    const double bytes = micro * 4 * (5.0 * (dense_elements + moe_elements) + dy_second);
    EXPECT_DOUBLE_EQ(r.fp8_quantise_bytes, bytes) << to_string(l);
    EXPECT_NEAR(r.time.compute,
                b.time.compute - flops * (1 / 100e12 - 1 / 400e12) + r.fp8_quantise_seconds,
                1e-9 * b.time.compute)
        << to_string(l);
    EXPECT_DOUBLE_EQ(r.fp8_scratch_bytes, R * F + 2 * R * F + E * F * C)
        << "N K rows, E experts; the output gradient's codes in two layouts";
    ++compared;
  }
  EXPECT_EQ(compared, 2);
  Layout ep = layout(1, 1, 2, 4);
  ep.ep = 2;
  PlanProblem two = fp8;
  two.hw.devices_per_node = 2;
  EXPECT_DOUBLE_EQ(predict(two, ep).fp8_scratch_bytes,
                   2 * R * F + 2 * 2 * R * F + E / 2 * F * C)
      << "N K EP rows, E/EP experts";
  ActivationShape s;
  s.micro_batch = 4;
  s.fp8 = true;
  s.expert_parallel = 2;
  EXPECT_EQ(fp8_scratch_elements(m, s), 2 * 2 * R * F + E / 2 * F * C);
  // The delayed recipe: the same GEMMs, a GPU's quantisation passes at 3 bytes an element.
  PlanProblem delayed = fp8;
  delayed.fp8_delayed = true;
  const Prediction d = predict(delayed, layout(1, 1, 1, 4)), c = predict(fp8, layout(1, 1, 1, 4));
  EXPECT_DOUBLE_EQ(d.fp8_gemm_seconds, c.fp8_gemm_seconds);
  const double second = micro * 4 * dy_both;  // written in both recipes
  EXPECT_DOUBLE_EQ(d.fp8_quantise_bytes - second, (c.fp8_quantise_bytes - second) * 3 / 5);
}

// The counting device's peak over init and one micro-batch's forward and backward of `model`
// (a fresh CPU transformer on its own host device).
template <class Model>
double peak_bytes_of_one_micro_batch(Model& model, const ModelConfig& m, int64_t mb) {
  model.init_weights(1);
  const int64_t N = mb * m.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(tokens.size());
  for (int64_t i = 0; i < N; ++i) tokens[i] = targets[i] = static_cast<int32_t>(i % 64);
  {
    auto a = model.make_activations(mb);
    model.forward(a, tokens.data(), targets.data(), nullptr, 1.0f);
    model.backward(a, 1.0f, nullptr, nullptr);
  }
  return static_cast<double>(model.kernels().device().peak_allocated_bytes());
}

// The plan's bytes of what the model allocates: its total less the optimizer's moments and the
// pipeline's two message buffers (fp32 rows of the stream).
double planned_model_bytes(const Prediction& r, const ModelConfig& m, int64_t mb) {
  const double message = static_cast<double>(mb * m.seq_len * m.width) * 4.0;
  return r.memory.total() - r.memory.optimizer - 2.0 * message;
}

// small_gpt() with 4 layers as `arch` ("gpt2", or "llama" with 2 kv heads).
ModelConfig four_layers_of(const std::string& arch) {
  ModelConfig m = small_gpt();
  m.arch = arch;
  m.kv_heads = m.is_llama() ? 2 : 0;
  m.layers = 4;
  return m;
}

// The plan's memory for an fp8 layout is what the trainer allocates: the CPU model (the FP8
// reference, its quantised copies fp32) on a counting device, one micro-batch's forward and
// backward, against the plan on a CPU device without reserved memory. The plan's total less
// what the model does not allocate (the optimizer's moments, the pipeline's two message
// buffers) is the device's peak, to the byte, for fp32 and for fp8 with and without skipped
// layers, and with every layer skipped (issue 54 item 4); and for a mixture of experts (E 4, top
// 2, every layer), whose experts' quantised copies are the largest.
TEST(PlanFp8, MemoryIsWhatTheCpuModelAllocates) {
  int compared = 0;
  for (const std::string arch : {"gpt2", "llama", "llama-moe"}) {
    ModelConfig m = four_layers_of(arch == "gpt2" ? "gpt2" : "llama");
    if (arch == "llama-moe") {
      m.moe_experts = 4;
      m.moe_top_k = 2;
    }
    for (const auto& [precision, skip] :
         {std::pair<std::string, int64_t>{"fp32", 0}, {"fp8", 0}, {"fp8", 1}, {"fp8", 2}}) {
      const int64_t mb = 2;
      PlanProblem p = problem(m, 1, mb);
      p.hw.device.kind = "cpu";
      p.hw.device.reserved_gib = 0.0;
      p.hw.devices_per_node = 1;
      p.precision = precision;
      p.fp8_skip_first = p.fp8_skip_last = skip;
      const Prediction r = predict(p, layout(1, 1, 1, mb));

      ModelShard shard = ModelShard::whole(m);
      shard.fp8.enabled = precision == "fp8";
      shard.fp8.skip_first = shard.fp8.skip_last = skip;
      auto self = make_self_communicator("tensor");
      CpuModel<float> model(m, shard, *self);
      const double measured = peak_bytes_of_one_micro_batch(model, m, mb);
      const double planned = planned_model_bytes(r, m, mb);
      EXPECT_EQ(planned, measured) << arch << " " << precision << " skip " << skip;
      // Every layer skipped (2 + 2 of 4): no FP8 GEMM, no quantised copies.
      EXPECT_EQ(r.fp8_scratch_bytes == 0.0, precision == "fp32" || skip == 2);
      std::printf("[ measured ] %s %s skip %lld: the plan %.0f bytes, the model allocates %.0f "
                  "(fp8 scratch %.0f)\n",
                  arch.c_str(), precision.c_str(), static_cast<long long>(skip), planned,
                  measured, r.fp8_scratch_bytes);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 12);
}

// train.precision = "bf16" on a CPU: the CPU's bf16 holds bf16 values in fp32 storage
// (model/cpu_bf16_kernels.hpp), so the plan counts 4 bytes an activation and a compute copy of
// 4 bytes a parameter: its total less the moments and the messages is the bf16 model's peak on
// the counting device, to the byte (a plan counting the GPU's 2 bytes misses by the copy's
// half and the activations' half). On a core whose bf16 peak is above its fp32 one (AMX),
// where train.cpu_bf16_gemm = "auto" runs the oneDNN engine, the plan adds that engine's packed
// bf16 weights (2 bytes a parameter), again to the byte of what that model allocates.
TEST(PlanBf16, CpuMemoryIsWhatTheCpuBf16ModelAllocates) {
  int compared = 0;
  for (const bool amx : {false, true}) {
    if (amx && !cpu::bf16_gemm_available()) {
      std::printf("[ skipped  ] the oneDNN engine's model: no AVX512-BF16 or AMX here\n");
      continue;
    }
    for (const std::string arch : {"gpt2", "llama"}) {
      const ModelConfig m = four_layers_of(arch);
      const int64_t mb = 2;
      PlanProblem p = problem(m, 1, mb);
      p.hw.device.kind = "cpu";
      p.hw.device.reserved_gib = 0.0;
      p.hw.device.peak_tflops_bf16 = p.hw.device.peak_tflops_fp32 * (amx ? 4.0 : 1.0);
      p.hw.devices_per_node = 1;
      p.precision = "bf16";
      const Prediction r = predict(p, layout(1, 1, 1, mb));
      auto self = make_self_communicator("tensor");
      auto host = make_cpu_device();
      Transformer<CpuBf16Kernels> model(
          m, ModelShard::whole(m), *self,
          CpuBf16Kernels(*host, amx ? Bf16Gemm::OneDnn : Bf16Gemm::Fma));
      const double measured = peak_bytes_of_one_micro_batch(model, m, mb);
      const double planned = planned_model_bytes(r, m, mb);
      EXPECT_EQ(planned, measured) << arch << (amx ? " (oneDNN engine)" : "");
      std::printf("[ measured ] %s bf16 on a CPU%s: the plan %.0f bytes, the model allocates "
                  "%.0f\n",
                  arch.c_str(), amx ? " with AMX (oneDNN engine)" : "", planned, measured);
      ++compared;
    }
  }
  EXPECT_GE(compared, 2);
}

// The CPU's bf16 products at their own grid: with gemm_efficiency_shapes_bf16 at half the
// fp32 grid's fractions, a bf16 plan's layer GEMMs and LM head take twice the time they take
// on the fp32 grid alone (the same bf16 peak), while an fp32 plan is untouched by it.
TEST(PlanBf16, TheEnginesGridPricesTheBf16Gemms) {
  auto flat_grid = [](double fraction) {
    std::vector<std::array<double, 4>> g;
    for (double r : {16.0, 4096.0})
      for (double i : {16.0, 4096.0})
        for (double o : {16.0, 65536.0}) g.push_back({r, i, o, fraction});
    return g;
  };
  const ModelConfig m = small_gpt();
  const Layout l = layout(1, 1, 1, 2);
  PlanProblem p = problem(m);
  p.hw.device.kind = "cpu";
  p.hw.devices_per_node = 1;
  p.hw.device.peak_tflops_bf16 = 2.0 * p.hw.device.peak_tflops_fp32;
  p.hw.device.gemm_efficiency_shapes = flat_grid(0.8);
  p.precision = "bf16";
  const Prediction without = predict(p, l);
  p.hw.device.gemm_efficiency_shapes_bf16 = flat_grid(0.4);
  const Prediction with = predict(p, l);
  EXPECT_NEAR(with.compute_gemm_seconds, 2.0 * without.compute_gemm_seconds,
              1e-12 * with.compute_gemm_seconds);
  EXPECT_GT(with.compute_head_seconds, without.compute_head_seconds);
  // No attention curve in the file: the attention on the GEMM grid of its precision.
  EXPECT_NEAR(with.compute_attention_seconds, 2.0 * without.compute_attention_seconds,
              1e-12 * with.compute_attention_seconds);
  // The engine's attention curve at half the fp32 one: its part twice as long.
  p.hw.device.attention_efficiency = {{1.0, 0.6}, {1e5, 0.6}};
  const Prediction fp32_curve = predict(p, l);
  p.hw.device.attention_efficiency_bf16 = {{1.0, 0.3}, {1e5, 0.3}};
  const Prediction bf16_curve = predict(p, l);
  EXPECT_NEAR(bf16_curve.compute_attention_seconds, 2.0 * fp32_curve.compute_attention_seconds,
              1e-12 * bf16_curve.compute_attention_seconds);
  // (the memory part is the compute less the others: equal up to their sums' rounding)
  EXPECT_NEAR(with.compute_memory_seconds, without.compute_memory_seconds,
              1e-12 * with.time.compute);
  p.precision = "fp32";
  const Prediction fp32_with = predict(p, l);
  p.hw.device.gemm_efficiency_shapes_bf16.clear();
  p.hw.device.attention_efficiency_bf16.clear();
  const Prediction fp32_without = predict(p, l);
  EXPECT_DOUBLE_EQ(fp32_with.time.compute, fp32_without.time.compute);
  std::printf("[ measured ] bf16 layer GEMMs %.3g s on the fp32 grid, %.3g s on the bf16 grid\n",
              without.compute_gemm_seconds, with.compute_gemm_seconds);
}

// time.compute split into the layers' linear GEMMs, attention, memory-bound passes and the LM
// head: the parts sum to it on every kind of layout (dense, MoE, FP8, recomputation,
// pipelines with the head on one stage, materialized attention with dropout, CP); the GEMMs
// are the layers' linear FLOPs at the curve's rate (by hand on one rank), and each part moves
// with what it models.
TEST(PlanComputeParts, SumToTheComputeAndEachIsWhatItModels) {
  struct Case {
    std::string name;
    PlanProblem p;
    Layout l;
  };
  std::vector<Case> cases;
  // One node of exactly the layout's devices.
  auto on = [](PlanProblem p, const Layout& l) {
    p.hw.devices_per_node = l.tp * l.cp * l.pp * l.dp;
    return p;
  };
  const ModelConfig gpt = small_gpt();
  cases.push_back({"gpt2 1 rank", problem(gpt), layout(1, 1, 1, 2)});
  Layout full = layout(2, 2, 1, 2);
  full.recompute = Recompute::Full;
  cases.push_back({"gpt2 TP 2 PP 2 full recompute", problem(gpt), full});
  Layout selective = layout(1, 1, 2, 1);
  selective.recompute = Recompute::Selective;
  PlanProblem materialized = problem(gpt);
  materialized.attention = "materialized";
  materialized.attention_dropout = true;
  cases.push_back({"materialized + dropout, selective", materialized, selective});
  cases.push_back({"moe", problem(small_moe()), layout(1, 1, 2, 1)});
  cases.push_back({"fp8", fp8_problem(gpt), layout(1, 2, 1, 1, ScheduleKind::ZeroBubbleH1)});
  PlanProblem cp = problem(long_llama(4096), 1, 4);
  cp.hw.devices_per_node = 2;
  cases.push_back({"llama CP 2", cp, context_layout(1, 2, 1, 1)});
  int compared = 0;
  for (const Case& c : cases) {
    const Prediction r = predict(on(c.p, c.l), c.l);
    const double sum = r.compute_gemm_seconds + r.compute_attention_seconds +
                       r.compute_memory_seconds + r.compute_head_seconds;
    EXPECT_NEAR(sum, r.time.compute, 1e-12 * r.time.compute) << c.name;
    EXPECT_GT(r.compute_gemm_seconds, 0.0) << c.name;
    EXPECT_GT(r.compute_attention_seconds, 0.0) << c.name;
    EXPECT_GT(r.compute_memory_seconds, 0.0) << c.name;
    EXPECT_GT(r.compute_head_seconds, 0.0) << c.name;
    ++compared;
  }
  EXPECT_EQ(compared, 6);
  // One rank, no recomputation: the layers' linear training FLOPs at the curve's rate.
  const Layout l = layout(1, 1, 1, 2);
  PlanProblem one = on(problem(gpt), l);
  one.hw.device.memory_bandwidth_gbs = 1.0;  // memory-bound passes of a size to compare
  const Prediction r = predict(one, l);
  const TrainingFlopsParts parts = training_flops_parts(gpt, 64);  // layer_linear: no vocab
  const double N = 2.0 * 16, C = 64, F = 256;
  const double shapes[4][3] = {{N, C, 3 * C}, {N, C, C}, {N, C, F}, {N, F, C}};
  double flops = 0, time = 0;
  for (const auto& s : shapes) {
    flops += s[0] * s[1] * s[2];
    time += s[0] * s[1] * s[2] / one.hw.gemm_efficiency(s[0], s[1], s[2]);
  }
  const double peak = one.hw.peak_flops("fp32");
  const double micro = 32.0 / 2.0;
  const double gemm = micro * 8 * parts.layer_linear * N / (peak * flops / time);
  EXPECT_NEAR(r.compute_gemm_seconds, gemm, 1e-9 * gemm);
  // Full recomputation reruns the forward: a third more GEMM and attention time.
  Layout again = l;
  again.recompute = Recompute::Full;
  const Prediction f = predict(one, again);
  EXPECT_NEAR(f.compute_gemm_seconds, r.compute_gemm_seconds * 4.0 / 3.0, 1e-9 * gemm);
  EXPECT_NEAR(f.compute_attention_seconds, r.compute_attention_seconds * 4.0 / 3.0,
              1e-9 * r.compute_attention_seconds);
  EXPECT_EQ(f.compute_head_seconds, r.compute_head_seconds) << "the head is not recomputed";
  // The memory-bound part goes with the bandwidth.
  PlanProblem slow = one;
  slow.hw.device.memory_bandwidth_gbs /= 2.0;
  const Prediction s = predict(slow, l);
  EXPECT_NEAR(s.compute_memory_seconds, 2.0 * r.compute_memory_seconds,
              1e-9 * r.compute_memory_seconds);
  EXPECT_EQ(s.compute_gemm_seconds, r.compute_gemm_seconds);
}

// storage.write_gbs and device.host_link_gbs: optional, read and written back, each error one
// line naming the key; a CPU's staging copy runs at its memory bandwidth, so host_link_gbs
// is refused there.
TEST(PlanHardware, StorageAndHostLinkAreOptionalKeys) {
  const std::string base = ideal_hardware_text();
  EXPECT_EQ(parse_hardware(base, "hw.toml").storage_write_gbs, 0.0);
  EXPECT_EQ(parse_hardware(base, "hw.toml").device.host_link_gbs, 0.0);
  const std::string with = replace(base, "memory_bandwidth_gbs = 1e12\n",
                                   "memory_bandwidth_gbs = 1e12\nhost_link_gbs = 25.0\n") +
                           "[storage]\nwrite_gbs = 7.5\n";
  const HardwareSpec hw = parse_hardware(with, "hw.toml");
  EXPECT_EQ(hw.storage_write_gbs, 7.5);
  EXPECT_EQ(hw.device.host_link_gbs, 25.0);
  const HardwareSpec again = parse_hardware(hardware_to_toml(hw, {}), "again.toml");
  EXPECT_EQ(again.storage_write_gbs, 7.5);
  EXPECT_EQ(again.device.host_link_gbs, 25.0);
  expect_error(base + "[storage]\nwrite_gbs = 0\n", "storage.write_gbs = 0 must be greater");
  expect_error(base + "[storage]\nwrite_gbs = \"fast\"\n", "storage.write_gbs must be a number");
  expect_error(base + "[storage]\nread_gbs = 3.0\n", "storage.read_gbs is not a hardware key");
  expect_error(base + "[storage]\ndataset_ms = 1.0\n",
               "storage.dataset_ms needs storage.write_gbs");
  expect_error(base + "[storage]\nwrite_gbs = 1.0\ndataset_ms = -1\n",
               "storage.dataset_ms = -1 must be >= 0");
  expect_error(replace(with, "kind = \"gpu\"", "kind = \"cpu\""),
               "device.host_link_gbs is for a GPU");
}

namespace {
// small_gpt() on the ideal GPU with storage at `write_gbs` and a 20 GB/s host link, a save
// every `interval` steps.
PlanProblem checkpointed(int64_t interval, bool async, double write_gbs) {
  PlanProblem p = problem(small_gpt());
  p.hw.storage_write_gbs = write_gbs;
  p.hw.device.host_link_gbs = 20.0;
  p.checkpoint_interval = interval;
  p.checkpoint_async = async;
  return p;
}
}  // namespace

// A synchronous save: the rank's weights and moments staged over the host link, then the
// job's 12 bytes a parameter written at storage.write_gbs; training waits for both, once every
// interval steps. The step is the one without checkpoints plus that over the interval.
TEST(PlanCheckpoint, SynchronousSaveWaitsForTheStagingAndTheWrite) {
  const Layout l = layout(2, 2, 2, 2);
  const Prediction none = predict(checkpointed(0, false, 2.0), l);
  EXPECT_EQ(none.time.checkpoint, 0.0);
  EXPECT_EQ(none.checkpoint_bytes, 0.0);
  const Prediction r = predict(checkpointed(10, false, 2.0), l);
  const double bytes = 12.0 * static_cast<double>(parameter_count(small_gpt()));
  EXPECT_DOUBLE_EQ(r.checkpoint_bytes, bytes);
  EXPECT_DOUBLE_EQ(r.checkpoint_write_seconds, bytes / 2e9);
  // The fullest rank's fp32 weights and moments (no ZeRO: its whole stage), 12 bytes each.
  EXPECT_DOUBLE_EQ(r.checkpoint_staging_bytes, r.memory.weights * 3.0);
  EXPECT_DOUBLE_EQ(r.checkpoint_staging_seconds, r.checkpoint_staging_bytes / 20e9);
  EXPECT_DOUBLE_EQ(r.checkpoint_stall_seconds,
                   r.checkpoint_staging_seconds + r.checkpoint_write_seconds);
  EXPECT_DOUBLE_EQ(r.time.checkpoint, r.checkpoint_stall_seconds / 10.0);
  EXPECT_NEAR(r.step_seconds, none.step_seconds + r.time.checkpoint, 1e-12);
  // Each dataset's own cost (storage.dataset_ms): three a tensor.
  PlanProblem per_dataset = checkpointed(10, false, 2.0);
  per_dataset.hw.storage_dataset_ms = 2.0;
  const double tensors = static_cast<double>(
      parameter_layout(small_gpt(), ModelShard::whole(small_gpt())).params.size());
  EXPECT_NEAR(predict(per_dataset, l).checkpoint_write_seconds,
              r.checkpoint_write_seconds + 3.0 * tensors * 2e-3, 1e-12);
  EXPECT_EQ(r.memory.total(), none.memory.total()) << "a GPU stages into host memory";
  // No storage figure: not modelled (the plan says so), nothing added.
  const Prediction unknown = predict(checkpointed(10, false, 0.0), l);
  EXPECT_EQ(unknown.time.checkpoint, 0.0);
  EXPECT_EQ(unknown.step_seconds, none.step_seconds);
}

// An asynchronous save: training waits for the staging copy only while the write fits in the
// interval's steps; a write that outlasts them makes the next save wait for the rest
// (checkpoint_backlog), and the checkpoint warning says so.
TEST(PlanCheckpoint, AsynchronousSaveHidesTheWriteUntilItOutlastsTheInterval) {
  const Layout l = layout(1, 1, 8, 4);
  const Prediction none = predict(checkpointed(0, true, 1.0), l);
  const Prediction fast = predict(checkpointed(100, true, 1e3), l);
  EXPECT_FALSE(fast.checkpoint_backlog);
  EXPECT_DOUBLE_EQ(fast.checkpoint_stall_seconds, fast.checkpoint_staging_seconds);
  EXPECT_NEAR(fast.step_seconds, none.step_seconds + fast.checkpoint_staging_seconds / 100.0,
              1e-12);
  // Storage so slow that one write takes longer than 10 steps.
  const double bytes = 12.0 * static_cast<double>(parameter_count(small_gpt()));
  const double slow_gbs = bytes / (100.0 * none.step_seconds) / 1e9;
  const Prediction slow = predict(checkpointed(10, true, slow_gbs), l);
  EXPECT_TRUE(slow.checkpoint_backlog);
  EXPECT_NEAR(slow.checkpoint_stall_seconds,
              slow.checkpoint_staging_seconds + slow.checkpoint_write_seconds -
                  10.0 * none.step_seconds,
              1e-9 * slow.checkpoint_write_seconds);
  int warned = 0;
  for (const PlanWarning& w : layout_warnings(checkpointed(10, true, slow_gbs), slow))
    if (w.kind == "checkpoint") {
      ++warned;
      EXPECT_EQ(w.code, 'c');
      EXPECT_NE(w.text.find("outlasts the interval"), std::string::npos) << w.text;
    }
  EXPECT_EQ(warned, 1);
  for (const PlanWarning& w : layout_warnings(checkpointed(100, true, 1e3), fast))
    EXPECT_NE(w.kind, "checkpoint") << w.text;
  // Synchronous at the slow rate: over 5 % of the step, with the advice to go asynchronous.
  const Prediction sync = predict(checkpointed(10, false, slow_gbs), l);
  bool advised = false;
  for (const PlanWarning& w : layout_warnings(checkpointed(10, false, slow_gbs), sync))
    advised |= w.kind == "checkpoint" &&
               w.text.find("checkpoint.async = true") != std::string::npos;
  EXPECT_TRUE(advised);
}

// On a CPU the asynchronous staging copy is the rank's own memory: the plan counts it in the
// fullest device's total (memory.staging), to the byte of what the trainer stages
// (checkpoint_buffers: the rank's flat weight buffer, ZeRO-3's slice of it, and AdamW's moments
// of the elements the rank owns, ZeRO-1 on sharded), on layouts with TP, PP, DP and every ZeRO
// stage; the flat buffer's size is the model's own (a CPU model's weight store, whole model).
// Its copy takes the bytes read and written at the memory bandwidth. Synchronous saves stage
// nothing. The start-up estimate (estimate_rank_memory, which divides the whole model's
// parameters by TP and gives each end stage all of the embedding and head) is within 5 % of it
// here (3.8 % at TP 2 and PP 2: a width-64 layer's norms and biases, which TP does not split).
TEST(PlanCheckpoint, CpuStagingIsWhatTheTrainerStages) {
  int compared = 0;
  for (const auto& [tp, pp, dp, zero] : std::vector<std::array<int, 4>>{
           {1, 1, 1, 0}, {2, 1, 1, 0}, {1, 2, 1, 0}, {1, 1, 4, 1}, {1, 1, 4, 2}, {1, 1, 4, 3},
           {2, 2, 2, 1}}) {
    const std::vector<std::string> sets = {
        "checkpoint.dir=\"ck\"", "checkpoint.interval=5", "checkpoint.async=true",
        "optim.zero_stage=" + std::to_string(zero), "parallel.tensor=" + std::to_string(tp),
        "parallel.pipeline=" + std::to_string(pp), "parallel.data=" + std::to_string(dp)};
    const Config c = parse_config(
        "[model]\nlayers = 4\nheads = 4\nwidth = 64\nvocab_size = 256\nseq_len = 64\n"
        "[train]\nmicro_batch = 2\nglobal_batch = 16\n[data]\ntrain = \"x.bin\"\n",
        "tiny.toml", sets);
    PlanProblem p = problem(c.model, 1, c.train.global_batch);
    p.hw.device.kind = "cpu";
    p.hw.devices_per_node = tp * pp * dp;
    p.hw.device.memory_bandwidth_gbs = 10.0;
    p.hw.storage_write_gbs = 1.0;
    p.checkpoint_interval = c.checkpoint.interval;
    p.checkpoint_async = c.checkpoint.saves_async();
    Layout l = layout(tp, pp, dp, 2);
    l.zero_stage = zero;
    const Prediction r = predict(p, l);
    double staged = 0.0, estimated = 0.0;  // the fullest stage's
    for (int stage = 0; stage < pp; ++stage) {
      ShardCoord coord;  // tensor rank 0 of the stage, as the trainer plans it
      coord.tp_size = tp;
      coord.pp_rank = stage;
      coord.pp_size = pp;
      const ModelShard shard = plan_model_shard(c, coord);
      const double flat = static_cast<double>(parameter_layout(c.model, shard).flat_size);
      const double owned = zero >= 1 ? std::ceil(flat / dp) : flat;
      staged = std::max(staged, (zero == 3 ? owned : flat) * 4.0 + owned * 8.0);
      estimated = std::max(estimated, estimate_rank_memory(c, shard, dp, stage).staging_bytes);
    }
    EXPECT_EQ(r.checkpoint_staging_bytes, staged) << to_string(l);
    EXPECT_NEAR(estimated, staged, 0.05 * staged) << to_string(l);
    EXPECT_EQ(r.memory.staging, r.checkpoint_staging_bytes) << to_string(l);
    EXPECT_DOUBLE_EQ(r.checkpoint_staging_seconds, 2.0 * staged / 10e9);
    // The writer thread's work shares the step's cores: the write is not hidden on a CPU.
    EXPECT_DOUBLE_EQ(r.checkpoint_stall_seconds,
                     r.checkpoint_staging_seconds + r.checkpoint_write_seconds);
    p.checkpoint_async = false;
    const Prediction sync = predict(p, l);
    EXPECT_EQ(sync.memory.staging, 0.0);
    EXPECT_EQ(sync.checkpoint_staging_seconds, 0.0);
    EXPECT_DOUBLE_EQ(r.memory.total() - sync.memory.total(), r.memory.staging) << to_string(l);
    std::printf("[ measured ] %s: the plan stages %.0f bytes, the trainer's buffers %.0f (its "
                "start-up estimate %.0f)\n",
                to_string(l).c_str(), r.checkpoint_staging_bytes, staged, estimated);
    ++compared;
  }
  EXPECT_EQ(compared, 7);
  // The flat buffer counted is the model's own weight store.
  const ModelConfig m = four_layers_of("gpt2");
  auto self = make_self_communicator("tensor");
  CpuModel<float> model(m, ModelShard::whole(m), *self);
  EXPECT_EQ(model.weight_store().size(), parameter_layout(m, ModelShard::whole(m)).flat_size);
}

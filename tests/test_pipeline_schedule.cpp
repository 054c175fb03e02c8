// Pure tests of the pipeline schedule generator and the stage partition (no MPI): the op lists
// of every stage for many (stages, micro-batches), their in-flight memory bound, a joint
// simulation of all stages (non-blocking sends, blocking receives) that must complete with
// every message matched in order, the unit-time makespan and bubble, and the layer split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "pipeline/schedule.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::OneFOneB, ScheduleKind::GPipe};

std::string where(ScheduleKind kind, int stage, int stages, int64_t m) {
  return to_string(kind) + " stage " + std::to_string(stage) + "/" + std::to_string(stages) +
         " M=" + std::to_string(m);
}

std::vector<int64_t> micros_of(const std::vector<PipeOp>& ops, PipeOpKind kind) {
  std::vector<int64_t> v;
  for (const PipeOp& op : ops)
    if (op.kind == kind) v.push_back(op.micro);
  return v;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The error message of `f`, or "" when it does not throw trident::Error.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A time-aligned text picture of a simulated run: 3 characters per time unit, "F3 " for a
// forward of micro-batch 3 (1 unit), "B3    " for its backward (2 units), ".  " for idle.
std::string render(const PipeSimResult& r) {
  std::string out;
  for (size_t s = 0; s < r.timeline.size(); ++s) {
    std::string row = "stage " + std::to_string(s) + " | ";
    double t = 0.0;
    for (const PipeSimInterval& iv : r.timeline[s]) {
      for (; t + 0.5 < iv.start; t += 1.0) row += ".  ";
      std::string cell = to_string(iv.op);
      const size_t width = static_cast<size_t>(std::lround((iv.end - iv.start) * 3.0));
      cell.resize(std::max(width, cell.size() + 1), ' ');
      row += cell;
      t = iv.end;
    }
    for (; t + 0.5 < r.makespan; t += 1.0) row += ".  ";
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + "\n";
  }
  return out;
}

// ---- names ----------------------------------------------------------------------------------

TEST(pipeline_schedule, ParsesKindsAndNamesOps) {
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::OneFOneB);
  EXPECT_EQ(parse_schedule_kind("gpipe"), ScheduleKind::GPipe);
  EXPECT_EQ(to_string(ScheduleKind::OneFOneB), "1f1b");
  EXPECT_EQ(to_string(ScheduleKind::GPipe), "gpipe");
  for (const char* bad : {"", "1F1B", "GPipe", "interleaved"}) {
    const std::string msg = error_of([&] { parse_schedule_kind(bad); });
    EXPECT_NE(msg.find("parallel.schedule"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("\"1f1b\" or \"gpipe\""), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::Forward, 3}), "F3");
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::RecvBackward, 2}), "RB2");
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::RecvForward, 0}), "RF0");
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::SendForward, 11}), "SF11");
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::Backward, 1}), "B1");
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::SendBackward, 7}), "SB7");
  EXPECT_EQ(to_string(std::vector<PipeOp>{{PipeOpKind::Forward, 0}, {PipeOpKind::Backward, 0}}),
            "F0 B0");
}

TEST(pipeline_schedule, RejectsBadArguments) {
  std::string msg = error_of([] { pipeline_schedule(ScheduleKind::OneFOneB, 0, 2, 0); });
  EXPECT_NE(msg.find("micro-batch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.global_batch"), std::string::npos) << msg;
  msg = error_of([] { pipeline_schedule(ScheduleKind::GPipe, 0, 0, 4); });
  EXPECT_NE(msg.find("parallel.pipeline = 0"), std::string::npos) << msg;
  msg = error_of([] { pipeline_schedule(ScheduleKind::GPipe, 2, 2, 4); });
  EXPECT_NE(msg.find("stage 2"), std::string::npos) << msg;
  msg = error_of([] { pipeline_schedule(ScheduleKind::OneFOneB, -1, 2, 4); });
  EXPECT_NE(msg.find("stage -1"), std::string::npos) << msg;
}

// ---- exact lists ----------------------------------------------------------------------------

TEST(pipeline_schedule, ExactListsForSmallCases) {
  using K = ScheduleKind;
  // Two stages, three micro-batches.
  EXPECT_EQ(to_string(pipeline_schedule(K::OneFOneB, 0, 2, 3)),
            "F0 SF0 F1 SF1 RB0 B0 F2 SF2 RB1 B1 RB2 B2");
  EXPECT_EQ(to_string(pipeline_schedule(K::OneFOneB, 1, 2, 3)),
            "RF0 F0 B0 SB0 RF1 F1 B1 SB1 RF2 F2 B2 SB2");
  EXPECT_EQ(to_string(pipeline_schedule(K::GPipe, 0, 2, 3)),
            "F0 SF0 F1 SF1 F2 SF2 RB0 B0 RB1 B1 RB2 B2");
  EXPECT_EQ(to_string(pipeline_schedule(K::GPipe, 1, 2, 3)),
            "RF0 F0 RF1 F1 RF2 F2 B0 SB0 B1 SB1 B2 SB2");
  // A middle stage has all six kinds.
  EXPECT_EQ(to_string(pipeline_schedule(K::OneFOneB, 1, 3, 2)),
            "RF0 F0 SF0 RF1 F1 SF1 RB0 B0 SB0 RB1 B1 SB1");
  // One stage: no communication at all.
  EXPECT_EQ(to_string(pipeline_schedule(K::OneFOneB, 0, 1, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(to_string(pipeline_schedule(K::GPipe, 0, 1, 3)), "F0 F1 F2 B0 B1 B2");

  // 4 stages x 8 micro-batches, compute order only.
  auto compute = [](int stage) {
    std::vector<PipeOp> c;
    for (const PipeOp& op : pipeline_schedule(K::OneFOneB, stage, 4, 8))
      if (op.kind == PipeOpKind::Forward || op.kind == PipeOpKind::Backward) c.push_back(op);
    return to_string(c);
  };
  EXPECT_EQ(compute(0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(compute(1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(compute(2), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(compute(3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than warmup: all forwards, then all backwards.
  EXPECT_EQ(to_string(pipeline_schedule(K::OneFOneB, 0, 4, 2)), "F0 SF0 F1 SF1 RB0 B0 RB1 B1");
}

// ---- 1. structure over many shapes ----------------------------------------------------------

TEST(pipeline_schedule, EveryStageForwardsAndBackwardsEachMicroBatchOnceInOrder) {
  for (ScheduleKind kind : kKinds)
    for (int stages = 1; stages <= 8; ++stages)
      for (int64_t m = 1; m <= 16; ++m) {
        std::vector<std::vector<PipeOp>> all;
        for (int stage = 0; stage < stages; ++stage) {
          SCOPED_TRACE(where(kind, stage, stages, m));
          const std::vector<PipeOp> ops = pipeline_schedule(kind, stage, stages, m);
          all.push_back(ops);
          const bool first = stage == 0, last = stage == stages - 1;
          // Forwards and backwards: each micro-batch once, in order 0..M-1.
          EXPECT_EQ(micros_of(ops, PipeOpKind::Forward), iota(m));
          EXPECT_EQ(micros_of(ops, PipeOpKind::Backward), iota(m));
          // Communication exactly where the stage's position says, in micro-batch order.
          EXPECT_EQ(micros_of(ops, PipeOpKind::RecvForward), first ? std::vector<int64_t>{} : iota(m));
          EXPECT_EQ(micros_of(ops, PipeOpKind::SendForward), last ? std::vector<int64_t>{} : iota(m));
          EXPECT_EQ(micros_of(ops, PipeOpKind::RecvBackward), last ? std::vector<int64_t>{} : iota(m));
          EXPECT_EQ(micros_of(ops, PipeOpKind::SendBackward), first ? std::vector<int64_t>{} : iota(m));
          EXPECT_EQ(static_cast<int64_t>(ops.size()), m * (2 + (first ? 0 : 2) + (last ? 0 : 2)));
          // Forward m precedes Backward m; a receive immediately precedes its compute and a
          // send immediately follows it.
          std::vector<size_t> fwd_at(static_cast<size_t>(m)), bwd_at(static_cast<size_t>(m));
          for (size_t i = 0; i < ops.size(); ++i) {
            const PipeOp& op = ops[i];
            const auto micro = static_cast<size_t>(op.micro);
            auto neighbour_is = [&](long offset, PipeOpKind k) {
              const long j = static_cast<long>(i) + offset;
              return j >= 0 && j < static_cast<long>(ops.size()) &&
                     ops[static_cast<size_t>(j)] == PipeOp{k, op.micro};
            };
            switch (op.kind) {
              case PipeOpKind::Forward: fwd_at[micro] = i; break;
              case PipeOpKind::Backward: bwd_at[micro] = i; break;
              case PipeOpKind::RecvForward:
                EXPECT_TRUE(neighbour_is(+1, PipeOpKind::Forward)) << to_string(op); break;
              case PipeOpKind::SendForward:
                EXPECT_TRUE(neighbour_is(-1, PipeOpKind::Forward)) << to_string(op); break;
              case PipeOpKind::RecvBackward:
                EXPECT_TRUE(neighbour_is(+1, PipeOpKind::Backward)) << to_string(op); break;
              case PipeOpKind::SendBackward:
                EXPECT_TRUE(neighbour_is(-1, PipeOpKind::Backward)) << to_string(op); break;
            }
          }
          for (size_t i = 0; i < fwd_at.size(); ++i) EXPECT_LT(fwd_at[i], bwd_at[i]) << "micro " << i;
        }
        // Neighbours agree on the order of what crosses between them.
        for (int s = 0; s + 1 < stages; ++s) {
          EXPECT_EQ(micros_of(all[s], PipeOpKind::SendForward),
                    micros_of(all[s + 1], PipeOpKind::RecvForward));
          EXPECT_EQ(micros_of(all[s + 1], PipeOpKind::SendBackward),
                    micros_of(all[s], PipeOpKind::RecvBackward));
        }
      }
}

// ---- 2. memory bound ------------------------------------------------------------------------

TEST(pipeline_schedule, PeakInFlightIsTheMemoryBound) {
  for (int stages = 1; stages <= 8; ++stages)
    for (int64_t m = 1; m <= 16; ++m)
      for (int stage = 0; stage < stages; ++stage) {
        SCOPED_TRACE(where(ScheduleKind::OneFOneB, stage, stages, m));
        EXPECT_EQ(peak_in_flight(pipeline_schedule(ScheduleKind::OneFOneB, stage, stages, m)),
                  std::min<int64_t>(stages - stage, m));
        EXPECT_EQ(peak_in_flight(pipeline_schedule(ScheduleKind::GPipe, stage, stages, m)), m);
      }
  EXPECT_EQ(peak_in_flight(pipeline_schedule(ScheduleKind::OneFOneB, 0, 4, 8)), 4);
  EXPECT_EQ(peak_in_flight(pipeline_schedule(ScheduleKind::GPipe, 0, 4, 8)), 8);
  EXPECT_EQ(peak_in_flight(pipeline_schedule(ScheduleKind::OneFOneB, 3, 4, 8)), 1);
}

// ---- 3. joint simulation --------------------------------------------------------------------

TEST(pipeline_schedule, AllStagesTogetherCompleteWithMessagesMatchedInOrder) {
  for (ScheduleKind kind : kKinds)
    for (int stages = 1; stages <= 8; ++stages)
      for (int64_t m = 1; m <= 16; ++m) {
        SCOPED_TRACE(where(kind, -1, stages, m));
        const PipeSimResult r = simulate_pipeline(kind, stages, m);
        ASSERT_TRUE(r.ok) << r.error;
        // Unit time, F = 1, B = 2, no communication cost: both schedules take
        // (M + p - 1) * (F + B); the idle share is the classic (p - 1) / (M + p - 1).
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * static_cast<double>(m + stages - 1));
        EXPECT_NEAR(r.bubble_fraction(),
                    static_cast<double>(stages - 1) / static_cast<double>(m + stages - 1), 1e-12);
        for (int s = 0; s < stages; ++s) {
          EXPECT_DOUBLE_EQ(r.busy[static_cast<size_t>(s)], 3.0 * static_cast<double>(m));
          EXPECT_EQ(r.peak_in_flight[static_cast<size_t>(s)],
                    kind == ScheduleKind::GPipe ? m : std::min<int64_t>(stages - s, m));
        }
      }
}

TEST(pipeline_schedule, MakespanHoldsForOtherComputeCosts) {
  // With no communication cost the makespan is (M + p - 1) * (F + B) for any F, B under both
  // schedules (all stages equally loaded).
  for (ScheduleKind kind : kKinds)
    for (PipeSimCosts c : {PipeSimCosts{1, 1, 0}, PipeSimCosts{1, 3, 0}, PipeSimCosts{2, 1, 0}})
      for (int stages = 1; stages <= 6; ++stages)
        for (int64_t m = 1; m <= 12; ++m) {
          const PipeSimResult r = simulate_pipeline(kind, stages, m, c);
          ASSERT_TRUE(r.ok) << r.error;
          EXPECT_DOUBLE_EQ(r.makespan, static_cast<double>(m + stages - 1) * (c.forward + c.backward))
              << where(kind, -1, stages, m) << " F=" << c.forward << " B=" << c.backward;
        }
}

TEST(pipeline_schedule, PrintsTimelineAndBubbleTable) {
  for (ScheduleKind kind : kKinds) {
    const PipeSimResult r = simulate_pipeline(kind, 4, 8);
    ASSERT_TRUE(r.ok) << r.error;
    std::printf("%s, 4 stages x 8 micro-batches (F = 1, B = 2, comm = 0), makespan %g:\n%s",
                to_string(kind).c_str(), r.makespan, render(r).c_str());
  }
  std::printf("\n%-6s %3s %4s %9s %10s %10s %9s %13s %13s\n", "kind", "p", "M", "makespan",
              "bubble", "(p-1)/(M+p-1)", "peak s0", "bubble c=0.1", "makespan c=0.1");
  for (ScheduleKind kind : kKinds)
    for (int p : {2, 4, 8})
      for (int64_t m : {1, 4, 8, 16, 32, 64}) {
        const PipeSimResult r = simulate_pipeline(kind, p, m);
        const PipeSimResult rc = simulate_pipeline(kind, p, m, {1.0, 2.0, 0.1});
        ASSERT_TRUE(r.ok && rc.ok) << r.error << rc.error;
        const double theory = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
        std::printf("%-6s %3d %4lld %9g %10.4f %13.4f %9lld %13.4f %13g\n", to_string(kind).c_str(),
                    p, static_cast<long long>(m), r.makespan, r.bubble_fraction(), theory,
                    static_cast<long long>(r.peak_in_flight[0]), rc.bubble_fraction(), rc.makespan);
      }
}

TEST(pipeline_schedule, SimulatorCatchesBrokenSchedules) {
  using K = PipeOpKind;
  // Stage 0 waits for a gradient before sending the activation that produces it.
  std::vector<std::vector<PipeOp>> deadlock = {
      {{K::Forward, 0}, {K::RecvBackward, 0}, {K::SendForward, 0}, {K::Backward, 0}},
      {{K::RecvForward, 0}, {K::Forward, 0}, {K::Backward, 0}, {K::SendBackward, 0}}};
  PipeSimResult r = simulate_pipeline(deadlock, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("stage 0: op 1 of 4 (RB0)"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("stage 1: op 0 of 4 (RF0)"), std::string::npos) << r.error;

  // Sends in one order, receives in the other.
  std::vector<std::vector<PipeOp>> reordered = {
      {{K::Forward, 0}, {K::Forward, 1}, {K::SendForward, 1}, {K::SendForward, 0},
       {K::RecvBackward, 0}, {K::Backward, 0}, {K::RecvBackward, 1}, {K::Backward, 1}},
      {{K::RecvForward, 0}, {K::Forward, 0}, {K::Backward, 0}, {K::SendBackward, 0},
       {K::RecvForward, 1}, {K::Forward, 1}, {K::Backward, 1}, {K::SendBackward, 1}}};
  r = simulate_pipeline(reordered, 2);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("stage 1 op 0 (RF0): the next message on the channel is micro-batch 1"),
            std::string::npos)
      << r.error;

  // A send nobody receives.
  std::vector<std::vector<PipeOp>> unmatched = {
      {{K::Forward, 0}, {K::SendForward, 0}},
      {{K::RecvForward, 0}, {K::Forward, 0}, {K::Backward, 0}, {K::SendBackward, 0}}};
  r = simulate_pipeline(unmatched, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("stage 1 sent backward messages nobody received"), std::string::npos)
      << r.error;
  EXPECT_NE(r.error.find("1->0 backward [0]"), std::string::npos) << r.error;

  // Communication the stage's position does not allow, a backward before its forward, a
  // micro-batch never run.
  r = simulate_pipeline({{{K::RecvForward, 0}, {K::Forward, 0}, {K::Backward, 0}}}, 1);
  EXPECT_NE(r.error.find("no previous stage"), std::string::npos) << r.error;
  r = simulate_pipeline({{{K::Forward, 0}, {K::SendForward, 0}, {K::Backward, 0}}}, 1);
  EXPECT_NE(r.error.find("no next stage"), std::string::npos) << r.error;
  r = simulate_pipeline({{{K::Backward, 0}, {K::Forward, 0}}}, 1);
  EXPECT_NE(r.error.find("backward before its forward"), std::string::npos) << r.error;
  r = simulate_pipeline({{{K::Forward, 0}, {K::Backward, 0}}}, 2);
  EXPECT_NE(r.error.find("finished without Forward 1"), std::string::npos) << r.error;
}

// ---- 4. stage partition ---------------------------------------------------------------------

TEST(pipeline_schedule, EvenSplitPutsExtrasJustBeforeTheLastStage) {
  EXPECT_EQ(stage_layer_counts(12, 4, {}), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(stage_layer_counts(10, 4, {}), (std::vector<int64_t>{2, 3, 3, 2}));
  EXPECT_EQ(stage_layer_counts(7, 4, {}), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(stage_layer_counts(13, 4, {}), (std::vector<int64_t>{3, 3, 4, 3}));
  EXPECT_EQ(stage_layer_counts(3, 2, {}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(stage_layer_counts(5, 1, {}), (std::vector<int64_t>{5}));
  EXPECT_EQ(stage_layer_counts(4, 4, {}), (std::vector<int64_t>{1, 1, 1, 1}));
  for (int64_t layers = 1; layers <= 40; ++layers)
    for (int stages = 1; stages <= std::min<int64_t>(layers, 12); ++stages) {
      const std::vector<int64_t> c = stage_layer_counts(layers, stages, {});
      ASSERT_EQ(c.size(), static_cast<size_t>(stages));
      EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t{0}), layers);
      const auto [lo, hi] = std::minmax_element(c.begin(), c.end());
      EXPECT_GE(*lo, 1);
      EXPECT_LE(*hi - *lo, 1);
      EXPECT_EQ(c.back(), layers / stages) << "the last stage never gets an extra layer";
      // Ranges tile [0, layers) in order.
      int64_t at = 0;
      for (int s = 0; s < stages; ++s) {
        const auto [b, e] = stage_layer_range(c, s);
        EXPECT_EQ(b, at);
        EXPECT_EQ(e - b, c[static_cast<size_t>(s)]);
        at = e;
      }
      EXPECT_EQ(at, layers);
    }
}

TEST(pipeline_schedule, ExplicitCountsAreCheckedAndUsed) {
  EXPECT_EQ(stage_layer_counts(8, 3, {2, 4, 2}), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_EQ(stage_layer_counts(3, 1, {3}), (std::vector<int64_t>{3}));
  EXPECT_EQ(stage_layer_range({2, 4, 2}, 0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(stage_layer_range({2, 4, 2}, 1), (std::pair<int64_t, int64_t>{2, 6}));
  EXPECT_EQ(stage_layer_range({2, 4, 2}, 2), (std::pair<int64_t, int64_t>{6, 8}));

  auto check = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  check(error_of([] { stage_layer_counts(4, 3, {1, 1}); }),
        "parallel.pipeline_layers ([1, 1]) must have parallel.pipeline (3) entries, has 2");
  check(error_of([] { stage_layer_counts(2, 2, {1, 2}); }),
        "parallel.pipeline_layers ([1, 2]) must sum to model.layers (2), sums to 3");
  check(error_of([] { stage_layer_counts(4, 2, {4, 0}); }),
        "parallel.pipeline_layers ([4, 0]) gives stage 1 0 layers: every pipeline stage needs at "
        "least one layer");
  check(error_of([] { stage_layer_counts(4, 2, {5, -1}); }), "gives stage 1 -1 layers");
  check(error_of([] { stage_layer_counts(2, 4, {}); }),
        "parallel.pipeline = 4 is more than model.layers = 2: every pipeline stage needs at "
        "least one layer");
  check(error_of([] { stage_layer_counts(2, 4, {1, 1, 0, 0}); }), "is more than model.layers = 2");
  check(error_of([] { stage_layer_counts(4, 0, {}); }), "parallel.pipeline = 0 must be >= 1");
  check(error_of([] { stage_layer_counts(0, 1, {}); }), "model.layers = 0 must be >= 1");
  check(error_of([] { stage_layer_range({2, 2}, 2); }), "pipeline stage 2 is out of range");
  check(error_of([] { stage_layer_range({2, 2}, -1); }), "pipeline stage -1 is out of range");
}

}  // namespace
}  // namespace trident

// Pure tests of the pipeline schedule generator and the stage partition (no MPI): the op lists
// of every stage for many (stages, micro-batches), their in-flight memory bound, a joint
// simulation of all stages (non-blocking sends, blocking receives) that must complete with
// every message matched in order, the unit-time makespan and bubble, and the layer split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "pipeline/schedule.hpp"
#include "pipeline/simulator.hpp"
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

// Every stage's op list of one schedule.
std::vector<std::vector<PipeOp>> stage_lists(ScheduleKind kind, int stages, int64_t m, int v) {
  std::vector<std::vector<PipeOp>> ops;
  for (int s = 0; s < stages; ++s) ops.push_back(pipeline_schedule(kind, s, stages, m, v));
  return ops;
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
  EXPECT_EQ(parse_schedule_kind("interleaved"), ScheduleKind::Interleaved);
  EXPECT_EQ(parse_schedule_kind("zb-h1"), ScheduleKind::ZeroBubbleH1);
  EXPECT_EQ(to_string(ScheduleKind::Interleaved), "interleaved");
  EXPECT_EQ(to_string(ScheduleKind::ZeroBubbleH1), "zb-h1");
  EXPECT_EQ(parse_schedule_kind("zb-h2"), ScheduleKind::ZeroBubbleH2);
  EXPECT_EQ(to_string(ScheduleKind::ZeroBubbleH2), "zb-h2");
  EXPECT_TRUE(splits_backward(ScheduleKind::ZeroBubbleH1));
  EXPECT_TRUE(splits_backward(ScheduleKind::ZeroBubbleH2));
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::GPipe, ScheduleKind::Interleaved})
    EXPECT_FALSE(splits_backward(k)) << to_string(k);
  for (const char* bad : {"", "1F1B", "GPipe", "zb-h3", "zbh1", "zb-v"}) {
    const std::string msg = error_of([&] { parse_schedule_kind(bad); });
    EXPECT_NE(msg.find("parallel.schedule"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("\"1f1b\", \"gpipe\", \"interleaved\", \"zb-h1\" or \"zb-h2\""),
              std::string::npos)
        << msg;
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
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::BackwardInput, 4}), "BI4");
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::BackwardWeight, 4, 0}), "W4");
  EXPECT_EQ(to_string(PipeOp{PipeOpKind::Forward, 5, 2}), "F5:2");
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

TEST(pipeline_schedule, PerStageCostsSimulateEachStageAtItsOwnCosts) {
  // The same costs on every stage: the one-cost simulation exactly.
  const PipeSimCosts unit{1, 2, 0.25, 1};
  for (ScheduleKind kind :
       {ScheduleKind::OneFOneB, ScheduleKind::GPipe, ScheduleKind::ZeroBubbleH1,
        ScheduleKind::ZeroBubbleH2}) {
    std::vector<std::vector<PipeOp>> ops;
    for (int s = 0; s < 3; ++s) ops.push_back(pipeline_schedule(kind, s, 3, 5));
    const PipeSimResult same =
        simulate_pipeline_per_stage(ops, 5, std::vector<PipeSimCosts>(3, unit));
    const PipeSimResult one = simulate_pipeline(kind, 3, 5, unit);
    ASSERT_TRUE(same.ok && one.ok) << same.error << one.error;
    EXPECT_EQ(same.makespan, one.makespan) << to_string(kind);
    EXPECT_EQ(same.busy, one.busy) << to_string(kind);
    // A stage twice as slow: its busy time doubles, and the pipeline runs at its pace: at least
    // its own work after stage 0's first forward, at most the makespan of three slow stages,
    // (M + p - 1) (F + B).
    std::vector<PipeSimCosts> slow(3, PipeSimCosts{1, 2, 0, 1});
    slow[1] = PipeSimCosts{2, 4, 0, 2};
    const PipeSimResult r = simulate_pipeline_per_stage(ops, 5, slow);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_DOUBLE_EQ(r.busy[1], 5 * 6.0) << to_string(kind);
    EXPECT_DOUBLE_EQ(r.busy[0], 5 * 3.0) << to_string(kind);
    EXPECT_GE(r.makespan, 5 * 6.0 + 1) << to_string(kind);
    EXPECT_LE(r.makespan, (5 + 2) * 6.0) << to_string(kind);
  }
  std::vector<std::vector<PipeOp>> two = {pipeline_schedule(ScheduleKind::OneFOneB, 0, 2, 2),
                                          pipeline_schedule(ScheduleKind::OneFOneB, 1, 2, 2)};
  const PipeSimResult wrong =
      simulate_pipeline_per_stage(two, 2, std::vector<PipeSimCosts>(3, unit));
  EXPECT_FALSE(wrong.ok);
  EXPECT_NE(wrong.error.find("3 stage costs for 2 stages"), std::string::npos) << wrong.error;
}

// Per-chunk costs: the same costs on every chunk are the per-stage simulation exactly; one chunk
// twice as slow adds its extra work to its stage's busy time only, and a cost table of the
// wrong shape is an error.
TEST(pipeline_schedule, PerChunkCostsSimulateEachChunkAtItsOwnCosts) {
  const PipeSimCosts unit{1, 2, 0.25, 1};
  constexpr int kStages = 2, kChunks = 2;
  constexpr int64_t kMicro = 4;
  const auto ops = stage_lists(ScheduleKind::Interleaved, kStages, kMicro, kChunks);
  const std::vector<std::vector<PipeSimCosts>> same(kStages,
                                                     std::vector<PipeSimCosts>(kChunks, unit));
  const PipeSimResult a = simulate_pipeline_per_chunk(ops, kMicro, same, kChunks);
  const PipeSimResult b = simulate_pipeline_per_stage(
      ops, kMicro, std::vector<PipeSimCosts>(kStages, unit), kChunks);
  ASSERT_TRUE(a.ok && b.ok) << a.error << b.error;
  EXPECT_EQ(a.makespan, b.makespan);
  EXPECT_EQ(a.busy, b.busy);
  std::vector<std::vector<PipeSimCosts>> slow = same;
  slow[0][1] = PipeSimCosts{2, 4, 0.25, 2};
  const PipeSimResult r = simulate_pipeline_per_chunk(ops, kMicro, slow, kChunks);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.busy[0], kMicro * 3.0 + kMicro * 6.0);
  EXPECT_DOUBLE_EQ(r.busy[1], 2 * kMicro * 3.0);
  EXPECT_GT(r.makespan, a.makespan);
  for (const PipeSimInterval& i : r.timeline[0])
    if (i.op.kind == PipeOpKind::Forward)
      EXPECT_DOUBLE_EQ(i.end - i.start, i.op.chunk == 1 ? 2.0 : 1.0) << to_string(i.op);
  const PipeSimResult wrong = simulate_pipeline_per_chunk(
      ops, kMicro, std::vector<std::vector<PipeSimCosts>>(kStages, {unit}), kChunks);
  EXPECT_FALSE(wrong.ok);
  EXPECT_NE(wrong.error.find("stage 0 has 1 chunk costs for 2 chunks"), std::string::npos)
      << wrong.error;
}

// Each op at its own cost (a measured step's durations): the chunks' costs given per op are the
// per-chunk simulation exactly, and one op made longer moves every op that waits on it.
TEST(pipeline_schedule, PerOpCostsSimulateEachOpAtItsOwnCost) {
  const PipeSimCosts unit{1, 2, 0.25, 1};
  constexpr int64_t kMicro = 4;  // on 2 stages of one chunk each
  const auto ops = stage_lists(ScheduleKind::ZeroBubbleH1, 2, kMicro, 1);
  const std::vector<std::vector<PipeSimCosts>> costs(2, {unit});
  const auto chunk_cost = [&](int, const PipeOp& op) {
    switch (op.kind) {
      case PipeOpKind::Forward: return unit.forward;
      case PipeOpKind::Backward: return unit.backward;
      case PipeOpKind::BackwardInput: return unit.backward - unit.weight;
      default: return unit.weight;
    }
  };
  const PipeSimResult a = simulate_pipeline_per_chunk(ops, kMicro, costs, 1);
  const PipeSimResult b = simulate_pipeline_per_op(ops, kMicro, costs, chunk_cost, 1);
  ASSERT_TRUE(a.ok && b.ok) << a.error << b.error;
  EXPECT_EQ(a.makespan, b.makespan);
  EXPECT_EQ(a.busy, b.busy);
  // Stage 1's forward of micro-batch 0 takes 5 more: stage 1 is busy 5 longer, stage 0 not,
  // and the step ends later by at most those 5 (stage 0 waits on that micro-batch's gradient).
  const auto slow = [&](int stage, const PipeOp& op) {
    const bool late = stage == 1 && op.kind == PipeOpKind::Forward && op.micro == 0;
    return chunk_cost(stage, op) + (late ? 5.0 : 0.0);
  };
  const PipeSimResult r = simulate_pipeline_per_op(ops, kMicro, costs, slow, 1);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.busy[1], a.busy[1] + 5.0);
  EXPECT_DOUBLE_EQ(r.busy[0], a.busy[0]);
  EXPECT_GT(r.makespan, a.makespan);
  EXPECT_LE(r.makespan, a.makespan + 5.0);
  int compared = 0;
  for (size_t i = 0; i < r.timeline[1].size(); ++i) {
    const PipeSimInterval& x = r.timeline[1][i];
    if (x.op.kind == PipeOpKind::Forward && x.op.micro == 0) {
      EXPECT_DOUBLE_EQ(x.end - x.start, unit.forward + 5.0);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 1);
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

// ---- 4. interleaved 1F1B and ZB-H1 ----------------------------------------------------------

// Compute ops of a list, in order.
std::string compute_order(const std::vector<PipeOp>& ops) {
  std::vector<PipeOp> c;
  for (const PipeOp& op : ops)
    if (op.kind == PipeOpKind::Forward || op.kind == PipeOpKind::Backward ||
        op.kind == PipeOpKind::BackwardInput || op.kind == PipeOpKind::BackwardWeight)
      c.push_back(op);
  return to_string(c);
}

TEST(pipeline_schedule, InterleavedFollowsMegatronOrder) {
  using K = ScheduleKind;
  // p = 2, v = 2, M = 4. Stage 0: warmup (2-0-1)*2 + (2-1)*2 = 4 forwards; stage 1: 2.
  // Forward k runs chunk (k mod 4) / 2 on micro-batch (k / 4) * 2 + k mod 2; backward k the
  // chunks in reverse.
  EXPECT_EQ(compute_order(pipeline_schedule(K::Interleaved, 0, 2, 4, 2)),
            "F0 F1 F0:1 F1:1 F2 B0:1 F3 B1:1 F2:1 B0 F3:1 B1 B2:1 B3:1 B2 B3");
  EXPECT_EQ(compute_order(pipeline_schedule(K::Interleaved, 1, 2, 4, 2)),
            "F0 F1 F0:1 B0:1 F1:1 B1:1 F2 B0 F3 B1 F2:1 B2:1 F3:1 B3:1 B2 B3");
  // Communication: chunk 1 of stage 0 receives from stage 1's chunk 0; the last virtual stage
  // (stage 1, chunk 1) neither sends forward nor receives backward.
  EXPECT_EQ(to_string(pipeline_schedule(K::Interleaved, 1, 2, 2, 2)),
            "RF0 F0 SF0 RF1 F1 SF1 RF0:1 F0:1 RF1:1 F1:1 B0:1 SB0:1 B1:1 SB1:1 RB0 B0 SB0 RB1 B1 "
            "SB1");
  // M = p: every forward first (Megatron's all-warmup case).
  EXPECT_EQ(compute_order(pipeline_schedule(K::Interleaved, 0, 2, 2, 2)),
            "F0 F1 F0:1 F1:1 B0:1 B1:1 B0 B1");
}

// Exact lists of the zero-bubble schedules: their compute ops, or (`comm`) every op.
TEST(pipeline_schedule, ZeroBubbleListsDeferWeightGradientsByStage) {
  using K = ScheduleKind;
  struct Case {
    K kind;
    int stage, stages;
    int64_t micro;
    bool comm;
    const char* ops;
    const char* why;
  };
  const Case cases[] = {
      {K::ZeroBubbleH1, 0, 4, 6, false,
       "F0 F1 F2 F3 BI0 W0 F4 BI1 W1 F5 BI2 W2 BI3 W3 BI4 W4 BI5 W5",
       "H1: stage s keeps up to s weight gradients pending; stage 0 none"},
      {K::ZeroBubbleH1, 3, 4, 6, false,
       "F0 BI0 F1 BI1 F2 BI2 F3 BI3 W0 F4 BI4 W1 F5 BI5 W2 W3 W4 W5", "H1: the last stage 3"},
      {K::ZeroBubbleH1, 1, 2, 2, true, "RF0 F0 BI0 SB0 RF1 F1 BI1 SB1 W0 W1",
       "H1: the last of 2 stages, sends and receives"},
      {K::ZeroBubbleH2, 0, 2, 8, false,
       "F0 F1 F2 BI0 W0 F3 BI1 W1 F4 BI2 W2 F5 BI3 W3 F6 BI4 W4 F7 BI5 W5 BI6 W6 BI7 W7",
       "H2: stage 0 runs 2p-1 = 3 forwards before its first input gradient (H1: 2), defers none"},
      {K::ZeroBubbleH2, 1, 2, 8, false,
       "F0 BI0 F1 BI1 F2 BI2 W0 F3 BI3 W1 F4 BI4 W2 F5 BI5 W3 F6 BI6 W4 F7 BI7 W5 W6 W7",
       "H2: stage 1 of 2 runs one forward first and keeps up to 2 pending (H1: 1)"},
      {K::ZeroBubbleH2, 1, 4, 8, false,
       "F0 F1 F2 F3 F4 BI0 F5 BI1 F6 BI2 W0 F7 BI3 W1 BI4 W2 BI5 W3 BI6 W4 BI7 W5 W6 W7",
       "H2: stage 1 of 4 runs 5 forwards first and defers 2"},
      {K::ZeroBubbleH2, 1, 2, 2, true, "RF0 F0 BI0 SB0 RF1 F1 BI1 SB1 W0 W1",
       "H2, M < 2p-1: the deferral capped at M-(p-s) = 1, not 2"},
      {K::ZeroBubbleH2, 3, 4, 3, false, "F0 BI0 F1 BI1 F2 BI2 W0 W1 W2",
       "H2, M < 2p-1: stage 3 of 4 defers M-(p-s) = 2, not 6"},
  };
  for (const Case& c : cases) {
    const std::vector<PipeOp> ops = pipeline_schedule(c.kind, c.stage, c.stages, c.micro);
    EXPECT_EQ(c.comm ? to_string(ops) : compute_order(ops), c.ops) << c.why;
  }
}

TEST(pipeline_schedule, ZeroBubbleH2IsNeverSlowerThanH1AndFasterWhenWeightGradientsAreCheaper) {
  // Unit costs F = B = W: the same step as ZB-H1 for M >= 2p-1, never longer for any M. With
  // W < B (the weight gradients cheaper than the input gradients, as on real layers) it is
  // never longer and shorter wherever M >= 2p-1 and p >= 2. Also with the measured costs of
  // bench/README.md's PP 2 trace (stage 0: F 9.3, BI 9.4, W 6.2 ms; stage 1 with the LM head:
  // F 15.7, BI 6.2, W 3.9; no transfer time): 223.5 ms -> 219.6 ms in the simulation.
  const PipeSimCosts unit{1.0, 2.0, 0.0, 1.0}, cheap_w{1.0, 1.6, 0.0, 0.6};
  int64_t compared = 0, shorter = 0;
  for (int p = 1; p <= 8; ++p)
    for (int64_t m = 1; m <= 16; ++m) {
      for (const PipeSimCosts& c : {unit, cheap_w}) {
        const PipeSimResult h1 = simulate_pipeline(ScheduleKind::ZeroBubbleH1, p, m, c);
        const PipeSimResult h2 = simulate_pipeline(ScheduleKind::ZeroBubbleH2, p, m, c);
        ASSERT_TRUE(h1.ok && h2.ok) << h1.error << h2.error;
        EXPECT_LE(h2.makespan, h1.makespan + 1e-12) << p << " " << m << " W " << c.weight;
        const bool deep = p >= 2 && m >= 2 * p - 1;
        if (deep && c.weight == unit.weight) EXPECT_DOUBLE_EQ(h2.makespan, h1.makespan);
        if (deep && c.weight < unit.weight) {
          EXPECT_LT(h2.makespan, h1.makespan - 1e-9) << p << " " << m;
          shorter += h2.makespan < h1.makespan - 1e-9;
        }
        ++compared;
      }
    }
  EXPECT_EQ(compared, 2 * 8 * 16);
  EXPECT_GT(shorter, 50);
  std::vector<PipeSimCosts> measured(2);
  measured[0] = PipeSimCosts{9.3, 9.4 + 6.2, 0.0, 6.2};
  measured[1] = PipeSimCosts{15.7, 6.2 + 3.9, 0.0, 3.9};
  auto step = [&](ScheduleKind kind) {
    const PipeSimResult r = simulate_pipeline_per_stage(
        {pipeline_schedule(kind, 0, 2, 8), pipeline_schedule(kind, 1, 2, 8)}, 8, measured);
    EXPECT_TRUE(r.ok) << r.error;
    return r.makespan;
  };
  EXPECT_NEAR(step(ScheduleKind::ZeroBubbleH1), 223.5, 0.05);
  EXPECT_NEAR(step(ScheduleKind::ZeroBubbleH2), 219.6, 0.05);
}

TEST(pipeline_schedule, VirtualStageArgumentsAreChecked) {
  using K = ScheduleKind;
  auto check = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  check(error_of([] { pipeline_schedule(K::Interleaved, 0, 2, 3, 2); }),
        "needs the micro-batches per step (3 = train.global_batch / (train.micro_batch * "
        "parallel.data)) to be a multiple of parallel.pipeline = 2");
  check(error_of([] { pipeline_schedule(K::Interleaved, 0, 2, 4, 1); }),
        "parallel.virtual_stages = 1: the interleaved schedule needs at least 2 model chunks");
  check(error_of([] { pipeline_schedule(K::Interleaved, 0, 1, 4, 2); }),
        "parallel.schedule = \"interleaved\" needs parallel.pipeline >= 2, it is 1");
  check(error_of([] { pipeline_schedule(K::OneFOneB, 0, 2, 4, 2); }),
        "parallel.virtual_stages = 2 needs parallel.schedule = \"interleaved\" (it is \"1f1b\")");
  check(error_of([] { schedule_peak_bound(K::ZeroBubbleH1, 0, 2, 4, 3); }),
        "parallel.virtual_stages = 3 needs parallel.schedule");
}

// The shapes the invariants are checked on: p <= 8, M <= 16, v <= 4 (interleaved: p >= 2 and
// M a multiple of p; the others v = 1).
struct Shape {
  ScheduleKind kind;
  int stages;
  int64_t micro;
  int chunks;
};
std::vector<Shape> split_and_interleaved_shapes() {
  std::vector<Shape> shapes;
  for (int p = 1; p <= 8; ++p)
    for (int64_t m = 1; m <= 16; ++m) {
      shapes.push_back({ScheduleKind::ZeroBubbleH1, p, m, 1});
      shapes.push_back({ScheduleKind::ZeroBubbleH2, p, m, 1});
      for (int v = 2; v <= 4; ++v)
        if (p >= 2 && m % p == 0) shapes.push_back({ScheduleKind::Interleaved, p, m, v});
    }
  return shapes;
}
std::string where(const Shape& x) {
  return where(x.kind, -1, x.stages, x.micro) + " v=" + std::to_string(x.chunks);
}

TEST(pipeline_schedule, InterleavedAndZeroBubbleRunEveryOpOnceInOrderAndComplete) {
  int64_t lists = 0;
  for (const Shape& x : split_and_interleaved_shapes()) {
    SCOPED_TRACE(where(x));
    std::vector<std::vector<PipeOp>> all;
    for (int stage = 0; stage < x.stages; ++stage) {
      const std::vector<PipeOp> ops = pipeline_schedule(x.kind, stage, x.stages, x.micro, x.chunks);
      ++lists;
      // Per chunk: forwards, input gradients (whole or split) and weight gradients each run
      // every micro-batch once, in micro-batch order; F before its B before its W.
      const bool split = splits_backward(x.kind);
      for (int c = 0; c < x.chunks; ++c) {
        std::vector<int64_t> f, b, w;
        std::vector<int64_t> f_at(static_cast<size_t>(x.micro), -1), b_at = f_at, w_at = f_at;
        for (size_t i = 0; i < ops.size(); ++i) {
          const PipeOp& op = ops[i];
          if (op.chunk != c) continue;
          const auto m = static_cast<size_t>(op.micro);
          if (op.kind == PipeOpKind::Forward) f.push_back(op.micro), f_at[m] = int64_t(i);
          if (op.kind == (split ? PipeOpKind::BackwardInput : PipeOpKind::Backward))
            b.push_back(op.micro), b_at[m] = int64_t(i);
          if (op.kind == PipeOpKind::BackwardWeight) w.push_back(op.micro), w_at[m] = int64_t(i);
          EXPECT_NE(op.kind, split ? PipeOpKind::Backward : PipeOpKind::BackwardInput);
        }
        EXPECT_EQ(f, iota(x.micro)) << "chunk " << c;
        EXPECT_EQ(b, iota(x.micro)) << "chunk " << c;
        EXPECT_EQ(w, split ? iota(x.micro) : std::vector<int64_t>{}) << "chunk " << c;
        for (size_t m = 0; m < f_at.size(); ++m) {
          EXPECT_LT(f_at[m], b_at[m]) << "F before B, micro " << m;
          if (split) EXPECT_LT(b_at[m], w_at[m]) << "B before W, micro " << m;
        }
      }
      EXPECT_EQ(peak_in_flight(ops),
                schedule_peak_bound(x.kind, stage, x.stages, x.micro, x.chunks))
          << "stage " << stage;
      all.push_back(ops);
    }
    // Together: every send received in order, no deadlock, the simulator's memory = the bound.
    const PipeSimResult r = simulate_pipeline(all, x.micro, {}, x.chunks);
    ASSERT_TRUE(r.ok) << r.error;
    for (int s = 0; s < x.stages; ++s)
      EXPECT_EQ(r.peak_in_flight[static_cast<size_t>(s)],
                schedule_peak_bound(x.kind, s, x.stages, x.micro, x.chunks));
  }
  // ZB-H1 and ZB-H2: sum over p = 1..8 of 16 p = 576 stage lists each; interleaved: sum over
  // p = 2..8 of p * floor(16 / p) * 3 values of v = 312.
  EXPECT_EQ(lists, 2 * 576 + 312);
}

TEST(pipeline_schedule, BubblesMatchTheClosedForms) {
  // Unit costs F = B = W = 1 (a whole backward costs 2). 1F1B: (p-1)/(M+p-1);
  // interleaved (each chunk op costs the same): (p-1)/(vM+p-1); ZB-H1: (p-1)/(3M+p-1) —
  // the paper's (p-1)(F+B-W) idle time against 1F1B's (p-1)(F+B+W).
  const PipeSimCosts unit{1.0, 2.0, 0.0, 1.0};
  int64_t compared = 0;
  for (int p = 2; p <= 8; ++p)
    for (int64_t m = p; m <= 16; ++m) {
      const double pm1 = p - 1;
      const PipeSimResult one = simulate_pipeline(ScheduleKind::OneFOneB, p, m, unit);
      const PipeSimResult zb = simulate_pipeline(ScheduleKind::ZeroBubbleH1, p, m, unit);
      ASSERT_TRUE(one.ok && zb.ok) << one.error << zb.error;
      EXPECT_NEAR(one.bubble_fraction(), pm1 / (double(m) + pm1), 1e-12) << p << " " << m;
      EXPECT_NEAR(zb.bubble_fraction(), pm1 / (3.0 * double(m) + pm1), 1e-12) << p << " " << m;
      EXPECT_DOUBLE_EQ(zb.makespan, 3.0 * double(m) + pm1) << p << " " << m;
      compared += 2;
      if (m % p != 0) continue;
      for (int v = 2; v <= 4; ++v) {
        const PipeSimResult il = simulate_pipeline(ScheduleKind::Interleaved, p, m, unit, v);
        ASSERT_TRUE(il.ok) << il.error;
        EXPECT_NEAR(il.bubble_fraction(), pm1 / (double(v) * double(m) + pm1), 1e-12)
            << p << " " << m << " v " << v;
        ++compared;
      }
    }
  EXPECT_GT(compared, 200);
}

TEST(pipeline_schedule, PrintsScheduleComparison) {
  const PipeSimCosts unit{1.0, 2.0, 0.0, 1.0};
  for (const Shape& x : {Shape{ScheduleKind::Interleaved, 4, 8, 2},
                         Shape{ScheduleKind::ZeroBubbleH1, 4, 8, 1}}) {
    const PipeSimResult r = simulate_pipeline(x.kind, x.stages, x.micro, unit, x.chunks);
    ASSERT_TRUE(r.ok) << r.error;
    std::printf("%s, 4 stages x 8 micro-batches, v = %d (F = B = W = 1), makespan %g:\n%s",
                to_string(x.kind).c_str(), x.chunks, r.makespan, render(r).c_str());
  }
  std::printf("\n%-12s %3s %4s %3s %10s %10s %11s\n", "schedule", "p", "M", "v", "bubble",
              "theory", "peak s0");
  for (int p : {2, 4, 8})
    for (int64_t m : {8, 16, 32})
      for (const Shape& x : {Shape{ScheduleKind::GPipe, p, m, 1}, Shape{ScheduleKind::OneFOneB, p, m, 1},
                             Shape{ScheduleKind::Interleaved, p, m, 2},
                             Shape{ScheduleKind::Interleaved, p, m, 4},
                             Shape{ScheduleKind::ZeroBubbleH1, p, m, 1},
                             Shape{ScheduleKind::ZeroBubbleH2, p, m, 1}}) {
        const PipeSimResult r = simulate_pipeline(x.kind, p, m, unit, x.chunks);
        ASSERT_TRUE(r.ok) << r.error;
        const double pm1 = p - 1;
        const double theory = splits_backward(x.kind) ? pm1 / (3.0 * m + pm1)
                                                      : pm1 / (x.chunks * m + pm1);
        std::printf("%-12s %3d %4lld %3d %10.4f %10.4f %8lld/%d\n", to_string(x.kind).c_str(), p,
                    static_cast<long long>(m), x.chunks, r.bubble_fraction(), theory,
                    static_cast<long long>(r.peak_in_flight[0]), x.chunks);
      }
}

TEST(pipeline_schedule, SimulatorCatchesBrokenSplitAndChunkedSchedules) {
  using K = PipeOpKind;
  PipeSimResult r = simulate_pipeline({{{K::Forward, 0}, {K::BackwardWeight, 0}}}, 1);
  EXPECT_NE(r.error.find("weight gradient before its input gradient"), std::string::npos) << r.error;
  r = simulate_pipeline({{{K::Forward, 0}, {K::BackwardInput, 0}}}, 1);
  EXPECT_NE(r.error.find("finished without BackwardWeight 0"), std::string::npos) << r.error;
  r = simulate_pipeline({{{K::Forward, 0}, {K::BackwardInput, 0}, {K::Backward, 0}}}, 1);
  EXPECT_NE(r.error.find("backwarded twice"), std::string::npos) << r.error;
  r = simulate_pipeline({{{K::Forward, 0, 1}, {K::Backward, 0, 1}}}, 1);
  EXPECT_NE(r.error.find("chunk out of range [0, 1)"), std::string::npos) << r.error;
  // Two chunks on two stages: stage 0's chunk 1 must receive from stage 1's chunk 0; receiving
  // chunk 1 before chunk 0's message was consumed is a mismatch.
  std::vector<std::vector<PipeOp>> lists;
  for (int s = 0; s < 2; ++s) lists.push_back(pipeline_schedule(ScheduleKind::Interleaved, s, 2, 2, 2));
  ASSERT_TRUE(simulate_pipeline(lists, 2, {}, 2).ok);
  std::vector<PipeOp>& stage0 = lists[0];
  const auto at = [&](PipeOp op) {
    return static_cast<size_t>(std::find(stage0.begin(), stage0.end(), op) - stage0.begin());
  };
  const size_t first = at({K::RecvForward, 0, 1}), second = at({K::RecvForward, 1, 1});
  ASSERT_EQ(second, first + 3);  // RF0:1 F0:1 SF0:1 RF1:1 F1:1 SF1:1
  std::rotate(stage0.begin() + first, stage0.begin() + second, stage0.begin() + second + 3);
  r = simulate_pipeline(lists, 2, {}, 2);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("(RF1:1): the next message on the channel is micro-batch 0 of chunk 1"),
            std::string::npos)
      << r.error;
}

// ---- 5. stage partition ---------------------------------------------------------------------

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

// The interleaved schedule's chunks: p * v equal chunks, stage s holding s, s + p, ...; every
// layer on exactly one (stage, chunk), the virtual stages in model order.
TEST(pipeline_schedule, InterleavedChunksCoverTheLayersInVirtualStageOrder) {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(stage_layer_chunks(8, 2, 2, 0), (Ranges{{0, 2}, {4, 6}}));
  EXPECT_EQ(stage_layer_chunks(8, 2, 2, 1), (Ranges{{2, 4}, {6, 8}}));
  EXPECT_EQ(stage_layer_chunks(8, 4, 2, 3), (Ranges{{3, 4}, {7, 8}}));
  for (const auto& [stages, v] : {std::pair{2, 2}, {2, 3}, {4, 2}, {3, 4}}) {
    const int64_t layers = 2 * stages * v;
    std::vector<std::pair<int64_t, int64_t>> by_virtual(static_cast<size_t>(stages * v));
    for (int s = 0; s < stages; ++s) {
      const auto chunks = stage_layer_chunks(layers, stages, v, s);
      ASSERT_EQ(chunks.size(), static_cast<size_t>(v));
      for (int c = 0; c < v; ++c) by_virtual[static_cast<size_t>(c * stages + s)] = chunks[c];
    }
    int64_t at = 0;
    for (const auto& [b, e] : by_virtual) {
      EXPECT_EQ(b, at);
      EXPECT_EQ(e - b, 2);
      at = e;
    }
    EXPECT_EQ(at, layers) << stages << " stages, v " << v;
  }
  const std::string uneven = error_of([] { stage_layer_chunks(6, 2, 2, 0); });
  EXPECT_EQ(uneven,
            "model.layers (6) must be divisible by parallel.pipeline * parallel.virtual_stages "
            "(2 * 2 = 4): the interleaved schedule cuts the layers into that many equal chunks");
  EXPECT_NE(error_of([] { stage_layer_chunks(8, 2, 2, 2); }).find("pipeline stage 2 is out of range"),
            std::string::npos);
}


// parallel.pipeline_balance = "flops": the last stage's k layers minimise the largest stage
// cost (every layer c, the last stage e more). Checked against every split of the layers into
// stages (all compositions), so a split the rule misses would show; ties go to the smaller k.
TEST(pipeline_schedule, BalancedSplitMinimisesTheLargestStageCost) {
  EXPECT_EQ(balanced_stage_layer_counts(8, 2, 1.0, 3.0), (std::vector<int64_t>{6, 2}));  // tie
  EXPECT_EQ(balanced_stage_layer_counts(8, 2, 1.0, 2.5), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(balanced_stage_layer_counts(10, 4, 1.0, 100.0), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(balanced_stage_layer_counts(9, 1, 1.0, 5.0), (std::vector<int64_t>{9}));
  for (int64_t layers : {7, 10, 12, 13})  // no extra cost: the even split
    for (int stages : {1, 2, 3, 4})
      EXPECT_EQ(balanced_stage_layer_counts(layers, stages, 1.0, 0.0),
                stage_layer_counts(layers, stages, {}));
  int64_t compared = 0;
  for (int64_t layers = 2; layers <= 10; ++layers)
    for (int stages = 2; stages <= std::min<int64_t>(4, layers); ++stages)
      for (double extra : {0.5, 1.0, 2.0, 3.0, 4.5, 7.0}) {
        const auto counts = balanced_stage_layer_counts(layers, stages, 1.0, extra);
        ASSERT_EQ(static_cast<int>(counts.size()), stages);
        ASSERT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), layers);
        const auto cost = [&](const std::vector<int64_t>& c) {
          double worst = 0.0;
          for (size_t s = 0; s < c.size(); ++s)
            worst = std::max(worst, static_cast<double>(c[s]) + (s + 1 == c.size() ? extra : 0));
          return worst;
        };
        // Every composition of `layers` into `stages` parts >= 1, by recursion on the prefix.
        double best = 1e300;
        std::vector<int64_t> split;
        const std::function<void(int64_t)> all = [&](int64_t left) {
          if (static_cast<int>(split.size()) == stages - 1) {
            split.push_back(left);
            best = std::min(best, cost(split));
            split.pop_back();
            return;
          }
          for (int64_t n = 1; n <= left - (stages - 1 - static_cast<int64_t>(split.size())); ++n) {
            split.push_back(n);
            all(left - n);
            split.pop_back();
          }
        };
        all(layers);
        EXPECT_DOUBLE_EQ(cost(counts), best) << layers << " layers, " << stages << " stages, extra "
                                             << extra;
        ++compared;
      }
  EXPECT_GT(compared, 100);
}

}  // namespace
}  // namespace trident

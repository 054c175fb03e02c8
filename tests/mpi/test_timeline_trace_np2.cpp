// The timeline trace (log.trace) and the measured pipeline bubble, on PP 2 (2 ranks).
//
// Trace: a real run of 4 steps (whose metrics.jsonl lines carry pipeline_bubble, 2 stages) tracing
// steps 2-3 under 1F1B, GPipe and ZB-H1 (4 micro-batches) writes one valid JSON file with one track
// per rank named with its coordinates, exactly the operations pipeline_schedule() gives each stage
// in each traced step (names compared in order, so a missing, doubled or reordered op fails),
// monotone time stamps per track, communicator slices with a group and bytes, and one optimizer
// slice per traced step.
//
// Bubble: the real executor's operations timed by its op observer (steps 2-4 of 4; the median
// step). Per step the pipeline bubble is 1 - (summed compute time of both stages) / (2 * span),
// the span running from the first compute op to the last on either stage: the simulator's
// bubble_fraction(). The simulator driven by each stage's mean measured F, B (BI, W) durations
// and message latency must agree within kBubbleTolerance, and the schedules must order as
// theory says: 1F1B above ZB-H1, GPipe not below 1F1B (equal in theory: at p = 2 both idle
// (p-1)(F+B) per stage). Interleaved 1F1B is not executed on this branch, so not measured.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "parity.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/simulator.hpp"

using namespace trident;
using namespace trident::test;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

constexpr int64_t kMicro = 4;  // global batch 8 in micro-batches of 2

void check_trace(const std::string& schedule) {
  const auto dir = shared_corpus("timeline_trace");
  const auto run_dir = dir / ("run_" + schedule);
  const Config config =
      parity_config(dir, {1, 2, 1},
                    {"parallel.schedule=" + schedule, "train.steps=4", "train.global_batch=8",
                     "log.trace=true", "log.trace_steps=[2, 3]", "log.dir=" + run_dir.string()});
  ASSERT_EQ(config.num_microbatches(), kMicro);
  on_layout(config, [](Trainer& t, ProcessGrid&) { t.run(); });
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) return;

  // metrics.jsonl: every logged step (log.interval = 1) carries each stage's measured bubble.
  const auto rows = read_metrics(run_dir);
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    ASSERT_TRUE(row.contains("pipeline_bubble")) << row.dump();
    ASSERT_EQ(row["pipeline_bubble"].size(), 2u) << row.dump();
    for (const auto& b : row["pipeline_bubble"]) {
      EXPECT_GE(b.get<double>(), 0.0) << row.dump();
      EXPECT_LT(b.get<double>(), 1.0) << row.dump();
    }
  }

  std::ifstream in(run_dir / "trace.json");
  ASSERT_TRUE(in) << "no trace.json in " << run_dir;
  const nlohmann::json trace = nlohmann::json::parse(in);  // throws (fails) on invalid JSON
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::map<int, std::string> track_names;
  std::map<int, std::map<int64_t, std::vector<std::string>>> ops;  // pid -> step -> names
  std::map<int, double> last_ts;
  std::map<int, int> comm_slices, optimizer_slices;
  std::map<std::tuple<int, int64_t, int64_t>, std::pair<double, double>>
      forwards;  // (pid, step, micro)
  for (const auto& e : trace["traceEvents"]) {
    const int pid = e.at("pid").get<int>();
    ASSERT_EQ(e.at("tid").get<int>(), pid) << "one track per rank";
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") track_names[pid] = e["args"]["name"];
      continue;
    }
    ASSERT_EQ(e.at("ph"), "X");
    const double ts = e.at("ts").get<double>();
    ASSERT_GE(e.at("dur").get<double>(), 0.0);
    if (last_ts.count(pid)) EXPECT_GE(ts, last_ts[pid]) << "track " << pid << " not monotone";
    last_ts[pid] = ts;
    const std::string cat = e.at("cat");
    const int64_t step = e.at("args").at("step").get<int64_t>();
    EXPECT_TRUE(step == 2 || step == 3) << "slice of untraced step " << step;
    if (cat == "pipeline") ops[pid][step].push_back(e.at("name"));
    if (cat == "pipeline" && e["args"].at("kind") == "F")
      forwards[{pid, step, e["args"].at("micro").get<int64_t>()}] = {ts,
                                                                     ts + e["dur"].get<double>()};
    if (cat == "comm") {
      ++comm_slices[pid];
      EXPECT_FALSE(e["args"].at("group").get<std::string>().empty());
      EXPECT_GE(e["args"].at("bytes").get<int64_t>(), 0);
    }
    if (cat == "optimizer") ++optimizer_slices[pid];
  }
  ASSERT_EQ(track_names.size(), 2u);
  EXPECT_EQ(track_names[0], "rank 0 (tp 0, pp 0, dp 0)");
  EXPECT_EQ(track_names[1], "rank 1 (tp 0, pp 1, dp 0)");
  int64_t compared = 0;
  for (int stage = 0; stage < 2; ++stage) {
    std::vector<std::string> expected;
    for (const PipeOp& op : pipeline_schedule(parse_schedule_kind(schedule), stage, 2, kMicro))
      expected.push_back(to_string(op));
    ASSERT_EQ(ops[stage].size(), 2u) << "stage " << stage << ": traced steps";
    for (int64_t step : {2, 3}) {
      EXPECT_EQ(ops[stage][step], expected) << schedule << " stage " << stage << " step " << step;
      compared += static_cast<int64_t>(ops[stage][step].size());
    }
    EXPECT_GT(comm_slices[stage], 0) << "stage " << stage;
    EXPECT_EQ(optimizer_slices[stage], 2) << "stage " << stage;
  }
  // One time line for both ranks: stage 1 starts a micro-batch's forward after stage 0 ended
  // its, within 500 us (the clock offsets' error is microseconds; a barrier's exit skew, the origin
  // before offsets were measured, was milliseconds).
  for (int64_t step : {2, 3})
    for (int64_t micro = 0; micro < kMicro; ++micro)
      EXPECT_GE(forwards.at({1, step, micro}).first, forwards.at({0, step, micro}).second - 500)
          << "step " << step << " micro " << micro;
  std::printf("[ trace %s ] %lld pipeline slices matched the schedule, %d + %d comm slices\n",
              schedule.c_str(), static_cast<long long>(compared), comm_slices[0], comm_slices[1]);
  EXPECT_GT(compared, 0);
}

// ---- measured bubble ---------------------------------------------------------------------

// An op of one step: stage, kind and micro-batch (as doubles, to gather them as one array),
// start and end in seconds of the monotonic clock, which the ranks of this test (one machine)
// share.
struct Timed {
  double stage, kind, micro, start, end;
};

bool is_compute(PipeOpKind k) {
  return k == PipeOpKind::Forward || k == PipeOpKind::Backward || k == PipeOpKind::BackwardInput ||
         k == PipeOpKind::BackwardWeight;
}

struct BubbleResult {
  double measured = 0, simulated = 0;
  // Per stage: mean seconds of each compute kind, and of its messages' latency.
  std::map<PipeOpKind, double> mean_seconds[2];
  double message_latency[2] = {0, 0};
};

// Every rank's ops of one step on rank 0 (empty elsewhere).
std::vector<Timed> gather_ops(const std::vector<Timed>& mine) {
  static_assert(sizeof(Timed) == 5 * sizeof(double));
  const int n = static_cast<int>(mine.size() * 5);
  int counts[2] = {0, 0}, offsets[2] = {0, 0};
  MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
  offsets[1] = counts[0];
  std::vector<Timed> all(world_rank() == 0 ? (counts[0] + counts[1]) / 5 : 0);
  MPI_Gatherv(mine.data(), n, MPI_DOUBLE, all.data(), counts, offsets, MPI_DOUBLE, 0,
              MPI_COMM_WORLD);
  return all;
}

// Seconds from a send being posted to the end of the receive that waited for it (a receive
// posted after its message arrived measures nothing and is skipped). On an oversubscribed
// machine this is mostly the time until the waiting rank is scheduled again.
// out[s]: the messages stage s sent.
void add_latencies(const std::vector<Timed>& ops, std::vector<double> out[2]) {
  const auto find = [&](int stage, PipeOpKind kind, double micro) -> const Timed* {
    for (const Timed& t : ops)
      if (t.stage == stage && t.kind == static_cast<double>(kind) && t.micro == micro) return &t;
    return nullptr;
  };
  for (const Timed& r : ops) {
    const auto kind = static_cast<PipeOpKind>(static_cast<int>(r.kind));
    const bool forward = kind == PipeOpKind::RecvForward;
    if (!forward && kind != PipeOpKind::RecvBackward) continue;
    const int sender = forward ? 0 : 1;
    const Timed* send =
        find(sender, forward ? PipeOpKind::SendForward : PipeOpKind::SendBackward, r.micro);
    if (send && send->start > r.start) out[sender].push_back(r.end - send->start);
  }
}

constexpr int64_t kSteps = 4;  // the first is a warmup, not measured

// Widths large enough that the ops take milliseconds to tens of milliseconds.
BubbleResult measure_bubble(const std::string& schedule) {
  const auto dir = shared_corpus("timeline_trace");
  const Config config = parity_config(
      dir, {1, 2, 1},
      {"parallel.schedule=" + schedule, "train.global_batch=8", "model.width=256", "model.heads=4",
       "model.seq_len=64", "model.layers=4", "log.dir=" + (dir / ("bubble_" + schedule)).string()});
  std::vector<std::vector<Timed>> steps(kSteps);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    int64_t step = 0;
    const double stage = grid.coord().pp;
    t.pipeline().set_op_observer([&](const PipeOp& op, std::chrono::steady_clock::time_point a,
                                     std::chrono::steady_clock::time_point b) {
      const auto s = [](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(t.time_since_epoch()).count();
      };
      steps[step].push_back(
          {stage, static_cast<double>(op.kind), static_cast<double>(op.micro), s(a), s(b)});
    });
    for (step = 0; step < kSteps; ++step) t.train_step(step);
  });
  BubbleResult result;
  std::vector<double> measured, latencies[2];
  std::map<PipeOpKind, std::pair<double, int64_t>> sums[2];  // per stage
  for (int64_t step = 1; step < kSteps; ++step) {
    const std::vector<Timed> all = gather_ops(steps[step]);
    if (world_rank() != 0) continue;
    double first = 1e300, last = -1e300, busy = 0;
    for (const Timed& t : all) {
      const auto kind = static_cast<PipeOpKind>(static_cast<int>(t.kind));
      if (!is_compute(kind)) continue;
      first = std::min(first, t.start);
      last = std::max(last, t.end);
      busy += t.end - t.start;
      sums[static_cast<int>(t.stage)][kind].first += t.end - t.start;
      sums[static_cast<int>(t.stage)][kind].second += 1;
    }
    measured.push_back(1.0 - busy / (2 * (last - first)));
    add_latencies(all, latencies);
  }
  if (world_rank() != 0) return result;
  std::sort(measured.begin(), measured.end());
  result.measured = measured[measured.size() / 2];  // the median step
  std::vector<PipeSimCosts> costs(2);
  for (int stage = 0; stage < 2; ++stage) {
    std::map<PipeOpKind, double>& mean = result.mean_seconds[stage];
    for (const auto& [kind, sum] : sums[stage]) mean[kind] = sum.first / sum.second;
    for (double l : latencies[stage])
      result.message_latency[stage] += l / static_cast<double>(latencies[stage].size());
    PipeSimCosts& c = costs[stage];
    c.forward = mean[PipeOpKind::Forward];
    c.comm = result.message_latency[stage];
    if (schedule == "zb-h1") {
      c.weight = mean[PipeOpKind::BackwardWeight];
      c.backward = mean[PipeOpKind::BackwardInput] + c.weight;
    } else {
      c.backward = mean[PipeOpKind::Backward];
      c.weight = 0;
    }
  }
  std::vector<std::vector<PipeOp>> ops;
  for (int stage = 0; stage < 2; ++stage)
    ops.push_back(pipeline_schedule(parse_schedule_kind(schedule), stage, 2, kMicro));
  const PipeSimResult sim = simulate_pipeline_per_stage(ops, kMicro, costs);
  EXPECT_TRUE(sim.ok) << sim.error;
  result.simulated = sim.bubble_fraction();
  return result;
}

// The measured bubble may differ from the simulated one by this much (absolute fraction of the
// pipeline's time). What the simulator leaves out: the spread of op times around their means
// (on a loaded 2-core machine an op is preempted for whole scheduler ticks, 4 ms against ops
// of 5-20 ms) and of the message latency, and the receive and send ops' own time. Observed on
// the 2-core development machine under load: differences up to 0.045 over repeated runs. The
// schedules differ by more: 0.20 (1F1B, GPipe) against 0.08 (ZB-H1) in theory.
constexpr double kBubbleTolerance = 0.06;

}  // namespace

TEST(TimelineTrace, OneFOneBPp2HasOneSlicePerScheduledOp) { check_trace("1f1b"); }
TEST(TimelineTrace, GPipePp2HasOneSlicePerScheduledOp) { check_trace("gpipe"); }
TEST(TimelineTrace, ZeroBubblePp2HasOneSlicePerScheduledOp) { check_trace("zb-h1"); }

TEST(MeasuredBubble, Pp2SchedulesOrderAsTheoryAndMatchTheSimulator) {
  std::map<std::string, BubbleResult> r;
  for (const std::string schedule : {"1f1b", "gpipe", "zb-h1"})
    r[schedule] = measure_bubble(schedule);
  if (world_rank() != 0) return;
  // Interleaved 1F1B is not run by this branch's executor (the generator and simulator only).
  for (const auto& [schedule, b] : r) {
    std::printf("[ bubble %-5s ] measured %.3f, simulator %.3f |", schedule.c_str(), b.measured,
                b.simulated);
    for (int stage = 0; stage < 2; ++stage) {
      std::printf(" stage %d:", stage);
      for (const auto& [kind, seconds] : b.mean_seconds[stage])
        std::printf(" %s %.1f", to_string(kind).c_str(), 1e3 * seconds);
      std::printf(" latency %.1f ms", 1e3 * b.message_latency[stage]);
    }
    std::printf("\n");
    EXPECT_NEAR(b.measured, b.simulated, kBubbleTolerance) << schedule;
  }
  EXPECT_GT(r["1f1b"].measured, r["zb-h1"].measured);
  EXPECT_GE(r["gpipe"].measured, r["1f1b"].measured - kBubbleTolerance);
}

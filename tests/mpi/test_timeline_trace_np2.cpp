// The timeline trace (log.trace) and the measured pipeline bubble, on PP 2 (2 ranks).
//
// Trace: a real run of 4 steps (whose metrics.jsonl lines carry pipeline_bubble, 2 stages)
// tracing steps 2-3 under 1F1B, GPipe, ZB-H1, ZB-H2 and interleaved (v = 2; 4 micro-batches)
// writes one valid JSON file with one track per rank named with its coordinates, exactly the
// operations pipeline_schedule() gives each stage in each traced step (names, chunk included,
// compared in order, so a missing, doubled or reordered op fails), monotone time stamps per
// track, communicator slices with a group and bytes, and one optimizer slice per traced step.
//
// Bubble: the real executor's operations timed by its op observer (steps 2-4 of 4; the median
// step). Per step the pipeline bubble is 1 - (summed compute time of both stages) / (2 * span),
// the span running from the first compute op to the last on either stage: the simulator's
// bubble_fraction(). The simulator driven by each stage's (each chunk's) mean measured F, B
// (BI, W) durations and message latency must agree within kBubbleTolerance, and the schedules
// must order as theory says: 1F1B above ZB-H1, ZB-H2 and interleaved, GPipe not below 1F1B
// (equal in theory: at p = 2 both idle (p-1)(F+B) per stage); interleaved against ZB-H1 as the
// simulator at the measured costs predicts, where it predicts a gap above the tolerance.
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

constexpr int64_t kMicro = 4;  // global batch 8 in micro-batches of 2

// The schedule's options: interleaved with 2 chunks per stage (4 layers: chunks of one layer).
std::vector<std::string> schedule_options(const std::string& schedule) {
  std::vector<std::string> o = {"parallel.schedule=" + schedule};
  if (schedule == "interleaved") o.push_back("parallel.virtual_stages=2");
  return o;
}

int virtual_stages(const std::string& schedule) { return schedule == "interleaved" ? 2 : 1; }

void check_trace(const std::string& schedule) {
  const auto dir = shared_corpus("timeline_trace");
  const auto run_dir = dir / ("run_" + schedule);
  std::vector<std::string> options = schedule_options(schedule);
  for (const std::string o : {"train.steps=4", "train.global_batch=8", "log.trace=true",
                              "log.trace_steps=[2, 3]"})
    options.push_back(o);
  options.push_back("log.dir=" + run_dir.string());
  const Config config = parity_config(dir, {1, 2, 1}, options);
  ASSERT_EQ(config.num_microbatches(), kMicro);
  const int chunks = virtual_stages(schedule);
  ASSERT_EQ(config.parallel.virtual_stages, chunks);
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
  std::map<std::tuple<int, int64_t, int64_t, int>, std::pair<double, double>>
      forwards;  // (pid, step, micro, chunk)
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
      forwards[{pid, step, e["args"].at("micro").get<int64_t>(),
                e["args"].at("chunk").get<int>()}] = {ts, ts + e["dur"].get<double>()};
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
    for (const PipeOp& op :
         pipeline_schedule(parse_schedule_kind(schedule), stage, 2, kMicro, chunks))
      expected.push_back(to_string(op));
    ASSERT_EQ(ops[stage].size(), 2u) << "stage " << stage << ": traced steps";
    for (int64_t step : {2, 3}) {
      EXPECT_EQ(ops[stage][step], expected) << schedule << " stage " << stage << " step " << step;
      compared += static_cast<int64_t>(ops[stage][step].size());
    }
    EXPECT_GT(comm_slices[stage], 0) << "stage " << stage;
    EXPECT_EQ(optimizer_slices[stage], 2) << "stage " << stage;
  }
  // One time line for both ranks: stage 1 starts a micro-batch's forward (of a chunk) after
  // stage 0 ended its (of the same chunk: virtual stage 2c feeds 2c + 1), within 500 us (the
  // clock offsets' error is microseconds; a barrier's exit skew, the origin before offsets were
  // measured, was milliseconds).
  for (int64_t step : {2, 3})
    for (int64_t micro = 0; micro < kMicro; ++micro)
      for (int chunk = 0; chunk < chunks; ++chunk)
        EXPECT_GE(forwards.at({1, step, micro, chunk}).first,
                  forwards.at({0, step, micro, chunk}).second - 500)
            << "step " << step << " micro " << micro << " chunk " << chunk;
  std::printf("[ trace %s ] %lld pipeline slices matched the schedule, %d + %d comm slices\n",
              schedule.c_str(), static_cast<long long>(compared), comm_slices[0], comm_slices[1]);
  EXPECT_GT(compared, 0);
}

// ---- measured bubble ---------------------------------------------------------------------

// An op of one step: stage, kind, micro-batch and chunk (as doubles, to gather them as one
// array), start and end in seconds of the monotonic clock, which the ranks of this test (one
// machine) share.
struct Timed {
  double stage, kind, micro, chunk, start, end;
};

bool is_compute(PipeOpKind k) {
  return k == PipeOpKind::Forward || k == PipeOpKind::Backward || k == PipeOpKind::BackwardInput ||
         k == PipeOpKind::BackwardWeight;
}

struct BubbleResult {
  double measured = 0, simulated = 0;
  double step_seconds = 0;  // the median measured step's pipeline time, first op to last
  // Per stage: median seconds of each compute kind on each chunk, and of its messages' latency.
  std::map<std::pair<int, PipeOpKind>, double> op_seconds[2];  // (chunk, kind)
  double message_latency[2] = {0, 0};
  // How much longer than the median of its kind (stage, chunk, kind) the most delayed compute
  // op of the measured steps took: 0 where every op of a kind took the same time, as the
  // simulator assumes.
  double op_delay_seconds = 0;
};

// Every rank's ops of one step on rank 0 (empty elsewhere).
std::vector<Timed> gather_ops(const std::vector<Timed>& mine) {
  constexpr int kFields = sizeof(Timed) / sizeof(double);
  static_assert(sizeof(Timed) == kFields * sizeof(double));
  const int n = static_cast<int>(mine.size() * kFields);
  int counts[2] = {0, 0}, offsets[2] = {0, 0};
  MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
  offsets[1] = counts[0];
  std::vector<Timed> all(world_rank() == 0 ? (counts[0] + counts[1]) / kFields : 0);
  MPI_Gatherv(mine.data(), n, MPI_DOUBLE, all.data(), counts, offsets, MPI_DOUBLE, 0,
              MPI_COMM_WORLD);
  return all;
}

// Seconds from a send being posted to the end of the receive that waited for it (a receive
// posted after its message arrived measures nothing and is skipped). On an oversubscribed
// machine this is mostly the time until the waiting rank is scheduled again.
// out[s]: the messages stage s sent. On 2 stages the sender of a receive is the other stage;
// its chunk (virtual stage k = chunk * 2 + stage, activations flow k -> k + 1): a forward
// received by stage 0 on chunk c left stage 1's chunk c - 1, by stage 1 stage 0's chunk c; a
// gradient received by stage 1 on chunk c left stage 0's chunk c + 1, by stage 0 stage 1's c.
void add_latencies(const std::vector<Timed>& ops, std::vector<double> out[2]) {
  const auto find = [&](int stage, PipeOpKind kind, double micro, double chunk) -> const Timed* {
    for (const Timed& t : ops)
      if (t.stage == stage && t.kind == static_cast<double>(kind) && t.micro == micro &&
          t.chunk == chunk)
        return &t;
    return nullptr;
  };
  for (const Timed& r : ops) {
    const auto kind = static_cast<PipeOpKind>(static_cast<int>(r.kind));
    const bool forward = kind == PipeOpKind::RecvForward;
    if (!forward && kind != PipeOpKind::RecvBackward) continue;
    const int sender = 1 - static_cast<int>(r.stage);
    double chunk = r.chunk;
    if (forward && r.stage == 0) chunk -= 1;
    if (!forward && r.stage == 1) chunk += 1;
    const Timed* send =
        find(sender, forward ? PipeOpKind::SendForward : PipeOpKind::SendBackward, r.micro, chunk);
    if (send && send->start > r.start) out[sender].push_back(r.end - send->start);
  }
}

constexpr int64_t kSteps = 4;  // the first is a warmup, not measured

// The upper median (the middle of an odd count).
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Sizes large enough that the ops take 10-50 ms (interleaved: 4 chunks of one layer, half a
// stage's work each): with ops of a few ms, a message's latency on a loaded machine (1-2 ms,
// twice as many messages under interleaved) outweighs what interleaving saves.
BubbleResult measure_bubble(const std::string& schedule) {
  const auto dir = shared_corpus("timeline_trace");
  std::vector<std::string> options = schedule_options(schedule);
  for (const std::string o : {"train.global_batch=32", "train.micro_batch=8", "model.width=256",
                              "model.heads=4", "model.seq_len=64", "model.layers=4"})
    options.push_back(o);
  options.push_back("log.dir=" + (dir / ("bubble_" + schedule)).string());
  const Config config = parity_config(dir, {1, 2, 1}, options);
  const int chunks = virtual_stages(schedule);
  std::vector<std::vector<Timed>> steps(kSteps);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    int64_t step = 0;
    const double stage = grid.coord().pp;
    t.pipeline().set_op_observer([&](const PipeOp& op, std::chrono::steady_clock::time_point a,
                                     std::chrono::steady_clock::time_point b) {
      const auto s = [](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(t.time_since_epoch()).count();
      };
      steps[step].push_back({stage, static_cast<double>(op.kind), static_cast<double>(op.micro),
                             static_cast<double>(op.chunk), s(a), s(b)});
    });
    for (step = 0; step < kSteps; ++step) t.train_step(step);
  });
  BubbleResult result;
  std::vector<double> measured, spans, latencies[2];
  std::map<std::pair<int, PipeOpKind>, std::vector<double>> durations[2];  // per stage
  // Per measured step: each compute op's seconds, by (stage, op).
  std::vector<std::map<std::pair<int, std::string>, double>> op_seconds;
  for (int64_t step = 1; step < kSteps; ++step) {
    const std::vector<Timed> all = gather_ops(steps[step]);
    if (world_rank() != 0) continue;
    double first = 1e300, last = -1e300, busy = 0;
    auto& took = op_seconds.emplace_back();
    for (const Timed& t : all) {
      const auto kind = static_cast<PipeOpKind>(static_cast<int>(t.kind));
      if (!is_compute(kind)) continue;
      first = std::min(first, t.start);
      last = std::max(last, t.end);
      busy += t.end - t.start;
      durations[static_cast<int>(t.stage)][{static_cast<int>(t.chunk), kind}].push_back(
          t.end - t.start);
      const PipeOp op{kind, static_cast<int64_t>(t.micro), static_cast<int>(t.chunk)};
      took[{static_cast<int>(t.stage), to_string(op)}] = t.end - t.start;
    }
    measured.push_back(1.0 - busy / (2 * (last - first)));
    spans.push_back(last - first);
    add_latencies(all, latencies);
  }
  if (world_rank() != 0) return result;
  result.step_seconds = median(spans);
  // Each chunk's median measured costs (one chunk but under interleaved), printed, and its
  // messages' median latency, which the simulation below charges to every send.
  std::vector<std::vector<PipeSimCosts>> costs(2, std::vector<PipeSimCosts>(chunks));
  for (int stage = 0; stage < 2; ++stage) {
    auto& typical = result.op_seconds[stage];
    for (auto& [key, seconds] : durations[stage]) {
      typical[key] = median(seconds);
      for (double s : seconds)
        result.op_delay_seconds = std::max(result.op_delay_seconds, s - typical[key]);
    }
    if (!latencies[stage].empty()) result.message_latency[stage] = median(latencies[stage]);
    for (int chunk = 0; chunk < chunks; ++chunk) {
      PipeSimCosts& c = costs[stage][chunk];
      c.forward = typical[{chunk, PipeOpKind::Forward}];
      c.comm = result.message_latency[stage];
      if (splits_backward(parse_schedule_kind(schedule))) {
        c.weight = typical[{chunk, PipeOpKind::BackwardWeight}];
        c.backward = typical[{chunk, PipeOpKind::BackwardInput}] + c.weight;
      } else {
        c.backward = typical[{chunk, PipeOpKind::Backward}];
        c.weight = 0;
      }
      EXPECT_GT(c.forward, 0) << schedule << " stage " << stage << " chunk " << chunk;
      EXPECT_GT(c.backward, 0) << schedule << " stage " << stage << " chunk " << chunk;
    }
  }
  std::vector<std::vector<PipeOp>> ops;
  for (int stage = 0; stage < 2; ++stage)
    ops.push_back(pipeline_schedule(parse_schedule_kind(schedule), stage, 2, kMicro, chunks));
  // Each measured step simulated with the durations its own ops took: an op the machine
  // stalled (the hypervisor's steal, ~110 ms on these VMs) is in the simulation as in the
  // step, and what is compared is the schedule's order and waits. The median step by its
  // measured bubble is the one compared.
  std::vector<std::pair<double, double>> compared;  // (measured, simulated) per step
  for (size_t i = 0; i < measured.size(); ++i) {
    const auto& took = op_seconds[i];
    const PipeSimResult sim = simulate_pipeline_per_op(
        ops, kMicro, costs,
        [&](int stage, const PipeOp& op) {
          const auto it = took.find({stage, to_string(op)});
          EXPECT_NE(it, took.end()) << schedule << " stage " << stage << " " << to_string(op);
          return it == took.end() ? 0.0 : it->second;
        },
        chunks);
    EXPECT_TRUE(sim.ok) << sim.error;
    compared.emplace_back(measured[i], sim.bubble_fraction());
  }
  std::sort(compared.begin(), compared.end());
  std::tie(result.measured, result.simulated) = compared[compared.size() / 2];
  return result;
}

// The measured bubble may differ from the simulated one by this much (absolute fraction of the
// pipeline's time). What the simulation of a step with its own op durations leaves out: the
// spread of the message latency around its median, a stall that lands on a rank while it
// waits, and the receive and send ops' own time. Observed on the 2-vCPU VM: at most 0.013 in
// three runs alone, at most 0.024 in three runs beside a busy process (1.5 processes a vCPU).
// (At each chunk's median costs instead of the step's own: up to 0.045 under load, 0.153 in a
// CI run whose ZB-H2 ops the hypervisor had stalled.) The schedules differ by more: 0.20 (1F1B,
// GPipe) against 0.11 (interleaved, v = 2) and 0.08 (ZB-H1) in theory.
constexpr double kBubbleTolerance = 0.06;

}  // namespace

TEST(TimelineTrace, OneFOneBPp2HasOneSlicePerScheduledOp) { check_trace("1f1b"); }
TEST(TimelineTrace, GPipePp2HasOneSlicePerScheduledOp) { check_trace("gpipe"); }
TEST(TimelineTrace, ZeroBubblePp2HasOneSlicePerScheduledOp) { check_trace("zb-h1"); }
TEST(TimelineTrace, ZeroBubbleH2Pp2HasOneSlicePerScheduledOp) { check_trace("zb-h2"); }
// Slices named with their chunk ("F3:1"), one per op of each chunk.
TEST(TimelineTrace, InterleavedPp2V2HasOneSlicePerScheduledOp) { check_trace("interleaved"); }

// Each schedule is measured until a run is quiet, at most kBubbleMaxRuns times, and its
// quietest run kept: the one whose most delayed op ran the least past the median of its kind.
// The simulation follows each op's own time, but the order the theory gives holds where the
// ops of a kind cost the same; a slow spell of the machine stretches some ops of a run and not
// others, and the other stage's wait for them is bubble the schedule did not make (beside a
// busy process GPipe measured 0.239 against 1F1B's 0.299, the simulation 0.242 and 0.289).
// On the 2-vCPU VMs one op in a run's three steps often takes ~100 ms more than its
// 10: the hypervisor's steal (a plain C spin loop on both vCPUs sees the same 110 ms stalls,
// 5-9 in 1,500 iterations of a few ms, while /proc/stat's steal count grows); seen in CI,
// every one of three ZB-H2 runs so disturbed (steps of 234-240 ms against 137 for ZB-H1, a
// bubble of 0.234 against the simulator's 0.081 at the median costs). A run is quiet when no op
// ran more than kQuietDelaySeconds (one or two scheduler ticks; at most 0.04 of a ~130 ms step)
// past its kind's median. Chosen on the op times alone, never on the comparison.
constexpr int kBubbleMaxRuns = 8;
constexpr double kQuietDelaySeconds = 0.005;

TEST(MeasuredBubble, Pp2SchedulesOrderAsTheoryAndMatchTheSimulator) {
  std::map<std::string, BubbleResult> r;
  std::map<std::string, std::vector<std::pair<double, double>>> runs;  // (step, op delay)
  for (const std::string schedule : {"1f1b", "gpipe", "interleaved", "zb-h1", "zb-h2"})
    for (int run = 0; run < kBubbleMaxRuns; ++run) {
      BubbleResult b = measure_bubble(schedule);
      runs[schedule].emplace_back(b.step_seconds, b.op_delay_seconds);
      if (run == 0 || b.op_delay_seconds < r[schedule].op_delay_seconds)
        r[schedule] = std::move(b);
      // Rank 0 holds the measurements; every rank must run the same number of times.
      int enough = r[schedule].op_delay_seconds <= kQuietDelaySeconds;
      MPI_Bcast(&enough, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (enough) break;
    }
  if (world_rank() != 0) return;
  for (const auto& [schedule, b] : r) {
    std::printf("[ bubble %-11s ] measured %.3f, simulator %.3f | step %.1f ms, op delay %.1f ms "
                "(runs, step/delay ms:", schedule.c_str(), b.measured, b.simulated,
                1e3 * b.step_seconds, 1e3 * b.op_delay_seconds);
    for (const auto& [step, delay] : runs[schedule])
      std::printf(" %.0f/%.1f", 1e3 * step, 1e3 * delay);
    std::printf(") |");
    for (int stage = 0; stage < 2; ++stage) {
      std::printf(" stage %d:", stage);
      for (const auto& [key, seconds] : b.op_seconds[stage])
        std::printf(" %s%s %.1f", to_string(key.second).c_str(),
                    key.first ? (":" + std::to_string(key.first)).c_str() : "", 1e3 * seconds);
      std::printf(" latency %.1f ms", 1e3 * b.message_latency[stage]);
    }
    std::printf("\n");
    EXPECT_NEAR(b.measured, b.simulated, kBubbleTolerance) << schedule;
  }
  // Theory at p = 2, m = 4 (F = 1, B = 2): 1F1B and GPipe 0.20, interleaved v = 2 0.11, ZB-H1
  // 0.08 (B = BI + W).
  EXPECT_GT(r["1f1b"].measured, r["zb-h1"].measured);
  EXPECT_GT(r["1f1b"].measured, r["zb-h2"].measured);
  EXPECT_GT(r["1f1b"].measured, r["interleaved"].measured);
  EXPECT_GE(r["gpipe"].measured, r["1f1b"].measured - kBubbleTolerance);
  // Interleaved against ZB-H1: their theoretical bubbles differ by less than the tolerance, and
  // which is lower depends on the real costs (interleaved pays twice the messages; ZB-H1's W
  // fills the cooldown only as far as W is long). The simulator at the measured costs predicts
  // the order; asserted only where its predicted gap exceeds the tolerance.
  const double predicted_gap = r["interleaved"].simulated - r["zb-h1"].simulated;
  if (std::abs(predicted_gap) > kBubbleTolerance) {
    if (predicted_gap > 0)
      EXPECT_GT(r["interleaved"].measured, r["zb-h1"].measured);
    else
      EXPECT_LT(r["interleaved"].measured, r["zb-h1"].measured);
  }
  std::printf("[ bubble order ] interleaved - zb-h1: simulator %+.3f, measured %+.3f (%s)\n",
              predicted_gap, r["interleaved"].measured - r["zb-h1"].measured,
              std::abs(predicted_gap) > kBubbleTolerance ? "order asserted"
                                                         : "within the tolerance: not asserted");
}

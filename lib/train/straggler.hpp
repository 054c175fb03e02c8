#pragma once
// The straggler report: every log.straggler_interval steps, each rank's compute and
// communication time per step since the last report are gathered (one all-gather of two
// numbers per rank over the world group) and rank 0 names the slowest ranks, with their time
// relative to the median of all ranks, in one log line and one metrics.jsonl record:
//   straggler report, steps 101-200 (ms per step): compute median 41.2, slowest rank 3 x1.52
//   (62.6), rank 0 x1.01 (41.6), rank 5 x1.00 (41.2); communication median 12.0, most rank 2
//   x2.10 (25.2), ...
//   {"type": "straggler", "step": 200, "steps": 100, "compute_ms": [...], "comm_ms": [...],
//    "slowest": [{"rank": 3, "score": 1.52}, ...]}
// Compute is wall time minus the time inside communication calls (the communicators' counted
// seconds), so it also holds evaluation, logging and checkpoint writes of those steps. A slow
// rank shows a high compute score; its peers, which wait for it inside collectives, show a
// high communication score.
//
// Test hook (util/test_hooks.hpp): TRIDENT_TEST_SLOW_RANK = "rank:ms" makes world rank `rank`
// sleep that many milliseconds per step (counted as compute).
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace trident {

class Communicator;
class MetricsLog;
class ParallelDims;
struct Config;

struct RankScore {
  int rank = 0;
  double ms = 0;     // per step
  double score = 0;  // ms / median over ranks (1 when the median is 0)
};

// Every rank's entry, the highest score first (ties: lower rank first).
std::vector<RankScore> rank_by_score(const std::vector<double>& ms_per_rank);
double median_of(std::vector<double> values);

// The report of steps [first_step, last_step] (1-based) from per-rank ms per step; `shown`:
// how many ranks the line names per kind.
std::string format_straggler_line(int64_t first_step, int64_t last_step,
                                  const std::vector<double>& compute_ms,
                                  const std::vector<double>& comm_ms, int shown = 3);
nlohmann::json straggler_record(int64_t last_step, int64_t steps,
                                const std::vector<double>& compute_ms,
                                const std::vector<double>& comm_ms, int shown = 3);

// The communicators whose seconds are a trainer rank's communication time: every host
// communicator of the table once, and on a GPU run over NCCL its device communicators (staged
// MPI ones are counted by the host communicators they run on).
std::vector<const Communicator*> timed_communicators(const ParallelDims& groups,
                                                     const Config& config);

class StragglerReport {
 public:
  // interval 0: off (step_done does nothing but the test hook). `comms`: the communicators
  // whose seconds are this rank's communication time. `log`: rank 0's, else nullptr. The
  // first window starts now.
  StragglerReport(int64_t interval, Communicator& world, std::vector<const Communicator*> comms,
                  MetricsLog* log);
  // After step `step` (0-based). Collective over `world` when (step + 1) % interval == 0.
  void step_done(int64_t step);

 private:
  double comm_seconds() const;

  int64_t interval_;
  Communicator& world_;
  std::vector<const Communicator*> comms_;
  MetricsLog* log_;
  int slow_ms_ = 0;  // TRIDENT_TEST_SLOW_RANK's delay for this rank
  double window_start_ = 0, comm_at_start_ = 0;
  int64_t first_step_ = -1;  // of the window, 0-based; -1: none yet
};

}  // namespace trident

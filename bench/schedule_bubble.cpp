// The theoretical bubble of one pipeline schedule, two ways: the closed form and the simulator
// (pipeline/simulator.hpp) with F = 1, B = 2 (BI = W = 1 under zb-h1/h2; each chunk 1/v of that
// under interleaved). bench/pipeline_schedules.sh prints them beside the measured bubble.
//   bench_schedule_bubble SCHEDULE STAGES MICROBATCHES [VIRTUAL_STAGES]
// prints "closed_form simulator" (fractions of the pipeline's time spent idle; "-" for a
// closed form that does not exist: ZB-H2 with m < 2p - 1).
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "pipeline/schedule.hpp"
#include "pipeline/simulator.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

// Idle fraction: (p-1)/(v m + p-1) for GPipe, 1F1B (v = 1) and interleaved; ZB-H1's deferred
// weight gradients fill two thirds of 1F1B's idle time when F = B = W: (p-1)/(3m + p-1), and
// ZB-H2's the same for m >= 2p - 1 (below that it has no closed form: std::nullopt).
std::optional<double> closed_form(ScheduleKind kind, int p, int64_t m, int v) {
  const double idle = p - 1;
  if (kind == ScheduleKind::ZeroBubbleH2 && m < 2 * int64_t{p} - 1) return std::nullopt;
  if (splits_backward(kind)) return idle / (3.0 * m + idle);
  return idle / (static_cast<double>(v) * m + idle);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::fprintf(stderr, "usage: %s SCHEDULE STAGES MICROBATCHES [VIRTUAL_STAGES]\n", argv[0]);
    return 2;
  }
  try {
    const ScheduleKind kind = parse_schedule_kind(argv[1]);
    const int p = std::atoi(argv[2]), v = argc == 5 ? std::atoi(argv[4]) : 1;
    const int64_t m = std::atoll(argv[3]);
    const PipeSimCosts chunk{1.0 / v, 2.0 / v, 0.0, 1.0 / v};
    const PipeSimResult r = simulate_pipeline(kind, p, m, chunk, v);
    if (!r.ok) throw Error("simulator: " + r.error);
    const std::optional<double> closed = closed_form(kind, p, m, v);
    if (closed)
      std::printf("%.4f %.4f\n", *closed, r.bubble_fraction());
    else
      std::printf("- %.4f\n", r.bubble_fraction());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_schedule_bubble: %s\n", e.what());
    return 1;
  }
  return 0;
}

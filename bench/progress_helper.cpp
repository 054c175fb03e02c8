// The cost of one overlapped collective's hand-over to comm.hpp's ProgressHelper, without MPI:
// during() of a request that never completes, around work that spins for 0, 100 and 300 us,
// timed against the work alone. What is left is the caller's share of the hand-over (waking
// the helper, taking the request back), paid once per overlapped collective under
// parallel.tp_overlap. Prints one line per work length; --poll-us sets the helper's poll.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/comm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct NeverDone final : trident::CommRequest {
  bool test() override { return false; }
  void wait() override {}
};

void spin_for(std::chrono::microseconds d) {
  const auto end = Clock::now() + d;
  while (Clock::now() < end) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  long poll_us = 50;
  if (argc == 3 && std::strcmp(argv[1], "--poll-us") == 0) {
    char* end = nullptr;
    poll_us = std::strtol(argv[2], &end, 10);
    if (*end != '\0' || poll_us < 1) {
      std::fprintf(stderr, "bench_progress_helper: --poll-us %s must be a whole number >= 1\n",
                   argv[2]);
      return 2;
    }
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: bench_progress_helper [--poll-us N]\n");
    return 2;
  }
  trident::ProgressHelper helper{std::chrono::microseconds(poll_us)};
  constexpr int kReps = 2000;
  for (int work_us : {0, 100, 300}) {
    const std::chrono::microseconds work(work_us);
    auto start = Clock::now();
    for (int i = 0; i < kReps; ++i) spin_for(work);
    const double alone = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    start = Clock::now();
    for (int i = 0; i < kReps; ++i) {
      NeverDone request;
      helper.during(request, [&] { spin_for(work); });
    }
    const double with = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    std::printf("work %3d us, poll %ld us: during() %.1f us a call, %.1f us over the work alone\n",
                work_us, poll_us, with / kReps, (with - alone) / kReps);
  }
  return 0;
}

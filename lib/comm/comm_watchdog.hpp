#pragma once
// The collective watchdog: a rank that waits too long for a communication operation ends the
// whole job, naming what it waited for, instead of hanging until the scheduler's time limit.
//
// Bookkeeping. Every operation posted on a Communicator gets a per-group sequence number
// (Communicator::post); every wait for one (a blocking collective, or a request's wait()) is
// bracketed by a Communicator::WaitScope, which tells the rank's watchdog which group,
// operation and number the rank is waiting for, and since when.
//
// Design: a watchdog thread per rank. A blocking MPI call cannot be interrupted, so the thread
// looks at the rank's current wait every poll period (timeout / 20, between 10 ms and 1 s) and,
// once it has lasted parallel.comm_timeout_s, calls on_timeout with one line naming the group,
// its world ranks, the operation, its number and the last completed number of that group. The
// trainer's on_timeout prints it, aborts the device's NCCL communicators (CommWatch) and calls
// MPI_Abort with kCommTimeoutExitCode, so mpiexec/srun kills every rank. MPI_Abort from a
// second thread while the first is inside MPI needs MPI_THREAD_MULTIPLE (app/main.cpp asks for
// it). Why not non-blocking calls polled with a deadline on the main thread: it would replace
// MPICH's blocking collective algorithms with the non-blocking ones everywhere, and the thread
// costs the hot path only two uncontended mutex operations per wait (measured: no change in
// step time, docs/reliability.md). A rank that is stuck in computation (or stopped, SIGSTOP)
// is not waiting: its peers are, in the operation it never joins, and they end the job.
//
// Checkpoint I/O. A checkpoint's collective HDF5 calls wait inside MPI-IO, not in a
// Communicator, so a rank stopped during a write (SIGSTOP) or a file system that stops
// answering would leave the others waiting there for ever. The trainer brackets every
// checkpoint write and read with an IoScope; the same thread ends the job once one has lasted
// checkpoint.io_timeout_s (longer than a collective: a large write takes minutes), with one
// line naming the file and the key. Which rank did not arrive is not known there (MPI-IO does
// not say): the line comes from the ranks that wait, never from the stalled one.
//
// Not covered: waits before the watchdog starts (the grid's construction).
//
// Pure C++ (no MPI): tests/test_comm_watchdog.cpp drives it with a fake clock.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "comm/comm.hpp"
#include "comm/comm_watch.hpp"

namespace trident {

// The exit code of a job ended by the watchdog: distinct from 1 (an error) and from 75 (stopped
// and checkpointed: requeue). A rerun may succeed (a node or link failed), but the job did not
// save anything, so it is not a requeue request.
inline constexpr int kCommTimeoutExitCode = 76;

// Test hook (TRIDENT_TEST_SKIP_COLLECTIVE = "rank:group:seq", util/test_hooks.hpp):
// world rank `rank` never joins operation number `seq` of group `group`: it stalls there, as a
// rank would that took another path, and its peers' watchdogs end the job.
struct SkipHook {
  int rank = -1;  // -1: no hook
  std::string group;
  int64_t seq = 0;
};
// Parses "rank:group:seq"; throws trident::Error naming the variable on a malformed value.
SkipHook parse_skip_hook(const std::string& text);

class CommWatchdog {
 public:
  using OnTimeout = std::function<void(const std::string& line)>;
  // world_rank: for the line. timeout_s > 0.
  CommWatchdog(int world_rank, double timeout_s, OnTimeout on_timeout,
               WaitClock clock = WaitClock::steady());
  ~CommWatchdog();  // stops the thread
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  // Checkpoint I/O's limit (seconds, > 0; throws trident::Error otherwise) and the key that set
  // it, for the line. Before start(): the thread's poll period follows the shorter limit.
  // Unset, checkpoint I/O is not watched.
  void set_io_timeout(double seconds, std::string key);
  // Starts the watchdog thread (once). Without it, check() can still be called by hand.
  void start();
  void stop();
  double timeout_s() const { return timeout_s_; }
  double io_timeout_s() const { return io_timeout_s_; }
  double poll_seconds() const;

  // The rank is in checkpoint I/O (`what`: "writing checkpoint 'PATH'") from now on / no
  // longer. Not nested.
  void io_begin(const std::string& what);
  void io_end();
  // io_begin .. io_end over a scope; a null watchdog watches nothing.
  class IoScope {
   public:
    IoScope(CommWatchdog* watchdog, const std::string& what);
    ~IoScope();
    IoScope(const IoScope&) = delete;
    IoScope& operator=(const IoScope&) = delete;

   private:
    CommWatchdog* watchdog_;
  };

  // The rank waits for operation `seq` (`op`) of `comm` from now on / no longer.
  void wait_begin(const Communicator& comm, const std::string& op, int64_t seq);
  void wait_end();
  // The timeout line when the current wait has lasted timeout_s or more, or the current
  // checkpoint I/O io_timeout_s or more, else "".
  std::string check() const;

  void set_skip_hook(SkipHook hook) { skip_ = std::move(hook); }
  // Called by Communicator::post: when the hook names this rank, `comm` and `seq`, prints one
  // line on stderr and sleeps forever (never returns).
  void maybe_stall(const Communicator& comm, const std::string& op, int64_t seq) const;

 private:
  void run();

  int world_rank_;
  double timeout_s_;
  OnTimeout on_timeout_;
  WaitClock clock_;
  SkipHook skip_;

  // The current wait (the main thread writes, the watchdog thread reads).
  mutable std::mutex mutex_;
  const Communicator* comm_ = nullptr;  // nullptr: not waiting
  const std::string* op_ = nullptr;
  int64_t seq_ = 0, completed_before_ = 0;
  double since_ = 0;
  // The current checkpoint I/O ("": none), under the same mutex.
  double io_timeout_s_ = 0;  // 0: not watched
  std::string io_key_;
  std::string io_what_;
  double io_since_ = 0;

  std::thread thread_;
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
};

}  // namespace trident

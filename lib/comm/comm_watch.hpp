#pragma once
// Bounded waits on device streams that carry communication, and the abort that ends them.
//
// Why. A GPU stream that holds an NCCL operation finishes only once every peer has joined it:
// with a dead or stalled peer, cudaStreamSynchronize (or a blocking copy, or cudaFree, which
// waits for the device) never returns and the job hangs, silently, until the scheduler kills
// it. So no host wait on such a stream blocks: it polls (bounded_wait) the stream's completion,
// the communicators' asynchronous errors (ncclCommGetAsyncError) and the clock. On an
// asynchronous error, or once the communication timeout has passed, every communicator of the
// rank is aborted (ncclCommAbort ends their kernels, so the stream can drain) and a
// trident::Error is thrown naming the rank, the wait, and each communicator with the last
// operation posted on it.
//
// Teardown. While an exception unwinds, device memory must not be freed (cudaFree waits for the
// device) and no stream synchronised before the communicators are aborted: a kernel of theirs
// may wait for a peer that is gone. Device-memory deleters and device destructors call
// CommWatch::before_teardown(), which aborts every communicator first when an exception is
// unwinding, so the abort comes before the first free whatever order objects are destroyed in.
// Consequence: an exception that unwinds through an owner of device memory ends the rank's
// communication, even if it is caught later; recoverable errors must be handled before they
// unwind through such owners (none in the trainer today: every error ends the job).
//
// This file is pure C++ (no CUDA, no NCCL, no MPI): the GPU code (cuda/cuda_device.cpp,
// cuda/nccl_comm.cpp) plugs its queries in as functions, and tests/test_comm_wait.cpp drives
// it with fakes (a stream that never completes, an injected asynchronous error, a fake clock).
//
// Timeout: the config's parallel.comm_timeout_s (the GPU backend passes it), which the
// environment variable TRIDENT_COMM_TIMEOUT_S (seconds, > 0) overrides when set; the same limit
// as the collective watchdog's (comm/comm_watchdog.hpp). A timeout throws CommTimeoutError, so
// the job ends with the watchdog's exit code.
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace trident {

inline constexpr double kDefaultCommTimeoutSeconds = 600.0;
inline constexpr const char* kCommTimeoutEnv = "TRIDENT_COMM_TIMEOUT_S";

// TRIDENT_COMM_TIMEOUT_S when set (throws trident::Error unless it is a number > 0), else
// kDefaultCommTimeoutSeconds.
double comm_timeout_from_env();
// TRIDENT_COMM_TIMEOUT_S when set (checked as above), else `configured`
// (parallel.comm_timeout_s).
double comm_timeout_seconds(double configured);
// What set the timeout, for the lines that cite it: "TRIDENT_COMM_TIMEOUT_S" when that is set,
// else "parallel.comm_timeout_s".
std::string comm_timeout_key();

// The clock a bounded wait reads and the sleep between its polls (seconds); injectable so a
// test runs a 600 s timeout in no time.
struct WaitClock {
  std::function<double()> now;
  std::function<void(double)> sleep;
  static WaitClock steady();  // std::chrono::steady_clock and std::this_thread::sleep_for
};

enum class WaitEnd { Done, AsyncError, TimedOut };

struct WaitResult {
  WaitEnd end = WaitEnd::Done;
  std::string error;     // the asynchronous error (AsyncError)
  double seconds = 0;    // time waited
};

// Polls is_done() until it returns true (Done), async_error() returns a non-empty text
// (AsyncError, the text in .error), or timeout_s seconds have passed since the call (TimedOut).
// Polls back to back at first, then sleeps between polls, growing to 1 ms (the latency a wait
// adds is at most that). is_done() is polled before the first clock read, so a finished wait
// returns at once. Exceptions of is_done/async_error propagate. Never throws otherwise.
WaitResult poll_until(const std::function<bool()>& is_done,
                      const std::function<std::string()>& async_error, double timeout_s,
                      const WaitClock& clock = WaitClock::steady());

// poll_until; on AsyncError or TimedOut calls on_failure() (the abort), then throws
// trident::Error(describe(result)) (TimedOut: trident::CommTimeoutError). If is_done or async_error throws, on_failure() runs too
// before the exception propagates (a failed stream is no reason to leave peers waiting).
void bounded_wait(const std::function<bool()>& is_done,
                  const std::function<std::string()>& async_error, double timeout_s,
                  const std::function<std::string(const WaitResult&)>& describe,
                  const std::function<void()>& on_failure,
                  const WaitClock& clock = WaitClock::steady());

// The communicators whose work a rank's device stream carries, seen from that stream's waits.
// One per rank (the GPU backend owns it, shared with the device and its communicators).
// Thread-safe: a watchdog thread may call abort_all() while the main thread waits.
class CommWatch {
 public:
  // rank: the world rank, for messages. timeout_s <= 0: comm_timeout_from_env().
  explicit CommWatch(int rank, double timeout_s = 0, WaitClock clock = WaitClock::steady());
  CommWatch(const CommWatch&) = delete;
  CommWatch& operator=(const CommWatch&) = delete;

  // A communicator joins: its name, how many library communicators it holds (NCCL comms, for
  // the start line), its asynchronous-error query ("" = none) and its abort (must be safe to
  // call once from any state; the watch calls it at most once). Returns its id.
  int add(const std::string& name, int handles, std::function<std::string()> async_error,
          std::function<void()> abort);
  // A communicator leaves (its destructor; after that the watch never calls it).
  void remove(int id);
  // The member posted `op` (kept as "the last operation" for error messages, with a count).
  void posted(int id, const std::string& op);

  int rank() const { return rank_; }
  double timeout_s() const { return timeout_s_; }
  // True when some member is live (not removed, not aborted): waits must then be bounded.
  bool active() const;
  // Library communicators of the live members, and "3 (tensor 1, pipeline 2)" for the log.
  int handle_count() const;
  std::string summary() const;
  bool aborted() const;

  // The first member's asynchronous error, as "communicator 'data': <error>", or "".
  std::string async_error() const;
  // Aborts every live member, once (later calls do nothing); `reason` is kept for messages.
  void abort_all(const std::string& reason);
  // "communicator 'data' all_reduce (call 42), communicator 'pipeline' recv (call 17)" or
  // "none".
  std::string last_operations() const;

  // Non-blocking: when a member reports an asynchronous error, aborts every member and throws
  // trident::Error ("rank 3: communicator 'pipeline' reported an asynchronous error: ... (during
  // <what>); last operations posted: ...; all communicators of this rank aborted").
  void check(const std::string& what);
  // bounded_wait on is_done with the members' asynchronous errors and this watch's timeout
  // and clock; on failure aborts every member and throws trident::Error:
  //   "rank 3: communication timeout: <what> did not finish within 600 s; last operations
  //    posted: ...; all communicators of this rank aborted (a peer failed or stalled;
  //    parallel.comm_timeout_s sets the limit)"
  //   "rank 3: communicator 'pipeline' reported an asynchronous error during <what>: <error>;
  //    last operations posted: ...; all communicators of this rank aborted"
  void wait(const std::function<bool()>& is_done, const std::string& what);
  // The same wait for a destructor: never throws; false when it timed out or failed (the
  // members are then aborted).
  bool wait_quietly(const std::function<bool()>& is_done, const std::string& what) noexcept;

  // For device-memory deleters and device destructors. When an exception is unwinding and a
  // member is live, aborts every member first (once). Returns true when the caller must not
  // wait for its stream (the members were aborted: an error is being handled).
  bool before_teardown() noexcept;

 private:
  struct Member {
    int id;
    std::string name;
    int handles;
    std::function<std::string()> async_error;
    std::function<void()> abort;
    std::string last_op;
    int64_t calls = 0;
    bool live = true;
  };
  std::string describe_failure(const WaitResult& r, const std::string& what) const;

  int rank_;
  double timeout_s_;
  WaitClock clock_;
  mutable std::recursive_mutex mutex_;
  std::vector<Member> members_;
  int next_id_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace trident

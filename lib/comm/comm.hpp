#pragma once
// One communication interface for every process group (tensor, pipeline, data, embedding, ...).
// MPI implements it now; NCCL implements the same interface for the GPU backend. Every call is
// counted per group (calls, bytes, seconds) so tests can assert the collective pattern of a
// training step and the log can print where communication time went.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace trident {

class CommWatchdog;  // comm/comm_watchdog.hpp

enum class DType { F32, F64, I32, I64, BF16 };
enum class ReduceOp { Sum, Max };

size_t dtype_bytes(DType t);

struct OpStats {
  int64_t calls = 0;
  int64_t bytes = 0;   // payload bytes this rank contributed (count * dtype size)
  double seconds = 0;  // wall time inside the call (for non-blocking p2p: inside wait)
  int64_t posted = 0;  // of `calls`, those posted non-blocking (MPI's i* calls), waited later
};

// The operation names the counters are kept under.
inline const std::string kAllReduce = "all_reduce";
inline const std::string kAllGather = "all_gather";
inline const std::string kReduceScatter = "reduce_scatter";
inline const std::string kBroadcast = "broadcast";
inline const std::string kSend = "send";
inline const std::string kRecv = "recv";
inline const std::string kBarrier = "barrier";
inline const std::string kAllToAll = "all_to_all";

// Counts per operation name (the names above).
struct CommStats {
  std::map<std::string, OpStats> ops;
  // With keep_all_reduce_counts set, each all-reduce's element count is also appended to
  // all_reduce_counts (tests check the sizes of the calls). Off by default: a run's list would
  // grow with every step and never shrink.
  bool keep_all_reduce_counts = false;
  std::vector<int64_t> all_reduce_counts;
  // Zeroes the counts; keep_all_reduce_counts stays as set.
  void reset() {
    const bool keep = keep_all_reduce_counts;
    *this = CommStats{};
    keep_all_reduce_counts = keep;
  }
  int64_t calls(const std::string& op) const {
    auto it = ops.find(op);
    return it == ops.end() ? 0 : it->second.calls;
  }
  int64_t bytes(const std::string& op) const {
    auto it = ops.find(op);
    return it == ops.end() ? 0 : it->second.bytes;
  }
};

// A pending non-blocking send or receive.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  // Lets the library make progress without blocking; true once the operation is complete.
  virtual bool test() = 0;
};

class Communicator;

// A helper thread, kept for the life of this object, that drives one request at a time.
// during(request, work) runs `work` (computation, no communication call) on the calling thread
// while the helper calls test() on `request` every `poll` (a busy-polling MPI progresses a
// non-blocking collective only inside MPI calls, and a GEMM makes none), then waits for the
// request: the collective overlaps the work. The helper has let go of the request before
// during() returns or throws; an error of test() is rethrown by during(). Kept rather than
// started per call: an overlapped collective costs no thread start and no allocation. Only
// where the request's communicator says progress_from_helper_thread(); one calling thread.
//
// The caller never sleeps on the helper: hand_over() wakes it without waiting, and take_back()
// clears the request and waits only while a test() is running (microseconds), not for the
// helper to wake from its poll. Waiting for that wake-up (a condition variable handshake each
// way, and the end of a 50 us sleep) cost 33-107 us per call on a 2-vCPU VM
// (bench_progress_helper), 2-4 % of a 2-rank TP step there (docs/model.md).
class ProgressHelper {
 public:
  explicit ProgressHelper(std::chrono::microseconds poll = std::chrono::microseconds(50));
  ~ProgressHelper();
  ProgressHelper(const ProgressHelper&) = delete;
  ProgressHelper& operator=(const ProgressHelper&) = delete;

  template <class Work>
  void during(CommRequest& request, Work&& work) {
    hand_over(request);
    try {
      work();
    } catch (...) {
      take_back();
      failure_ = nullptr;  // the work's error is the one to report
      throw;
    }
    take_back();
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
    request.wait();  // returns at once when the helper saw it complete
  }

 private:
  void hand_over(CommRequest& request);  // the helper starts driving `request`
  void take_back();                      // it stops; returns once it has let go
  void drive();                          // the helper thread's loop

  const std::chrono::microseconds poll_;
  std::mutex mutex_;                 // quit_, handed_over_ and the helper's sleep
  std::condition_variable wake_;     // a request handed over, or quit_
  bool quit_ = false;                // (mutex_)
  uint64_t handed_over_ = 0;         // hand_over() calls so far (mutex_)
  // The request being driven, null when none. The helper sets testing_ before it reads
  // request_ and take_back() clears request_ before it reads testing_ (both sequentially
  // consistent), so a test() never starts on a request taken back.
  std::atomic<CommRequest*> request_{nullptr};
  std::atomic<bool> testing_{false};
  std::exception_ptr failure_;  // test()'s error: written before testing_ falls, read after
  std::thread thread_;
};

// Sees every call of the communicators it is installed on (set_recorder), with its wall time:
// the timeline trace (train/timeline_trace.hpp) hooks in here once, not at each call site.
// Blocking calls: the whole call. Non-blocking ones (isend, irecv, iall_reduce): the MPI
// communicator reports the CommRequest::wait() that completes them (where this rank's time
// goes), the other implementations the post, with no duration.
class CommRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~CommRecorder() = default;
  // `op` is one of the operation names below; `bytes` as counted in OpStats.
  virtual void record(const Communicator& comm, const std::string& op, int64_t bytes,
                      Clock::time_point start, Clock::time_point end) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  const std::string& name() const { return name_; }

  virtual void all_reduce(void* data, int64_t count, DType type, ReduceOp op) = 0;
  // Non-blocking all-reduce in place (counted as an "all_reduce"; its time is the wait's).
  virtual std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType type,
                                                   ReduceOp op) = 0;
  // recv[size * count] = concatenation of every rank's send[count], in rank order.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType type) = 0;
  // Non-blocking all_gather (counted as an "all_gather"; its time is the wait's); send and recv
  // stay untouched by the caller until the wait (send may be recv + rank() * count: in place).
  // MPI posts MPI_Iallgather; the default (the other backends) runs the blocking call and
  // returns a completed request.
  virtual std::unique_ptr<CommRequest> iall_gather(const void* send, void* recv, int64_t count,
                                                   DType type);
  // send[size * count] summed over ranks; this rank receives block `rank()` of the sum.
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, DType type) = 0;
  // Non-blocking reduce_scatter (counted as a "reduce_scatter"; its time is the wait's); send
  // and recv stay untouched by the caller until the wait. MPI posts MPI_Ireduce_scatter_block;
  // the default (the other backends) runs the blocking call and returns a completed request.
  virtual std::unique_ptr<CommRequest> ireduce_scatter(const void* send, void* recv,
                                                       int64_t count, DType type);
  virtual void broadcast(void* data, int64_t count, DType type, int root) = 0;
  virtual std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType type,
                                             int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType type, int peer,
                                             int tag) = 0;
  virtual void barrier() = 0;
  // Whether a request of this communicator may be driven (test()) from a helper thread while
  // the calling thread makes no communication call (progress_during): MPI needs at least
  // MPI_THREAD_SERIALIZED for that. False unless an implementation says so.
  virtual bool progress_from_helper_thread() const { return false; }
  // Personalised exchange (MPI_Alltoallv with packed blocks): send holds send_counts[p]
  // elements for each rank p, back to back in rank order; recv receives recv_counts[p]
  // elements from each rank p, back to back in rank order. Both count vectors have size()
  // entries and every rank's recv_counts[q] must equal rank q's send_counts[rank()] (exchange
  // the counts first, e.g. with an all_to_all_v of one I64 each). Counted as one "all_to_all"
  // of the elements this rank sends (its own block included, so a token dispatch counts
  // tokens x top-k x width whatever the layout). MPI, NCCL (grouped ncclSend/ncclRecv), the
  // staged communicator and one-rank groups implement it; the default throws (a backend that
  // has none).
  virtual void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                            void* recv, const std::vector<int64_t>& recv_counts, DType type);

  // Typed conveniences.
  void all_reduce_sum(float* x, int64_t n) { all_reduce(x, n, DType::F32, ReduceOp::Sum); }
  void all_reduce_max(float* x, int64_t n) { all_reduce(x, n, DType::F32, ReduceOp::Max); }
  void all_reduce_sum(double* x, int64_t n) { all_reduce(x, n, DType::F64, ReduceOp::Sum); }
  void all_reduce_max(double* x, int64_t n) { all_reduce(x, n, DType::F64, ReduceOp::Max); }

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

  // nullptr: nothing recorded (the default). The recorder must outlive its use here.
  void set_recorder(CommRecorder* recorder) { recorder_ = recorder; }
  // A non-blocking call's wait that completed it: seconds + `seconds` (not calls or bytes,
  // counted when it was posted), and the recorder sees the wait as one `op` of `bytes`.
  void count_wait(const std::string& op, int64_t bytes, double seconds);
  // ---- Sequence numbers (comm/comm_watchdog.hpp) ----
  // Every operation posted on this communicator gets the next sequence number (1, 2, ...),
  // blocking or not; an operation is completed when its blocking call or its request's
  // wait()/test() has seen it finish. The numbers are per group: every rank of the group posts
  // the same operations in the same order, so "#42" names the same operation on every member.
  int64_t last_posted() const { return last_posted_; }
  int64_t last_completed() const { return last_completed_; }
  // The world ranks of this group, in group-rank order (empty when not known: a self group).
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // The watchdog told about every wait of this communicator (nullptr: none). Not owned; it
  // must outlive the communicator's operations (set nullptr before destroying it).
  void set_watchdog(CommWatchdog* watchdog) { watchdog_ = watchdog; }

  // For implementations (and their requests): post returns the operation's number (and runs
  // the watchdog's test hook, which may stall this rank forever); a WaitScope spans the time
  // a rank waits for operation `seq` (a blocking call, or a request's wait()), telling the
  // watchdog; completed(seq) marks it done.
  int64_t post(const std::string& op);
  void completed(int64_t seq) { last_completed_ = std::max(last_completed_, seq); }
  class WaitScope {
   public:
    WaitScope(Communicator& comm, const std::string& op, int64_t seq);
    ~WaitScope();  // the wait ended: completed(seq), and the watchdog is told
    WaitScope(const WaitScope&) = delete;
    WaitScope& operator=(const WaitScope&) = delete;

   private:
    Communicator& comm_;
    int64_t seq_;
  };

 protected:
  explicit Communicator(std::string name) : name_(std::move(name)) {}
  // Argument checks of every implementation: throw trident::Error naming this communicator
  // ("communicator 'tensor': all_reduce with negative count -1", "... isend peer 5 is not a
  // rank of this 2-rank group") before anything is sent or counted.
  void check_count(const char* op, int64_t count) const;
  void check_peer(const char* what, int peer) const;
  // all_to_all_v's count vectors: size() entries each, none negative; returns the send total.
  int64_t check_all_to_all_counts(const std::vector<int64_t>& send_counts,
                                  const std::vector<int64_t>& recv_counts) const;
  // One call of `op`: calls + 1, bytes + count * dtype size, seconds + seconds; the recorder
  // sees it as ending now.
  void count_call(const std::string& op, int64_t count, DType type, double seconds);
  // calls + 1, posted + 1 and bytes of a non-blocking call being posted (its time comes with
  // count_wait).
  void count_post(const std::string& op, int64_t count, DType type);
  // An all-reduce of `count` elements into stats_.all_reduce_counts, if it keeps them.
  void note_all_reduce_count(int64_t count) {
    if (stats_.keep_all_reduce_counts) stats_.all_reduce_counts.push_back(count);
  }
  std::string name_;
  CommStats stats_;
  CommRecorder* recorder_ = nullptr;
  std::vector<int> world_ranks_;
  int64_t last_posted_ = 0;
  int64_t last_completed_ = 0;
  CommWatchdog* watchdog_ = nullptr;
};

// A group of one rank: every collective is the identity, still counted (so a single-rank run
// reports the same call pattern as a parallel one).
std::unique_ptr<Communicator> make_self_communicator(const std::string& name);

// The same for buffers in a device's memory (a GPU's): the copies that all_gather,
// reduce_scatter and all_to_all_v make (send to recv) go through `copy` (dst, src, bytes), the
// device's own stream-ordered copy, never through the host. Point-to-point messages to oneself
// would be read on the host and are refused with an Error.
using DeviceCopy = std::function<void(void* dst, const void* src, int64_t bytes)>;
std::unique_ptr<Communicator> make_device_self_communicator(const std::string& name,
                                                            DeviceCopy copy);

}  // namespace trident

// dtype sizes, the operations' sequence numbers and the self communicator (a group of one
// rank).
#include "comm/comm.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <sstream>
#include <thread>

#include "comm/comm_watchdog.hpp"
#include "util/error.hpp"

namespace trident {

ProgressHelper::ProgressHelper(std::chrono::microseconds poll)
    : poll_(poll), thread_([this] { drive(); }) {}

ProgressHelper::~ProgressHelper() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ProgressHelper::hand_over(CommRequest& request) {
  {
    std::lock_guard lock(mutex_);  // so that the helper cannot miss the notification
    request_.store(&request);
    ++handed_over_;
  }
  wake_.notify_one();
}

void ProgressHelper::take_back() {
  request_.store(nullptr);
  while (testing_.load()) std::this_thread::yield();  // one test() at most
}

void ProgressHelper::drive() {
  std::unique_lock lock(mutex_);
  uint64_t seen = 0;  // the hand-overs this loop has started on
  for (;;) {
    wake_.wait(lock, [&] { return quit_ || request_.load() != nullptr; });
    if (quit_) return;
    seen = handed_over_;
    lock.unlock();
    testing_.store(true);
    if (CommRequest* request = request_.load()) {
      try {
        // Complete: stop testing it (unless taken back already, and another handed over).
        if (request->test()) request_.compare_exchange_strong(request, nullptr);
      } catch (...) {
        failure_ = std::current_exception();
        request_.compare_exchange_strong(request, nullptr);
      }
    }
    testing_.store(false);
    lock.lock();
    // Sleeps a poll between tests, so that the helper takes next to no core from the work; a
    // request taken back is seen at the poll's end, one handed over ends the poll at once.
    if (request_.load() != nullptr)
      wake_.wait_for(lock, poll_, [&] { return quit_ || handed_over_ != seen; });
  }
}

size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::BF16: return 2;
  }
  throw Error("dtype_bytes: unknown DType");
}

void Communicator::check_count(const char* op, int64_t count) const {
  if (count < 0) {
    std::ostringstream m;
    m << "communicator '" << name_ << "': " << op << " with negative count " << count;
    throw Error(m.str());
  }
}

void Communicator::check_peer(const char* what, int peer) const {
  if (peer < 0 || peer >= size()) {
    std::ostringstream m;
    m << "communicator '" << name_ << "': " << what << " " << peer << " is not a rank of this "
      << size() << "-rank group";
    throw Error(m.str());
  }
}

int64_t Communicator::check_all_to_all_counts(const std::vector<int64_t>& send_counts,
                                              const std::vector<int64_t>& recv_counts) const {
  const auto n = static_cast<size_t>(size());
  if (send_counts.size() != n || recv_counts.size() != n) {
    std::ostringstream m;
    m << "communicator '" << name_ << "': all_to_all_v needs " << n
      << " send and receive counts (one per rank), got " << send_counts.size() << " and "
      << recv_counts.size();
    throw Error(m.str());
  }
  int64_t total = 0;
  for (size_t p = 0; p < n; ++p) {
    check_count("all_to_all_v send", send_counts[p]);
    check_count("all_to_all_v receive", recv_counts[p]);
    total += send_counts[p];
  }
  return total;
}

namespace {
struct CompletedRequest final : CommRequest {
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

std::unique_ptr<CommRequest> Communicator::iall_gather(const void* send, void* recv,
                                                       int64_t count, DType type) {
  all_gather(send, recv, count, type);
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<CommRequest> Communicator::ireduce_scatter(const void* send, void* recv,
                                                           int64_t count, DType type) {
  reduce_scatter(send, recv, count, type);
  return std::make_unique<CompletedRequest>();
}

void Communicator::all_to_all_v(const void*, const std::vector<int64_t>&, void*,
                                const std::vector<int64_t>&, DType) {
  throw Error("communicator '" + name_ +
              "': all_to_all_v is not implemented by this backend (the MPI, NCCL, staged and "
              "one-rank communicators have it)");
}

namespace {

// The interval of `seconds` that ends now.
void record_ending_now(CommRecorder* recorder, const Communicator& comm, const std::string& op,
                       int64_t bytes, double seconds) {
  if (!recorder) return;
  const auto end = CommRecorder::Clock::now();
  const auto length = std::chrono::duration_cast<CommRecorder::Clock::duration>(
      std::chrono::duration<double>(seconds));
  recorder->record(comm, op, bytes, end - length, end);
}

}  // namespace

void Communicator::count_call(const std::string& op, int64_t count, DType type,
                              double seconds) {
  OpStats& s = stats_.ops[op];
  const int64_t bytes = count * static_cast<int64_t>(dtype_bytes(type));
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += seconds;
  record_ending_now(recorder_, *this, op, bytes, seconds);
}

void Communicator::count_post(const std::string& op, int64_t count, DType type) {
  OpStats& s = stats_.ops[op];
  s.calls += 1;
  s.posted += 1;
  s.bytes += count * static_cast<int64_t>(dtype_bytes(type));
}

void Communicator::count_wait(const std::string& op, int64_t bytes, double seconds) {
  stats_.ops[op].seconds += seconds;
  record_ending_now(recorder_, *this, op, bytes, seconds);
}

// Sequence numbers and waits, told to the rank's watchdog (comm/comm_watchdog.hpp).
int64_t Communicator::post(const std::string& op) {
  const int64_t seq = ++last_posted_;
  if (watchdog_) watchdog_->maybe_stall(*this, op, seq);
  return seq;
}

Communicator::WaitScope::WaitScope(Communicator& comm, const std::string& op, int64_t seq)
    : comm_(comm), seq_(seq) {
  if (comm_.watchdog_) comm_.watchdog_->wait_begin(comm_, op, seq);
}

Communicator::WaitScope::~WaitScope() {
  if (comm_.watchdog_) comm_.watchdog_->wait_end();
  comm_.completed(seq_);
}

namespace {

void check_one_rank_peer(const std::string& comm, const char* op, int peer) {
  if (peer != 0) {
    std::ostringstream m;
    m << "communicator '" << comm << "' has one rank: " << op << " peer " << peer
      << " does not exist";
    throw Error(m.str());
  }
}

// Every collective of a one-rank group is a copy at most; all are counted like the MPI ones
// (bytes = count * dtype size, the count argument of the call).
class SelfCommunicator final : public Communicator {
 public:
  // device_copy: empty for host memory (memmove), else the device's copy (device memory).
  SelfCommunicator(const std::string& name, DeviceCopy device_copy)
      : Communicator(name), device_copy_(std::move(device_copy)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }

  void all_reduce(void*, int64_t count, DType type, ReduceOp) override {
    check_count("all_reduce", count);
    count_call(kAllReduce, count, type, 0.0);
    note_all_reduce_count(count);
  }
  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType type,
                                           ReduceOp op) override {
    all_reduce(data, count, type, op);
    return std::make_unique<SendRequest>();  // already complete
  }
  void all_gather(const void* send, void* recv, int64_t count, DType type) override {
    check_count("all_gather", count);
    auto t0 = std::chrono::steady_clock::now();
    copy(send, recv, count, type);
    count_call(kAllGather, count, type, since(t0));
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType type) override {
    check_count("reduce_scatter", count);
    auto t0 = std::chrono::steady_clock::now();
    copy(send, recv, count, type);
    count_call(kReduceScatter, count, type, since(t0));
  }
  void broadcast(void*, int64_t count, DType type, int root) override {
    check_count("broadcast", count);
    check_one_rank_peer(name_, "broadcast root", root);
    count_call(kBroadcast, count, type, 0.0);
  }

  // A send to oneself is copied when it is posted (matched in order per tag, as MPI does);
  // a receive completes when a send with its tag has been posted, before or after it.
  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType type, int peer,
                                     int tag) override {
    check_count("isend", count);
    check_one_rank_peer(name_, "isend", peer);
    check_host_memory("isend");
    const size_t bytes = static_cast<size_t>(count) * dtype_bytes(type);
    count_call(kSend, count, type, 0.0);
    for (auto it = pending_recvs_.begin(); it != pending_recvs_.end(); ++it) {
      if ((*it)->tag == tag) {
        (*it)->deliver(data, bytes);
        pending_recvs_.erase(it);
        return std::make_unique<SendRequest>();
      }
    }
    Message msg;
    msg.tag = tag;
    msg.data.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    mailbox_.push_back(std::move(msg));
    return std::make_unique<SendRequest>();
  }

  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType type, int peer,
                                     int tag) override {
    check_count("irecv", count);
    check_one_rank_peer(name_, "irecv", peer);
    check_host_memory("irecv");
    count_call(kRecv, count, type, 0.0);
    auto state = std::make_shared<RecvState>();
    state->comm = name_;
    state->buf = data;
    state->capacity = static_cast<size_t>(count) * dtype_bytes(type);
    state->tag = tag;
    for (auto it = mailbox_.begin(); it != mailbox_.end(); ++it) {
      if (it->tag == tag) {
        state->deliver(it->data.data(), it->data.size());
        mailbox_.erase(it);
        return std::make_unique<RecvRequest>(state);
      }
    }
    pending_recvs_.push_back(state);
    return std::make_unique<RecvRequest>(state);
  }

  void barrier() override { count_call(kBarrier, 0, DType::F32, 0.0); }

  // The one block goes from send to recv.
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType type) override {
    const int64_t count = check_all_to_all_counts(send_counts, recv_counts);
    if (recv_counts[0] != count) {
      std::ostringstream m;
      m << "communicator '" << name_ << "': all_to_all_v sends " << count
        << " elements to itself but expects " << recv_counts[0];
      throw Error(m.str());
    }
    auto t0 = std::chrono::steady_clock::now();
    copy(send, recv, count, type);
    count_call(kAllToAll, count, type, since(t0));
  }

 private:
  struct Message {
    int tag = 0;
    std::vector<char> data;
  };
  struct RecvState {
    std::string comm;
    void* buf = nullptr;
    size_t capacity = 0;
    int tag = 0;
    bool done = false;
    void deliver(const void* src, size_t bytes) {
      if (bytes > capacity) {
        std::ostringstream m;
        m << "communicator '" << comm << "': message of " << bytes
          << " bytes is larger than the receive buffer of " << capacity << " bytes (tag " << tag
          << ")";
        throw Error(m.str());
      }
      if (bytes) std::memcpy(buf, src, bytes);
      done = true;
    }
  };
  struct SendRequest final : CommRequest {
    void wait() override {}
    bool test() override { return true; }
  };
  struct RecvRequest final : CommRequest {
    explicit RecvRequest(std::shared_ptr<RecvState> s) : state(std::move(s)) {}
    bool test() override { return state->done; }
    void wait() override {
      if (!state->done) {
        std::ostringstream m;
        m << "communicator '" << state->comm << "': waiting for a receive (tag " << state->tag
          << ") that no send on this rank matches: this would deadlock";
        throw Error(m.str());
      }
    }
    std::shared_ptr<RecvState> state;
  };

  static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void copy(const void* send, void* recv, int64_t count, DType type) {
    const size_t bytes = static_cast<size_t>(count) * dtype_bytes(type);
    if (bytes == 0 || send == recv) return;
    if (device_copy_)
      device_copy_(recv, send, static_cast<int64_t>(bytes));
    else
      std::memmove(recv, send, bytes);
  }
  // The mailbox holds messages in host memory: a device's buffers cannot go through it.
  void check_host_memory(const char* op) const {
    if (device_copy_)
      throw Error("communicator '" + name_ + "' (one rank, device memory): " + op +
                  " to itself is not supported");
  }

  DeviceCopy device_copy_;
  std::deque<Message> mailbox_;
  std::deque<std::shared_ptr<RecvState>> pending_recvs_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(const std::string& name) {
  return std::make_unique<SelfCommunicator>(name, DeviceCopy{});
}

std::unique_ptr<Communicator> make_device_self_communicator(const std::string& name,
                                                            DeviceCopy copy) {
  if (!copy) throw Error("make_device_self_communicator('" + name + "'): no copy function");
  return std::make_unique<SelfCommunicator>(name, std::move(copy));
}

}  // namespace trident

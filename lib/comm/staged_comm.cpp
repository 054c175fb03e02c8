// The staged communicator: device buffers communicated through host memory and a host
// communicator (see staged_comm.hpp for why and for the rules).
#include "comm/staged_comm.hpp"

#include <chrono>
#include <vector>

#include "util/error.hpp"

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t nbytes(int64_t count, DType type) {
  return count * static_cast<int64_t>(dtype_bytes(type));
}

// Host memory of a fixed size, owned by one non-blocking request.
using HostBuffer = std::unique_ptr<char[]>;

// A non-blocking host operation on the request's own staging buffer. A receive or all-reduce
// (device_dst != nullptr) copies the buffer to `device_dst` once, when the host operation is
// first seen complete; that copy and the wait are timed into stats.ops[*op], looked up at that
// time (stats().reset() may have cleared the map since the call was posted).
class StagedRequest final : public CommRequest {
 public:
  StagedRequest(Device& device, CommStats& stats, const std::string* op, HostBuffer buffer,
                void* device_dst, int64_t bytes)
      : device_(device), stats_(stats), op_(op), buffer_(std::move(buffer)),
        device_dst_(device_dst), bytes_(bytes) {}

  // The host request is posted after the staging buffer is in place (and uses it).
  void set_host_request(std::unique_ptr<CommRequest> r) { host_ = std::move(r); }
  char* buffer() { return buffer_.get(); }

  ~StagedRequest() override {
    if (complete_ || host_ == nullptr) return;
    // Never block here (an error may be unwinding). Completed after all: free normally.
    bool done = false;
    try {
      done = host_->test();
    } catch (...) {
    }
    host_.reset();  // MPI frees the operation (cancelling a receive) but may still use the buffer
    if (!done) (void)buffer_.release();  // so it is leaked on purpose, not freed under MPI
  }

  void wait() override {
    if (complete_) return;
    auto t0 = Clock::now();
    host_->wait();
    finish();
    stats_.ops[*op_].seconds += since(t0);
  }

  bool test() override {
    if (complete_) return true;
    if (!host_->test()) return false;
    auto t0 = Clock::now();
    finish();
    stats_.ops[*op_].seconds += since(t0);
    return true;
  }

 private:
  void finish() {
    if (device_dst_ != nullptr && bytes_ > 0) {
      device_.from_host(device_dst_, buffer_.get(), bytes_);
    }
    complete_ = true;
  }

  Device& device_;
  CommStats& stats_;  // the communicator's counters (the object, not a map entry)
  const std::string* op_;
  HostBuffer buffer_;
  void* device_dst_;  // nullptr: nothing to copy back (a send)
  int64_t bytes_;
  std::unique_ptr<CommRequest> host_;
  bool complete_ = false;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(Communicator& host, Device& device, std::string name)
      : Communicator(std::move(name)), host_(host), device_(device) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void all_reduce(void* data, int64_t count, DType type, ReduceOp op) override {
    check_count("all_reduce", count);
    const int64_t b = nbytes(count, type);
    auto t0 = Clock::now();
    char* h = staging(b);
    to_host(h, data, b);
    host_.all_reduce(h, count, type, op);
    from_host(data, h, b);
    count_call(kAllReduce, count, type, since(t0));
    note_all_reduce_count(count);
  }

  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType type,
                                           ReduceOp op) override {
    check_count("iall_reduce", count);
    const int64_t b = nbytes(count, type);
    auto req = std::make_unique<StagedRequest>(device_, stats_, &kAllReduce, new_buffer(b), data,
                                               b);
    to_host(req->buffer(), data, b);
    req->set_host_request(host_.iall_reduce(req->buffer(), count, type, op));
    count_call(kAllReduce, count, type, 0.0);
    note_all_reduce_count(count);
    return req;
  }

  void all_gather(const void* send, void* recv, int64_t count, DType type) override {
    check_count("all_gather", count);
    const int64_t b = nbytes(count, type);
    const int64_t total = b * size();
    auto t0 = Clock::now();
    // [ send block | all blocks ]: separate host buffers, whatever the device aliasing.
    char* h = staging(b + total);
    to_host(h, send, b);
    host_.all_gather(h, h + b, count, type);
    from_host(recv, h + b, total);
    count_call(kAllGather, count, type, since(t0));
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, DType type) override {
    check_count("reduce_scatter", count);
    const int64_t b = nbytes(count, type);
    const int64_t total = b * size();
    auto t0 = Clock::now();
    // The whole input is on the host before anything is written back, so send == recv (the
    // in-place form: input in recv[size * count], result to recv[0, count)) needs no care.
    char* h = staging(total + b);
    to_host(h, send, total);
    host_.reduce_scatter(h, h + total, count, type);
    from_host(recv, h + total, b);
    count_call(kReduceScatter, count, type, since(t0));
  }

  void broadcast(void* data, int64_t count, DType type, int root) override {
    check_count("broadcast", count);
    check_peer("broadcast root", root);
    const int64_t b = nbytes(count, type);
    auto t0 = Clock::now();
    char* h = staging(b);
    const bool is_root = root == rank();
    if (is_root) to_host(h, data, b);
    host_.broadcast(h, count, type, root);
    if (!is_root) from_host(data, h, b);
    count_call(kBroadcast, count, type, since(t0));
  }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType type, int peer,
                                     int tag) override {
    check_count("isend", count);
    check_peer("isend peer", peer);
    const int64_t b = nbytes(count, type);
    auto req =
        std::make_unique<StagedRequest>(device_, stats_, &kSend, new_buffer(b), nullptr, b);
    to_host(req->buffer(), data, b);
    req->set_host_request(host_.isend(req->buffer(), count, type, peer, tag));
    count_call(kSend, count, type, 0.0);
    return req;
  }

  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType type, int peer,
                                     int tag) override {
    check_count("irecv", count);
    check_peer("irecv peer", peer);
    const int64_t b = nbytes(count, type);
    auto req = std::make_unique<StagedRequest>(device_, stats_, &kRecv, new_buffer(b), data, b);
    req->set_host_request(host_.irecv(req->buffer(), count, type, peer, tag));
    count_call(kRecv, count, type, 0.0);
    return req;
  }

  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType type) override {
    const int64_t sent = check_all_to_all_counts(send_counts, recv_counts);
    int64_t received = 0;
    for (int64_t c : recv_counts) received += c;
    const int64_t sb = nbytes(sent, type), rb = nbytes(received, type);
    auto t0 = Clock::now();
    // [ packed send blocks | packed receive blocks ]: separate host buffers, so a device send
    // and receive that alias cannot meet on the host.
    char* h = staging(sb + rb);
    to_host(h, send, sb);
    host_.all_to_all_v(h, send_counts, h + sb, recv_counts, type);
    from_host(recv, h + sb, rb);
    count_call(kAllToAll, sent, type, since(t0));
  }

  void barrier() override {
    auto t0 = Clock::now();
    host_.barrier();
    count_call(kBarrier, 0, DType::F32, since(t0));
  }

 private:
  // The persistent staging buffer of the blocking calls, grown to at least `bytes`.
  char* staging(int64_t bytes) {
    if (bytes > staging_bytes_) {
      staging_.reset();  // free first: the old contents are not needed
      staging_.reset(new char[bytes]);
      staging_bytes_ = bytes;
    }
    return staging_.get();
  }
  static HostBuffer new_buffer(int64_t bytes) {
    return HostBuffer(new char[bytes > 0 ? bytes : 1]);
  }

  void to_host(void* h, const void* d, int64_t bytes) {
    if (bytes > 0) device_.to_host(h, d, bytes);
  }
  void from_host(void* d, const void* h, int64_t bytes) {
    if (bytes > 0) device_.from_host(d, h, bytes);
  }


  Communicator& host_;
  Device& device_;
  HostBuffer staging_;
  int64_t staging_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, Device& device,
                                                       std::string name) {
  return std::make_unique<StagedCommunicator>(host, device, std::move(name));
}

std::unique_ptr<Communicator> make_device_communicator(Communicator& group, Device& device) {
  if (group.size() == 1)
    return make_device_self_communicator(
        group.name(),
        [&device](void* dst, const void* src, int64_t bytes) { device.copy(dst, src, bytes); });
  return make_staged_communicator(group, device, group.name());
}

}  // namespace trident

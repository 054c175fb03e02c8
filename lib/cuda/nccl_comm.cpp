// The NCCL communicator (see nccl_comm.hpp for the stream, request, channel and counting rules).
#include "cuda/nccl_comm.hpp"

#include <nccl.h>

#include <chrono>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/ops.hpp"  // CUDA_CHECK
#include "util/error.hpp"

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void nccl_fail(const std::string& comm, const char* call, ncclResult_t rc,
                            ncclComm_t handle) {
  std::ostringstream m;
  m << "communicator '" << comm << "': " << call << " failed: " << ncclGetErrorString(rc);
  const char* detail = ncclGetLastError(handle);
  if (detail != nullptr && *detail != '\0') m << " (" << detail << ")";
  throw Error(m.str());
}

inline void nccl_check(ncclResult_t rc, const std::string& comm, const char* call,
                       ncclComm_t handle = nullptr) {
  if (rc != ncclSuccess) nccl_fail(comm, call, rc, handle);
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::BF16: return ncclBfloat16;
  }
  throw Error("nccl: unknown DType");
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

// One NCCL communicator and the stream its operations run on.
struct Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// "<ncclGetErrorString> (<ncclGetLastError>)" of a channel's asynchronous error, or "".
std::string async_error_of(const Channel& c, const char* which) {
  if (c.comm == nullptr) return "";
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(c.comm, &async);
  if (rc != ncclSuccess) async = rc;
  if (async == ncclSuccess || async == ncclInProgress) return "";
  std::string e = std::string(which) + ": " + ncclGetErrorString(async);
  const char* detail = ncclGetLastError(c.comm);
  if (detail != nullptr && *detail != '\0') e += std::string(" (") + detail + ")";
  return e;
}

// Everything the communicator owns, released in its destructor, which also runs when the
// communicator's constructor throws half way (a fully constructed member).
struct Handles {
  cudaStream_t compute = nullptr;  // the caller's: never destroyed here
  Channel main;                    // collectives; main.stream = the private iall_reduce stream
  std::vector<Channel> p2p;        // point-to-point channels
  cudaEvent_t ready = nullptr;     // recorded on `compute` before each non-blocking operation
  std::shared_ptr<CommWatch> watch;
  int watch_id = -1;
  bool aborted = false;
  std::string name;

  // ncclCommAbort of every NCCL communicator (the watch calls it at most once; the destructor
  // when an error unwinds). Streams stay: they drain once the NCCL kernels have ended.
  void abort() {
    aborted = true;
    if (main.comm != nullptr) ncclCommAbort(main.comm);
    main.comm = nullptr;
    for (Channel& c : p2p) {
      if (c.comm != nullptr) ncclCommAbort(c.comm);
      c.comm = nullptr;
    }
  }

  std::string async_error() const {
    std::string e = async_error_of(main, "collectives");
    for (size_t i = 0; e.empty() && i < p2p.size(); ++i)
      e = async_error_of(p2p[i], "point-to-point channel");
    return e;
  }

  // True once every stream this communicator enqueues on has run what it was given.
  bool streams_idle() const {
    auto idle = [](cudaStream_t s) { return cudaStreamQuery(s) != cudaErrorNotReady; };
    if (main.comm != nullptr && !idle(compute)) return false;  // nullptr is a valid stream
    if (main.stream != nullptr && !idle(main.stream)) return false;
    for (const Channel& c : p2p)
      if (c.stream != nullptr && !idle(c.stream)) return false;
    return true;
  }

  ~Handles() {
    // While an exception unwinds a peer may have failed: waiting for streams or destroying
    // (which completes pending work) could hang, so abort instead. After an abort (the watch's,
    // on a failed wait) there is nothing left to wait for. Otherwise wait, bounded.
    bool failing = aborted;
    if (watch) failing = watch->before_teardown() || failing;
    if (std::uncaught_exceptions() > 0) failing = true;  // also a constructor that threw
    if (!failing && watch && (main.comm != nullptr || !p2p.empty())) {
      failing = !watch->wait_quietly([this] { return streams_idle(); },
                                     "teardown of communicator '" + name + "'");
    }
    if (watch) watch->remove(watch_id);  // the watch never calls back after this
    if (failing) abort();
    auto release = [](Channel& c) {
      if (c.comm != nullptr) ncclCommDestroy(c.comm);
      if (c.stream != nullptr) cudaStreamDestroy(c.stream);
      c = Channel{};
    };
    for (Channel& c : p2p) release(c);
    release(main);
    if (ready != nullptr) cudaEventDestroy(ready);
  }
};

// A non-blocking operation: its completion event, recorded on the stream it ran on.
class NcclRequest final : public CommRequest {
 public:
  NcclRequest(Communicator* comm, const std::string* op, cudaStream_t compute,
              CommWatch* watch)
      : comm_(comm), op_(op), compute_(compute), watch_(watch) {
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~NcclRequest() override {
    if (done_ != nullptr) cudaEventDestroy(done_);  // fine while pending: freed on completion
  }
  NcclRequest(const NcclRequest&) = delete;
  NcclRequest& operator=(const NcclRequest&) = delete;

  cudaEvent_t event() const { return done_; }

  // Never blocks the host: the compute stream waits (its host waits are the bounded ones).
  void wait() override {
    if (waited_) return;
    auto t0 = Clock::now();
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    waited_ = true;
    comm_->stats().ops[*op_].seconds += since(t0);
  }

  bool test() override {
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) CUDA_CHECK(e);
    watch_->check("test of " + *op_ + " on communicator '" + comm_->name() + "'");
    return false;
  }

 private:
  Communicator* comm_;
  const std::string* op_;
  cudaStream_t compute_;
  CommWatch* watch_;
  cudaEvent_t done_ = nullptr;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& host, std::string name, cudaStream_t stream, NcclUse use,
                   std::shared_ptr<CommWatch> watch)
      : Communicator(std::move(name)), host_(host), rank_(host.rank()), size_(host.size()) {
    h_.compute = stream;
    h_.name = name_;
    h_.watch = watch ? std::move(watch) : std::make_shared<CommWatch>(rank_);

    // Channels: none for one rank; lower->higher and higher->lower; split by the parity of the
    // lower rank when there are more than 2 ranks. The collectives' communicator only where
    // collectives are used.
    parities_ = size_ > 2 ? 2 : 1;
    const bool collectives = use != NcclUse::PointToPoint;
    const int channels = size_ > 1 && use != NcclUse::Collectives ? 2 * parities_ : 0;
    const int first_channel = collectives ? 1 : 0;
    const int ids_needed = first_channel + channels;

    // Rank 0 makes every unique id; the outcome travels with them, so a failure there is
    // thrown on every rank instead of leaving the others waiting in NCCL.
    struct Ids {
      int32_t ok = 1;
      ncclResult_t rc = ncclSuccess;
      ncclUniqueId id[5];
    } ids{};
    // The host communicator's broadcast moves typed elements: the record travels as int32s.
    static_assert(sizeof(Ids) % sizeof(int32_t) == 0, "Ids must be whole int32s");
    if (rank_ == 0) {
      for (int i = 0; i < ids_needed && ids.ok; ++i) {
        ids.rc = ncclGetUniqueId(&ids.id[i]);
        ids.ok = ids.rc == ncclSuccess;
      }
    }
    host_.broadcast(&ids, static_cast<int64_t>(sizeof ids / sizeof(int32_t)), DType::I32, 0);
    if (!ids.ok) nccl_fail(name_, "ncclGetUniqueId (on rank 0)", ids.rc, nullptr);

    CUDA_CHECK(cudaEventCreateWithFlags(&h_.ready, cudaEventDisableTiming));
    if (collectives) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&h_.main.stream, cudaStreamNonBlocking));
      nccl_check(ncclCommInitRank(&h_.main.comm, size_, ids.id[0], rank_), name_,
                 "ncclCommInitRank");
    }
    h_.p2p.resize(channels);
    for (int i = 0; i < channels; ++i) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&h_.p2p[i].stream, cudaStreamNonBlocking));
      nccl_check(ncclCommInitRank(&h_.p2p[i].comm, size_, ids.id[first_channel + i], rank_),
                 name_, "ncclCommInitRank (point-to-point channel)");
    }
    Handles* h = &h_;
    h_.watch_id = h_.watch->add(
        name_, ids_needed, [h] { return h->async_error(); }, [h] { h->abort(); });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(void* data, int64_t count, DType type, ReduceOp op) override {
    check_count("all_reduce", count);
    ncclComm_t c = collective("all_reduce");
    auto t0 = Clock::now();
    nccl_check(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(type),
                             nccl_op(op), c, h_.compute),
               name_, "ncclAllReduce", c);
    posted(kAllReduce);
    count_call(kAllReduce, count, type, since(t0));
    note_all_reduce_count(count);
  }

  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType type,
                                           ReduceOp op) override {
    check_count("iall_reduce", count);
    ncclComm_t c = collective("iall_reduce");
    auto req = std::make_unique<NcclRequest>(this, &kAllReduce, h_.compute, h_.watch.get());
    after_compute(h_.main.stream);
    nccl_check(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(type),
                             nccl_op(op), c, h_.main.stream),
               name_, "ncclAllReduce (non-blocking)", c);
    CUDA_CHECK(cudaEventRecord(req->event(), h_.main.stream));
    posted(kAllReduce);
    count_call(kAllReduce, count, type, 0.0);
    note_all_reduce_count(count);
    return req;
  }

  void all_gather(const void* send, void* recv, int64_t count, DType type) override {
    check_count("all_gather", count);
    ncclComm_t c = collective("all_gather");
    auto t0 = Clock::now();
    // send == recv + rank * count is NCCL's in-place form too.
    nccl_check(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(type), c,
                             h_.compute),
               name_, "ncclAllGather", c);
    posted(kAllGather);
    count_call(kAllGather, count, type, since(t0));
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, DType type) override {
    check_count("reduce_scatter", count);
    ncclComm_t c = collective("reduce_scatter");
    auto t0 = Clock::now();
    const size_t block = static_cast<size_t>(count) * dtype_bytes(type);
    if (send == recv && rank_ > 0) {
      // The interface's in-place form (input recv[size * count], result to recv[0, count)) is
      // not NCCL's (result at recv + rank * count): reduce in NCCL's form, then move the block.
      char* mine = static_cast<char*>(recv) + block * rank_;
      nccl_check(ncclReduceScatter(recv, mine, static_cast<size_t>(count), nccl_type(type),
                                   ncclSum, c, h_.compute),
                 name_, "ncclReduceScatter", c);
      if (block > 0) {
        CUDA_CHECK(cudaMemcpyAsync(recv, mine, block, cudaMemcpyDeviceToDevice, h_.compute));
      }
    } else {
      nccl_check(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(type),
                                   ncclSum, c, h_.compute),
                 name_, "ncclReduceScatter", c);
    }
    posted(kReduceScatter);
    count_call(kReduceScatter, count, type, since(t0));
  }

  void broadcast(void* data, int64_t count, DType type, int root) override {
    check_count("broadcast", count);
    check_peer("broadcast root", root);
    ncclComm_t c = collective("broadcast");
    auto t0 = Clock::now();
    nccl_check(ncclBroadcast(data, data, static_cast<size_t>(count), nccl_type(type), root, c,
                             h_.compute),
               name_, "ncclBroadcast", c);
    posted(kBroadcast);
    count_call(kBroadcast, count, type, since(t0));
  }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType type, int peer,
                                     int) override {
    check_count("isend", count);
    check_p2p_peer("isend peer", peer);
    Channel& ch = channel(rank_, peer);
    auto req = std::make_unique<NcclRequest>(this, &kSend, h_.compute, h_.watch.get());
    after_compute(ch.stream);
    nccl_check(ncclSend(data, static_cast<size_t>(count), nccl_type(type), peer, ch.comm,
                        ch.stream),
               name_, "ncclSend", ch.comm);
    CUDA_CHECK(cudaEventRecord(req->event(), ch.stream));
    posted("send to " + std::to_string(peer));
    count_call(kSend, count, type, 0.0);
    return req;
  }

  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType type, int peer,
                                     int) override {
    check_count("irecv", count);
    check_p2p_peer("irecv peer", peer);
    Channel& ch = channel(peer, rank_);
    auto req = std::make_unique<NcclRequest>(this, &kRecv, h_.compute, h_.watch.get());
    after_compute(ch.stream);
    nccl_check(ncclRecv(data, static_cast<size_t>(count), nccl_type(type), peer, ch.comm,
                        ch.stream),
               name_, "ncclRecv", ch.comm);
    CUDA_CHECK(cudaEventRecord(req->event(), ch.stream));
    posted("recv from " + std::to_string(peer));
    count_call(kRecv, count, type, 0.0);
    return req;
  }

  // Grouped ncclSend/ncclRecv on the collectives' communicator and the compute stream, one
  // pair per peer with its counts (zero counts skipped); this rank's own block is a device copy
  // on the same stream (no NCCL message to oneself).
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType type) override {
    const int64_t sent = check_all_to_all_counts(send_counts, recv_counts);
    if (send_counts[rank_] != recv_counts[rank_]) {
      throw Error("communicator '" + name_ + "': all_to_all_v sends " +
                  std::to_string(send_counts[rank_]) + " elements to this rank and receives " +
                  std::to_string(recv_counts[rank_]));
    }
    ncclComm_t c = collective("all_to_all_v");
    auto t0 = Clock::now();
    const size_t elem = dtype_bytes(type);
    const char* s = static_cast<const char*>(send);
    char* r = static_cast<char*>(recv);
    size_t soff = 0, roff = 0, own_send = 0, own_recv = 0;
    ncclResult_t rc = ncclGroupStart();
    nccl_check(rc, name_, "ncclGroupStart", c);
    const char* failed = nullptr;
    for (int p = 0; p < size_; ++p) {
      const size_t sn = static_cast<size_t>(send_counts[p]);
      const size_t rn = static_cast<size_t>(recv_counts[p]);
      if (p == rank_) {
        own_send = soff;
        own_recv = roff;
      } else {
        if (sn > 0 && failed == nullptr) {
          rc = ncclSend(s + soff * elem, sn, nccl_type(type), p, c, h_.compute);
          if (rc != ncclSuccess) failed = "ncclSend (all_to_all_v)";
        }
        if (rn > 0 && failed == nullptr) {
          rc = ncclRecv(r + roff * elem, rn, nccl_type(type), p, c, h_.compute);
          if (rc != ncclSuccess) failed = "ncclRecv (all_to_all_v)";
        }
      }
      soff += sn;
      roff += rn;
    }
    const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failure
    if (failed != nullptr) nccl_fail(name_, failed, rc, c);
    nccl_check(end, name_, "ncclGroupEnd (all_to_all_v)", c);
    const size_t own_bytes = static_cast<size_t>(send_counts[rank_]) * elem;
    if (own_bytes > 0) {
      CUDA_CHECK(cudaMemcpyAsync(r + own_recv * elem, s + own_send * elem, own_bytes,
                                 cudaMemcpyDeviceToDevice, h_.compute));
    }
    posted(kAllToAll);
    count_call(kAllToAll, sent, type, since(t0));
  }

  void barrier() override {
    check_live();
    auto t0 = Clock::now();
    h_.watch->wait(
        [this] {
          const cudaError_t e = cudaStreamQuery(h_.compute);
          if (e == cudaErrorNotReady) return false;
          CUDA_CHECK(e);
          return true;
        },
        "barrier of communicator '" + name_ + "' (waiting for the compute stream)");
    host_.barrier();
    count_call(kBarrier, 0, DType::F32, since(t0));
  }

 private:
  void check_live() const {
    if (h_.aborted)
      throw Error("communicator '" + name_ + "' was aborted after a communication failure on "
                  "this rank");
  }

  // The collectives' communicator (not created for a point-to-point-only group).
  ncclComm_t collective(const char* op) const {
    check_live();
    if (h_.main.comm == nullptr)
      throw Error("communicator '" + name_ + "': " + op + ": this group was built for "
                  "point-to-point messages only (no NCCL communicator for collectives)");
    return h_.main.comm;
  }

  void posted(const std::string& op) { h_.watch->posted(h_.watch_id, op); }

  void check_p2p_peer(const char* what, int peer) const {
    check_peer(what, peer);
    if (peer == rank_) {
      throw Error("communicator '" + name_ + "': " + what + " " + std::to_string(peer) +
                  " is this rank: NCCL point-to-point to oneself is not supported");
    }
  }

  // The channel of messages from rank `from` to rank `to` (from != to).
  Channel& channel(int from, int to) {
    check_live();
    if (h_.p2p.empty())
      throw Error("communicator '" + name_ + "' was built without point-to-point channels");
    const int direction = from < to ? 0 : 1;
    const int lower = from < to ? from : to;
    return h_.p2p[direction * parities_ + lower % parities_];
  }

  // Makes `s` wait for everything enqueued on the compute stream so far.
  void after_compute(cudaStream_t s) {
    CUDA_CHECK(cudaEventRecord(h_.ready, h_.compute));
    CUDA_CHECK(cudaStreamWaitEvent(s, h_.ready, 0));
  }

  Communicator& host_;  // the same ranks on the host: the ids' broadcast and barrier()
  int rank_ = 0, size_ = 1;
  Handles h_;  // after host_ and the ranks, which the constructor reads before filling it
  int parities_ = 1;
};

}  // namespace

int nccl_handle_count(int size, NcclUse use) {
  if (size <= 1) return use == NcclUse::PointToPoint ? 0 : 1;
  const int channels = use == NcclUse::Collectives ? 0 : (size > 2 ? 4 : 2);
  return (use == NcclUse::PointToPoint ? 0 : 1) + channels;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, std::string name,
                                                     cudaStream_t stream, NcclUse use,
                                                     std::shared_ptr<CommWatch> watch) {
  return std::make_unique<NcclCommunicator>(host, std::move(name), stream, use,
                                            std::move(watch));
}

}  // namespace trident

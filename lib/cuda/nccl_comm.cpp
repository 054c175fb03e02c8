// The NCCL communicator (see nccl_comm.hpp for the stream, request, channel and counting rules).
#include "cuda/nccl_comm.hpp"

#include <nccl.h>

#include <chrono>
#include <exception>
#include <sstream>
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

void mpi_check(int rc, const std::string& comm, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error("communicator '" + comm + "': " + call + " failed: " + std::string(text, len));
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

// Everything the communicator owns, released in its destructor, which also runs when the
// communicator's constructor throws half way (a fully constructed member).
struct Handles {
  cudaStream_t compute = nullptr;  // the caller's: never destroyed here
  Channel main;                    // collectives; main.stream = the private iall_reduce stream
  std::vector<Channel> p2p;        // point-to-point channels
  cudaEvent_t ready = nullptr;     // recorded on `compute` before each non-blocking operation
  MPI_Comm mpi = MPI_COMM_NULL;    // a duplicate of the construction communicator (barrier)

  ~Handles() {
    // While an exception unwinds a peer may have failed: waiting for streams or destroying
    // (which completes pending work) could hang, so abort instead.
    const bool unwinding = std::uncaught_exceptions() > 0;
    if (!unwinding) {
      if (main.comm != nullptr) cudaStreamSynchronize(compute);  // nullptr is a valid stream
      if (main.stream != nullptr) cudaStreamSynchronize(main.stream);
      for (const Channel& c : p2p) {
        if (c.stream != nullptr) cudaStreamSynchronize(c.stream);
      }
    }
    auto release = [unwinding](Channel& c) {
      if (c.comm != nullptr) unwinding ? ncclCommAbort(c.comm) : ncclCommDestroy(c.comm);
      if (c.stream != nullptr) cudaStreamDestroy(c.stream);
      c = Channel{};
    };
    for (Channel& c : p2p) release(c);
    release(main);
    if (ready != nullptr) cudaEventDestroy(ready);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&mpi);
  }
};

// A non-blocking operation: its completion event, recorded on the stream it ran on.
class NcclRequest final : public CommRequest {
 public:
  NcclRequest(Communicator* comm, const std::string* op, cudaStream_t compute, ncclComm_t nccl)
      : comm_(comm), op_(op), compute_(compute), nccl_(nccl) {
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~NcclRequest() override {
    if (done_ != nullptr) cudaEventDestroy(done_);  // fine while pending: freed on completion
  }
  NcclRequest(const NcclRequest&) = delete;
  NcclRequest& operator=(const NcclRequest&) = delete;

  cudaEvent_t event() const { return done_; }

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
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(nccl_, &async), comm_->name(), "ncclCommGetAsyncError",
               nccl_);
    nccl_check(async, comm_->name(), "asynchronous NCCL operation", nccl_);
    return false;
  }

 private:
  Communicator* comm_;
  const std::string* op_;
  cudaStream_t compute_;
  ncclComm_t nccl_;
  cudaEvent_t done_ = nullptr;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name, cudaStream_t stream, bool point_to_point)
      : Communicator(std::move(name)) {
    h_.compute = stream;
    mpi_check(MPI_Comm_rank(comm, &rank_), name_, "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm, &size_), name_, "MPI_Comm_size");
    mpi_check(MPI_Comm_dup(comm, &h_.mpi), name_, "MPI_Comm_dup");

    // Channels: none for one rank; lower->higher and higher->lower; split by the parity of the
    // lower rank when there are more than 2 ranks.
    parities_ = size_ > 2 ? 2 : 1;
    const int channels = size_ > 1 && point_to_point ? 2 * parities_ : 0;

    // Rank 0 makes every unique id; the outcome travels with them, so a failure there is
    // thrown on every rank instead of leaving the others waiting in NCCL.
    struct Ids {
      int32_t ok = 1;
      ncclResult_t rc = ncclSuccess;
      ncclUniqueId id[5];
    } ids{};
    if (rank_ == 0) {
      for (int i = 0; i <= channels && ids.ok; ++i) {
        ids.rc = ncclGetUniqueId(&ids.id[i]);
        ids.ok = ids.rc == ncclSuccess;
      }
    }
    mpi_check(MPI_Bcast(&ids, sizeof ids, MPI_BYTE, 0, h_.mpi), name_, "MPI_Bcast");
    if (!ids.ok) nccl_fail(name_, "ncclGetUniqueId (on rank 0)", ids.rc, nullptr);

    CUDA_CHECK(cudaEventCreateWithFlags(&h_.ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaStreamCreateWithFlags(&h_.main.stream, cudaStreamNonBlocking));
    nccl_check(ncclCommInitRank(&h_.main.comm, size_, ids.id[0], rank_), name_,
               "ncclCommInitRank");
    h_.p2p.resize(channels);
    for (int i = 0; i < channels; ++i) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&h_.p2p[i].stream, cudaStreamNonBlocking));
      nccl_check(ncclCommInitRank(&h_.p2p[i].comm, size_, ids.id[1 + i], rank_), name_,
                 "ncclCommInitRank (point-to-point channel)");
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(void* data, int64_t count, DType type, ReduceOp op) override {
    check_count("all_reduce", count);
    auto t0 = Clock::now();
    nccl_check(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(type),
                             nccl_op(op), h_.main.comm, h_.compute),
               name_, "ncclAllReduce", h_.main.comm);
    count_call(kAllReduce, count, type, since(t0));
    stats_.all_reduce_counts.push_back(count);
  }

  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType type,
                                           ReduceOp op) override {
    check_count("iall_reduce", count);
    auto req = std::make_unique<NcclRequest>(this, &kAllReduce, h_.compute, h_.main.comm);
    after_compute(h_.main.stream);
    nccl_check(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(type),
                             nccl_op(op), h_.main.comm, h_.main.stream),
               name_, "ncclAllReduce (non-blocking)", h_.main.comm);
    CUDA_CHECK(cudaEventRecord(req->event(), h_.main.stream));
    count_call(kAllReduce, count, type, 0.0);
    stats_.all_reduce_counts.push_back(count);
    return req;
  }

  void all_gather(const void* send, void* recv, int64_t count, DType type) override {
    check_count("all_gather", count);
    auto t0 = Clock::now();
    // send == recv + rank * count is NCCL's in-place form too.
    nccl_check(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(type),
                             h_.main.comm, h_.compute),
               name_, "ncclAllGather", h_.main.comm);
    count_call(kAllGather, count, type, since(t0));
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, DType type) override {
    check_count("reduce_scatter", count);
    auto t0 = Clock::now();
    const size_t block = static_cast<size_t>(count) * dtype_bytes(type);
    if (send == recv && rank_ > 0) {
      // The interface's in-place form (input recv[size * count], result to recv[0, count)) is
      // not NCCL's (result at recv + rank * count): reduce in NCCL's form, then move the block.
      char* mine = static_cast<char*>(recv) + block * rank_;
      nccl_check(ncclReduceScatter(recv, mine, static_cast<size_t>(count), nccl_type(type),
                                   ncclSum, h_.main.comm, h_.compute),
                 name_, "ncclReduceScatter", h_.main.comm);
      if (block > 0) {
        CUDA_CHECK(cudaMemcpyAsync(recv, mine, block, cudaMemcpyDeviceToDevice, h_.compute));
      }
    } else {
      nccl_check(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(type),
                                   ncclSum, h_.main.comm, h_.compute),
                 name_, "ncclReduceScatter", h_.main.comm);
    }
    count_call(kReduceScatter, count, type, since(t0));
  }

  void broadcast(void* data, int64_t count, DType type, int root) override {
    check_count("broadcast", count);
    check_peer("broadcast root", root);
    auto t0 = Clock::now();
    nccl_check(ncclBroadcast(data, data, static_cast<size_t>(count), nccl_type(type), root,
                             h_.main.comm, h_.compute),
               name_, "ncclBroadcast", h_.main.comm);
    count_call(kBroadcast, count, type, since(t0));
  }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType type, int peer,
                                     int) override {
    check_count("isend", count);
    check_p2p_peer("isend peer", peer);
    Channel& ch = channel(rank_, peer);
    auto req = std::make_unique<NcclRequest>(this, &kSend, h_.compute, ch.comm);
    after_compute(ch.stream);
    nccl_check(ncclSend(data, static_cast<size_t>(count), nccl_type(type), peer, ch.comm,
                        ch.stream),
               name_, "ncclSend", ch.comm);
    CUDA_CHECK(cudaEventRecord(req->event(), ch.stream));
    count_call(kSend, count, type, 0.0);
    return req;
  }

  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType type, int peer,
                                     int) override {
    check_count("irecv", count);
    check_p2p_peer("irecv peer", peer);
    Channel& ch = channel(peer, rank_);
    auto req = std::make_unique<NcclRequest>(this, &kRecv, h_.compute, ch.comm);
    after_compute(ch.stream);
    nccl_check(ncclRecv(data, static_cast<size_t>(count), nccl_type(type), peer, ch.comm,
                        ch.stream),
               name_, "ncclRecv", ch.comm);
    CUDA_CHECK(cudaEventRecord(req->event(), ch.stream));
    count_call(kRecv, count, type, 0.0);
    return req;
  }

  void barrier() override {
    auto t0 = Clock::now();
    CUDA_CHECK(cudaStreamSynchronize(h_.compute));
    mpi_check(MPI_Barrier(h_.mpi), name_, "MPI_Barrier");
    count_call(kBarrier, 0, DType::F32, since(t0));
  }

 private:
  void check_p2p_peer(const char* what, int peer) const {
    check_peer(what, peer);
    if (peer == rank_) {
      throw Error("communicator '" + name_ + "': " + what + " " + std::to_string(peer) +
                  " is this rank: NCCL point-to-point to oneself is not supported");
    }
  }

  // The channel of messages from rank `from` to rank `to` (from != to).
  Channel& channel(int from, int to) {
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


  Handles h_;
  int rank_ = 0, size_ = 1;
  int parities_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name,
                                                     cudaStream_t stream, bool point_to_point) {
  return std::make_unique<NcclCommunicator>(comm, std::move(name), stream, point_to_point);
}

}  // namespace trident

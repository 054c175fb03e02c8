#pragma once
// The MPI implementation of Communicator: one MPI_Comm per process group.
//
// Counting (CommStats, per communicator and operation name):
//   calls   +1 per call (isend/irecv: when posted);
//   bytes   += count * dtype_bytes(type), `count` being the count argument of the call
//           (all_gather: the elements this rank sends; reduce_scatter: the elements of the block
//           this rank receives; broadcast: the same on the root and the receivers);
//   seconds += wall time inside the call (isend/irecv: inside CommRequest::wait()).
// All-reduces also append their element count to stats().all_reduce_counts where
// keep_all_reduce_counts is set (tests). Counting allocates nothing per call (besides that
// list, and the first use of an operation name).
//
// Element counts may exceed INT_MAX (MPI 4 large-count calls are used then). Every operation
// takes every DType. BF16 (raw bfloat16 bits) travels as a 2-byte MPI type of its own and is
// reduced by user operators that widen to float, combine and round back to nearest even after
// each combining step (mpi_comm.cpp says more, including when they are freed). Argument errors
// (bad root or peer, negative count) throw trident::Error; MPI failures also throw
// trident::Error with MPI's message.
//
// Waiting: the blocking operations are MPI's nonblocking ones, completed by polling MPI_Test
// and yielding the core between polls (as are CommRequest waits), never MPI_Wait or a blocking
// collective, inside which MPICH busy-polls: with more ranks than cores, a rank spinning there
// keeps the rank it waits for off the core (mpi_comm.cpp, complete()).
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"

namespace trident {

// Ends the whole job with `exit_code` after the caller has printed its one error line:
// MPI_Abort makes mpiexec/srun kill every process. Waits a moment first, so that the
// launcher's proxies forward the line before the kill (under load it was lost), and sends
// stderr to /dev/null for the abort, whose own "Abort(1) on node 0 ..." line MPICH prints
// even with MPIR_CVAR_SUPPRESS_ABORT_MESSAGE (errors are one line).
[[noreturn]] void abort_job(int exit_code);

// MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, and for BF16 a committed contiguous type
// of 2 bytes (created on first use; MPI must be initialized; valid until MPI_Finalize).
MPI_Datatype mpi_datatype(DType t);
// MPI_SUM / MPI_MAX, and for BF16 the matching user operator (created with the BF16 type).
MPI_Op mpi_reduce_op(DType t, ReduceOp op);

class MpiCommunicator final : public Communicator {
 public:
  // Wraps `comm` (must not be MPI_COMM_NULL). owns = true: MPI_Comm_free in the destructor
  // (skipped when MPI is already finalized); never pass owns = true for MPI_COMM_WORLD.
  MpiCommunicator(MPI_Comm comm, std::string name, bool owns = true);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  MPI_Comm comm() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // In place (MPI_IN_PLACE).
  void all_reduce(void* data, int64_t count, DType type, ReduceOp op) override;
  // send may also be recv + rank() * count elements (in place).
  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType type,
                                           ReduceOp op) override;
  std::unique_ptr<CommRequest> iall_gather(const void* send, void* recv, int64_t count,
                                           DType type) override;
  std::unique_ptr<CommRequest> ireduce_scatter(const void* send, void* recv, int64_t count,
                                               DType type) override;
  // MPI initialised with MPI_THREAD_SERIALIZED or more (app/main.cpp asks for MULTIPLE).
  bool progress_from_helper_thread() const override;
  void all_gather(const void* send, void* recv, int64_t count, DType type) override;
  // send == recv is allowed: the input is read from recv[size * count] and this rank's block
  // is written to recv[0, count) (MPI's in-place rule).
  void reduce_scatter(const void* send, void* recv, int64_t count, DType type) override;
  void broadcast(void* data, int64_t count, DType type, int root) override;
  // The returned request must be waited on (or destroyed: a request destroyed unwaited is
  // freed, a pending receive cancelled) before this communicator is destroyed. Buffers must
  // stay valid until wait() returns.
  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType type, int peer,
                                     int tag) override;
  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType type, int peer,
                                     int tag) override;
  void barrier() override;
  // MPI_Ialltoallv (MPI_Ialltoallv_c when a count or offset exceeds INT_MAX); send and recv
  // must not overlap.
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType type) override;

 private:
  // A non-blocking collective of `count` elements of `type`, counted as `op`: the count
  // checked (MPI's i* collectives take an int), then post(type's MPI datatype, &request),
  // MPI's call (`mpi_call` in its error). `call` names the operation in errors. A template
  // (defined in mpi_comm.cpp, its only user): a std::function of the caller's lambda would
  // allocate at every call.
  template <class Post>
  std::unique_ptr<CommRequest> post_collective(const std::string& op, const char* call,
                                               const char* mpi_call, int64_t count, DType type,
                                               Post&& post);
  // all_to_all_v's count and displacement arrays, kept from call to call.
  struct AllToAllArrays {
    std::vector<MPI_Count> send_counts, recv_counts;
    std::vector<MPI_Aint> send_displs, recv_displs;
    std::vector<int> send_counts_int, send_displs_int, recv_counts_int, recv_displs_int;
  };
  MPI_Comm comm_;
  AllToAllArrays a2a_;
  bool owns_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace trident

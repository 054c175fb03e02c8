#include "comm/mpi_comm.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <vector>

#include "util/bf16.hpp"
#include "util/error.hpp"

namespace trident {

void abort_job(int exit_code) {
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) ::dup2(null, STDERR_FILENO);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

namespace {

// ---- BF16 on MPI ----
// MPI has no bfloat16 type, so BF16 buffers travel as a committed 2-byte contiguous type of
// their own (created once, on first use), and reductions over it use two user operators that
// widen each pair of elements to float, combine them and round back to nearest even: a sum is
// rounded once per combining step (as NCCL's bf16 all-reduce does), a max is exact (it selects
// one of the inputs; a NaN on either side wins so that divergence is never hidden).
// The operators are declared commutative, so MPI may pick the combining order, exactly as for
// MPI_SUM on MPI_FLOAT (rounded sums are not associative: the order may differ from one group
// size or algorithm to another, but MPICH's all-reduce algorithms give every rank of one call
// the same bits). They are created with MPI_Op_create_c (large-count user functions) so they
// also serve the MPI 4 large-count calls used for > INT_MAX elements.
//
// Lifetime: the type and operators are freed at the start of MPI_Finalize, by the delete
// callback of an attribute set on MPI_COMM_SELF (MPI deletes MPI_COMM_SELF's attributes
// first thing in MPI_Finalize, while MPI is still fully usable). Nothing else frees them, so a
// communicator may use them for as long as MPI is initialized.

void bf16_sum_fn(void* in, void* inout, MPI_Count* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (MPI_Count i = 0; i < *len; ++i) {
    b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
  }
}

void bf16_max_fn(void* in, void* inout, MPI_Count* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (MPI_Count i = 0; i < *len; ++i) {
    const float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    if (y != y) continue;              // inout is NaN: it stays
    if (x != x || x > y) b[i] = a[i];  // in is NaN, or larger
  }
}

struct Bf16Mpi {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL;
  MPI_Op max = MPI_OP_NULL;
};

Bf16Mpi g_bf16;  // written once, under the function-local static's guard in bf16_mpi()

int free_bf16_at_finalize(MPI_Comm, int, void*, void*) {
  if (g_bf16.sum != MPI_OP_NULL) MPI_Op_free(&g_bf16.sum);
  if (g_bf16.max != MPI_OP_NULL) MPI_Op_free(&g_bf16.max);
  if (g_bf16.type != MPI_DATATYPE_NULL) MPI_Type_free(&g_bf16.type);
  return MPI_SUCCESS;
}

void check_bf16_setup(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("BF16 on MPI: ") + call + " failed: " + std::string(text, len));
}

// The type and operators, created on the first call (thread-safe; MPI must be initialized).
const Bf16Mpi& bf16_mpi() {
  static const bool ready = [] {
    check_bf16_setup(MPI_Type_contiguous(2, MPI_BYTE, &g_bf16.type), "MPI_Type_contiguous");
    check_bf16_setup(MPI_Type_commit(&g_bf16.type), "MPI_Type_commit");
    check_bf16_setup(MPI_Op_create_c(&bf16_sum_fn, 1, &g_bf16.sum), "MPI_Op_create_c");
    check_bf16_setup(MPI_Op_create_c(&bf16_max_fn, 1, &g_bf16.max), "MPI_Op_create_c");
    int keyval = MPI_KEYVAL_INVALID;
    check_bf16_setup(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_bf16_at_finalize,
                                            &keyval, nullptr),
                     "MPI_Comm_create_keyval");
    check_bf16_setup(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr), "MPI_Comm_set_attr");
    // The key itself is released when its one attribute is deleted (at MPI_Finalize).
    check_bf16_setup(MPI_Comm_free_keyval(&keyval), "MPI_Comm_free_keyval");
    return true;
  }();
  (void)ready;
  return g_bf16;
}

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void mpi_fail(const std::string& comm, const char* call, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::ostringstream m;
  m << "communicator '" << comm << "': " << call << " failed: " << std::string(text, len);
  throw Error(m.str());
}

inline void check(int rc, const std::string& comm, const char* call) {
  if (rc != MPI_SUCCESS) mpi_fail(comm, call, rc);
}

inline bool fits_int(int64_t n) { return n <= INT_MAX; }

// Completes `req` by polling MPI_Test and giving the core away between polls. Every wait of
// this communicator goes through here, and its collectives are the nonblocking ones completed
// here, because MPICH busy-polls inside MPI_Wait and the blocking collectives: with more ranks
// than cores, a waiting rank then spins through its whole time slice while the rank it waits
// for is not running. On 2 cores, an 8-byte all-reduce took 4.2 ms blocking and 0.04 ms this way
// on 4 ranks, 26 ms and 0.2 ms on 8 (docs/parallelism.md, "Ranks sharing cores"). On a core of
// its own, sched_yield returns at once.
int complete(MPI_Request* req) {
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    sched_yield();
  }
}

// The MPI_COMM_WORLD rank of each rank of `comm`, in its rank order (for the watchdog's line).
std::vector<int> world_ranks_of(MPI_Comm comm, int size, const std::string& name) {
  MPI_Group group, world;
  check(MPI_Comm_group(comm, &group), name, "MPI_Comm_group");
  check(MPI_Comm_group(MPI_COMM_WORLD, &world), name, "MPI_Comm_group");
  std::vector<int> mine(size), ranks(size);
  for (int i = 0; i < size; ++i) mine[i] = i;
  const int rc = MPI_Group_translate_ranks(group, size, mine.data(), world, ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  check(rc, name, "MPI_Group_translate_ranks");
  return ranks;
}

}  // namespace

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::BF16: return bf16_mpi().type;
  }
  throw Error("mpi_datatype: unknown DType");
}

MPI_Op mpi_reduce_op(DType t, ReduceOp op) {
  if (t == DType::BF16) return op == ReduceOp::Sum ? bf16_mpi().sum : bf16_mpi().max;
  return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
}

// A posted MPI_Isend / MPI_Irecv. wait() adds its time to the communicator's stats.
class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MpiCommunicator* comm, const std::string* op, bool is_recv, int64_t bytes)
      : comm_(comm), op_(op), is_recv_(is_recv), bytes_(bytes), seq_(comm->post(*op)) {}
  ~MpiRequest() override {
    if (req_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Never block in a destructor (it may run while an error unwinds): cancel a receive, and
    // let MPI finish or drop the operation on its own.
    if (is_recv_) MPI_Cancel(&req_);
    MPI_Request_free(&req_);
  }
  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;  // already waited (or an empty request)
    Communicator::WaitScope waiting(*comm_, *op_, seq_);
    auto t0 = Clock::now();
    int rc = complete(&req_);
    comm_->count_wait(*op_, bytes_, since(t0));
    check(rc, comm_->name(), is_recv_ ? "MPI_Test (recv)" : "MPI_Test (send)");
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), comm_->name(), "MPI_Test");
    if (done) comm_->completed(seq_);
    return done != 0;
  }
  MPI_Request* handle() { return &req_; }

 private:
  MpiCommunicator* comm_;
  const std::string* op_;
  bool is_recv_;
  int64_t bytes_;  // the payload, for the recorder
  int64_t seq_;    // the operation's number in its group
  MPI_Request req_ = MPI_REQUEST_NULL;
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, bool owns)
    : Communicator(std::move(name)), comm_(comm), owns_(owns) {
  if (comm_ == MPI_COMM_NULL) {
    throw Error("communicator '" + name_ + "': MPI_COMM_NULL cannot be wrapped");
  }
  check(MPI_Comm_rank(comm_, &rank_), name_, "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), name_, "MPI_Comm_size");
  world_ranks_ = world_ranks_of(comm_, size_, name_);
}

MpiCommunicator::~MpiCommunicator() {
  if (!owns_ || comm_ == MPI_COMM_NULL || comm_ == MPI_COMM_WORLD || comm_ == MPI_COMM_SELF)
    return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_reduce(void* data, int64_t count, DType type, ReduceOp op) {
  check_count("all_reduce", count);
  MPI_Datatype dt = mpi_datatype(type);
  MPI_Op mop = mpi_reduce_op(type, op);
  const int64_t seq = post(kAllReduce);
  WaitScope waiting(*this, kAllReduce, seq);
  auto t0 = Clock::now();
  MPI_Request req;
  int rc;
  if (fits_int(count)) {
    rc = MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), dt, mop, comm_, &req);
  } else {
    rc = MPI_Iallreduce_c(MPI_IN_PLACE, data, static_cast<MPI_Count>(count), dt, mop, comm_,
                          &req);
  }
  if (rc == MPI_SUCCESS) rc = complete(&req);
  double dt_s = since(t0);
  check(rc, name_, "MPI_Iallreduce");
  count_call(kAllReduce, count, type, dt_s);
  note_all_reduce_count(count);
}

template <class Post>
std::unique_ptr<CommRequest> MpiCommunicator::post_collective(const std::string& op,
                                                              const char* call,
                                                              const char* mpi_call, int64_t count,
                                                              DType type, Post&& post) {
  check_count(call, count);
  if (!fits_int(count))
    throw Error("communicator '" + name_ + "': " + call + " of " + std::to_string(count) +
                " elements exceeds the int count of " + mpi_call + "; use smaller pieces");
  const MPI_Datatype dt = mpi_datatype(type);
  auto req = std::make_unique<MpiRequest>(this, &op, false,
                                         count * static_cast<int64_t>(dtype_bytes(type)));
  check(post(dt, req->handle()), name_, mpi_call);
  count_post(op, count, type);
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::iall_reduce(void* data, int64_t count, DType type,
                                                          ReduceOp op) {
  auto req = post_collective(kAllReduce, "iall_reduce", "MPI_Iallreduce", count, type,
                             [&](MPI_Datatype dt, MPI_Request* r) {
                               return MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count),
                                                     dt, mpi_reduce_op(type, op), comm_, r);
                             });
  note_all_reduce_count(count);
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::iall_gather(const void* send, void* recv,
                                                          int64_t count, DType type) {
  const size_t block = static_cast<size_t>(std::max<int64_t>(count, 0)) * dtype_bytes(type);
  const void* sbuf = send;
  if (count > 0 && send == static_cast<const char*>(recv) + block * rank_) sbuf = MPI_IN_PLACE;
  return post_collective(kAllGather, "iall_gather", "MPI_Iallgather", count, type,
                         [&](MPI_Datatype dt, MPI_Request* r) {
                           const int n = static_cast<int>(count);
                           return MPI_Iallgather(sbuf, n, dt, recv, n, dt, comm_, r);
                         });
}

std::unique_ptr<CommRequest> MpiCommunicator::ireduce_scatter(const void* send, void* recv,
                                                              int64_t count, DType type) {
  const void* sbuf = send == recv ? MPI_IN_PLACE : send;
  return post_collective(kReduceScatter, "ireduce_scatter", "MPI_Ireduce_scatter_block", count,
                         type, [&](MPI_Datatype dt, MPI_Request* r) {
                           return MPI_Ireduce_scatter_block(sbuf, recv, static_cast<int>(count),
                                                            dt, mpi_reduce_op(type, ReduceOp::Sum),
                                                            comm_, r);
                         });
}

bool MpiCommunicator::progress_from_helper_thread() const {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided >= MPI_THREAD_SERIALIZED;
}

void MpiCommunicator::all_gather(const void* send, void* recv, int64_t count, DType type) {
  check_count("all_gather", count);
  MPI_Datatype dt = mpi_datatype(type);
  const size_t block = static_cast<size_t>(count) * dtype_bytes(type);
  const void* sbuf = send;
  if (count > 0 && send == static_cast<const char*>(recv) + block * rank_) sbuf = MPI_IN_PLACE;
  const int64_t seq = post(kAllGather);
  WaitScope waiting(*this, kAllGather, seq);
  auto t0 = Clock::now();
  MPI_Request req;
  int rc;
  if (fits_int(count)) {
    rc = MPI_Iallgather(sbuf, static_cast<int>(count), dt, recv, static_cast<int>(count), dt,
                        comm_, &req);
  } else {
    rc = MPI_Iallgather_c(sbuf, static_cast<MPI_Count>(count), dt, recv,
                          static_cast<MPI_Count>(count), dt, comm_, &req);
  }
  if (rc == MPI_SUCCESS) rc = complete(&req);
  double dt_s = since(t0);
  check(rc, name_, "MPI_Iallgather");
  count_call(kAllGather, count, type, dt_s);
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType type) {
  check_count("reduce_scatter", count);
  MPI_Datatype dt = mpi_datatype(type);
  MPI_Op sum = mpi_reduce_op(type, ReduceOp::Sum);
  const void* sbuf = send == recv ? MPI_IN_PLACE : send;
  const int64_t seq = post(kReduceScatter);
  WaitScope waiting(*this, kReduceScatter, seq);
  auto t0 = Clock::now();
  MPI_Request req;
  int rc;
  if (fits_int(count)) {
    rc = MPI_Ireduce_scatter_block(sbuf, recv, static_cast<int>(count), dt, sum, comm_, &req);
  } else {
    rc = MPI_Ireduce_scatter_block_c(sbuf, recv, static_cast<MPI_Count>(count), dt, sum, comm_,
                                     &req);
  }
  if (rc == MPI_SUCCESS) rc = complete(&req);
  double dt_s = since(t0);
  check(rc, name_, "MPI_Ireduce_scatter_block");
  count_call(kReduceScatter, count, type, dt_s);
}

void MpiCommunicator::broadcast(void* data, int64_t count, DType type, int root) {
  check_count("broadcast", count);
  check_peer("broadcast root", root);
  MPI_Datatype dt = mpi_datatype(type);
  const int64_t seq = post(kBroadcast);
  WaitScope waiting(*this, kBroadcast, seq);
  auto t0 = Clock::now();
  MPI_Request req;
  int rc;
  if (fits_int(count)) {
    rc = MPI_Ibcast(data, static_cast<int>(count), dt, root, comm_, &req);
  } else {
    rc = MPI_Ibcast_c(data, static_cast<MPI_Count>(count), dt, root, comm_, &req);
  }
  if (rc == MPI_SUCCESS) rc = complete(&req);
  double dt_s = since(t0);
  check(rc, name_, "MPI_Ibcast");
  count_call(kBroadcast, count, type, dt_s);
}

std::unique_ptr<CommRequest> MpiCommunicator::isend(const void* data, int64_t count, DType type,
                                                    int peer, int tag) {
  check_count("isend", count);
  check_peer("isend peer", peer);
  MPI_Datatype dt = mpi_datatype(type);
  auto req = std::make_unique<MpiRequest>(this, &kSend, false,
                                         count * static_cast<int64_t>(dtype_bytes(type)));
  int rc;
  if (fits_int(count)) {
    rc = MPI_Isend(data, static_cast<int>(count), dt, peer, tag, comm_, req->handle());
  } else {
    rc = MPI_Isend_c(data, static_cast<MPI_Count>(count), dt, peer, tag, comm_, req->handle());
  }
  check(rc, name_, "MPI_Isend");
  count_post(kSend, count, type);
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::irecv(void* data, int64_t count, DType type,
                                                    int peer, int tag) {
  check_count("irecv", count);
  check_peer("irecv peer", peer);
  MPI_Datatype dt = mpi_datatype(type);
  auto req = std::make_unique<MpiRequest>(this, &kRecv, true,
                                         count * static_cast<int64_t>(dtype_bytes(type)));
  int rc;
  if (fits_int(count)) {
    rc = MPI_Irecv(data, static_cast<int>(count), dt, peer, tag, comm_, req->handle());
  } else {
    rc = MPI_Irecv_c(data, static_cast<MPI_Count>(count), dt, peer, tag, comm_, req->handle());
  }
  check(rc, name_, "MPI_Irecv");
  count_post(kRecv, count, type);
  return req;
}

void MpiCommunicator::all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                                   void* recv, const std::vector<int64_t>& recv_counts,
                                   DType type) {
  const int64_t count = check_all_to_all_counts(send_counts, recv_counts);
  MPI_Datatype dt = mpi_datatype(type);
  // Packed blocks: each displacement is the sum of the counts before it. The arrays are the
  // communicator's, sized once (the call is blocking: they live until it completes).
  std::vector<MPI_Count>& scounts = a2a_.send_counts;
  std::vector<MPI_Count>& rcounts = a2a_.recv_counts;
  std::vector<MPI_Aint>& sdispls = a2a_.send_displs;
  std::vector<MPI_Aint>& rdispls = a2a_.recv_displs;
  scounts.resize(size_);
  rcounts.resize(size_);
  sdispls.resize(size_);
  rdispls.resize(size_);
  int64_t soff = 0, roff = 0;
  for (int p = 0; p < size_; ++p) {
    scounts[p] = send_counts[p];
    rcounts[p] = recv_counts[p];
    sdispls[p] = soff;
    rdispls[p] = roff;
    soff += send_counts[p];
    roff += recv_counts[p];
  }
  const bool small = fits_int(soff) && fits_int(roff);
  const int64_t seq = post(kAllToAll);
  WaitScope waiting(*this, kAllToAll, seq);
  auto t0 = Clock::now();
  // The int count and displacement arrays of the small case.
  std::vector<int>& sc = a2a_.send_counts_int;
  std::vector<int>& sd = a2a_.send_displs_int;
  std::vector<int>& rc_ = a2a_.recv_counts_int;
  std::vector<int>& rd = a2a_.recv_displs_int;
  MPI_Request req;
  int rc;
  if (small) {
    sc.resize(size_);
    sd.resize(size_);
    rc_.resize(size_);
    rd.resize(size_);
    for (int p = 0; p < size_; ++p) {
      sc[p] = static_cast<int>(scounts[p]);
      sd[p] = static_cast<int>(sdispls[p]);
      rc_[p] = static_cast<int>(rcounts[p]);
      rd[p] = static_cast<int>(rdispls[p]);
    }
    rc = MPI_Ialltoallv(send, sc.data(), sd.data(), dt, recv, rc_.data(), rd.data(), dt, comm_,
                        &req);
  } else {
    rc = MPI_Ialltoallv_c(send, scounts.data(), sdispls.data(), dt, recv, rcounts.data(),
                          rdispls.data(), dt, comm_, &req);
  }
  if (rc == MPI_SUCCESS) rc = complete(&req);
  double dt_s = since(t0);
  check(rc, name_, "MPI_Ialltoallv");
  count_call(kAllToAll, count, type, dt_s);
}

void MpiCommunicator::barrier() {
  const int64_t seq = post(kBarrier);
  WaitScope waiting(*this, kBarrier, seq);
  auto t0 = Clock::now();
  MPI_Request req;
  int rc = MPI_Ibarrier(comm_, &req);
  if (rc == MPI_SUCCESS) rc = complete(&req);
  double dt_s = since(t0);
  check(rc, name_, "MPI_Ibarrier");
  count_call(kBarrier, 0, DType::F32, dt_s);
}

}  // namespace trident

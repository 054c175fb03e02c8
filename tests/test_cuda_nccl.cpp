// The NCCL communicator (cuda/nccl_comm.hpp) on one rank (bootstrapped over an MPI communicator
// of MPI_COMM_SELF, one GPU): every
// collective of a one-rank group is the identity, so the results are the inputs, but each goes
// through NCCL on the compute stream: all_reduce (F32 sum and max, F64, I32, I64, BF16 sum and
// max, bit for bit), all_gather (also in place), reduce_scatter (also in place), broadcast,
// iall_reduce (wait() orders the compute stream after it; test() reports completion), the
// counters, barrier, and the refused arguments (bad root, message to oneself, negative count);
// all_to_all_v (one rank: its own block, I64 and F32, an empty exchange, refused counts).
// Also: only the NCCL communicators a group uses are created (NcclUse, counted without a GPU),
// a point-to-point-only group refuses collectives, the communicator joins the device's
// CommWatch (counted, last operation recorded, gone on destruction), and after an abort every
// call throws and destruction returns (no wait).
// Multi-rank NCCL needs one GPU per rank and is exercised by the GPU trainer's runs.
//
// Without a CUDA device every test is skipped with "no CUDA device: NCCL tests skipped"; MPI is
// only initialised (singleton, no mpiexec needed) once a device is found.
#include <gtest/gtest.h>

#ifndef TRIDENT_TEST_CUDA

TEST(CudaNccl, NotBuilt) { GTEST_SKIP() << "TRIDENT_CUDA is OFF: NCCL tests not built"; }

#else

#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_watch.hpp"
#include "comm/mpi_comm.hpp"
#include "cuda/nccl_comm.hpp"
#include "kernels/cuda/ops.hpp"
#include "util/bf16.hpp"
#include "util/error.hpp"

namespace {

using trident::Communicator;
using trident::DType;
using trident::ReduceOp;

#define REQUIRE_CUDA_DEVICE()                                          \
  do {                                                                 \
    if (!trident::cuda::device_available())                            \
      GTEST_SKIP() << "no CUDA device: NCCL tests skipped";            \
  } while (0)

// Finalizes MPI at the end of the program if a test initialised it.
class MpiFinalizer : public ::testing::Environment {
 public:
  void TearDown() override {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Finalize();
  }
};
const ::testing::Environment* const kMpiFinalizer =
    ::testing::AddGlobalTestEnvironment(new MpiFinalizer);

// Device memory of n elements of T, freed at scope exit.
template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : n(n) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T) + 1));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* p = nullptr;
  size_t n;
};

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_CUDA_DEVICE();
    int init = 0;
    MPI_Initialized(&init);
    if (!init) MPI_Init(nullptr, nullptr);
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    host = std::make_unique<trident::MpiCommunicator>(MPI_COMM_SELF, "self", /*owns=*/false);
    comm = trident::make_nccl_communicator(*host, "nccl-self", stream);
    comm->stats().keep_all_reduce_counts = true;
    ASSERT_EQ(comm->rank(), 0);
    ASSERT_EQ(comm->size(), 1);
    ASSERT_EQ(comm->name(), "nccl-self");
  }
  void TearDown() override {
    comm.reset();
    host.reset();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  template <typename T>
  std::unique_ptr<DeviceBuffer<T>> upload(const std::vector<T>& v) {
    auto d = std::make_unique<DeviceBuffer<T>>(v.size());
    CUDA_CHECK(cudaMemcpyAsync(d->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice,
                               stream));
    return d;
  }
  // Enqueued on the compute stream after everything before it, then waited for.
  template <typename T>
  std::vector<T> download(const DeviceBuffer<T>& d, size_t n) {
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpyAsync(v.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return v;
  }

  cudaStream_t stream = nullptr;
  std::unique_ptr<Communicator> host;  // what the NCCL communicators bootstrap over
  std::unique_ptr<Communicator> comm;
};

TEST_F(Nccl, AllReduceIsTheIdentity) {
  const std::vector<float> f{1.5f, -2.0f, 3.25f};
  auto df = upload(f);
  comm->all_reduce(df->p, 3, DType::F32, ReduceOp::Sum);
  comm->all_reduce(df->p, 3, DType::F32, ReduceOp::Max);
  EXPECT_EQ(download(*df, 3), f);
  const std::vector<double> d{0.1, -7.0};
  auto dd = upload(d);
  comm->all_reduce_sum(dd->p, 2);
  EXPECT_EQ(download(*dd, 2), d);
  const std::vector<int32_t> i{-5, 1 << 30};
  auto di = upload(i);
  comm->all_reduce(di->p, 2, DType::I32, ReduceOp::Max);
  EXPECT_EQ(download(*di, 2), i);
  const std::vector<int64_t> l{int64_t{1} << 40, -3};
  auto dl = upload(l);
  comm->all_reduce(dl->p, 2, DType::I64, ReduceOp::Sum);
  EXPECT_EQ(download(*dl, 2), l);

  const trident::CommStats& s = comm->stats();
  EXPECT_EQ(s.calls("all_reduce"), 5);
  EXPECT_EQ(s.ops.at("all_reduce").bytes, 2 * 3 * 4 + 2 * 8 + 2 * 4 + 2 * 8);
  EXPECT_EQ(s.all_reduce_counts, (std::vector<int64_t>{3, 3, 2, 2, 2}));
}

TEST_F(Nccl, Bf16AllReduce) {
  std::vector<uint16_t> h;
  for (float x : {1.0f, -0.5f, 1.0078125f, 3.0e38f, 0.0f}) h.push_back(trident::float_to_bf16(x));
  auto dh = upload(h);
  comm->all_reduce(dh->p, static_cast<int64_t>(h.size()), DType::BF16, ReduceOp::Sum);
  EXPECT_EQ(download(*dh, h.size()), h);  // bit for bit
  comm->all_reduce(dh->p, static_cast<int64_t>(h.size()), DType::BF16, ReduceOp::Max);
  EXPECT_EQ(download(*dh, h.size()), h);
  EXPECT_EQ(comm->stats().ops.at("all_reduce").bytes, 2 * 5 * 2);
}

TEST_F(Nccl, AllGatherAndReduceScatter) {
  const std::vector<float> v{1, 2, 3, 4};
  auto send = upload(v);
  DeviceBuffer<float> recv(4);
  comm->all_gather(send->p, recv.p, 4, DType::F32);
  EXPECT_EQ(download(recv, 4), v);
  comm->all_gather(send->p, send->p, 4, DType::F32);  // in place (recv + 0 * count)
  EXPECT_EQ(download(*send, 4), v);
  DeviceBuffer<float> rs(4);
  comm->reduce_scatter(send->p, rs.p, 4, DType::F32);
  EXPECT_EQ(download(rs, 4), v);
  comm->reduce_scatter(send->p, send->p, 4, DType::F32);  // in place
  EXPECT_EQ(download(*send, 4), v);
  EXPECT_EQ(comm->stats().calls("all_gather"), 2);
  EXPECT_EQ(comm->stats().ops.at("all_gather").bytes, 32);
  EXPECT_EQ(comm->stats().calls("reduce_scatter"), 2);
  EXPECT_EQ(comm->stats().ops.at("reduce_scatter").bytes, 32);
}

TEST_F(Nccl, Broadcast) {
  const std::vector<int64_t> v{42, -7, 5};
  auto d = upload(v);
  comm->broadcast(d->p, 3, DType::I64, 0);
  EXPECT_EQ(download(*d, 3), v);
  EXPECT_EQ(comm->stats().ops.at("broadcast").bytes, 24);
  EXPECT_THROW(comm->broadcast(d->p, 3, DType::I64, 1), trident::Error);
  EXPECT_EQ(comm->stats().calls("broadcast"), 1);
}

TEST_F(Nccl, IallReduceOrdersTheComputeStream) {
  const size_t n = size_t(1) << 20;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * 0.5f;
  auto d = upload(v);
  auto req = comm->iall_reduce(d->p, static_cast<int64_t>(n), DType::F32, ReduceOp::Sum);
  req->wait();
  req->wait();  // a second wait is a no-op
  EXPECT_EQ(download(*d, n), v);  // enqueued on the compute stream after wait()
  while (!req->test()) {
  }
  EXPECT_EQ(comm->stats().calls("all_reduce"), 1);
  EXPECT_EQ(comm->stats().all_reduce_counts, std::vector<int64_t>{static_cast<int64_t>(n)});
  EXPECT_EQ(comm->stats().ops.at("all_reduce").bytes, static_cast<int64_t>(n * 4));
}

TEST_F(Nccl, BarrierAndRefusedArguments) {
  comm->barrier();
  EXPECT_EQ(comm->stats().calls("barrier"), 1);
  DeviceBuffer<float> d(4);
  try {
    comm->isend(d.p, 4, DType::F32, 0, 0);
    ADD_FAILURE() << "a message to oneself was accepted";
  } catch (const trident::Error& e) {
    EXPECT_NE(std::string(e.what()).find("to oneself is not supported"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm->irecv(d.p, 4, DType::F32, 1, 0), trident::Error);
  EXPECT_THROW(comm->all_reduce(d.p, -1, DType::F32, ReduceOp::Sum), trident::Error);
  EXPECT_EQ(comm->stats().calls("send"), 0);
  EXPECT_EQ(comm->stats().calls("all_reduce"), 0);
}

// One rank: all_to_all_v is this rank's own block, a device copy on the compute stream (the
// grouped ncclSend/ncclRecv of other peers need one GPU per rank). I64 beyond 32 bits, F32,
// an empty exchange, the counters, and the refused counts.
TEST_F(Nccl, AllToAllV) {
  const std::vector<int64_t> l{int64_t{1} << 40, -3, 7};
  auto dl = upload(l);
  DeviceBuffer<int64_t> rl(3);
  comm->all_to_all_v(dl->p, {3}, rl.p, {3}, DType::I64);
  EXPECT_EQ(download(rl, 3), l);
  const std::vector<float> f{1.5f, -2.0f};
  auto df = upload(f);
  DeviceBuffer<float> rf(2);
  comm->all_to_all_v(df->p, {2}, rf.p, {2}, DType::F32);
  EXPECT_EQ(download(rf, 2), f);
  comm->all_to_all_v(df->p, {0}, rf.p, {0}, DType::F32);  // an empty exchange
  EXPECT_EQ(download(rf, 2), f);
  EXPECT_EQ(comm->stats().calls("all_to_all"), 3);
  EXPECT_EQ(comm->stats().ops.at("all_to_all").bytes, 3 * 8 + 2 * 4);
  // Refused before anything is enqueued or counted: wrong vector size, negative, and a block
  // to oneself whose send and receive counts differ.
  EXPECT_THROW(comm->all_to_all_v(df->p, {1, 1}, rf.p, {1, 1}, DType::F32), trident::Error);
  EXPECT_THROW(comm->all_to_all_v(df->p, {-1}, rf.p, {-1}, DType::F32), trident::Error);
  try {
    comm->all_to_all_v(df->p, {2}, rf.p, {1}, DType::F32);
    ADD_FAILURE() << "unequal counts to oneself were accepted";
  } catch (const trident::Error& e) {
    EXPECT_NE(std::string(e.what()).find("communicator 'nccl-self': all_to_all_v sends 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(comm->stats().calls("all_to_all"), 3);
}

// No GPU needed: how many NCCL communicators each kind of group creates.
TEST(NcclCount, OnlyTheUsedCommunicators) {
  using trident::NcclUse;
  using trident::nccl_handle_count;
  EXPECT_EQ(nccl_handle_count(8, NcclUse::Collectives), 1);   // tensor, data, embedding
  EXPECT_EQ(nccl_handle_count(2, NcclUse::PointToPoint), 2);  // pipeline of 2 stages
  EXPECT_EQ(nccl_handle_count(4, NcclUse::PointToPoint), 4);  // pipeline of 3+ stages
  EXPECT_EQ(nccl_handle_count(4, NcclUse::Both), 5);          // (before: the pipeline's)
}

TEST_F(Nccl, PointToPointOnlyGroupHasNoCollectives) {
  auto watch = std::make_shared<trident::CommWatch>(0, 30.0);
  auto p2p = trident::make_nccl_communicator(*host, "pipeline", stream,
                                             trident::NcclUse::PointToPoint, watch);
  EXPECT_EQ(watch->handle_count(), 0);  // one rank: no channels, and no collectives
  DeviceBuffer<float> d(4);
  try {
    p2p->all_reduce(d.p, 4, DType::F32, ReduceOp::Sum);
    ADD_FAILURE() << "a point-to-point-only group ran a collective";
  } catch (const trident::Error& e) {
    EXPECT_NE(std::string(e.what()).find("point-to-point messages only"), std::string::npos)
        << e.what();
  }
}

TEST_F(Nccl, JoinsTheWatchAndAbortEndsIt) {
  auto watch = std::make_shared<trident::CommWatch>(0, 30.0);
  auto c = trident::make_nccl_communicator(*host, "data", stream,
                                           trident::NcclUse::Collectives, watch);
  EXPECT_EQ(watch->summary(), "1 (data 1)");
  EXPECT_TRUE(watch->active());
  DeviceBuffer<float> d(4);
  c->all_reduce(d.p, 4, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(watch->last_operations(), "communicator 'data' all_reduce (call 1)");
  // A bounded wait on the real stream that carries the all-reduce: completes.
  watch->wait([this] { return cudaStreamQuery(stream) == cudaSuccess; }, "test wait");
  EXPECT_EQ(watch->async_error(), "");
  watch->abort_all("test");  // ncclCommAbort
  EXPECT_FALSE(watch->active());
  EXPECT_THROW(c->all_reduce(d.p, 4, DType::F32, ReduceOp::Sum), trident::Error);
  c.reset();  // returns without waiting or destroying an aborted communicator
  EXPECT_EQ(watch->summary(), "0");
}

}  // namespace

#endif  // TRIDENT_TEST_CUDA

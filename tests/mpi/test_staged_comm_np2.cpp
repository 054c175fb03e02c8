// The staged communicator (comm/staged_comm.hpp) on 2 ranks, over an MpiCommunicator and a fake
// device whose memory the host cannot use by accident (FakeDevice and CheckingComm,
// tests/mpi/staged_fake_device.hpp).
// Covered: all_reduce (F32 sum and max, F64, I64, BF16 sum with rounding to nearest even),
// iall_reduce (result copied back exactly once, through test() or wait()), all_gather and
// reduce_scatter (also in place), broadcast (root copies up only, receivers down only),
// isend/irecv pairs (a send copies at post time), argument errors, and the counters against an
// MpiCommunicator running the same calls; all_to_all_v (tests/mpi/staged_all_to_all_cases.hpp,
// also run on 3 ranks by test_staged_comm_np3). Also the node placement the GPU backend takes
// from the process grid (ParallelDims::placement, filled by ProcessGrid: one node detection for
// both backends).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "comm/staged_comm.hpp"
#include "grid/device_select.hpp"
#include "grid/process_grid.hpp"
#include "mpi/staged_all_to_all_cases.hpp"
#include "mpi/staged_fake_device.hpp"
#include "tensor/device.hpp"
#include "train/trainer.hpp"
#include "util/bf16.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

using staged_test::CheckingComm;
using staged_test::download;
using staged_test::dup_world;
using staged_test::FakeDevice;
using staged_test::upload;

class Staged : public ::testing::Test {
 protected:
  void SetUp() override {
    mpi = std::make_unique<MpiCommunicator>(dup_world(), "host");
    checking = std::make_unique<CheckingComm>(*mpi, dev);
    comm = make_staged_communicator(*checking, dev, "staged");
    comm->stats().keep_all_reduce_counts = true;
    ASSERT_EQ(comm->size(), 2);
    ASSERT_EQ(comm->rank(), mpi->rank());
    ASSERT_EQ(comm->name(), "staged");
    r = comm->rank();
  }
  FakeDevice dev;  // declared first: outlives the communicators and every DeviceArray
  std::unique_ptr<MpiCommunicator> mpi;
  std::unique_ptr<CheckingComm> checking;
  std::unique_ptr<Communicator> comm;
  int r = 0;
};

TEST_F(Staged, AllReduce) {
  auto f = upload<float>(dev, {1.0f + r, -2.0f * r, 0.25f});
  comm->all_reduce(f.data(), 3, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(download(dev, f), (std::vector<float>{3, -2, 0.5f}));
  auto m = upload<float>(dev, {1.0f * r, -1.0f * r});
  comm->all_reduce(m.data(), 2, DType::F32, ReduceOp::Max);
  EXPECT_EQ(download(dev, m), (std::vector<float>{1, 0}));
  auto d = upload<double>(dev, {0.5 * r});
  comm->all_reduce_sum(d.data(), 1);
  EXPECT_EQ(download(dev, d), std::vector<double>{0.5});
  auto l = upload<int64_t>(dev, {int64_t{3} << 40, 7 * r});
  comm->all_reduce(l.data(), 2, DType::I64, ReduceOp::Sum);
  EXPECT_EQ(download(dev, l), (std::vector<int64_t>{int64_t{6} << 40, 7}));
  // BF16: 1.5 + 2.5 = 4 exact; 1.0078125 + 2^-8 and 1 + 2^-8 are ties that round to even
  // (1.015625 up, 1.0 down; truncation would give 1.0078125 and 1.0).
  auto h = upload<uint16_t>(dev, {float_to_bf16(1.5f + r),
                                  float_to_bf16(r == 0 ? 1.0078125f : 0.00390625f),
                                  float_to_bf16(r == 0 ? 1.0f : 0.00390625f)});
  comm->all_reduce(h.data(), 3, DType::BF16, ReduceOp::Sum);
  std::vector<uint16_t> hb = download(dev, h);
  EXPECT_EQ(bf16_to_float(hb[0]), 4.0f);
  EXPECT_EQ(bf16_to_float(hb[1]), 1.015625f);
  EXPECT_EQ(bf16_to_float(hb[2]), 1.0f);

  const CommStats& s = comm->stats();
  EXPECT_EQ(s.calls("all_reduce"), 5);
  EXPECT_EQ(s.ops.at("all_reduce").bytes, 3 * 4 + 2 * 4 + 8 + 2 * 8 + 3 * 2);
  EXPECT_EQ(s.all_reduce_counts, (std::vector<int64_t>{3, 2, 1, 2, 3}));
  EXPECT_GT(s.ops.at("all_reduce").seconds, 0.0);
  EXPECT_EQ(s.ops.size(), 1u);
  EXPECT_EQ(mpi->stats().calls("all_reduce"), 5);  // it really went through the host comm
  EXPECT_EQ(checking->calls, 5);
}

TEST_F(Staged, ZeroCountIsCountedAndCopiesNothing) {
  const int64_t up = dev.to_host_calls, down = dev.from_host_calls;
  comm->all_reduce(nullptr, 0, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(dev.to_host_calls, up);
  EXPECT_EQ(dev.from_host_calls, down);
  EXPECT_EQ(comm->stats().all_reduce_counts, std::vector<int64_t>{0});
}

TEST_F(Staged, IallReduceCopiesBackExactlyOnce) {
  // Completed through test(): the copy happens in the test() that first reports completion.
  auto a = upload<float>(dev, {1.0f + r, 10.0f * r});
  auto req = comm->iall_reduce(a.data(), 2, DType::F32, ReduceOp::Sum);
  while (!req->test()) {
  }
  EXPECT_EQ(dev.from_host_into[a.data()], 2);  // the upload, then the result
  EXPECT_TRUE(req->test());
  req->wait();
  req->wait();
  EXPECT_EQ(dev.from_host_into[a.data()], 2);
  EXPECT_EQ(download(dev, a), (std::vector<float>{3, 10}));

  // Completed through wait(); the device buffer is untouched until then.
  auto b = upload<uint16_t>(dev, {float_to_bf16(0.5f), float_to_bf16(-1.0f * r)});
  auto req2 = comm->iall_reduce(b.data(), 2, DType::BF16, ReduceOp::Max);
  EXPECT_EQ(dev.from_host_into[b.data()], 1);
  req2->wait();
  EXPECT_EQ(dev.from_host_into[b.data()], 2);
  EXPECT_TRUE(req2->test());
  req2->wait();
  EXPECT_EQ(dev.from_host_into[b.data()], 2);
  std::vector<uint16_t> bb = download(dev, b);
  EXPECT_EQ(bf16_to_float(bb[0]), 0.5f);
  EXPECT_EQ(bf16_to_float(bb[1]), 0.0f);

  EXPECT_EQ(comm->stats().calls("all_reduce"), 2);
  EXPECT_EQ(comm->stats().ops.at("all_reduce").bytes, 2 * 4 + 2 * 2);
  EXPECT_EQ(comm->stats().all_reduce_counts, (std::vector<int64_t>{2, 2}));
  EXPECT_GT(comm->stats().ops.at("all_reduce").seconds, 0.0);
}

TEST_F(Staged, IallReduceSurvivesStatsReset) {
  auto a = upload<double>(dev, {1.0});
  auto req = comm->iall_reduce(a.data(), 1, DType::F64, ReduceOp::Sum);
  comm->stats().reset();  // the pending request must not hold a dangling counter
  req->wait();
  EXPECT_EQ(download(dev, a), std::vector<double>{2.0});
  EXPECT_EQ(comm->stats().calls("all_reduce"), 0);
}

TEST_F(Staged, AllGather) {
  auto send = upload<int32_t>(dev, {10 * r, 10 * r + 1});
  DeviceArray<int32_t> recv(dev, 4);
  comm->all_gather(send.data(), recv.data(), 2, DType::I32);
  EXPECT_EQ(download(dev, recv), (std::vector<int32_t>{0, 1, 10, 11}));
  // In place on the device: this rank's block already sits at recv + rank * count.
  std::vector<float> init(4, -1.0f);
  init[2 * r] = 1.0f + r;
  init[2 * r + 1] = 5.0f + r;
  auto buf = upload(dev, init);
  comm->all_gather(buf.data() + 2 * r, buf.data(), 2, DType::F32);
  EXPECT_EQ(download(dev, buf), (std::vector<float>{1, 5, 2, 6}));
  EXPECT_EQ(comm->stats().calls("all_gather"), 2);
  EXPECT_EQ(comm->stats().ops.at("all_gather").bytes, 2 * 4 + 2 * 4);
}

TEST_F(Staged, ReduceScatter) {
  // send[i] = i + r over 2 blocks of 3: block b of the sum = 2 * (3b + j) + 1.
  std::vector<float> in(6);
  for (int i = 0; i < 6; ++i) in[i] = static_cast<float>(i + r);
  auto send = upload(dev, in);
  DeviceArray<float> recv(dev, 3);
  comm->reduce_scatter(send.data(), recv.data(), 3, DType::F32);
  std::vector<float> want(3);
  for (int j = 0; j < 3; ++j) want[j] = 2.0f * (3 * r + j) + 1;
  EXPECT_EQ(download(dev, recv), want);
  // In place (send == recv): the input is the whole buffer, this rank's block lands in front.
  auto inplace = upload(dev, in);
  comm->reduce_scatter(inplace.data(), inplace.data(), 3, DType::F32);
  std::vector<float> got = download(dev, inplace);
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3), want);
  // BF16 sums: block 0 = 0.5 + 1.5; block 1 = 1.0078125 + 2^-8, a tie rounded to even.
  auto hb = upload<uint16_t>(
      dev, {float_to_bf16(0.5f + r), float_to_bf16(r == 0 ? 1.0078125f : 0.00390625f)});
  DeviceArray<uint16_t> hr(dev, 1);
  comm->reduce_scatter(hb.data(), hr.data(), 1, DType::BF16);
  EXPECT_EQ(bf16_to_float(download(dev, hr)[0]), r == 0 ? 2.0f : 1.015625f);
  EXPECT_EQ(comm->stats().calls("reduce_scatter"), 3);
  EXPECT_EQ(comm->stats().ops.at("reduce_scatter").bytes, 3 * 4 + 3 * 4 + 2);
}

TEST_F(Staged, BroadcastCopiesOnlyWhatItMust) {
  auto v = upload<int64_t>(dev, {r == 1 ? 42 : 0, r == 1 ? -7 : 0});
  const int64_t up = dev.to_host_calls, down = dev.from_host_calls;
  comm->broadcast(v.data(), 2, DType::I64, 1);
  if (r == 1) {
    EXPECT_EQ(dev.to_host_calls - up, 1);
    EXPECT_EQ(dev.from_host_calls - down, 0);
  } else {
    EXPECT_EQ(dev.to_host_calls - up, 0);
    EXPECT_EQ(dev.from_host_calls - down, 1);
  }
  EXPECT_EQ(download(dev, v), (std::vector<int64_t>{42, -7}));
  EXPECT_EQ(comm->stats().calls("broadcast"), 1);
  EXPECT_EQ(comm->stats().ops.at("broadcast").bytes, 16);
}

TEST_F(Staged, IsendIrecvPairs) {
  const int peer = 1 - r;
  std::vector<float> mine(4);
  for (int i = 0; i < 4; ++i) mine[i] = 100.0f * r + i;
  auto out = upload(dev, mine);
  DeviceArray<float> in(dev, 4);
  auto out2 = upload<uint16_t>(dev, {float_to_bf16(-0.5f * (r + 1))});
  DeviceArray<uint16_t> in2(dev, 1);

  auto rq = comm->irecv(in.data(), 4, DType::F32, peer, 1);
  auto rq2 = comm->irecv(in2.data(), 1, DType::BF16, peer, 2);
  auto sq = comm->isend(out.data(), 4, DType::F32, peer, 1);
  // isend copied at post time: overwriting the device buffer now must not change the message.
  dev.from_host(out.data(), std::vector<float>(4, -99.0f).data(), out.bytes());
  auto sq2 = comm->isend(out2.data(), 1, DType::BF16, peer, 2);
  EXPECT_EQ(dev.from_host_into[in.data()], 0);
  // One receive completes through test(), the other through wait(); each copies once.
  while (!rq->test()) {
  }
  EXPECT_EQ(dev.from_host_into[in.data()], 1);
  rq->wait();
  rq2->wait();
  rq2->wait();
  EXPECT_TRUE(rq2->test());
  sq->wait();
  sq2->wait();
  EXPECT_EQ(dev.from_host_into[in.data()], 1);
  EXPECT_EQ(dev.from_host_into[in2.data()], 1);
  std::vector<float> want(4);
  for (int i = 0; i < 4; ++i) want[i] = 100.0f * peer + i;
  EXPECT_EQ(download(dev, in), want);
  EXPECT_EQ(bf16_to_float(download(dev, in2)[0]), -0.5f * (peer + 1));

  const CommStats& s = comm->stats();
  EXPECT_EQ(s.calls("send"), 2);
  EXPECT_EQ(s.calls("recv"), 2);
  EXPECT_EQ(s.ops.at("send").bytes, 4 * 4 + 2);
  EXPECT_EQ(s.ops.at("recv").bytes, 4 * 4 + 2);
  EXPECT_GT(s.ops.at("recv").seconds, 0.0);
}

TEST_F(Staged, ArgumentErrorsThrowBeforeAnyCopy) {
  auto a = upload<float>(dev, {1.0f});
  const int64_t up = dev.to_host_calls, host_calls = checking->calls;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([&] { comm->isend(a.data(), 1, DType::F32, 2, 0); }),
            "communicator 'staged': isend peer 2 is not a rank of this 2-rank group");
  EXPECT_EQ(message([&] { comm->irecv(a.data(), 1, DType::F32, -1, 0); }),
            "communicator 'staged': irecv peer -1 is not a rank of this 2-rank group");
  EXPECT_EQ(message([&] { comm->broadcast(a.data(), 1, DType::F32, 5); }),
            "communicator 'staged': broadcast root 5 is not a rank of this 2-rank group");
  EXPECT_EQ(message([&] { comm->all_reduce(a.data(), -3, DType::F32, ReduceOp::Sum); }),
            "communicator 'staged': all_reduce with negative count -3");
  EXPECT_EQ(dev.to_host_calls, up);
  EXPECT_EQ(checking->calls, host_calls);
  for (const auto& [op, s] : comm->stats().ops) EXPECT_EQ(s.calls, 0) << op;
}

// The same calls on the staged communicator and on a plain MpiCommunicator count the same
// (calls, bytes, all-reduce sizes under the same op names).
TEST_F(Staged, CountsLikeMpiCommunicator) {
  MpiCommunicator plain(dup_world(), "plain");
  plain.stats().keep_all_reduce_counts = true;
  const int peer = 1 - r;
  std::vector<float> h(8, 1.0f), h2(8);
  DeviceArray<float> d(dev, 8), d2(dev, 8);
  auto run = [&](Communicator& c, float* x, float* y) {
    c.all_reduce(x, 3, DType::F32, ReduceOp::Sum);
    c.iall_reduce(x, 5, DType::F32, ReduceOp::Max)->wait();
    c.all_gather(x, y, 2, DType::F32);
    c.reduce_scatter(x, y, 4, DType::F32);
    c.broadcast(x, 6, DType::F32, 0);
    auto rq = c.irecv(y, 7, DType::F32, peer, 9);
    auto sq = c.isend(x, 7, DType::F32, peer, 9);
    sq->wait();
    rq->wait();
    c.barrier();
  };
  run(plain, h.data(), h2.data());
  run(*comm, d.data(), d2.data());
  const CommStats& a = plain.stats();
  const CommStats& b = comm->stats();
  ASSERT_EQ(a.ops.size(), b.ops.size());
  for (const auto& [op, s] : a.ops) {
    ASSERT_EQ(b.ops.count(op), 1u) << op;
    EXPECT_EQ(b.ops.at(op).calls, s.calls) << op;
    EXPECT_EQ(b.ops.at(op).bytes, s.bytes) << op;
    EXPECT_GE(b.ops.at(op).seconds, 0.0) << op;
  }
  EXPECT_EQ(a.all_reduce_counts, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(b.all_reduce_counts, a.all_reduce_counts);
  EXPECT_EQ(b.calls("barrier"), 1);
}

TEST(NodePlacement, TakenFromTheGrid) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    // The single-rank reference groups: one node of one rank.
    SelfGroups self;
    const NodePlacement p = self.groups().placement;
    EXPECT_EQ(p.local_rank, 0);
    EXPECT_EQ(p.local_size, 1);
    EXPECT_EQ(p.num_nodes, 1);
  }
  {
    ProcessGrid grid(MPI_COMM_WORLD, GridShape{1, 1, world}, 0, ModelConfig{});
    const NodePlacement p = grid.dims().placement;
    EXPECT_EQ(p.local_rank, rank);  // both ranks on this machine (detected)
    EXPECT_EQ(p.local_size, world);
    EXPECT_EQ(p.num_nodes, 1);
    EXPECT_FALSE(p.simulated);
    EXPECT_EQ(select_device(p.local_rank, p.local_size, 1), 0);  // one GPU: shared
  }
  {
    // parallel.ranks_per_node = 1: each rank its own simulated node, node-local rank 0.
    ProcessGrid grid(MPI_COMM_WORLD, GridShape{1, 1, world}, 1, ModelConfig{});
    const NodePlacement p = grid.dims().placement;
    EXPECT_EQ(p.local_rank, 0);
    EXPECT_EQ(p.local_size, 1);
    EXPECT_EQ(p.node, rank);
    EXPECT_EQ(p.num_nodes, world);
    EXPECT_TRUE(p.simulated);
  }
}

}  // namespace
}  // namespace trident

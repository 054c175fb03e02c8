// MpiCommunicator and ProcessGrid on 4 ranks: every collective's result and counters (F32, F64,
// I32, I64 and BF16), p2p in a ring, the grid's communicators against the pure functions for
// every 4-rank layout, node simulation and detection, and layout errors thrown on every rank
// without hanging.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "grid/grid.hpp"
#include "grid/process_grid.hpp"
#include "util/bf16.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Sets (or unsets) TRIDENT_RANKS_PER_NODE for one scope, restoring "unset" after.
struct EnvRanksPerNode {
  explicit EnvRanksPerNode(const char* value) {
    if (value) setenv("TRIDENT_RANKS_PER_NODE", value, 1);
    else unsetenv("TRIDENT_RANKS_PER_NODE");
  }
  ~EnvRanksPerNode() { unsetenv("TRIDENT_RANKS_PER_NODE"); }
};

// One communicator over all 4 ranks for the collective tests.
class MpiComm : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    comm = std::make_unique<MpiCommunicator>(dup, "test");
    comm->stats().keep_all_reduce_counts = true;
    ASSERT_EQ(comm->size(), 4);
    r = comm->rank();
  }
  std::unique_ptr<MpiCommunicator> comm;
  int r = 0;
};

TEST_F(MpiComm, AllReduceSumAndMax) {
  std::vector<float> f{1.0f * r, 10.0f + r, -1.0f * r};
  comm->all_reduce_sum(f.data(), 3);
  EXPECT_EQ(f, (std::vector<float>{6, 46, -6}));
  std::vector<double> d{1.0 * r, -1.0 * r};
  comm->all_reduce_max(d.data(), 2);
  EXPECT_EQ(d, (std::vector<double>{3, 0}));
  std::vector<int32_t> i{r, 100 * r};
  comm->all_reduce(i.data(), 2, DType::I32, ReduceOp::Max);
  EXPECT_EQ(i, (std::vector<int32_t>{3, 300}));
  std::vector<int64_t> l{int64_t{1} << 40, r};
  comm->all_reduce(l.data(), 2, DType::I64, ReduceOp::Sum);
  EXPECT_EQ(l, (std::vector<int64_t>{int64_t{4} << 40, 6}));

  const CommStats& s = comm->stats();
  EXPECT_EQ(s.calls("all_reduce"), 4);
  EXPECT_EQ(s.ops.at("all_reduce").bytes, 3 * 4 + 2 * 8 + 2 * 4 + 2 * 8);
  EXPECT_EQ(s.all_reduce_counts, (std::vector<int64_t>{3, 2, 2, 2}));
  EXPECT_GE(s.ops.at("all_reduce").seconds, 0.0);
  EXPECT_EQ(s.ops.size(), 1u);
}

// A request whose completion, seen by test() on any thread, the test can read safely.
class WatchedRequest final : public CommRequest {
 public:
  explicit WatchedRequest(std::unique_ptr<CommRequest> inner) : inner_(std::move(inner)) {}
  void wait() override { inner_->wait(); }
  bool test() override {
    const bool done = inner_->test();
    if (done) completed.store(true, std::memory_order_release);
    return done;
  }
  std::atomic<bool> completed{false};

 private:
  std::unique_ptr<CommRequest> inner_;
};

// comm.hpp's ProgressHelper (the tensor-parallel backward's overlap): its helper thread alone
// completes a large non-blocking all-reduce while the calling thread makes no MPI call (as
// during a GEMM); a busy-polling MPI would otherwise progress it only in the final wait. The
// same helper does it again for the next one.
TEST_F(MpiComm, ProgressHelperCompletesTheAllReduceWhileWorkRuns) {
  ASSERT_TRUE(comm->progress_from_helper_thread())
      << "tests/mpi/mpi_gtest_main.cpp initialises MPI with MPI_THREAD_MULTIPLE";
  const int64_t n = int64_t{1} << 21;  // 8 MiB of floats, far past any eager limit
  ProgressHelper helper;
  for (int round = 0; round < 2; ++round) {
    std::vector<float> x(static_cast<size_t>(n), static_cast<float>(r + 1));
    WatchedRequest request(comm->iall_reduce(x.data(), n, DType::F32, ReduceOp::Sum));
    bool completed_during_work = false;
    helper.during(request, [&] {
      // Computation stand-in, no MPI call: it ends once the sum has completed (at most 30 s).
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (std::chrono::steady_clock::now() < end) {
        if (request.completed.load(std::memory_order_acquire)) {
          completed_during_work = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    EXPECT_TRUE(completed_during_work) << "round " << round;
    int64_t wrong = 0;
    for (const float v : x) wrong += v != 10.0f;  // 1 + 2 + 3 + 4
    EXPECT_EQ(wrong, 0) << "of " << n << " elements, round " << round;
  }
  EXPECT_EQ(comm->stats().calls("all_reduce"), 2);
}

TEST_F(MpiComm, AllGatherInRankOrder) {
  std::vector<int32_t> send{10 * r, 10 * r + 1}, recv(8, -1);
  comm->all_gather(send.data(), recv.data(), 2, DType::I32);
  EXPECT_EQ(recv, (std::vector<int32_t>{0, 1, 10, 11, 20, 21, 30, 31}));
  // In place: this rank's block already sits at recv + rank * count.
  std::vector<double> buf(4, -1.0);
  buf[r] = 0.5 * r;
  comm->all_gather(buf.data() + r, buf.data(), 1, DType::F64);
  EXPECT_EQ(buf, (std::vector<double>{0, 0.5, 1.0, 1.5}));
  EXPECT_EQ(comm->stats().calls("all_gather"), 2);
  EXPECT_EQ(comm->stats().ops.at("all_gather").bytes, 2 * 4 + 1 * 8);
}

TEST_F(MpiComm, ReduceScatterBlocks) {
  // send[i] = i + r over 4 blocks of 2: block b of the sum = 4*(2b + j) + 6.
  std::vector<float> send(8), recv(2, -1);
  for (int i = 0; i < 8; ++i) send[i] = static_cast<float>(i + r);
  comm->reduce_scatter(send.data(), recv.data(), 2, DType::F32);
  EXPECT_EQ(recv, (std::vector<float>{4.0f * (2 * r) + 6, 4.0f * (2 * r + 1) + 6}));
  // In place (send == recv): this rank's block lands at the front.
  std::vector<int64_t> inplace(4);
  for (int i = 0; i < 4; ++i) inplace[i] = i * 100 + r;
  comm->reduce_scatter(inplace.data(), inplace.data(), 1, DType::I64);
  EXPECT_EQ(inplace[0], 400 * r + 6);
  EXPECT_EQ(comm->stats().calls("reduce_scatter"), 2);
  EXPECT_EQ(comm->stats().ops.at("reduce_scatter").bytes, 2 * 4 + 1 * 8);
}

// The non-blocking reduce-scatter (the overlapped backward under sequence parallelism): the
// blocking one's blocks, counted as a reduce_scatter, completed by a ProgressHelper; a
// one-rank group's (Communicator's default: the blocking call, a completed request) copies.
TEST_F(MpiComm, IreduceScatterEqualsTheBlockingOneAndIsDrivenByTheHelper) {
  const int64_t n = int64_t{1} << 19;  // a block of 2 MiB, past the eager limit
  std::vector<float> send(static_cast<size_t>(4 * n)), recv(static_cast<size_t>(n), -1.0f);
  for (int64_t i = 0; i < 4 * n; ++i) send[i] = static_cast<float>((i % 1000) + r);
  std::vector<float> blocking(static_cast<size_t>(n), -1.0f);
  comm->reduce_scatter(send.data(), blocking.data(), n, DType::F32);
  comm->stats().reset();
  auto request = comm->ireduce_scatter(send.data(), recv.data(), n, DType::F32);
  ProgressHelper().during(*request, [] {});
  EXPECT_EQ(recv, blocking);
  EXPECT_EQ(recv[0], 4.0f * static_cast<float>((r * n) % 1000) + 6);
  EXPECT_EQ(comm->stats().calls("reduce_scatter"), 1);
  EXPECT_EQ(comm->stats().ops.at("reduce_scatter").posted, 1);
  EXPECT_EQ(comm->stats().ops.at("reduce_scatter").bytes, n * 4);
  const std::unique_ptr<Communicator> self = make_self_communicator("self");
  std::vector<float> one{1.5f, 2.5f}, out(2, 0.0f);
  self->ireduce_scatter(one.data(), out.data(), 2, DType::F32)->wait();
  EXPECT_EQ(out, one);
  EXPECT_EQ(self->stats().calls("reduce_scatter"), 1);
}

// The non-blocking all-gather (the overlapped backward under sequence parallelism gathers a
// recomputed norm output in place while its input gradient runs): the blocking one's result,
// counted as one all_gather posted non-blocking, completed by a ProgressHelper; in
// place and not; a one-rank group's (the default: the blocking call) copies.
TEST_F(MpiComm, IallGatherEqualsTheBlockingOneAndIsDrivenByTheHelper) {
  const int64_t n = int64_t{1} << 19;  // a block of 2 MiB, past the eager limit
  std::vector<float> send(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) send[i] = static_cast<float>((i % 1000) + 1000 * r);
  std::vector<float> blocking(static_cast<size_t>(4 * n), -1.0f);
  comm->all_gather(send.data(), blocking.data(), n, DType::F32);
  EXPECT_EQ(comm->stats().ops.at("all_gather").posted, 0);
  comm->stats().reset();
  std::vector<float> recv(static_cast<size_t>(4 * n), -1.0f);
  ProgressHelper helper;
  auto request = comm->iall_gather(send.data(), recv.data(), n, DType::F32);
  helper.during(*request, [] {});
  EXPECT_EQ(recv, blocking);
  EXPECT_EQ(recv[static_cast<size_t>(3 * n + 7)], 3007.0f);  // rank 3's block, element 7
  std::vector<float> inplace(static_cast<size_t>(4 * n), -1.0f);
  std::copy(send.begin(), send.end(), inplace.begin() + r * n);
  auto in_place = comm->iall_gather(inplace.data() + r * n, inplace.data(), n, DType::F32);
  helper.during(*in_place, [] {});
  EXPECT_EQ(inplace, blocking);
  const OpStats& st = comm->stats().ops.at("all_gather");
  EXPECT_EQ(st.calls, 2);
  EXPECT_EQ(st.posted, 2);
  EXPECT_EQ(st.bytes, 2 * n * 4);
  const std::unique_ptr<Communicator> self = make_self_communicator("self");
  std::vector<float> one{1.5f, 2.5f}, out(2, 0.0f);
  self->iall_gather(one.data(), out.data(), 2, DType::F32)->wait();
  EXPECT_EQ(out, one);
  EXPECT_EQ(self->stats().calls("all_gather"), 1);
}

TEST_F(MpiComm, BroadcastFromAnyRoot) {
  std::vector<int64_t> v{r == 2 ? 42 : 0, r == 2 ? -7 : 0, r == 2 ? 5 : 0};
  comm->broadcast(v.data(), 3, DType::I64, 2);
  EXPECT_EQ(v, (std::vector<int64_t>{42, -7, 5}));
  float x = r == 0 ? 3.5f : 0.0f;
  comm->broadcast(&x, 1, DType::F32, 0);
  EXPECT_EQ(x, 3.5f);
  EXPECT_EQ(comm->stats().calls("broadcast"), 2);
  EXPECT_EQ(comm->stats().ops.at("broadcast").bytes, 3 * 8 + 4);
  EXPECT_THROW(comm->broadcast(&x, 1, DType::F32, 4), Error);  // checked before any MPI call
}

TEST_F(MpiComm, IsendIrecvRing) {
  const int next = (r + 1) % 4, prev = (r + 3) % 4;
  std::vector<float> out(5), in(5, -1);
  for (int i = 0; i < 5; ++i) out[i] = 100.0f * r + i;
  std::vector<double> out2{1.0 * r}, in2{-1};
  // Receives first, then sends, two tags in flight at once.
  auto rq = comm->irecv(in.data(), 5, DType::F32, prev, 3);
  auto rq2 = comm->irecv(in2.data(), 1, DType::F64, next, 4);
  auto sq = comm->isend(out.data(), 5, DType::F32, next, 3);
  auto sq2 = comm->isend(out2.data(), 1, DType::F64, prev, 4);
  sq->wait();
  sq2->wait();
  rq->wait();
  rq2->wait();
  rq->wait();  // a second wait is a no-op
  for (int i = 0; i < 5; ++i) EXPECT_EQ(in[i], 100.0f * prev + i);
  EXPECT_EQ(in2[0], 1.0 * next);
  const CommStats& s = comm->stats();
  EXPECT_EQ(s.calls("send"), 2);
  EXPECT_EQ(s.calls("recv"), 2);
  EXPECT_EQ(s.ops.at("send").bytes, 5 * 4 + 8);
  EXPECT_EQ(s.ops.at("recv").bytes, 5 * 4 + 8);
  EXPECT_GE(s.ops.at("recv").seconds, 0.0);
  EXPECT_THROW(comm->isend(out.data(), 1, DType::F32, 4, 0), Error);
  EXPECT_THROW(comm->irecv(in.data(), 1, DType::F32, -1, 0), Error);
}

// Rank r sends (r + p) % 3 elements to rank p (some blocks empty), each element naming its
// source, destination and position; every rank checks what arrived from each source.
TEST_F(MpiComm, AllToAllVUnevenBlocks) {
  auto count = [](int src, int dst) { return static_cast<int64_t>((src + dst) % 3); };
  std::vector<int64_t> send_counts(4), recv_counts(4);
  std::vector<int32_t> send;
  for (int p = 0; p < 4; ++p) {
    send_counts[p] = count(r, p);
    recv_counts[p] = count(p, r);
    for (int64_t i = 0; i < send_counts[p]; ++i) send.push_back(100 * r + 10 * p + int(i));
  }
  const int64_t total_in = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  std::vector<int32_t> recv(total_in, -1);
  comm->all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::I32);
  std::vector<int32_t> expected;
  for (int p = 0; p < 4; ++p)
    for (int64_t i = 0; i < recv_counts[p]; ++i) expected.push_back(100 * p + 10 * r + int(i));
  ASSERT_FALSE(expected.empty());  // every rank receives something: the check compares data
  EXPECT_EQ(recv, expected);

  // The counts themselves travel as one I64 per rank (how a dispatch learns its receives).
  std::vector<int64_t> told(4, -1);
  comm->all_to_all_v(send_counts.data(), {1, 1, 1, 1}, told.data(), {1, 1, 1, 1}, DType::I64);
  EXPECT_EQ(told, recv_counts);

  // F64 rows of 3 elements: block sizes in elements are multiples of the row width.
  std::vector<double> rows_out(3 * 4), rows_in(3 * 4, -1);
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 3; ++j) rows_out[3 * p + j] = r + 0.25 * p + 0.01 * j;
  comm->all_to_all_v(rows_out.data(), {3, 3, 3, 3}, rows_in.data(), {3, 3, 3, 3}, DType::F64);
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(rows_in[3 * p + j], p + 0.25 * r + 0.01 * j);

  const CommStats& s = comm->stats();
  const int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  EXPECT_EQ(s.calls("all_to_all"), 3);
  EXPECT_EQ(s.ops.at("all_to_all").bytes, sent * 4 + 4 * 8 + 12 * 8);
  EXPECT_EQ(s.ops.size(), 1u);
  // Wrong count vectors are refused on every rank before MPI is called (no hang).
  EXPECT_THROW(comm->all_to_all_v(send.data(), {1, 1}, recv.data(), {1, 1}, DType::I32), Error);
  EXPECT_THROW(comm->all_to_all_v(send.data(), {0, 0, 0, -1}, recv.data(), {0, 0, 0, 0},
                                  DType::I32),
               Error);
  EXPECT_EQ(s.calls("all_to_all"), 3);
}

TEST_F(MpiComm, Barrier) {
  comm->barrier();
  EXPECT_EQ(comm->stats().calls("barrier"), 1);
  EXPECT_EQ(comm->stats().ops.at("barrier").bytes, 0);
  float x = 0;
  EXPECT_THROW(comm->all_reduce(&x, -1, DType::F32, ReduceOp::Sum), Error);
  EXPECT_EQ(comm->stats().calls("all_reduce"), 0);  // a rejected call is not counted
  comm->stats().reset();
  EXPECT_EQ(comm->stats().calls("barrier"), 0);
}

// BF16 (raw bits, util/bf16.hpp) through every operation; sums round to nearest even.
TEST_F(MpiComm, Bf16EveryOperation) {
  auto bf = [](float f) { return float_to_bf16(f); };
  auto fl = [](uint16_t h) { return bf16_to_float(h); };
  // Sum: 0.5 + 1.5 + 2.5 + 3.5 = 8 (exact); 1.0078125 + 2^-8 is a tie that rounds to the even
  // 1.015625 (truncation would give 1.0078125); the other ranks add zeros, so any combining
  // order gives the same bits.
  std::vector<uint16_t> h{bf(r + 0.5f), bf(r == 0 ? 1.0078125f : r == 1 ? 0.00390625f : 0.0f)};
  comm->all_reduce(h.data(), 2, DType::BF16, ReduceOp::Sum);
  EXPECT_EQ(fl(h[0]), 8.0f);
  EXPECT_EQ(fl(h[1]), 1.015625f);
  // Max, with a NaN on one rank winning its element.
  std::vector<uint16_t> m{bf(-1.0f * r), bf(0.25f * r), bf(r == 2 ? NAN : 1.0f)};
  comm->all_reduce(m.data(), 3, DType::BF16, ReduceOp::Max);
  EXPECT_EQ(fl(m[0]), 0.0f);
  EXPECT_EQ(fl(m[1]), 0.75f);
  EXPECT_TRUE(std::isnan(fl(m[2])));
  // Non-blocking.
  std::vector<uint16_t> a{bf(1.0f), bf(-2.0f * r)};
  auto req = comm->iall_reduce(a.data(), 2, DType::BF16, ReduceOp::Sum);
  req->wait();
  EXPECT_EQ(fl(a[0]), 4.0f);
  EXPECT_EQ(fl(a[1]), -12.0f);
  // Reduce-scatter: send[i] = i + r over 4 blocks of 1: block b = 4b + 6.
  std::vector<uint16_t> send(4), recv(1);
  for (int i = 0; i < 4; ++i) send[i] = bf(static_cast<float>(i + r));
  comm->reduce_scatter(send.data(), recv.data(), 1, DType::BF16);
  EXPECT_EQ(fl(recv[0]), 4.0f * r + 6);
  // All-gather, broadcast, a ring of point-to-point messages.
  uint16_t mine = bf(0.5f * r);
  std::vector<uint16_t> all(4);
  comm->all_gather(&mine, all.data(), 1, DType::BF16);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(fl(all[i]), 0.5f * i);
  uint16_t root_value = r == 3 ? bf(-7.5f) : 0;
  comm->broadcast(&root_value, 1, DType::BF16, 3);
  EXPECT_EQ(fl(root_value), -7.5f);
  uint16_t out = bf(static_cast<float>(r)), in = 0;
  auto rq = comm->irecv(&in, 1, DType::BF16, (r + 3) % 4, 5);
  auto sq = comm->isend(&out, 1, DType::BF16, (r + 1) % 4, 5);
  sq->wait();
  rq->wait();
  EXPECT_EQ(fl(in), static_cast<float>((r + 3) % 4));

  const CommStats& s = comm->stats();
  EXPECT_EQ(s.calls("all_reduce"), 3);
  EXPECT_EQ(s.ops.at("all_reduce").bytes, (2 + 3 + 2) * 2);
  EXPECT_EQ(s.all_reduce_counts, (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(s.ops.at("reduce_scatter").bytes, 2);
  EXPECT_EQ(s.ops.at("all_gather").bytes, 2);
  EXPECT_EQ(s.ops.at("send").bytes, 2);
  EXPECT_EQ(mpi_datatype(DType::BF16), mpi_datatype(DType::BF16));  // created once
  int type_size = 0;
  MPI_Type_size(mpi_datatype(DType::BF16), &type_size);
  EXPECT_EQ(type_size, 2);
}

// ---- ProcessGrid ----

std::vector<int> members(Communicator& c) {
  auto& m = dynamic_cast<MpiCommunicator&>(c);
  MPI_Group g, w;
  MPI_Comm_group(m.comm(), &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  int n = 0;
  MPI_Group_size(g, &n);
  std::vector<int> in(n), out(n);
  std::iota(in.begin(), in.end(), 0);
  MPI_Group_translate_ranks(g, n, in.data(), w, out.data());
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return out;
}

void expect_groups_match(ProcessGrid& grid) {
  const GridShape& s = grid.shape();
  const int r = world_rank();
  EXPECT_EQ(grid.rank(), r);
  EXPECT_EQ(grid.coord(), coord_of(s, r));
  EXPECT_EQ(members(grid.world()), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(members(grid.tensor()), tensor_group(s, r));
  EXPECT_EQ(members(grid.pipeline()), pipeline_group(s, r));
  EXPECT_EQ(members(grid.data()), data_group(s, r));
  EXPECT_EQ(members(grid.model()), model_group(s, r));
  EXPECT_EQ(grid.tensor().rank(), grid.coord().tp);
  EXPECT_EQ(grid.pipeline().rank(), grid.coord().pp);
  EXPECT_EQ(grid.data().rank(), grid.coord().dp);
  EXPECT_EQ(grid.tensor().size(), s.tp);
  EXPECT_EQ(grid.pipeline().size(), s.pp);
  EXPECT_EQ(grid.data().size(), s.dp);
  EXPECT_EQ(grid.model().size(), s.tp * s.pp);
  EXPECT_EQ(grid.tensor().name(), "tensor");
  const bool end = grid.is_first_stage() || grid.is_last_stage();
  ASSERT_EQ(grid.in_embedding_group(), end);
  if (end) {
    EXPECT_EQ(members(*grid.embedding()), embedding_group(s, r));
    EXPECT_EQ(grid.embedding()->rank(), grid.is_first_stage() ? 0 : 1);
  } else {
    EXPECT_EQ(grid.embedding(), nullptr);
  }
}

TEST(Grid4, CommunicatorsMatchThePureFunctions) {
  ModelConfig model;
  model.layers = 4;
  const std::vector<GridShape> layouts{{2, 2, 1}, {4, 1, 1}, {1, 2, 2}, {2, 1, 2}, {1, 4, 1},
                                       {1, 1, 4}};
  EnvRanksPerNode env(nullptr);
  for (const GridShape& s : layouts) {
    SCOPED_TRACE("TP=" + std::to_string(s.tp) + " PP=" + std::to_string(s.pp) +
                 " DP=" + std::to_string(s.dp));
    ProcessGrid grid(MPI_COMM_WORLD, s, 0, model);
    expect_groups_match(grid);
  }
}

TEST(Grid4, CollectivesRunOnTheRightGroups) {
  // (2,2,1): a sum of world ranks over each group shows who is in it, and the counters land on
  // the group that was used.
  EnvRanksPerNode env(nullptr);
  ProcessGrid grid(MPI_COMM_WORLD, GridShape{2, 2, 1}, 0, ModelConfig{});
  const int r = world_rank();
  int64_t t = r, p = r;
  grid.tensor().stats().keep_all_reduce_counts = true;
  grid.tensor().all_reduce(&t, 1, DType::I64, ReduceOp::Sum);
  grid.pipeline().all_reduce(&p, 1, DType::I64, ReduceOp::Sum);
  EXPECT_EQ(t, r < 2 ? 0 + 1 : 2 + 3);
  EXPECT_EQ(p, r % 2 == 0 ? 0 + 2 : 1 + 3);
  EXPECT_EQ(grid.tensor().stats().all_reduce_counts, std::vector<int64_t>{1});
  EXPECT_EQ(grid.pipeline().stats().calls("all_reduce"), 1);
  EXPECT_EQ(grid.data().stats().calls("all_reduce"), 0);
  EXPECT_EQ(grid.world().stats().calls("all_reduce"), 0);  // construction is not counted
  std::string table = grid.stats_table();
  EXPECT_NE(table.find("tensor"), std::string::npos) << table;
  EXPECT_NE(table.find("pipeline"), std::string::npos) << table;
  EXPECT_NE(table.find("all_reduce"), std::string::npos) << table;
  EXPECT_EQ(table.find("data "), std::string::npos) << table;  // unused groups are omitted
  grid.reset_stats();
  EXPECT_EQ(grid.tensor().stats().calls("all_reduce"), 0);
}

TEST(Grid4, OperationsAreNumberedPerGroupWithTheGroupsWorldRanks) {
  // The collective watchdog's bookkeeping (comm/comm_watchdog.hpp) on real communicators:
  // every rank of a group gives the same operation the same number, and each group knows its
  // members' world ranks.
  EnvRanksPerNode env(nullptr);
  const GridShape shape{2, 2, 1};
  ProcessGrid grid(MPI_COMM_WORLD, shape, 0, ModelConfig{});
  const int r = world_rank();
  EXPECT_EQ(grid.tensor().world_ranks(), tensor_group(shape, r));
  EXPECT_EQ(grid.pipeline().world_ranks(), pipeline_group(shape, r));
  EXPECT_EQ(grid.world().world_ranks(), (std::vector<int>{0, 1, 2, 3}));
  const int64_t tensor0 = grid.tensor().last_posted();
  const int64_t pipeline0 = grid.pipeline().last_posted();
  double x = r;
  grid.tensor().all_reduce_sum(&x, 1);
  grid.tensor().broadcast(&x, 1, DType::F64, 0);
  // A ring of two in the pipeline group: a send and a receive, waited on; then a barrier.
  const int peer = 1 - grid.pipeline().rank();
  double in = -1, out = r;
  auto recv = grid.pipeline().irecv(&in, 1, DType::F64, peer, 7);
  auto send = grid.pipeline().isend(&out, 1, DType::F64, peer, 7);
  EXPECT_EQ(grid.pipeline().last_posted(), pipeline0 + 2);
  send->wait();
  while (!recv->test()) {
  }
  EXPECT_EQ(grid.pipeline().last_completed(), pipeline0 + 2) << "the receive, seen by test()";
  grid.pipeline().barrier();
  EXPECT_EQ(grid.tensor().last_posted(), tensor0 + 2);
  EXPECT_EQ(grid.tensor().last_completed(), tensor0 + 2);
  EXPECT_EQ(grid.pipeline().last_completed(), pipeline0 + 3);
  // The same numbers on every rank of the world.
  int64_t mine[2] = {grid.tensor().last_posted(), grid.pipeline().last_posted()};
  int64_t lo[2], hi[2];
  MPI_Allreduce(mine, lo, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine, hi, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo[0], hi[0]);
  EXPECT_EQ(lo[1], hi[1]);
}

TEST(Grid4, DetectedNodeIsOneMachine) {
  EnvRanksPerNode env(nullptr);
  ProcessGrid grid(MPI_COMM_WORLD, GridShape{4, 1, 1}, 0, ModelConfig{});
  EXPECT_FALSE(grid.nodes_simulated());
  EXPECT_EQ(grid.node(), 0);
  EXPECT_EQ(grid.num_nodes(), 1);
  EXPECT_EQ(grid.ranks_per_node(), 4);
  EXPECT_EQ(grid.local_rank(), world_rank());
  EXPECT_FALSE(grid.host().empty());
  std::string d = grid.describe();
  EXPECT_NE(d.find("TP=4 PP=1 DP=1, 4 ranks on 1 node (detected with MPI_COMM_TYPE_SHARED)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find(grid.host()), std::string::npos) << d;
}

TEST(Grid4, EnvironmentSimulatesNodes) {
  EnvRanksPerNode env("2");
  ProcessGrid grid(MPI_COMM_WORLD, GridShape{2, 2, 1}, 0, ModelConfig{});
  const int r = world_rank();
  EXPECT_TRUE(grid.nodes_simulated());
  EXPECT_EQ(grid.node(), r / 2);
  EXPECT_EQ(grid.local_rank(), r % 2);
  EXPECT_EQ(grid.num_nodes(), 2);
  EXPECT_EQ(grid.ranks_per_node(), 2);
  expect_groups_match(grid);
  std::string d = grid.describe();
  EXPECT_NE(d.find("4 ranks on 2 nodes (simulated by TRIDENT_RANKS_PER_NODE)"), std::string::npos)
      << d;
  // One line per rank after the header lines: "rank node local tp pp dp host".
  EXPECT_NE(d.find("     3     1      1    1    1    0  "), std::string::npos) << d;
}

TEST(Grid4, ConfigRanksPerNodeOverridesEnvironment) {
  EnvRanksPerNode env("4");
  Config cfg;
  cfg.parallel.tensor = 1;
  cfg.parallel.pipeline = 2;
  cfg.parallel.data = 2;
  cfg.parallel.ranks_per_node = 1;
  ProcessGrid grid(MPI_COMM_WORLD, cfg);
  EXPECT_EQ(grid.node(), world_rank());
  EXPECT_EQ(grid.num_nodes(), 4);
  EXPECT_EQ(grid.local_rank(), 0);
  expect_groups_match(grid);
  EXPECT_NE(grid.describe().find("simulated by parallel.ranks_per_node"), std::string::npos);
}

// Constructs the grid, expecting a trident::Error; returns its message ("" if none).
std::string grid_error(const GridShape& s, int rpn, const ModelConfig& m) {
  try {
    ProcessGrid grid(MPI_COMM_WORLD, s, rpn, m);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every rank got the same message (and is still in step: this is a collective).
void expect_same_everywhere(const std::string& msg) {
  int len = static_cast<int>(msg.size()), lo = 0, hi = 0;
  MPI_Allreduce(&len, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&len, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
  std::string root = msg;
  root.resize(hi);
  MPI_Bcast(root.data(), hi, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(root, msg);
}

TEST(Grid4, InvalidLayoutsThrowOnEveryRank) {
  EnvRanksPerNode env(nullptr);
  ModelConfig m;
  std::string e = grid_error({2, 2, 2}, 0, m);
  EXPECT_EQ(e, "parallel.tensor * parallel.pipeline * parallel.data = 2*2*2 = 8 but the job has "
               "4 ranks");
  expect_same_everywhere(e);

  ModelConfig heads = m;
  heads.heads = 6;
  e = grid_error({4, 1, 1}, 0, heads);
  EXPECT_EQ(e.rfind("model.heads = 6 is not divisible by parallel.tensor = 4", 0), 0u) << e;
  expect_same_everywhere(e);

  e = grid_error({1, 4, 1}, 0, m);
  EXPECT_EQ(e.rfind("parallel.pipeline = 4 is more than model.layers = 2", 0), 0u) << e;

  e = grid_error({4, 1, 1}, 2, m);
  EXPECT_EQ(e, "parallel.tensor = 4 does not divide the 2 ranks per node: a tensor-parallel "
               "group must not cross a node");
  expect_same_everywhere(e);
}

TEST(Grid4, TensorGroupAcrossSimulatedNodesThrows) {
  EnvRanksPerNode env("2");
  std::string e = grid_error({4, 1, 1}, 0, ModelConfig{});
  EXPECT_EQ(e, "parallel.tensor = 4 does not divide the 2 ranks per node: a tensor-parallel "
               "group must not cross a node");
  expect_same_everywhere(e);
}

TEST(Grid4, BadEnvironmentValueThrows) {
  EnvRanksPerNode env("two");
  std::string e = grid_error({2, 2, 1}, 0, ModelConfig{});
  EXPECT_EQ(e, "TRIDENT_RANKS_PER_NODE='two' is not a positive integer");
  expect_same_everywhere(e);
}

}  // namespace
}  // namespace trident

// The MoE block (model/moe.hpp) under expert parallelism on 2 ranks: EP = 2, each rank routes
// one sequence and holds 2 of the 4 experts; the tokens cross the expert group by all-to-all.
// Against the one-rank block over both sequences (computed on every rank): the outputs and
// input gradients of each rank's tokens, each rank's experts' parameter gradients (their
// slice of the stacked tensors) and the router gradient summed over the ranks, with and
// without token dropping; and the expert group's all-to-all volume per micro-batch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "comm/staged_comm.hpp"
#include "host_device.hpp"
#include "model/cpu_kernels.hpp"
#include "model/moe.hpp"
#include "model/tensor_parallel.hpp"

namespace trident {
namespace {

using K = CpuKernels<double>;
using Vec = std::vector<double>;

constexpr int64_t kE = 4, kTopK = 2, kC = 6, kF = 10, kT = 8;

Vec random_vec(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

// The global parameters and the inputs of both sequences (the same on every rank).
struct Problem {
  Vec router, w1, b1, w2, b2, x, dout;
  explicit Problem(uint64_t seed) {
    std::mt19937_64 rng(seed);
    router = random_vec(rng, kE * kC);
    w1 = random_vec(rng, kE * kF * kC);
    b1 = random_vec(rng, kE * kF);
    w2 = random_vec(rng, kE * kC * kF);
    b2 = random_vec(rng, kE * kC);
    x = random_vec(rng, 2 * kT * kC);
    dout = random_vec(rng, 2 * kT * kC);
  }
};

// One block's run: output rows, input gradient rows and the parameter gradients it holds.
struct BlockRun {
  Vec out, dx, d_router, dw1, db1, dw2, db2;
  int64_t dropped = 0;  // assignments dropped by capacity
};

ModelConfig moe_config(double capacity_factor) {
  ModelConfig m;
  m.width = kC;
  m.seq_len = kT;
  m.moe_experts = kE;
  m.moe_top_k = kTopK;
  m.moe_aux_loss_coeff = 0.01;
  m.moe_z_loss_coeff = 0.001;
  m.moe_capacity_factor = capacity_factor;
  return m;
}

// Sequences [first, first + B) through a block holding experts [e0, e0 + El) (expert group
// `group`, nullptr: all experts on this rank). loss_scale is the LM loss's: the per-sequence
// auxiliary weight is loss_scale / B, so B = 1 with 0.5 weighs a sequence like B = 2 with 1.
BlockRun run_block(const Problem& pr, const ModelConfig& m, Communicator* group, int64_t first,
              int64_t B, double loss_scale, Device* device = nullptr) {
  K k = device ? K(*device) : K();
  auto self = make_self_communicator("tensor");
  ModelShard shard;
  TensorParallel<K> tp(*self, shard, k);
  MoeMlp<K> moe(m, kF, false);
  moe.set_expert_group(group);
  const int64_t El = moe.local_experts(), e0 = group ? group->rank() * El : 0;
  BlockRun r;
  r.d_router.assign(kE * kC, 0.0);
  r.dw1.assign(El * kF * kC, 0.0);
  r.db1.assign(El * kF, 0.0);
  r.dw2.assign(El * kC * kF, 0.0);
  r.db2.assign(El * kC, 0.0);
  MoeParams<K> p;
  p.router = pr.router.data();
  p.d_router = r.d_router.data();
  p.up = {pr.w1.data() + e0 * kF * kC, pr.b1.data() + e0 * kF, r.dw1.data(), r.db1.data()};
  p.down = {pr.w2.data() + e0 * kC * kF, pr.b2.data() + e0 * kC, r.dw2.data(), r.db2.data()};
  MoeActs<K> acts = moe.make_acts(k.device(), B);
  const int64_t N = B * kT;
  Vec norm2(pr.x.begin() + first * kT * kC, pr.x.begin() + (first + B) * kT * kC);
  Vec dout(pr.dout.begin() + first * kT * kC, pr.dout.begin() + (first + B) * kT * kC);
  r.out.assign(N * kC, 0.0);
  moe.forward(tp, k, p, acts, r.out.data(), norm2.data(), B, true);
  const double* dx = moe.backward(tp, k, p, acts, dout.data(), norm2.data(), B, loss_scale);
  r.dx.assign(dx, dx + N * kC);
  r.dropped = moe.take_stats().dropped;
  return r;
}

// |a - b| <= tol elementwise; returns the number of elements compared.
int64_t expect_close(const Vec& a, const double* b, int64_t n, double tol, const char* what) {
  EXPECT_EQ(static_cast<int64_t>(a.size()), n) << what;
  int64_t compared = 0;
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(a.size()); ++i, ++compared)
    EXPECT_NEAR(a[i], b[i], tol) << what << " element " << i;
  return compared;
}

// Every buffer the block hands its expert group lies in device memory, the row counts of the
// exchange plan included: they are host integers, and a GPU's staged or NCCL communicator cannot
// read host memory (cudaErrorInvalidValue on the H200, 2026-12-04, before the counts went
// through device memory). The group is the one a GPU run without NCCL gets
// (make_device_communicator: staged) over a strict tracking device, which fails every copy
// whose device side is host memory. Forward: counts, rows out, rows back; backward: two more.
TEST(MoeExpertParallelMemory, TheExpertGroupIsHandedDeviceMemoryOnly) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MpiCommunicator expert(dup, "expert");
  ASSERT_EQ(expert.size(), 2);
  testing_support::TrackingDevice device(/*strict=*/true);
  const auto group = make_device_communicator(expert, device);
  const BlockRun ep = run_block(Problem(18), moe_config(0.0), group.get(), expert.rank(), 1,
                                0.5, &device);
  EXPECT_EQ(group->stats().calls("all_to_all"), 5);
  EXPECT_FALSE(ep.out.empty());
}

class MoeExpertParallel : public ::testing::TestWithParam<double> {};

TEST_P(MoeExpertParallel, MatchesOneRankBlock) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MpiCommunicator expert(dup, "expert");
  ASSERT_EQ(expert.size(), 2);
  const int rank = expert.rank();
  const ModelConfig m = moe_config(GetParam());
  const Problem pr(18);
  const BlockRun ref = run_block(pr, m, nullptr, 0, 2, 1.0);
  const BlockRun ep = run_block(pr, m, &expert, rank, 1, 0.5);

  if (GetParam() > 0) EXPECT_GT(ref.dropped, 0) << "the capacity case must drop something";
  const double tol = 1e-12;
  const int64_t El = kE / 2, e0 = rank * El, rows = kT * kC;
  int64_t compared = 0;
  compared += expect_close(ep.out, ref.out.data() + rank * rows, rows, tol, "output");
  compared += expect_close(ep.dx, ref.dx.data() + rank * rows, rows, tol, "input gradient");
  compared += expect_close(ep.dw1, ref.dw1.data() + e0 * kF * kC, El * kF * kC, tol, "fc1 dW");
  compared += expect_close(ep.db1, ref.db1.data() + e0 * kF, El * kF, tol, "fc1 db");
  compared += expect_close(ep.dw2, ref.dw2.data() + e0 * kC * kF, El * kC * kF, tol, "fc2 dW");
  compared += expect_close(ep.db2, ref.db2.data() + e0 * kC, El * kC, tol, "fc2 db");
  // Each rank's router saw its own tokens: the sum over the ranks is the one-rank gradient.
  Vec d_router = ep.d_router;
  MPI_Allreduce(MPI_IN_PLACE, d_router.data(), static_cast<int>(d_router.size()), MPI_DOUBLE,
                MPI_SUM, MPI_COMM_WORLD);
  compared += expect_close(d_router, ref.d_router.data(), kE * kC, tol, "router dW");
  EXPECT_EQ(compared, 2 * rows + El * (2 * kF * kC + kF + kC) + kE * kC);
  // The block did something: some expert gradient is not zero.
  double norm = 0;
  for (double g : ep.dw1) norm += g * g;
  EXPECT_GT(norm, 0.0);
}

// Forward: the expert counts (E/EP integers to each rank), the rows to the experts, the
// outputs back; backward: the output gradients to the experts and the input gradients back.
// The rows a rank sends to the experts are its kept assignments: tokens x top-k x width x
// bytes when nothing is dropped.
TEST(MoeExpertParallelCounters, DispatchVolumeIsTokensTimesTopKTimesWidth) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MpiCommunicator expert(dup, "expert");
  const Problem pr(7);
  run_block(pr, moe_config(0.0), &expert, expert.rank(), 1, 0.5);
  const int64_t dispatch = kT * kTopK * kC * 8;
  // What this rank's experts received and sent back: the group's total minus the other rank's.
  int64_t sent = 0;
  const CommStats& s = expert.stats();
  ASSERT_EQ(s.calls(kAllToAll), 5);
  // counts: E int64; rows out and gradients out: `dispatch` each; outputs and input gradients
  // back: the rows this rank's experts received (R), twice.
  sent = s.ops.at(kAllToAll).bytes - kE * 8 - 2 * dispatch;
  int64_t total_back = sent;
  MPI_Allreduce(MPI_IN_PLACE, &total_back, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  // Every assignment of the group comes back to its token once per direction.
  EXPECT_EQ(total_back, 2 * 2 * dispatch);
  EXPECT_EQ(sent % (2 * kC * 8), 0);
}

INSTANTIATE_TEST_SUITE_P(Dropping, MoeExpertParallel, ::testing::Values(0.0, 1.0),
                         [](const ::testing::TestParamInfo<double>& info) {
                           return info.param == 0.0 ? std::string("Dropless")
                                                    : std::string("Capacity1");
                         });

}  // namespace
}  // namespace trident

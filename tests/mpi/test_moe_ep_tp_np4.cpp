// The MoE block (model/moe.hpp) under expert and tensor parallelism on 4 ranks: EP 2 x TP 2
// (world rank = dp * 2 + tp; the expert group is the 2 ranks with the same tensor rank). Each
// data rank routes one sequence; each rank holds 2 of the 4 experts, and of those its tensor
// slice (fc1 rows / bias, fc2 columns; fc2's bias whole, added by tensor rank 0). Against the
// one-rank block over both sequences: outputs, input gradients, each rank's slices of the
// expert gradients and the router gradient summed over the expert group, with and without
// token dropping.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <random>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "model/cpu_kernels.hpp"
#include "model/moe.hpp"
#include "model/tensor_parallel.hpp"

namespace trident {
namespace {

using K = CpuKernels<double>;
using Vec = std::vector<double>;

constexpr int64_t kE = 4, kTopK = 2, kC = 6, kF = 10, kT = 8, kTp = 2, kFl = kF / kTp;

Vec random_vec(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

// Global (one-rank) tensors: router [E,C], w1 [E*F,C], b1 [E*F], w2 [E*C,F], b2 [E*C].
struct Tensors {
  Vec router, w1, b1, w2, b2;
};

// The slice a (tensor rank t, experts [e0, e0+El)) rank holds of each stacked tensor.
Tensors slice(const Tensors& g, int64_t e0, int64_t El, int t) {
  Tensors s;
  s.router = g.router;
  for (int64_t e = e0; e < e0 + El; ++e) {
    for (int64_t f = t * kFl; f < (t + 1) * kFl; ++f) {
      const int64_t row = e * kF + f;
      s.w1.insert(s.w1.end(), g.w1.begin() + row * kC, g.w1.begin() + (row + 1) * kC);
      s.b1.push_back(g.b1[row]);
    }
    for (int64_t c = 0; c < kC; ++c) {
      const int64_t row = e * kC + c;
      s.w2.insert(s.w2.end(), g.w2.begin() + row * kF + t * kFl,
                  g.w2.begin() + row * kF + (t + 1) * kFl);
      s.b2.push_back(g.b2[row]);
    }
  }
  return s;
}

struct BlockRun {
  Vec out, dx;
  Tensors grad;
  int64_t dropped = 0;
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

// Sequences [first, first + B) of x / dout through a block with weights `w` (already this
// rank's slices), tensor group `tensor` (rank t of tp) and expert group `expert` (nullptr:
// EP = 1). loss_scale / B is the per-sequence auxiliary weight.
BlockRun run_block(const ModelConfig& m, const Tensors& w, const Vec& x, const Vec& dout,
                   Communicator& tensor, Communicator* expert, int64_t first, int64_t B,
                   double loss_scale) {
  K k;
  ModelShard shard;
  shard.tp_rank = tensor.rank();
  shard.tp_size = tensor.size();
  TensorParallel<K> tp(tensor, shard, k);
  const int64_t Fl = kF / tensor.size();
  MoeMlp<K> moe(m, Fl, false);
  moe.set_expert_group(expert);
  BlockRun r;
  r.grad.router.assign(w.router.size(), 0.0);
  r.grad.w1.assign(w.w1.size(), 0.0);
  r.grad.b1.assign(w.b1.size(), 0.0);
  r.grad.w2.assign(w.w2.size(), 0.0);
  r.grad.b2.assign(w.b2.size(), 0.0);
  MoeParams<K> p;
  p.router = w.router.data();
  p.d_router = r.grad.router.data();
  p.up = {w.w1.data(), w.b1.data(), r.grad.w1.data(), r.grad.b1.data()};
  p.down = {w.w2.data(), w.b2.data(), r.grad.w2.data(), r.grad.b2.data()};
  MoeActs<K> acts = moe.make_acts(k.device(), B);
  const int64_t N = B * kT;
  Vec norm2(x.begin() + first * kT * kC, x.begin() + (first + B) * kT * kC);
  Vec d(dout.begin() + first * kT * kC, dout.begin() + (first + B) * kT * kC);
  r.out.assign(N * kC, 0.0);
  moe.forward(tp, k, p, acts, r.out.data(), norm2.data(), B, true);
  const double* dx = moe.backward(tp, k, p, acts, d.data(), norm2.data(), B, loss_scale);
  r.dx.assign(dx, dx + N * kC);
  r.dropped = moe.take_stats().dropped;
  return r;
}

int64_t expect_close(const Vec& a, const Vec& b, double tol, const char* what) {
  EXPECT_EQ(a.size(), b.size()) << what;
  int64_t compared = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i, ++compared)
    EXPECT_NEAR(a[i], b[i], tol) << what << " element " << i;
  return compared;
}

class MoeExpertTensorParallel : public ::testing::TestWithParam<double> {};

TEST_P(MoeExpertTensorParallel, Ep2Tp2MatchesOneRankBlock) {
  int world = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, 4);
  const int t = world % kTp, dp = world / kTp;
  MPI_Comm tensor_comm, expert_comm;
  MPI_Comm_split(MPI_COMM_WORLD, dp, t, &tensor_comm);
  MPI_Comm_split(MPI_COMM_WORLD, t, dp, &expert_comm);
  MpiCommunicator tensor(tensor_comm, "tensor"), expert(expert_comm, "expert");
  auto self = make_self_communicator("tensor");

  std::mt19937_64 rng(182);
  Tensors g{random_vec(rng, kE * kC), random_vec(rng, kE * kF * kC), random_vec(rng, kE * kF),
            random_vec(rng, kE * kC * kF), random_vec(rng, kE * kC)};
  const Vec x = random_vec(rng, 2 * kT * kC), dout = random_vec(rng, 2 * kT * kC);
  const ModelConfig m = moe_config(GetParam());

  const BlockRun ref = run_block(m, g, x, dout, *self, nullptr, 0, 2, 1.0);
  if (GetParam() > 0) EXPECT_GT(ref.dropped, 0) << "the capacity case must drop something";
  const int64_t El = kE / 2, e0 = dp * El;
  const BlockRun ep = run_block(m, slice(g, e0, El, t), x, dout, tensor, &expert, dp, 1, 0.5);

  const double tol = 1e-12;
  const int64_t rows = kT * kC;
  const Vec ref_out(ref.out.begin() + dp * rows, ref.out.begin() + (dp + 1) * rows);
  const Vec ref_dx(ref.dx.begin() + dp * rows, ref.dx.begin() + (dp + 1) * rows);
  const Tensors ref_grad = slice(ref.grad, e0, El, t);
  int64_t compared = 0;
  compared += expect_close(ep.out, ref_out, tol, "output");
  compared += expect_close(ep.dx, ref_dx, tol, "input gradient");
  compared += expect_close(ep.grad.w1, ref_grad.w1, tol, "fc1 dW");
  compared += expect_close(ep.grad.b1, ref_grad.b1, tol, "fc1 db");
  compared += expect_close(ep.grad.w2, ref_grad.w2, tol, "fc2 dW");
  compared += expect_close(ep.grad.b2, ref_grad.b2, tol, "fc2 db");
  // Each data rank's router saw its own tokens: summed over the expert group (the same tensor
  // rank) it is the one-rank gradient, on every tensor rank.
  Vec d_router = ep.grad.router;
  expert.all_reduce_sum(d_router.data(), static_cast<int64_t>(d_router.size()));
  compared += expect_close(d_router, ref.grad.router, tol, "router dW");
  EXPECT_EQ(compared, 2 * rows + El * (2 * kFl * kC + kFl + kC) + kE * kC);
}

INSTANTIATE_TEST_SUITE_P(Dropping, MoeExpertTensorParallel, ::testing::Values(0.0, 1.0),
                         [](const ::testing::TestParamInfo<double>& info) {
                           return info.param == 0.0 ? std::string("Dropless")
                                                    : std::string("Capacity1");
                         });

}  // namespace
}  // namespace trident

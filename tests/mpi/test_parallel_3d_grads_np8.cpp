// Per-parameter gradient parity on the 8-rank 3D grid: after step 1, every parameter's
// gradient on test_parallel_3d_np8's four layouts, (TP, PP, DP) = (2, 2, 2) and (2, 1, 4) with
// ZeRO-1, (1, 2, 4) and (4, 2, 1) without, against the single-rank run's (relative error per
// parameter <= 1e-5). Every copy of every element is compared, and the distinct global
// elements compared must be the model's parameter count: a comparison that missed a tensor, a
// shard or a ZeRO slice fails. The model and data are test_parallel_3d_np8's (which checks the
// losses and gradient norms of 20 steps); one step each keeps 8 ranks short.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "parallel_3d_config.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

void check(int tp, int pp, int dp, int zero) {
  const std::string name = "(TP,PP,DP)=(" + std::to_string(tp) + "," + std::to_string(pp) + "," +
                           std::to_string(dp) + ")" + (zero ? " ZeRO-1" : "");
  const auto dir = shared_corpus("3d_grads");
  const Config config = parallel_3d_config(dir, tp, pp, dp, zero);
  const Reference ref = reference_run(config, 1);  // step-1 gradients, global layout
  GradParity g;
  double loss_error = 0;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    const double loss = t.forward_backward(0);
    loss_error = std::abs(loss - ref.losses[0]) / ref.losses[0];
    g = grad_parity(t, ref, config, grid);
  });
  EXPECT_GT(g.params, 0) << name;
  EXPECT_GT(g.compared, 0) << name << ": nothing compared";
  EXPECT_EQ(g.covered, g.params) << name << ": global gradient elements compared";
  EXPECT_GE(g.compared, g.covered) << name;
  EXPECT_LE(g.worst, 1e-5) << name << ": " << g.worst_name;
  EXPECT_LE(loss_error, 1e-5) << name;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] %s: step-1 gradients of %lld tensors, worst relative error %.3e "
                "(%s); %lld element comparisons covering %lld of %lld parameters; step-1 loss "
                "relative error %.3e\n",
                name.c_str(), static_cast<long long>(g.tensors), g.worst, g.worst_name.c_str(),
                static_cast<long long>(g.compared), static_cast<long long>(g.covered),
                static_cast<long long>(g.params), loss_error);
}

}  // namespace

TEST(Parallel3dGrads, Tp2Pp2Dp2Zero1) { check(2, 2, 2, 1); }
TEST(Parallel3dGrads, Tp1Pp2Dp4) { check(1, 2, 4, 0); }
TEST(Parallel3dGrads, Tp4Pp2Dp1) { check(4, 2, 1, 0); }
TEST(Parallel3dGrads, Tp2Pp1Dp4Zero1) { check(2, 1, 4, 1); }

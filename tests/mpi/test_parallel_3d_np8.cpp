// The full 3D grid on 8 ranks: (TP, PP, DP) = (2,2,2), (1,2,4), (4,2,1), (2,1,4), each with and
// without ZeRO-1, against the single-rank run (losses of 20 steps within 1e-5 relative, and the
// gradient norm on the steps where clipping is active, so the clipped update is the same);
// the collective calls of one step per group
// match the documented formula; ZeRO-1's optimizer state is 1/DP of the replicated one.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "parallel_3d_config.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 20;

const Reference& reference(const std::filesystem::path& dir) {
  static const Reference ref = reference_run(parallel_3d_config(dir, 1, 1, 1, 0), kSteps);
  return ref;
}

// docs/parallelism.md, "Collectives per step": the calls of one training step of this rank.
std::map<std::string, std::map<std::string, int64_t>> expected_calls(const Config& c,
                                                                     Trainer& t,
                                                                     ProcessGrid& grid) {
  const ModelShard& s = t.model().shard();
  const int64_t M = c.num_microbatches(), L = s.layer_end - s.layer_begin;
  const int pp = grid.shape().pp, dp = grid.shape().dp;
  const bool first = s.has_embedding, last = s.has_head;
  const int64_t buckets = static_cast<int64_t>(t.gradient_sync().buckets().size());
  const bool zero = c.optim.zero_stage == 1 && dp > 1;
  std::map<std::string, std::map<std::string, int64_t>> e;
  // The last stage's head: the loss's max and sum, then the input gradient; on one tensor rank
  // the fused cross-entropy needs neither reduction, only the input gradient's.
  const int64_t head = grid.shape().tp > 1 ? 3 : 1;
  e["tensor"]["all_reduce"] = M * (4 * L + (first ? 1 : 0) + (last ? head : 0));
  if (pp > 1) {
    e["pipeline"]["send"] = M * ((last ? 0 : 1) + (first ? 0 : 1));
    e["pipeline"]["recv"] = e["pipeline"]["send"];
    e["pipeline"]["broadcast"] = 1;  // the loss, from the last stage
    if (first || last) e["embedding"]["all_reduce"] = 1;
  }
  if (dp > 1) {
    e["data"]["all_reduce"] = 1 + (zero ? 1 : buckets);  // loss; norm or gradient buckets
    if (zero) e["data"]["reduce_scatter"] = e["data"]["all_gather"] = buckets;
  }
  e["model"]["all_reduce"] = 1;  // the gradient norm
  return e;
}

void check(int tp, int pp, int dp, int zero) {
  const std::string name = "(TP,PP,DP)=(" + std::to_string(tp) + "," + std::to_string(pp) + "," +
                           std::to_string(dp) + ")" + (zero ? " ZeRO-1" : "");
  const auto dir = shared_corpus("3d");
  const Reference& ref = reference(dir);
  ASSERT_GT(ref.grad_norms[0], 1.0) << "the test needs clipping active (optim.grad_clip = 1)";
  const Config config = parallel_3d_config(dir, tp, pp, dp, zero);
  double worst_loss = 0, worst_norm = 0, worst_clipped_norm = 0, state_bytes = 0;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    for (Communicator* c : grid.communicators()) c->stats().reset();
    for (int64_t s = 0; s < kSteps; ++s) {
      const StepMetrics m = t.apply_update(s, t.forward_backward(s));
      if (s == 0) {
        for (const auto& [group, ops] : expected_calls(config, t, grid))
          for (const auto& [op, calls] : ops) {
            Communicator* comm = nullptr;
            for (Communicator* c : grid.communicators())
              if (c->name() == group) comm = c;
            ASSERT_NE(comm, nullptr) << group;
            EXPECT_EQ(comm->stats().calls(op), calls)
                << name << " rank " << grid.rank() << " group " << group << " op " << op;
          }
      }
      worst_loss = std::max(worst_loss, std::abs(m.loss - ref.losses[s]) / ref.losses[s]);
      const double norm_err = std::abs(m.grad_norm - ref.grad_norms[s]) / ref.grad_norms[s];
      worst_norm = std::max(worst_norm, norm_err);
      // Where clipping is active the norm sets the update's scale: it must agree there.
      if (ref.grad_norms[s] > config.optim.grad_clip)
        worst_clipped_norm = std::max(worst_clipped_norm, norm_err);
    }
    state_bytes = static_cast<double>(t.optimizer().state_bytes());
  });
  EXPECT_LE(worst_loss, 1e-5) << name;
  EXPECT_LE(worst_clipped_norm, 1e-5) << name;
  worst_loss = max_over_world(worst_loss);
  worst_norm = max_over_world(worst_norm);
  worst_clipped_norm = max_over_world(worst_clipped_norm);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] %s: losses of 20 steps worst relative error %.3e; gradient norm "
                "%.3e on clipped steps, %.3e on all (final loss %.6f; step-1 norm %.3f > clip 1)\n",
                name.c_str(), worst_loss, worst_clipped_norm, worst_norm, ref.losses.back(),
                ref.grad_norms[0]);
  // ZeRO-1: each rank's optimizer state within 5% of 1/DP of the replicated optimizer's.
  static std::map<std::string, double> replicated_bytes;
  const std::string key = std::to_string(tp) + std::to_string(pp) + std::to_string(dp);
  double max_bytes = state_bytes;
  MPI_Allreduce(MPI_IN_PLACE, &max_bytes, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (!zero) {
    replicated_bytes[key] = max_bytes;
  } else {
    ASSERT_TRUE(replicated_bytes.count(key));
    const double target = replicated_bytes[key] / dp;
    EXPECT_LE(std::abs(max_bytes - target) / target, 0.05) << name;
    if (rank == 0)
      std::printf("[ measured ] %s: optimizer state %.0f bytes per rank = %.4f of 1/DP of %.0f\n",
                  name.c_str(), max_bytes, max_bytes / target, replicated_bytes[key]);
  }
}

}  // namespace

TEST(Parallel3d, Tp2Pp2Dp2) { check(2, 2, 2, 0); check(2, 2, 2, 1); }
TEST(Parallel3d, Tp1Pp2Dp4) { check(1, 2, 4, 0); check(1, 2, 4, 1); }
TEST(Parallel3d, Tp4Pp2Dp1) { check(4, 2, 1, 0); check(4, 2, 1, 1); }
TEST(Parallel3d, Tp2Pp1Dp4) { check(2, 1, 4, 0); check(2, 1, 4, 1); }

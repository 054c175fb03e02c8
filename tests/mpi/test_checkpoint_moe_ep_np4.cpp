// Expert-parallel checkpoints (docs/moe.md): every expert is written once (by its expert-data
// rank 0, or by each holder of a ZeRO-1 slice of its moments), so an EP 2 of DP 4 checkpoint
// with ZeRO-1 resumes bit for bit on its layout and continues within 1e-5 of the uninterrupted
// run on EP 1, EP 4 and EP 2 x TP 2.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "moe_configs.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {
constexpr int64_t kSteps = 12, kSaveAt = 6;
}  // namespace

// Every weight and moment element covered, each compared bit for bit.
TEST(MoeCheckpoint, Ep2Dp4Zero1SameLayoutIsBitwiseIdentical) {
  const auto dir = shared_corpus("moe_ckpt_ep_same");
  expect_bitwise_resume(moe_for(dir, 1, 1, 4, 1, "ep_same", 4, 2), kSteps, kSaveAt);
}

TEST(MoeCheckpoint, Ep2CheckpointResumesOnEp1Ep4AndTp2) {
  const auto dir = shared_corpus("moe_ckpt_ep_reshard");
  const SavedRun source_run =
      train_saving_at(moe_for(dir, 1, 1, 4, 1, "ep_reshard", 4, 2), kSaveAt, kSteps);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int layouts[][5] = {{1, 1, 1, 0, 1}, {1, 1, 4, 0, 4}, {2, 1, 2, 1, 2}};  // tp pp dp zero ep
  for (const auto& l : layouts) {
    const std::string what = "(" + std::to_string(l[0]) + "," + std::to_string(l[1]) + "," +
                             std::to_string(l[2]) + ") EP " + std::to_string(l[4]);
    const double worst = resumed_loss_error(
        moe_for(dir, l[0], l[1], l[2], l[3], "unused", 4, l[4]), source_run, kSaveAt, kSteps, what);
    if (rank == 0)
      std::printf("[ measured ] MoE (1,1,4) EP 2 ZeRO-1 checkpoint resumed on %s zero %d: next "
                  "%lld losses worst relative error %.3e\n",
                  what.c_str(), l[3], static_cast<long long>(kSteps - kSaveAt), worst);
  }
}

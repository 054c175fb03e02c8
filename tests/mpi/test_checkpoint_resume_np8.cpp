// Checkpoints on the 3D grid: resuming on the same layout is bitwise identical to an
// uninterrupted run (losses, weights and moments; with ZeRO-1 on both sides in
// test_checkpoint_zero1_np8), and a checkpoint written by (TP, PP, DP) = (2, 2, 2) with ZeRO-1
// resumes on (4, 1, 2), (1, 4, 2), (1, 1, 1) and (2, 2, 2) without ZeRO, continuing within 1e-5.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 20, kSaveAt = 10;

Config config_for(const std::filesystem::path& dir, int tp, int pp, int dp, int zero,
                  const std::string& ckpt) {
  return checkpoint_config(dir, tp, pp, dp, zero, ckpt, {"parallel.dp_bucket_mb=0.05"});
}

}  // namespace

TEST(CheckpointResume, SameLayoutIsBitwiseIdentical) {
  const auto dir = shared_corpus("ckpt_same");
  const StateComparison c = expect_bitwise_resume(config_for(dir, 2, 2, 2, 0, "same"), kSteps,
                                                  kSaveAt);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] (2,2,2) resumed at step 10 of 20: %lld elements of weights and "
                "moments compared bit for bit, %lld differ; global weights covered %lld\n",
                static_cast<long long>(c.compared), static_cast<long long>(c.differing),
                static_cast<long long>(c.weights_covered));
}

TEST(CheckpointResume, Zero1CheckpointOf222ResumesOnOtherLayouts) {
  const auto dir = shared_corpus("ckpt_reshard");
  const Config source = config_for(dir, 2, 2, 2, 1, "reshard");
  const SavedRun source_run = train_saving_at(source, kSaveAt, kSteps);
  const std::vector<double>& uninterrupted = source_run.losses;
  const std::string& path = source_run.path;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int layouts[][3] = {{4, 1, 2}, {1, 4, 2}, {1, 1, 1}, {2, 2, 2}};
  for (const auto& l : layouts) {
    const Config target = config_for(dir, l[0], l[1], l[2], 0, "unused");
    double worst = 0.0;
    on_layout(target, [&](Trainer& t, ProcessGrid&) {
      t.load_checkpoint(path);
      const auto losses = train_steps(t, kSaveAt, kSteps);
      for (int64_t i = 0; i < kSteps - kSaveAt; ++i)
        worst = std::max(worst, std::abs(losses[i] - uninterrupted[kSaveAt + i]) /
                                    uninterrupted[kSaveAt + i]);
    });
    EXPECT_LE(worst, 1e-5) << "resumed on (" << l[0] << "," << l[1] << "," << l[2] << ")";
    worst = max_over_world(worst);
    if (rank == 0)
      std::printf("[ measured ] (2,2,2) ZeRO-1 checkpoint resumed on (%d,%d,%d): next 10 losses "
                  "worst relative error %.3e\n", l[0], l[1], l[2], worst);
  }
}

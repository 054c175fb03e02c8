// Resuming into ZeRO-1 on 8 ranks. (TP, PP, DP) = (2, 2, 2) with ZeRO-1 on both sides: the run
// that stops at a checkpoint and resumes ends bit for bit where the uninterrupted run ends:
// losses, weights, both AdamW moments (each global element compared, counted) and the update
// count. A ZeRO-1 checkpoint of (1, 2, 2) resumed under ZeRO-1 on (1, 2, 4): each rank's
// moment slices (other slices than those written) equal the file's global tensors bit for bit,
// the source's slices equal them too, and the next losses follow the uninterrupted run within
// the cross-layout tolerance (1e-5 relative). test_checkpoint_resume_np8 covers ZeRO-1 into
// layouts without ZeRO and the same-layout resume without ZeRO.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

// Few steps: 8 ranks on a small machine are slow (MPICH busy-polls); Adam's moments and the
// bias correction are well past their start after 3 updates.
constexpr int64_t kSteps = 6, kSaveAt = 3;

Config config_for(const std::filesystem::path& dir, int tp, int pp, int dp,
                  const std::string& ckpt) {
  return checkpoint_config(dir, tp, pp, dp, 1, ckpt,
                           {"train.steps=" + std::to_string(kSteps), "parallel.dp_bucket_mb=0.05"});
}

std::string from_world_rank0(std::string s) {
  int64_t n = static_cast<int64_t>(s.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  s.resize(static_cast<size_t>(n));
  MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

}  // namespace

TEST(CheckpointZero1, Resume222WithZero1OnBothSidesIsBitwiseIdentical) {
  const auto dir = shared_corpus("zero1_same");
  const Config config = config_for(dir, 2, 2, 2, "same");
  const StateComparison c = expect_bitwise_resume(config, kSteps, kSaveAt);
  if (world_rank() == 0)
    std::printf("[ measured ] (2,2,2) ZeRO-1 -> (2,2,2) ZeRO-1, checkpoint at step %lld of %lld: "
                "%lld elements compared bit for bit (weights and both moments, copies "
                "included), %lld differ; global elements covered: weights %lld, exp_avg %lld, "
                "exp_avg_sq %lld of %lld parameters\n",
                static_cast<long long>(kSaveAt), static_cast<long long>(kSteps),
                static_cast<long long>(c.compared), static_cast<long long>(c.differing),
                static_cast<long long>(c.weights_covered),
                static_cast<long long>(c.exp_avg_covered),
                static_cast<long long>(c.exp_avg_sq_covered),
                static_cast<long long>(global_param_count(config)));
}

TEST(CheckpointZero1, Dp2CheckpointResumesUnderZero1OnDp4) {
  const auto dir = shared_corpus("zero1_dp");
  const int rank = world_rank();
  // (1, 2, 2) runs as two independent 4-rank jobs: each writes its own checkpoint directory.
  const Config source = config_for(dir, 1, 2, 2, "dp2_job" + std::to_string(rank / 4));
  const int64_t params = global_param_count(source);
  MomentCheck written;
  const SavedRun source_run =
      train_saving_at(source, kSaveAt, kSteps,
                      [&](Trainer& t, ProcessGrid& grid, const std::string& saved) {
                        written = check_moments_against_file(t, grid, saved);
                      });
  const std::vector<double>& uninterrupted = source_run.losses;
  std::string path = source_run.path;
  EXPECT_EQ(written.differing, 0) << "of " << written.compared;
  EXPECT_EQ(written.covered, 2 * params) << "global moment elements the DP 2 job compared";
  path = from_world_rank0(path);  // the first job's checkpoint

  const Config target = config_for(dir, 1, 2, 4, "unused");
  MomentCheck read;
  double worst = 0.0;
  size_t checked = 0;
  on_layout(target, [&](Trainer& t, ProcessGrid& grid) {
    t.load_checkpoint(path);
    ASSERT_EQ(t.start_step(), kSaveAt);
    EXPECT_EQ(t.optimizer().updates(), kSaveAt);
    read = check_moments_against_file(t, grid, path);
    const auto losses = train_steps(t, kSaveAt, kSteps);
    for (size_t i = 0; i < losses.size(); ++i, ++checked)
      worst = std::max(worst, std::abs(losses[i] - uninterrupted[kSaveAt + i]) /
                                  uninterrupted[kSaveAt + i]);
  });
  EXPECT_EQ(read.differing, 0) << "of " << read.compared;
  EXPECT_EQ(read.covered, 2 * params) << "global moment elements the DP 4 job compared";
  EXPECT_EQ(checked, static_cast<size_t>(kSteps - kSaveAt));
  EXPECT_LE(worst, 1e-5);
  worst = max_over_world(worst);
  if (rank == 0)
    std::printf("[ measured ] (1,2,2) ZeRO-1 checkpoint at step %lld -> (1,2,4) ZeRO-1: moments "
                "vs the file's global tensors: written %lld compared, %lld differ, %lld of "
                "%lld covered; read back %lld compared, %lld differ, %lld of %lld covered; "
                "next %lld losses worst relative error %.3e against the uninterrupted run\n",
                static_cast<long long>(kSaveAt), static_cast<long long>(written.compared),
                static_cast<long long>(written.differing),
                static_cast<long long>(written.covered), static_cast<long long>(2 * params),
                static_cast<long long>(read.compared), static_cast<long long>(read.differing),
                static_cast<long long>(read.covered), static_cast<long long>(2 * params),
                static_cast<long long>(kSteps - kSaveAt), worst);
}

// The divergence guard on PP 2 x DP 2: a loss spike on global batches 7 and 8
// (TRIDENT_TEST_CORRUPT_BATCHES, test only) makes the run roll back to its last checkpoint
// inside the job and skip those batches; its weights then equal, bit for bit, those of a run
// given train.skip_batches = [7, 8] from the start. A resume from a checkpoint written after
// the rollback keeps skipping them; with no rollback left, or no checkpoint, the run ends
// Diverged. And the non-finite-gradient skip with two pipeline stages.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "checkpoint/commit.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 14;

// PP 2 x DP 2, checkpoints every 2 steps, a spike is 3x the median of the last 4 good losses,
// 2 bad steps in a row roll back.
Config guarded_config(const std::filesystem::path& dir, const std::string& name,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "train.steps=" + std::to_string(kSteps), "checkpoint.interval=2", "train.spike_factor=3",
      "train.spike_window=4", "train.max_bad_steps=2", "checkpoint.keep=10"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  const Config config = checkpoint_config(dir, 1, 2, 2, 0, name, overrides);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::filesystem::remove_all(config.checkpoint.dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return config;
}

// The test-only corruption on every rank of this process (each rank is its own process).
void corrupt_batches(const char* list) {
  if (list) ::setenv("TRIDENT_TEST_CORRUPT_BATCHES", list, 1);
  else ::unsetenv("TRIDENT_TEST_CORRUPT_BATCHES");
}

// Elements compared over all ranks (each rank compares its own shard of the same layout).
int64_t total_over_world(int64_t n) {
  MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return n;
}

}  // namespace

TEST(Rollback, SkipsTheSpikeBatchesLikeARunThatNeverSawThem) {
  const auto dir = shared_corpus("rollback");
  // The rolled-back run: batches 7 and 8 spike; the checkpoint of step 8 is not written (bad
  // streak), so it goes back to step 6 and reads batch 9 at step 7.
  corrupt_batches("7,8");
  std::vector<float> rolled_back, reference, resumed;
  on_layout(guarded_config(dir, "spiked"), [&](Trainer& t, ProcessGrid&) {
    EXPECT_EQ(t.run(), RunOutcome::Finished);
    EXPECT_EQ(t.rollbacks(), 1);
    EXPECT_EQ(t.skipped_batches(), (std::vector<int64_t>{7, 8}));
    EXPECT_EQ(t.skipped_steps(), 0) << "the bad steps were undone by the rollback";
    EXPECT_EQ(t.optimizer().updates(), kSteps);
    rolled_back = t.host_weights();
  });
  // The reference: the same skip list from the start, no corruption, no rollback.
  corrupt_batches(nullptr);
  on_layout(guarded_config(dir, "reference", {"train.skip_batches=[7, 8]"}),
            [&](Trainer& t, ProcessGrid&) {
              EXPECT_EQ(t.run(), RunOutcome::Finished);
              EXPECT_EQ(t.rollbacks(), 0);
              reference = t.host_weights();
            });
  ASSERT_FALSE(rolled_back.empty());
  EXPECT_TRUE(rolled_back == reference) << "weights after the rollback differ from the reference";
  const int64_t compared = total_over_world(static_cast<int64_t>(rolled_back.size()));
  if (world_rank() == 0)
    std::printf("[ measured ] rollback vs train.skip_batches = [7, 8]: %lld weight elements "
                "compared over 4 ranks, bitwise equal\n", static_cast<long long>(compared));
  EXPECT_GT(compared, 0);

  // A resume from the rolled-back run's checkpoint of step 10 (written after the rollback),
  // with the corruption still on and no skip_batches in the config: the checkpoint's list
  // keeps batches 7 and 8 out (else step 10 would read batch 10, not 12, and differ).
  corrupt_batches("7,8");
  const Config spiked = guarded_config(dir, "resumed");
  on_layout(spiked, [&](Trainer& t, ProcessGrid&) {
    t.load_checkpoint((dir / "spiked" / checkpoint_name(10)).string());
    EXPECT_EQ(t.skipped_batches(), (std::vector<int64_t>{7, 8}));
    EXPECT_EQ(t.rollbacks(), 1);
    EXPECT_EQ(t.batch_of(10), 12);
    EXPECT_EQ(t.run(), RunOutcome::Finished);
    resumed = t.host_weights();
  });
  EXPECT_TRUE(resumed == reference) << "the resume did not keep skipping batches 7 and 8";
  corrupt_batches(nullptr);
}

TEST(Rollback, NoRollbackLeftOrNoCheckpointEndsDiverged) {
  const auto dir = shared_corpus("rollback_limit");
  corrupt_batches("7,8");
  on_layout(guarded_config(dir, "limit", {"train.max_rollbacks=0"}),
            [&](Trainer& t, ProcessGrid&) {
              EXPECT_EQ(t.run(), RunOutcome::Diverged);
              EXPECT_EQ(t.steps_run(), 9) << "ends at the second bad step";
              EXPECT_EQ(t.rollbacks(), 0);
            });
  // No checkpoint before the spike: nothing to roll back to.
  on_layout(guarded_config(dir, "none", {"checkpoint.interval=100"}),
            [&](Trainer& t, ProcessGrid&) {
              EXPECT_EQ(t.run(), RunOutcome::Diverged);
              EXPECT_EQ(t.steps_run(), 9);
            });
  corrupt_batches(nullptr);
}

// The non-finite-gradient skip across pipeline stages: a NaN in one gradient of the first
// stage (rank 0 of the pipeline, one replica) makes every rank of both stages skip the step;
// the weights equal those of a run that left that step's update out.
TEST(Rollback, NonFiniteGradientSkipWithTwoPipelineStages) {
  const auto dir = shared_corpus("nan_pp2");
  const Config config = checkpoint_config(dir, 1, 2, 2, 0, "nan", {"train.steps=4"});
  std::vector<float> skipped, reference;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    t.set_gradient_test_hook([&](int64_t step, float* grads) {
      if (step == 2 && grid.coord().pp == 0 && grid.coord().dp == 1) grads[0] = std::nanf("");
    });
    for (int64_t s = 0; s < 4; ++s) {
      const StepMetrics m = t.apply_update(s, t.forward_backward(s));
      EXPECT_EQ(std::isfinite(m.grad_norm), s != 2) << "step " << s;
    }
    EXPECT_EQ(t.skipped_steps(), 1);
    EXPECT_EQ(t.optimizer().updates(), 3);
    skipped = t.host_weights();
  });
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    for (int64_t s = 0; s < 4; ++s) {
      const double loss = t.forward_backward(s);
      if (s != 2) t.apply_update(s, loss);
    }
    reference = t.host_weights();
  });
  ASSERT_FALSE(skipped.empty());
  EXPECT_TRUE(skipped == reference);
  for (float w : skipped) ASSERT_TRUE(std::isfinite(w));
  const int64_t compared = total_over_world(static_cast<int64_t>(skipped.size()));
  if (world_rank() == 0)
    std::printf("[ measured ] NaN skip on PP 2 x DP 2: %lld weight elements compared, bitwise "
                "equal\n", static_cast<long long>(compared));
}

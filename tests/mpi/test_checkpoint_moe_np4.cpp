// Mixture-of-experts checkpoints (docs/moe.md): each stacked expert tensor and router is one
// global dataset, so a TP2 x PP2 checkpoint resumes on (4,1,1), (1,1,1) and (2,1,2) with
// ZeRO-1 within 1e-5 of the uninterrupted run's losses; a checkpoint with another expert count
// is refused: on resume naming the stacked tensor and both shapes, by train.init_from naming
// model.moe_experts.
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

TEST(MoeCheckpoint, Tp2Pp2CheckpointResumesOnOtherLayouts) {
  const auto dir = shared_corpus("moe_ckpt_reshard");
  const SavedRun source_run = train_saving_at(moe_for(dir, 2, 2, 1, 0, "reshard"), kSaveAt, kSteps);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int layouts[][4] = {{4, 1, 1, 0}, {1, 1, 1, 0}, {2, 1, 2, 1}};
  for (const auto& l : layouts) {
    const Config target = moe_for(dir, l[0], l[1], l[2], l[3], "unused");
    const double worst = resumed_loss_error(
        target, source_run, kSaveAt, kSteps,
        "(" + std::to_string(l[0]) + "," + std::to_string(l[1]) + "," + std::to_string(l[2]) + ")");
    if (rank == 0)
      std::printf("[ measured ] MoE (2,2,1) checkpoint resumed on (%d,%d,%d) zero %d: next %lld "
                  "losses worst relative error %.3e\n",
                  l[0], l[1], l[2], l[3], static_cast<long long>(kSteps - kSaveAt), worst);
  }
}

TEST(MoeCheckpoint, OtherExpertCountIsRefusedNamingTheKey) {
  const auto dir = shared_corpus("moe_ckpt_experts");
  std::string path;
  on_layout(moe_for(dir, 2, 2, 1, 0, "experts"), [&](Trainer& t, ProcessGrid&) {
    path = t.save_checkpoint(0);
  });
  on_layout(moe_for(dir, 2, 2, 1, 0, "unused", 2), [&](Trainer& t, ProcessGrid&) {
    // A resume meets the stacked tensors' other shape; train.init_from the model's keys.
    try {
      t.load_checkpoint(path);
      ADD_FAILURE() << "a 4-expert checkpoint loaded into a 2-expert model";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("router/weight': shape mismatch: expected [2, 32], found [4, 32]"),
                std::string::npos)
          << what;
    }
    try {
      t.init_weights_from(path);
      ADD_FAILURE() << "a 4-expert checkpoint initialised a 2-expert model";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("model.moe_experts = 4 in the checkpoint but 2"),
                std::string::npos)
          << e.what();
    }
  });
}


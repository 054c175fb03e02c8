// Llama checkpoints (untied head, grouped-query attention): resuming on the same layout is
// bitwise identical to an uninterrupted run; a TP2 x PP2 checkpoint resumes on (4,1,1),
// (1,1,1) and (2,1,2) with ZeRO-1 within 1e-5; a checkpoint of the other
// architecture is refused naming model.arch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 16, kSaveAt = 8;

Config llama_for(const std::filesystem::path& dir, int tp, int pp, int dp, int zero,
                 const std::string& ckpt, const std::string& arch = "llama") {
  return checkpoint_config(dir, tp, pp, dp, zero, ckpt,
                           {"model.arch=" + arch, "model.heads=8", "model.kv_heads=4",
                            "model.ffn_width=64", "train.steps=16"});
}

}  // namespace

TEST(LlamaCheckpoint, SameLayoutIsBitwiseIdentical) {
  const auto dir = shared_corpus("llama_ckpt_same");
  expect_bitwise_resume(llama_for(dir, 2, 2, 1, 0, "same"), kSteps, kSaveAt);
}

TEST(LlamaCheckpoint, Tp2Pp2CheckpointResumesOnOtherLayouts) {
  const auto dir = shared_corpus("llama_ckpt_reshard");
  const Config source = llama_for(dir, 2, 2, 1, 0, "reshard");
  const SavedRun source_run = train_saving_at(source, kSaveAt, kSteps);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int layouts[][4] = {{4, 1, 1, 0}, {1, 1, 1, 0}, {2, 1, 2, 1}};
  for (const auto& l : layouts) {
    const Config target = llama_for(dir, l[0], l[1], l[2], l[3], "unused");
    const double worst = resumed_loss_error(
        target, source_run, kSaveAt, kSteps,
        "(" + std::to_string(l[0]) + "," + std::to_string(l[1]) + "," + std::to_string(l[2]) + ")");
    if (rank == 0)
      std::printf("[ measured ] llama (2,2,1) checkpoint resumed on (%d,%d,%d) zero %d: next %lld "
                  "losses worst relative error %.3e\n",
                  l[0], l[1], l[2], l[3], static_cast<long long>(kSteps - kSaveAt), worst);
  }
}

TEST(LlamaCheckpoint, OtherArchitectureIsRefusedNamingTheKey) {
  const auto dir = shared_corpus("llama_ckpt_arch");
  std::string path;
  // One job of all 4 ranks writes (independent 1-rank jobs would write the same file).
  on_layout(llama_for(dir, 2, 2, 1, 0, "arch"), [&](Trainer& t, ProcessGrid&) {
    path = t.save_checkpoint(0);
  });
  on_layout(llama_for(dir, 2, 2, 1, 0, "unused", "gpt2"), [&](Trainer& t, ProcessGrid&) {
    try {
      t.load_checkpoint(path);
      ADD_FAILURE() << "a llama checkpoint loaded into gpt2";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("model.arch"), std::string::npos) << e.what();
    }
  });
}

// The interleaved schedule's execution beyond parity (test_parity_interleaved_np4.cpp): every
// stage holds exactly schedule_peak_bound chunk micro-batches (and their bytes); the grads-final
// hook, called from each chunk's last backward, reports falling watermarks and only gradients
// that stay final; and checkpoints, which hold global tensors, move between the interleaved
// layout and plain 1F1B both ways.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "parity.hpp"
#include "pipeline/schedule.hpp"

using namespace trident;
using namespace trident::test;

namespace {

const std::vector<std::string> kInterleavedV2 = {"parallel.schedule=interleaved",
                                                 "parallel.virtual_stages=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int64_t bound_of(int stage, int64_t micro) {
  return schedule_peak_bound(ScheduleKind::Interleaved, stage, 4, micro, 2);
}

}  // namespace

// PP 4, v 2, 8 layers (chunks of one layer): with M = p (all forwards first, 8 chunk
// micro-batches held) and M = 2p (Megatron's warmup). The bytes: the chunks off the last stage
// have the same activations, so the peak is bound * one chunk's bytes + the 3 message buffers.
TEST(Interleaved, Pp4HoldsTheSchedulesPeakBound) {
  const auto dir = shared_corpus("interleaved_peak");
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  for (const int64_t micro : {4, 8}) {
    const Config config = parity_config(
        dir, {1, 4, 1},
        with(kInterleavedV2, {"model.layers=8", "train.steps=2",
                              "train.global_batch=" + std::to_string(2 * micro)}));
    ASSERT_EQ(config.num_microbatches(), micro);
    on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
      const int stage = grid.coord().pp;
      for (int64_t s = 0; s < 2; ++s) t.apply_update(s, t.forward_backward(s));
      const PipelineStats& st = t.pipeline().stats();
      const int64_t bound = bound_of(stage, micro);
      EXPECT_EQ(st.peak_in_flight, bound) << "stage " << stage << ", M " << micro;
      StageModel& m = t.model();
      const int64_t B = config.train.micro_batch;
      const int64_t chunk_bytes = m.activation_bytes(B, false, 0);
      const int64_t messages =
          3 * m.stream_elements(B) * static_cast<int64_t>(dtype_bytes(m.stream_dtype()));
      if (stage < 3) {
        EXPECT_EQ(st.peak_activation_bytes, bound * chunk_bytes + messages) << "stage " << stage;
      } else {  // the last chunk also keeps the head's logits
        EXPECT_GT(m.activation_bytes(B, false, 1), chunk_bytes);
        EXPECT_GT(st.peak_activation_bytes, bound * chunk_bytes + messages);
        EXPECT_LE(st.peak_activation_bytes,
                  bound * m.activation_bytes(B, false, 1) + messages);
      }
      double all[4] = {0, 0, 0, 0};
      all[stage] = static_cast<double>(st.peak_in_flight);
      grid.pipeline().all_reduce_sum(all, 4);
      if (world_rank == 0)
        std::printf("[ measured ] interleaved PP=4 v=2 M=%lld: chunk micro-batches held per "
                    "stage %g %g %g %g (bounds %lld %lld %lld %lld)\n",
                    static_cast<long long>(micro), all[0], all[1], all[2], all[3],
                    static_cast<long long>(bound_of(0, micro)),
                    static_cast<long long>(bound_of(1, micro)),
                    static_cast<long long>(bound_of(2, micro)),
                    static_cast<long long>(bound_of(3, micro)));
    });
  }
}

// The grads-final hook's promise with chunks: a watermark w is reported only when every gradient
// at flat offset >= w has its last contribution of the step, so a copy taken at the report
// equals the step's final gradients; and the watermarks fall, down into chunk 0's layers (the
// data-parallel buckets are started from the buffer's end). CPU, PP 2, DP 1.
TEST(Interleaved, WhatTheGradsFinalHookReportsFinalStaysFinal) {
  const auto dir = shared_corpus("interleaved_hook");
  const Config config = parity_config(dir, {1, 2, 1}, with(kInterleavedV2, {"train.steps=1"}));
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    StageModel& model = t.model();
    ASSERT_TRUE(model.device().is_host());
    ASSERT_EQ(model.chunk_count(), 2);
    std::vector<std::pair<int64_t, std::vector<float>>> reported;  // watermark, grads[w:]
    t.pipeline().set_last_backward_hook([&](int64_t w) {
      reported.emplace_back(w, std::vector<float>(model.grads() + w,
                                                  model.grads() + model.flat_size()));
    });
    t.forward_backward(0);
    ASSERT_FALSE(reported.empty());
    int64_t compared = 0, changed = 0, rising = 0;
    for (size_t r = 0; r < reported.size(); ++r) {
      const auto& [w, copy] = reported[r];
      if (r > 0 && w > reported[r - 1].first) ++rising;
      for (size_t i = 0; i < copy.size(); ++i, ++compared)
        if (std::memcmp(&copy[i], model.grads() + w + i, sizeof(float)) != 0) ++changed;
    }
    const int stage = grid.coord().pp;
    EXPECT_EQ(changed, 0) << "stage " << stage << ": of " << compared << " reported final";
    EXPECT_EQ(rising, 0) << "stage " << stage;
    EXPECT_GT(compared, 0);
    // Stage s's chunk 0 holds layer s (4 layers, 4 chunks): its first tensor was reported.
    const ParamInfo& first = model.param(
        "layers." + std::to_string(stage) + ".ln1.weight");
    EXPECT_LE(reported.back().first, first.offset) << "stage " << stage;
    // ... and so was chunk 1's first layer (layer stage + 2), during chunk 1's last backward.
    const int64_t chunk1 = model.param("layers." + std::to_string(stage + 2) + ".ln1.weight").offset;
    EXPECT_TRUE(std::any_of(reported.begin(), reported.end(),
                            [&](const auto& r) { return r.first == chunk1; }))
        << "stage " << stage;
  });
}

namespace {

constexpr int64_t kSteps = 12, kSaveAt = 6;

// Trains `source` (one job of all 4 ranks: it writes the checkpoint alone) to kSteps, saving at
// kSaveAt; resumes `target` from the checkpoint and compares its losses with the source's.
void expect_resume_across(const Config& source, const Config& target, const char* what) {
  const SavedRun source_run = train_saving_at(source, kSaveAt, kSteps);
  const std::vector<double>& uninterrupted = source_run.losses;
  const std::string& path = source_run.path;
  double worst = 0.0;
  int64_t compared = 0;
  on_layout(target, [&](Trainer& t, ProcessGrid&) {
    t.load_checkpoint(path);
    ASSERT_EQ(t.start_step(), kSaveAt);
    const auto losses = train_steps(t, kSaveAt, kSteps);
    for (int64_t i = 0; i < kSteps - kSaveAt; ++i, ++compared)
      worst = std::max(worst, std::abs(losses[i] - uninterrupted[kSaveAt + i]) /
                                  uninterrupted[kSaveAt + i]);
  });
  EXPECT_EQ(compared, kSteps - kSaveAt) << what;
  EXPECT_LE(worst, 1e-5) << what;
  worst = max_over_world(worst);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] %s: next %lld losses worst relative error %.3e\n", what,
                static_cast<long long>(kSteps - kSaveAt), worst);
}

}  // namespace

TEST(Interleaved, CheckpointsMoveBetweenInterleavedAndOneFOneB) {
  const auto dir = shared_corpus("interleaved_ckpt");
  const std::vector<std::string> steps = {"train.steps=" + std::to_string(kSteps)};
  expect_resume_across(
      checkpoint_config(dir, 2, 2, 1, 0, "interleaved", with(kInterleavedV2, steps)),
      checkpoint_config(dir, 1, 1, 1, 0, "unused_a", steps),
      "interleaved TP=2 PP=2 v=2 checkpoint resumed by 1f1b on one rank");
  expect_resume_across(checkpoint_config(dir, 2, 1, 2, 0, "plain", steps),
                       checkpoint_config(dir, 1, 2, 1, 0, "unused_b", with(kInterleavedV2, steps)),
                       "1f1b TP=2 DP=2 checkpoint resumed by interleaved PP=2 v=2");
}

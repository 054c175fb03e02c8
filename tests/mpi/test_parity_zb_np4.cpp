// The zero-bubble schedule ZB-H1 (parallel.schedule = "zb-h1": each backward split into the
// input gradient and the linear layers' weight gradients, the latter deferred) run for real:
// against the single-rank run on PP 2, PP 2 x DP 2 (the data-parallel reduction started by
// the grads-final hook from the last weight gradient) and with ZeRO-1, PP 2 x TP 2 for gpt2 and
// llama (counted_parity.hpp: 20 losses and every gradient after step 1 within 1e-5 relative,
// every element of the global model compared); and ZB-H1 and ZB-H2 against 1F1B on PP 4 with 8
// micro-batches: every gradient and loss to the bit, while every stage holds
// schedule_peak_bound micro-batches (ZB-H1 min(stages, M) = 4, ZB-H2 min(2 stages - 1, M) = 7).
// And the grads-final hook's promise under every schedule: what it reports final does not
// change afterwards. PP 4 and sequence parallelism against the
// single-rank run: test_parity_zb_sp_np4.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <map>

#include "counted_parity.hpp"
#include "pipeline/schedule.hpp"

using namespace trident;
using namespace trident::test;

namespace {

const std::string kZeroBubble = "parallel.schedule=zb-h1";

}  // namespace

TEST(ZeroBubbleParity, Pp2) { check_counted_parity({1, 2, 1}, {kZeroBubble}); }
// Without ZeRO the grads-final hook starts the data-parallel all-reduce of each bucket during
// the step's last W (with ZeRO-1 the reduce-scatter runs after the step).
TEST(ZeroBubbleParity, Pp2Dp2) { check_counted_parity({1, 2, 2}, {kZeroBubble}); }
TEST(ZeroBubbleParity, Pp2Dp2Zero1) {
  check_counted_parity({1, 2, 2}, {kZeroBubble, "optim.zero_stage=1"});
}
TEST(ZeroBubbleParity, Tp2Pp2) { check_counted_parity({2, 2, 1}, {kZeroBubble}); }
// ZB-H2 (more forwards first, more weight gradients deferred) with the data-parallel
// reduction started from its last weight gradient.
TEST(ZeroBubbleParity, H2Pp2Dp2) { check_counted_parity({1, 2, 2}, {"parallel.schedule=zb-h2"}); }
TEST(ZeroBubbleParity, LlamaTp2Pp2) {
  check_counted_parity({2, 2, 1}, llama({kZeroBubble}), ParityData::Indexed);
}

TEST(ZeroBubble, Pp4MatchesOneFOneBToTheBitHoldingItsPeakBound) {
  const auto dir = shared_corpus("zero_bubble");
  const ParityLayout l{1, 4, 1};
  constexpr int64_t kSteps = 4, kMicro = 8;
  std::map<std::string, std::vector<float>> grads;    // this rank's, after step 1
  std::map<std::string, std::vector<double>> losses;  // per step
  int stage = -1;
  const std::vector<std::string> schedules = {"1f1b", "zb-h1", "zb-h2"};
  for (const std::string& schedule : schedules) {
    // 16 sequences in micro-batches of 2: 8 micro-batches per step.
    const Config config =
        parity_config(dir, l, {"parallel.schedule=" + schedule, "train.global_batch=16",
                               "train.steps=" + std::to_string(kSteps)});
    ASSERT_EQ(config.num_microbatches(), kMicro);
    on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
      stage = grid.coord().pp;
      for (int64_t s = 0; s < kSteps; ++s) {
        const double loss = t.forward_backward(s);
        if (s == 0) grads[schedule] = t.host_grads();
        losses[schedule].push_back(t.apply_update(s, loss).loss);
      }
      const int64_t held = t.pipeline().stats().peak_in_flight;
      const ScheduleKind kind = parse_schedule_kind(schedule);
      EXPECT_EQ(held, schedule_peak_bound(kind, stage, 4, kMicro))
          << schedule << " stage " << stage;
      if (schedule == "zb-h1") EXPECT_EQ(held, 4) << "stage " << stage;
      if (schedule == "zb-h2") EXPECT_EQ(held, 7) << "stage " << stage;
    });
  }
  const std::vector<float>& a = grads["1f1b"];
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(losses["1f1b"].size(), static_cast<size_t>(kSteps));
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  for (const std::string& schedule : {"zb-h1", "zb-h2"}) {
    const std::vector<float>& b = grads[schedule];
    ASSERT_EQ(a.size(), b.size()) << schedule;
    int64_t differing = 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differing;
    EXPECT_EQ(differing, 0) << schedule << ": of " << a.size() << " gradients on stage " << stage;
    EXPECT_EQ(losses["1f1b"], losses[schedule]) << schedule;  // every loss bit for bit
    if (world_rank == 0)
      std::printf("[ measured ] PP=4, 8 micro-batches: %s vs 1f1b on stage 0: %d of %zu "
                  "gradients differ; %zu losses equal bit for bit: %s\n",
                  schedule.c_str(), static_cast<int>(differing), a.size(),
                  losses["1f1b"].size(), losses["1f1b"] == losses[schedule] ? "yes" : "no");
  }
}

// The grads-final hook (data parallelism starts reducing a bucket when it reports it) reports a
// watermark w only when every gradient at flat offset >= w has its last contribution of the
// step: a copy taken at the report equals the step's final gradients. Under ZB-H1 and ZB-H2
// that holds only if the hook runs during the last W, not the last BI. CPU, PP 2, DP 1: the
// gradients are host memory and nothing after the executor touches offsets above the tied
// embedding.
TEST(ZeroBubble, WhatTheGradsFinalHookReportsFinalStaysFinal) {
  const auto dir = shared_corpus("zero_bubble_hook");
  for (const std::string schedule : {"1f1b", "zb-h1", "zb-h2"}) {
    const Config config = parity_config(
        dir, {1, 2, 1}, {"parallel.schedule=" + schedule, "train.steps=1"});
    on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
      StageModel& model = t.model();
      ASSERT_TRUE(model.device().is_host());
      std::vector<std::pair<int64_t, std::vector<float>>> reported;  // watermark, grads[w:]
      t.pipeline().set_last_backward_hook([&](int64_t w) {
        reported.emplace_back(w, std::vector<float>(model.grads() + w,
                                                    model.grads() + model.flat_size()));
      });
      t.forward_backward(0);
      ASSERT_FALSE(reported.empty()) << schedule;
      int64_t compared = 0, changed = 0;
      for (const auto& [w, copy] : reported)
        for (size_t i = 0; i < copy.size(); ++i, ++compared)
          if (std::memcmp(&copy[i], model.grads() + w + i, sizeof(float)) != 0) ++changed;
      EXPECT_EQ(changed, 0) << schedule << " stage " << grid.coord().pp << ": of " << compared
                            << " gradients reported final";
      EXPECT_GT(compared, 0);
    });
  }
}

// The model state a rank holds under each ZeRO stage, measured with the CPU device's allocation
// meter, against the formula the start-up lines state (estimate_model_state,
// docs/parallelism.md "ZeRO stages"): per parameter 16 bytes at stage 0, 8 + 8/d at 1,
// 4 + 12/d at 2 and 16/d at 3, plus the gather buffers; for stages 0 to 3 on DP 1, 2 and 4.
#include <gtest/gtest.h>

#include <cstdio>

#include "parity.hpp"
#include "pipeline/shard_plan.hpp"
#include "runtime/backend.hpp"
#include "train/startup_checks.hpp"

using namespace trident;
using namespace trident::test;

TEST(ZeroMemory, EachStageHoldsWhatTheFormulaSays) {
  const auto dir = shared_corpus("zero_memory");
  const double per_param[4][3] = {// bytes per parameter at d = 1, 2, 4
                                  {16, 16, 16},
                                  {16, 8 + 8 / 2.0, 8 + 8 / 4.0},
                                  {16, 4 + 12 / 2.0, 4 + 12 / 4.0},
                                  {16, 16 / 2.0, 16 / 4.0}};
  const int dps[3] = {1, 2, 4};
  for (int stage = 0; stage <= 3; ++stage) {
    for (int k = 0; k < 3; ++k) {
      const int dp = dps[k];
      // Layers larger than the embeddings (width 64, vocab 256): the layers are the largest
      // units, as in a real model's middle stages.
      const Config config = checkpoint_config(
          dir, 1, 1, dp, stage, "m" + std::to_string(stage) + std::to_string(dp) + "_" +
                                    std::to_string(world_rank() / dp),
          {"model.width=64", "model.heads=4", "parallel.dp_bucket_mb=0.1"});
      on_layout(config, [&](Trainer& t, ProcessGrid&) {
        StageModel& model = t.model();
        const Device& device = t.device();
        double P = 0;
        for (const ParamInfo& p : model.params()) P += static_cast<double>(p.numel());
        const int64_t units =
            static_cast<int64_t>(param_units(model.params(), model.flat_size()).size());
        // Measured at start: the state's arrays are all the device holds, but for a few bytes
        // (the loss sum) and, at stage 2 and 3, the received-slice buffer counted as a gather
        // buffer (the windows and slots come with the first step).
        ModelStateBytes state = model.state_bytes();
        const int64_t moments = t.optimizer().state_bytes();
        const int64_t staging = t.gradient_sync().staging_bytes();
        const int64_t held = state.weights + state.compute + state.gradients + moments;
        const int64_t allocated = device.allocated_bytes();
        EXPECT_GE(allocated, held + state.gather + staging);
        EXPECT_LE(allocated, held + state.gather + staging + 1024)
            << "stage " << stage << " dp " << dp;
        const ModelStateBytes formula =
            estimate_model_state(config, plan_model_shard(config, {}), dp);
        // Slices round up per unit (and the last rank's may be short): at most d elements of
        // each unit and kind either way.
        const double slack = 4.0 * static_cast<double>(units * dp);
        EXPECT_NEAR(state.weights, formula.weights, slack) << "stage " << stage << " dp " << dp;
        EXPECT_NEAR(state.gradients, formula.gradients, slack) << "stage " << stage;
        EXPECT_NEAR(moments, formula.moments, 2 * slack) << "stage " << stage << " dp " << dp;
        EXPECT_EQ(state.compute, formula.compute);
        EXPECT_NEAR(static_cast<double>(held) / P, per_param[stage][k], 16 * slack / P)
            << "stage " << stage << " dp " << dp;
        // After a step: the gather buffers made (windows, slots, staging) within the formula's.
        t.apply_update(0, t.forward_backward(0));
        state = model.state_bytes();
        const int64_t gathered = state.gather + t.gradient_sync().staging_bytes();
        EXPECT_LE(gathered, formula.gather) << "stage " << stage << " dp " << dp;
        if (stage >= 2 && dp > 1) EXPECT_GT(state.gather, 0) << "stage " << stage;
        if (world_rank() == 0)
          std::printf("[ measured ] ZeRO-%d DP %d: %.0f parameters, state %.3f bytes each "
                      "(formula %.3f): weights %lld, gradients %lld, moments %lld bytes "
                      "(formula %lld, %lld, %lld); gather buffers %lld bytes (formula %lld); "
                      "device holds %lld at start\n",
                      stage, dp, P, static_cast<double>(held) / P, per_param[stage][k],
                      static_cast<long long>(state.weights),
                      static_cast<long long>(state.gradients), static_cast<long long>(moments),
                      static_cast<long long>(formula.weights),
                      static_cast<long long>(formula.gradients),
                      static_cast<long long>(formula.moments),
                      static_cast<long long>(gathered), static_cast<long long>(formula.gather),
                      static_cast<long long>(allocated));
      });
    }
  }
}

// train.precision = "bf16" on the CPU keeps its bf16 values in fp32 storage: the compute copy
// of the weights is 4 bytes a parameter beside the master weights, and 2 more for its packed
// bf16 bits where the oneDNN engine runs (train.cpu_bf16_gemm = "auto" on an AMX core); none
// at stage 3, whose units are gathered into the slots; as the start-up formula counts it.
TEST(ZeroMemory, CpuBf16HoldsItsComputeCopyInFp32) {
  const auto dir = shared_corpus("zero_memory_bf16");
  for (const int stage : {0, 3}) {
    const int dp = 2;
    const Config config = checkpoint_config(
        dir, 1, 1, dp, stage, "b" + std::to_string(stage) + "_" + std::to_string(world_rank() / dp),
        {"model.width=64", "model.heads=4", "parallel.dp_bucket_mb=0.1",
         "train.precision=\"bf16\""});
    on_layout(config, [&](Trainer& t, ProcessGrid&) {
      StageModel& model = t.model();
      double P = 0;
      for (const ParamInfo& p : model.params()) P += static_cast<double>(p.numel());
      const ModelStateBytes state = model.state_bytes();
      const ModelStateBytes formula =
          estimate_model_state(config, plan_model_shard(config, {}), dp);
      EXPECT_EQ(state.compute, formula.compute) << "stage " << stage;
      const double copy = cpu_bf16_uses_onednn(config) ? 6 : 4;
      EXPECT_EQ(state.compute, stage == 3 ? 0 : static_cast<int64_t>(copy * P))
          << "stage " << stage;
      const int64_t held = state.weights + state.compute + state.gradients +
                           t.optimizer().state_bytes();
      const int64_t allocated = t.device().allocated_bytes();
      EXPECT_GE(allocated, held + state.gather + t.gradient_sync().staging_bytes());
      EXPECT_LE(allocated, held + state.gather + t.gradient_sync().staging_bytes() + 1024)
          << "stage " << stage;
    });
  }
}

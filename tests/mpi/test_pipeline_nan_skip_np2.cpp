// The non-finite-gradient skip under the schedules that reorder the backward: ZB-H1 (the
// linear layers' weight gradients computed by deferred W ops) and interleaved 1F1B (v = 2, a
// stage's layers in two chunks), on PP 2. During step 3 (index 2) a NaN appears in the first
// layer's qkv weight gradient on the first stage right after the op that writes it mid-schedule
// (the first W of stage 0 under ZB-H1; the first backward of chunk 0 under interleaved); the
// later ops of the step add to it (NaN stays NaN). The gradient norm at the end of the step
// sees it, because the executor runs every W and every chunk's backward before
// forward_backward returns: every rank of both stages skips the step, and the weights equal,
// bit for bit, those of a run that left that step's update out.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 4, kPoisonedStep = 2;

void check_nan_skip(std::vector<std::string> options, PipeOpKind poisoned_after) {
  const auto dir = shared_corpus("pipeline_nan_skip");
  options.push_back("train.steps=4");
  const Config config = parity_config(dir, {1, 2, 1}, options);
  std::vector<float> skipped, reference;
  int64_t poisoned = 0;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    int64_t step = 0;
    StageModel& model = t.model();
    t.pipeline().set_op_observer(
        [&](const PipeOp& op, std::chrono::steady_clock::time_point,
            std::chrono::steady_clock::time_point) {
          if (step != kPoisonedStep || grid.coord().pp != 0 || poisoned > 0) return;
          if (op.kind != poisoned_after || op.chunk != 0) return;
          const ParamInfo& qkv = model.param("layers.0.attn.qkv.weight");
          ASSERT_TRUE(model.device().is_host());
          model.grads()[qkv.offset] = std::nanf("");
          ++poisoned;
        });
    for (step = 0; step < kSteps; ++step) {
      const StepMetrics m = t.apply_update(step, t.forward_backward(step));
      EXPECT_EQ(std::isfinite(m.grad_norm), step != kPoisonedStep) << "step " << step;
    }
    EXPECT_EQ(t.skipped_steps(), 1);
    EXPECT_EQ(t.optimizer().updates(), kSteps - 1);
    skipped = t.host_weights();
  });
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    for (int64_t s = 0; s < kSteps; ++s) {
      const double loss = t.forward_backward(s);
      if (s != kPoisonedStep) t.apply_update(s, loss);
    }
    reference = t.host_weights();
  });
  ASSERT_FALSE(skipped.empty());
  EXPECT_TRUE(skipped == reference);
  for (float w : skipped) ASSERT_TRUE(std::isfinite(w));
  int64_t counts[2] = {static_cast<int64_t>(skipped.size()), poisoned};
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(counts[1], 1) << "the NaN was written once, on stage 0";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] NaN skip under %s on PP 2: %lld weight elements compared, "
                "bitwise equal to the run without step %lld's update\n",
                config.parallel.schedule.c_str(), static_cast<long long>(counts[0]),
                static_cast<long long>(kPoisonedStep + 1));
}

}  // namespace

TEST(PipelineNanSkip, ZeroBubbleNanInADeferredWeightGradient) {
  check_nan_skip({"parallel.schedule=zb-h1"}, PipeOpKind::BackwardWeight);
}
TEST(PipelineNanSkip, InterleavedNanInTheFirstChunksBackward) {
  check_nan_skip({"parallel.schedule=interleaved", "parallel.virtual_stages=2"},
                 PipeOpKind::Backward);
}

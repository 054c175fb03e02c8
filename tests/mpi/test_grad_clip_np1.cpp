// Gradient clipping checked independently of the trainer's update code. A single-rank trainer
// takes one step; from its gradients (read back before the update) the test computes the
// global norm, the clip scale optim.grad_clip / (norm + 1e-6) and AdamW's first update by hand,
// in double, and the trainer's new weights must equal that. The same by hand with scale 1
// equals the unclipped run, and the clipped and unclipped runs' weights differ by far more
// than the tolerance. optim.eps is set near the gradients' size: AdamW's first update is
// m_hat / (sqrt(v_hat) + eps) = g / (|g| + eps), which with the default 1e-8 is about sign(g)
// whatever the gradient's scale, so a clip would hardly show in it. Weight decay is 0: the
// update is the clipped gradient's alone.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

struct OneStep {
  std::vector<float> before, grads, after;  // weights, gradients before clipping, weights
  double grad_norm = 0, lr = 0;             // as the trainer reports them
};

OneStep train_one_step(const Config& config) {
  SelfGroups self;
  Trainer trainer(config, self.groups());
  OneStep s;
  s.before = trainer.host_weights();
  const double loss = trainer.forward_backward(0);
  s.grads = trainer.host_grads();
  const StepMetrics m = trainer.apply_update(0, loss);
  s.after = trainer.host_weights();
  s.grad_norm = m.grad_norm;
  s.lr = m.lr;
  return s;
}

double norm_by_hand(const std::vector<float>& grads) {
  double sum = 0;
  for (float g : grads) sum += static_cast<double>(g) * g;
  return std::sqrt(sum);
}

// AdamW's first update (zero moments, bias correction 1 - beta^1), no weight decay, of the
// gradients times `scale`.
std::vector<double> first_adamw_step(const OneStep& s, double scale, const OptimConfig& o) {
  std::vector<double> w(s.before.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const double g = static_cast<double>(s.grads[i]) * scale;
    const double m_hat = (1 - o.beta1) * g / (1 - o.beta1);
    const double v_hat = (1 - o.beta2) * g * g / (1 - o.beta2);
    w[i] = s.before[i] - s.lr * (m_hat / (std::sqrt(v_hat) + o.eps));
  }
  return w;
}

// The largest difference in fp32 rounding units of the weight (or of the lr-sized update,
// for weights near 0): the trainer computes in fp32, the test in double.
double worst_ulps(const std::vector<float>& trainer, const std::vector<double>& by_hand,
                  double lr) {
  double worst = 0;
  for (size_t i = 0; i < trainer.size(); ++i) {
    const double unit = FLT_EPSILON * std::max(std::abs(by_hand[i]), lr);
    worst = std::max(worst, std::abs(trainer[i] - by_hand[i]) / unit);
  }
  return worst;
}

TEST(GradClip, TheTrainersClippedStepEqualsOneByHand) {
  const auto dir = shared_corpus("grad_clip");
  const std::vector<std::string> common = {"optim.eps=1e-3", "optim.weight_decay=0"};
  auto with = [&](const std::string& clip) {
    std::vector<std::string> extra = common;
    extra.push_back("optim.grad_clip=" + clip);
    return parity_config(dir, {1, 1, 1}, extra);
  };

  const Config unclipped_config = with("0");
  const OneStep unclipped = train_one_step(unclipped_config);
  const double norm = norm_by_hand(unclipped.grads);
  ASSERT_GT(norm, 0.0);
  // A quarter of the norm: clipping is active and scales the gradients by about 1/4.
  const double clip = norm / 4;
  char clip_text[32];
  std::snprintf(clip_text, sizeof clip_text, "%.9g", clip);
  const Config clipped_config = with(clip_text);
  const OneStep clipped = train_one_step(clipped_config);
  ASSERT_EQ(clipped.grads.size(), unclipped.grads.size());
  ASSERT_FALSE(clipped.grads.empty());

  // The reported norm is the gradients' (before clipping), computed here on its own.
  const double clipped_norm = norm_by_hand(clipped.grads);
  EXPECT_LE(std::abs(clipped.grad_norm - clipped_norm) / clipped_norm, 1e-9);
  EXPECT_LE(std::abs(unclipped.grad_norm - norm) / norm, 1e-9);
  ASSERT_GT(clipped_norm, clipped_config.optim.grad_clip);

  const double scale = clipped_config.optim.grad_clip / (clipped_norm + 1e-6);
  const double lr = clipped.lr;
  ASSERT_EQ(unclipped.lr, lr);
  const double clipped_error =
      worst_ulps(clipped.after, first_adamw_step(clipped, scale, clipped_config.optim), lr);
  const double unclipped_error =
      worst_ulps(unclipped.after, first_adamw_step(unclipped, 1.0, unclipped_config.optim), lr);
  // Clipping left out by hand: the clipped run must NOT match that.
  const double clip_ignored_error =
      worst_ulps(clipped.after, first_adamw_step(clipped, 1.0, clipped_config.optim), lr);
  const std::vector<double> unclipped_after(unclipped.after.begin(), unclipped.after.end());
  const double on_off = worst_ulps(clipped.after, unclipped_after, lr);

  // A few rounding units: the weight's own rounding and the update's few fp32 operations.
  const double tolerance = 8;
  EXPECT_LE(clipped_error, tolerance);
  EXPECT_LE(unclipped_error, tolerance);
  EXPECT_GT(clip_ignored_error, 1000 * tolerance);
  EXPECT_GT(on_off, 1000 * tolerance);
  std::printf("[ measured ] %zu weights, grad norm %.6f, clip %.6f (scale %.4f), lr %.3e; "
              "worst differences in fp32 units: trainer vs by hand %.2f clipped, %.2f "
              "unclipped; clipped run vs by hand without the clip %.3g; clipped vs unclipped "
              "run %.3g\n",
              clipped.after.size(), clipped_norm, clipped_config.optim.grad_clip, scale, lr,
              clipped_error, unclipped_error, clip_ignored_error, on_off);
}

}  // namespace

#pragma once
// Per-tensor scaling of FP8 training (train.precision = "fp8"; Transformer Engine's recipes): a
// tensor x is quantised as fp8(x * scale) and its GEMM's output multiplied by 1 / scale, with
//   scale = max_finite(format) / amax / 2^margin
// so that the tensor's largest magnitude lands 2^margin below the format's largest value.
//   current: amax of the tensor as it is quantised (fp8_scale of it, each time);
//   delayed: amax = the largest of the last `history` steps' amaxes, the step's own not
//            included: every use in a step quantises with the same scale, fixed before the step,
//            and the step's amax (the largest over its uses, reduced over the ranks that hold
//            parts of the tensor) joins the history when the step ends.
// An amax of 0 (nothing seen yet, an all-zero tensor) or one that is not finite keeps the
// previous scale (1 at first), as Transformer Engine does; a step whose amax was not finite
// stays in the history but is left out of its maximum (one bad step does not freeze the scale
// for `history` steps).
#include <cstdint>
#include <vector>

#include "util/fp8.hpp"

namespace trident {

float fp8_scale(float amax, float previous, Fp8Format format, int margin);

// The delayed recipe's state of one tensor: its amax history (a ring of `history` steps) and
// the scale of the current step. Pure: the caller reduces step_amax() over its ranks.
class Fp8DelayedScaling {
 public:
  Fp8DelayedScaling(Fp8Format format, int history, int margin);
  float scale() const { return scale_; }
  // A use in the current step: the step's amax is the largest of its uses'.
  void observe(float amax);
  float step_amax() const { return step_amax_; }
  // Ends the step with its amax as reduced over the ranks (every rank passes the same value):
  // it joins the history, the next step's scale is computed, the step's amax restarts at 0.
  void end_step(float reduced_amax);
  // The history oldest first (at most `history` values) and the scale: what a checkpoint
  // keeps; restore() sets them back, so that the next scales are those of an unbroken run.
  std::vector<float> history() const;
  void restore(const std::vector<float>& history, float scale);

 private:
  Fp8Format format_;
  int capacity_, margin_;
  std::vector<float> ring_;  // the last capacity_ steps' amaxes
  int64_t steps_ = 0;        // steps recorded (ring_[steps_ % capacity_] is the next slot)
  float scale_ = 1.0f;
  float step_amax_ = 0.0f;
};

}  // namespace trident

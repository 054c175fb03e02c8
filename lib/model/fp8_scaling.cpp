#include "model/fp8_scaling.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "util/error.hpp"

namespace trident {

float fp8_scale(float amax, float previous, Fp8Format format, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  const float scale = fp8_spec(format).max_finite / amax / std::ldexp(1.0f, margin);
  return std::isfinite(scale) ? scale : previous;  // a subnormal amax would overflow it
}

Fp8DelayedScaling::Fp8DelayedScaling(Fp8Format format, int history, int margin)
    : format_(format), capacity_(history), margin_(margin) {
  if (history < 1) throw Error("FP8 delayed scaling: an amax history of " +
                               std::to_string(history) + " steps (at least 1)");
  if (margin < 0) throw Error("FP8 scaling: a negative margin (" + std::to_string(margin) + ")");
  ring_.reserve(static_cast<size_t>(capacity_));
}

void Fp8DelayedScaling::observe(float amax) {
  // NaN wins (std::max would drop it): the step's amax is then not finite and keeps the scale.
  if (std::isnan(amax) || amax > step_amax_) step_amax_ = amax;
}

void Fp8DelayedScaling::end_step(float reduced_amax) {
  const size_t slot = static_cast<size_t>(steps_ % capacity_);
  if (ring_.size() < static_cast<size_t>(capacity_))
    ring_.push_back(reduced_amax);
  else
    ring_[slot] = reduced_amax;
  ++steps_;
  // The largest finite amax of the history (a non-finite one is skipped, as the scale would
  // keep its previous value for it).
  float amax = 0.0f;
  for (float a : ring_)
    if (std::isfinite(a)) amax = std::max(amax, a);
  scale_ = fp8_scale(amax, scale_, format_, margin_);
  step_amax_ = 0.0f;
}

std::vector<float> Fp8DelayedScaling::history() const {
  std::vector<float> out;
  const int64_t n = static_cast<int64_t>(ring_.size());
  for (int64_t i = 0; i < n; ++i)  // oldest first
    out.push_back(ring_[static_cast<size_t>((steps_ - n + i) % capacity_)]);
  return out;
}

void Fp8DelayedScaling::restore(const std::vector<float>& history, float scale) {
  if (history.size() > static_cast<size_t>(capacity_))
    throw Error("FP8 delayed scaling: a saved amax history of " + std::to_string(history.size()) +
                " steps does not fit a history of " + std::to_string(capacity_));
  ring_ = history;  // oldest first: slot i for step i
  steps_ = static_cast<int64_t>(history.size());
  scale_ = scale;
  step_amax_ = 0.0f;
}

}  // namespace trident

#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace trident {

bool decays(const ParamInfo& p, const OptimConfig& optim) {
  if (p.name == "embedding.position.weight") return optim.decay_position_embedding;
  return p.weight_decay;
}

AdamW::AdamW(const std::vector<ParamInfo>& params, std::vector<FlatRange> owned,
             const OptimConfig& optim, Device& device, const FlatStore* weights_at,
             const FlatStore* grads_at)
    : owned_(std::move(owned)), optim_(optim), device_(device) {
  if (weights_at) weights_at_ = *weights_at;
  if (grads_at) grads_at_ = *grads_at;
  for (const ParamInfo& p : params)
    segments_.push_back({p.offset, p.offset + p.numel(), decays(p, optim)});
  std::sort(segments_.begin(), segments_.end(),
            [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  std::vector<Segment> merged;
  for (const Segment& s : segments_) {
    if (!merged.empty() && merged.back().end == s.begin && merged.back().decay == s.decay)
      merged.back().end = s.end;
    else
      merged.push_back(s);
  }
  segments_ = std::move(merged);
  int64_t state = 0;
  for (const FlatRange& r : owned_) state += r.size();
  int64_t parameter_elements = 0, owned_parameter_elements = 0;
  for (const Segment& s : segments_) {
    parameter_elements += s.end - s.begin;
    for (const FlatRange& r : owned_)
      owned_parameter_elements += std::max<int64_t>(0, std::min(s.end, r.end) -
                                                           std::max(s.begin, r.begin));
  }
  owns_every_parameter_ = owned_parameter_elements == parameter_elements;
  exp_avg_ = DeviceArray<float>(device, state);
  exp_avg_sq_ = DeviceArray<float>(device, state);
}

bool AdamW::update(float* weights, const float* grads, double lr, double grad_scale,
                   uint16_t* bf16_copy) {
  if (!owns_every_parameter_) bf16_copy = nullptr;
  const double b1 = optim_.beta1, b2 = optim_.beta2;
  const double t = static_cast<double>(++updates_);
  AdamWStep step;
  step.lr = static_cast<float>(lr);
  step.beta1 = static_cast<float>(b1);
  step.beta2 = static_cast<float>(b2);
  step.eps = static_cast<float>(optim_.eps);
  step.bias1 = static_cast<float>(1.0 - std::pow(b1, t));
  step.bias2 = static_cast<float>(1.0 - std::pow(b2, t));
  step.grad_scale = static_cast<float>(grad_scale);
  int64_t state_offset = 0;  // where the current owned range's moments start
  for (const FlatRange& range : owned_) {
    for (const Segment& s : segments_) {
      const int64_t lo = std::max(s.begin, range.begin), hi = std::min(s.end, range.end);
      if (lo >= hi) continue;
      step.weight_decay = s.decay ? static_cast<float>(optim_.weight_decay) : 0.0f;
      const int64_t state_index = state_offset + (lo - range.begin);
      const int64_t w_at = weights_at_ ? weights_at_->index_of(lo) : lo;
      const int64_t g_at = grads_at_ ? grads_at_->index_of(lo) : lo;
      device_.adamw(weights + w_at, grads + g_at, exp_avg_.data() + state_index,
                    exp_avg_sq_.data() + state_index, hi - lo, step,
                    bf16_copy == nullptr ? nullptr : bf16_copy + lo);
    }
    state_offset += range.size();
  }
  return bf16_copy != nullptr;
}

double grad_square_sum(const std::vector<ParamInfo>& params, const float* grads,
                       const std::vector<FlatRange>& ranges, Device& device) {
  std::vector<Device::Range> parts;
  return grad_square_sum(params, grads, FlatStore::whole(INT64_MAX), ranges, device, parts);
}

double grad_square_sum(const std::vector<ParamInfo>& params, const float* grads,
                       const FlatStore& grads_at, const std::vector<FlatRange>& ranges,
                       Device& device, std::vector<Device::Range>& parts) {
  parts.clear();
  for (const ParamInfo& p : params) {
    if (!p.counted_in_norm) continue;
    for (const FlatRange& r : ranges) {
      const int64_t lo = std::max(p.offset, r.begin), hi = std::min(p.offset + p.numel(), r.end);
      if (lo < hi)
        grads_at.for_each_stored(lo, hi, [&](int64_t, int64_t at, int64_t n) {
          parts.push_back({grads + at, n});
        });
    }
  }
  return device.square_sum(parts);
}

}  // namespace trident

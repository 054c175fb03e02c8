#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trident {

bool decays(const ParamInfo& p, const OptimConfig& optim) {
  if (p.name == "embedding.position.weight") return optim.decay_position_embedding;
  return p.weight_decay;
}

AdamW::AdamW(const std::vector<ParamInfo>& params, std::vector<FlatRange> owned,
             const OptimConfig& optim)
    : owned_(std::move(owned)), optim_(optim) {
  for (const ParamInfo& p : params)
    segments_.push_back({p.offset, p.offset + p.numel(), decays(p, optim)});
  std::sort(segments_.begin(), segments_.end(),
            [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  int64_t state = 0;
  for (const FlatRange& r : owned_) state += r.size();
  exp_avg_.assign(state, 0.0f);
  exp_avg_sq_.assign(state, 0.0f);
}

void AdamW::update(float* weights, const float* grads, double lr, double grad_scale) {
  const double b1 = optim_.beta1, b2 = optim_.beta2;
  const double t = static_cast<double>(++updates_);
  const float beta1 = static_cast<float>(b1), beta2 = static_cast<float>(b2);
  const float bias1 = static_cast<float>(1.0 - std::pow(b1, t));
  const float bias2 = static_cast<float>(1.0 - std::pow(b2, t));
  const float eps = static_cast<float>(optim_.eps), lr_f = static_cast<float>(lr);
  const float scale = static_cast<float>(grad_scale);
  int64_t state_offset = 0;  // where the current owned range's moments start
  for (const FlatRange& range : owned_) {
    float* m = exp_avg_.data() + state_offset - range.begin;  // indexed by flat offset
    float* v = exp_avg_sq_.data() + state_offset - range.begin;
    for (const Segment& s : segments_) {
      const int64_t lo = std::max(s.begin, range.begin), hi = std::min(s.end, range.end);
      if (lo >= hi) continue;
      const float wd = s.decay ? static_cast<float>(optim_.weight_decay) : 0.0f;
#pragma omp parallel for simd schedule(static)
      for (int64_t i = lo; i < hi; ++i) {
        const float g = grads[i] * scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        const float m_hat = m[i] / bias1, v_hat = v[i] / bias2;
        weights[i] -= lr_f * (m_hat / (std::sqrt(v_hat) + eps) + wd * weights[i]);
      }
    }
    state_offset += range.size();
  }
}

double grad_square_sum(const std::vector<ParamInfo>& params, const float* grads,
                       const std::vector<FlatRange>& ranges) {
  double total = 0.0;
  for (const ParamInfo& p : params) {
    if (!p.counted_in_norm) continue;
    for (const FlatRange& r : ranges) {
      const int64_t lo = std::max(p.offset, r.begin), hi = std::min(p.offset + p.numel(), r.end);
      if (lo >= hi) continue;
      // Fixed-size chunks summed in order: bitwise the same for any thread count (an OpenMP
      // reduction clause combines partial sums in whatever order threads finish).
      const int64_t n = hi - lo, chunk = 1 << 14, chunks = (n + chunk - 1) / chunk;
      std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        double sum = 0.0;
        for (int64_t i = lo + c * chunk; i < std::min(hi, lo + (c + 1) * chunk); ++i)
          sum += static_cast<double>(grads[i]) * grads[i];
        partial[c] = sum;
      }
      for (double s : partial) total += s;
    }
  }
  return total;
}

}  // namespace trident

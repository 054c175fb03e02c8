#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace trident {

double learning_rate(const OptimConfig& optim, int64_t total_steps, int64_t step) {
  const int64_t warmup = optim.warmup_steps;
  if (step < warmup) return optim.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup);
  const double progress =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  return optim.min_lr + 0.5 * (optim.lr - optim.min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace trident

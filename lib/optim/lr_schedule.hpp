#pragma once
// Learning rate of step s (0-based), a pure function of the config:
//   s <  warmup:  lr * (s + 1) / warmup                          (linear warmup)
//   s >= warmup:  min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,  p = (s - warmup) / (steps - warmup)
// so the first step after warmup uses lr and the decay reaches min_lr at step `steps`.
#include <cstdint>

#include "config/config.hpp"

namespace trident {

double learning_rate(const OptimConfig& optim, int64_t total_steps, int64_t step);

}  // namespace trident

#pragma once
// AdamW with decoupled weight decay over a flat parameter buffer, and the gradient-norm sum.
// The optimizer sees parameters as segments of the flat buffer (offset, length, decay?), so it
// can update any sub-range of it: the whole buffer now, a data-parallel shard under ZeRO-1.
#include <cstdint>
#include <vector>

#include "config/config.hpp"
#include "model/params.hpp"
#include "tensor/buffer.hpp"

namespace trident {

// Weight decay applies to matrices (linear weights, token embedding); not to biases, LayerNorm
// or the position table unless optim.decay_position_embedding.
bool decays(const ParamInfo& p, const OptimConfig& optim);

class AdamW {
 public:
  AdamW(const std::vector<ParamInfo>& params, int64_t buffer_size, const OptimConfig& optim);

  // One update of elements [begin, end) of the flat buffers. `step` is 0-based (bias
  // correction uses step + 1); gradients are multiplied by grad_scale (clipping) first.
  void update(float* weights, const float* grads, int64_t begin, int64_t end, int64_t step,
              double lr, double grad_scale);
  void update(float* weights, const float* grads, int64_t step, double lr, double grad_scale) {
    update(weights, grads, 0, static_cast<int64_t>(exp_avg_.size()), step, lr, grad_scale);
  }

  Buffer<float>& exp_avg() { return exp_avg_; }
  Buffer<float>& exp_avg_sq() { return exp_avg_sq_; }
  int64_t state_bytes() const {
    return static_cast<int64_t>((exp_avg_.size() + exp_avg_sq_.size()) * sizeof(float));
  }

 private:
  struct Segment {
    int64_t begin, end;
    bool decay;
  };
  std::vector<Segment> segments_;  // sorted, covering every parameter element
  OptimConfig optim_;
  Buffer<float> exp_avg_, exp_avg_sq_;
};

// Sum of squared gradients over the parameters this rank counts (counted_in_norm), in double.
// The caller sums it over the model-parallel group and takes the square root.
double grad_square_sum(const std::vector<ParamInfo>& params, const float* grads);

}  // namespace trident

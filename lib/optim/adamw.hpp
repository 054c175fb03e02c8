#pragma once
// AdamW with decoupled weight decay over a flat parameter buffer, and the gradient-norm sum.
// The optimizer keeps moments for the ranges of the flat buffer it owns: the whole buffer, or
// under ZeRO-1 this data-parallel rank's slices (its state shrinks with DP). Weights, gradients
// and moments live on the model's Device (host memory or a GPU); the element loop is the
// device's.
#include <cstdint>
#include <optional>
#include <vector>

#include "config/config.hpp"
#include "model/params.hpp"
#include "optim/grad_sync.hpp"
#include "tensor/device.hpp"

namespace trident {

// Weight decay applies to matrices (linear weights, token embedding); not to biases, LayerNorm
// or the position table unless optim.decay_position_embedding.
bool decays(const ParamInfo& p, const OptimConfig& optim);

class AdamW {
 public:
  // `owned`: sorted, disjoint ranges of the flat buffer this optimizer updates. `weights_at`,
  // `grads_at`: how update()'s weights and gradients are stored (model/params.hpp's FlatStore:
  // under ZeRO-2/3 packed slices); nullptr: at their flat offsets.
  AdamW(const std::vector<ParamInfo>& params, std::vector<FlatRange> owned,
        const OptimConfig& optim, Device& device, const FlatStore* weights_at = nullptr,
        const FlatStore* grads_at = nullptr);

  // One update of the owned elements: gradients times grad_scale (clipping), bias correction
  // by the number of updates done so far (a skipped step does not count).
  // `bf16_copy`: a bf16 model's compute copy of `weights` (StageModel::bf16_weights), or
  // nullptr. When this optimizer owns every parameter element, the update rewrites the copy in
  // its own pass and returns true; otherwise (ZeRO-1 over several ranks: most weights arrive
  // by all-gather afterwards) it leaves the copy alone and returns false, and the caller
  // refreshes it (StageModel::weights_changed).
  bool update(float* weights, const float* grads, double lr, double grad_scale,
              uint16_t* bf16_copy = nullptr);
  bool owns_every_parameter() const { return owns_every_parameter_; }

  int64_t updates() const { return updates_; }
  void set_updates(int64_t n) { updates_ = n; }
  const std::vector<FlatRange>& owned() const { return owned_; }
  // Moments of the owned ranges, concatenated in range order, in device memory.
  DeviceArray<float>& exp_avg() { return exp_avg_; }
  DeviceArray<float>& exp_avg_sq() { return exp_avg_sq_; }
  int64_t state_bytes() const { return exp_avg_.bytes() + exp_avg_sq_.bytes(); }

 private:
  struct Segment {
    int64_t begin, end;
    bool decay;
  };
  // Sorted, covering every parameter element; neighbours with the same decay are one segment
  // (one device loop instead of one per tensor).
  std::vector<Segment> segments_;
  std::vector<FlatRange> owned_;
  std::optional<FlatStore> weights_at_, grads_at_;
  bool owns_every_parameter_ = false;
  OptimConfig optim_;
  Device& device_;
  int64_t updates_ = 0;
  DeviceArray<float> exp_avg_, exp_avg_sq_;
};

// Sum of squared gradients, in double, over the elements of `ranges` that belong to parameters
// this rank counts (counted_in_norm); `grads` is device memory. The caller sums it over the
// ranks that share the parameters' gradients and takes the square root.
double grad_square_sum(const std::vector<ParamInfo>& params, const float* grads,
                       const std::vector<FlatRange>& ranges, Device& device);
// The same over gradients stored as `grads_at` says (ZeRO-2/3's packed slices), with the list
// of device ranges built in `parts` (cleared first): a caller that sums every step keeps it, and
// its capacity, from step to step.
double grad_square_sum(const std::vector<ParamInfo>& params, const float* grads,
                       const FlatStore& grads_at, const std::vector<FlatRange>& ranges,
                       Device& device, std::vector<Device::Range>& parts);

}  // namespace trident

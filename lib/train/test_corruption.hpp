#pragma once
// The trainer's side of TRIDENT_TEST_CORRUPT_BATCHES (util/test_hooks.hpp): the loss and the
// gradients of chosen global batches multiplied by 1000, the spike a bad batch brings, so that
// the divergence guard's tests can make one on purpose. Off (and free) unless the hook is set.
#include <cstdint>
#include <vector>

namespace trident {

class Device;

class BatchCorruption {
 public:
  // Reads the hook: a comma-separated list of global batches ("7,8"); throws naming the
  // variable when it is not one.
  BatchCorruption();
  bool any() const { return !batches_.empty(); }
  // When global batch `batch` is one of the hook's: `loss` and this rank's `n` gradients
  // (device memory) times 1000. The same on every rank: the loss is agreed already and each
  // rank scales its own gradients.
  void apply(int64_t batch, double& loss, Device& device, float* grads, int64_t n) const;

 private:
  std::vector<int64_t> batches_;  // sorted
};

}  // namespace trident

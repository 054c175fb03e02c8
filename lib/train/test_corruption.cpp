#include "train/test_corruption.hpp"

#include <algorithm>
#include <string>

#include "tensor/device.hpp"
#include "train/divergence_guard.hpp"
#include "util/test_hooks.hpp"

namespace trident {

BatchCorruption::BatchCorruption() {
  if (const std::string corrupt = test_hook(TestHook::CorruptBatches); !corrupt.empty())
    // "7,8" -> "[7,8]"
    batches_ = parse_skip_list("[" + corrupt + "]", test_hook_variable(TestHook::CorruptBatches));
}

void BatchCorruption::apply(int64_t batch, double& loss, Device& device, float* grads,
                            int64_t n) const {
  if (!std::binary_search(batches_.begin(), batches_.end(), batch)) return;
  loss *= 1000;
  std::vector<float> host(static_cast<size_t>(n));
  device.to_host(host.data(), grads, n * 4);
  for (float& g : host) g *= 1000;
  device.from_host(grads, host.data(), n * 4);
}

}  // namespace trident

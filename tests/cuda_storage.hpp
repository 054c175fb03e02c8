#pragma once
// The GPU kernel tests' element types: fp32 or bf16 storage (S), converted from and to the float
// the CPU references compute in. Included only where TRIDENT_TEST_CUDA builds the tests.
#include <cuda_bf16.h>

#include <cstddef>
#include <random>
#include <type_traits>
#include <vector>

namespace trident::testing_support {

template <typename S>
S to_storage(float x) {
  if constexpr (std::is_same_v<S, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

template <typename S>
float to_float(S x) {
  if constexpr (std::is_same_v<S, float>)
    return x;
  else
    return __bfloat162float(x);
}

// Random values in [lo, hi) the storage type holds exactly (what the CPU reference sees).
template <typename S>
std::vector<float> random_values(std::mt19937_64& rng, size_t n, float lo = -1.f,
                                 float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = to_float<S>(to_storage<S>(u(rng)));
  return v;
}

}  // namespace trident::testing_support

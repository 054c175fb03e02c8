// FP8 quantisation on the CPU (the reference of train.precision = "fp8", docs/gpu.md "FP8"):
// the values of a tensor scaled into an FP8 format's range and rounded to its grid by
// util/fp8.hpp's saturating conversion, kept as floats of that grid, and the tensor's amax.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/ops.hpp"
#include "util/fp8.hpp"

namespace trident::cpu {

template <typename F>
F abs_max(const F* x, int64_t n) {
  F m = 0;
  bool nan = false;
  for (int64_t i = 0; i < n; i++) {
    const F a = std::fabs(x[i]);
    nan |= std::isnan(a);
    m = a > m ? a : m;
  }
  return nan ? std::numeric_limits<F>::quiet_NaN() : m;
}

template <typename F>
void fp8_quantize(F* q, const F* x, int64_t n, float scale, Fp8Format format) {
  if constexpr (std::is_same_v<F, float>) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) q[i] = fp8_round(x[i] * scale, format);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
      q[i] = static_cast<F>(
          fp8_to_float(float_to_fp8(static_cast<float>(x[i]) * scale, format), format));
  }
}

#define TRIDENT_INSTANTIATE(F)                                                                \
  template F abs_max<F>(const F*, int64_t);                                                   \
  template void fp8_quantize<F>(F*, const F*, int64_t, float, Fp8Format);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

// FP8 quantisation on the CPU (the reference of train.precision = "fp8", docs/gpu.md "FP8"):
// the values of a tensor scaled into an FP8 format's range and rounded to its grid by
// util/fp8.hpp's saturating conversion, kept as floats of that grid, and the tensor's amax.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/blas.hpp"
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

template <typename F>
void fp8_linear_forward(F* out, const F* xq, const F* wq, const F* bias, int64_t N, int64_t C,
                        int64_t OC, F inv_scale) {
  F beta = F(0);
  if (bias != nullptr) {  // the bias rows first, added by beta = 1 (as linear_forward)
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) std::memcpy(out + n * OC, bias, sizeof(F) * OC);
    beta = F(1);
  }
  gemm<F>(false, true, N, OC, C, inv_scale, xq, C, wq, C, beta, out, OC);
}

template <typename F>
void fp8_linear_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* dyq, const F* xq,
                         const F* wq, int64_t N, int64_t C, int64_t OC, F inv_dinp,
                         F inv_dweight) {
  if (dbias != nullptr)
    linear_backward<F>(nullptr, nullptr, dbias, dout, nullptr, nullptr, N, C, OC);
  if (dweight != nullptr)
    gemm<F>(true, false, OC, C, N, inv_dweight, dyq, OC, xq, C, F(1), dweight, C);
  if (dinp != nullptr) gemm<F>(false, false, N, C, OC, inv_dinp, dyq, OC, wq, C, F(0), dinp, C);
}

#define TRIDENT_INSTANTIATE(F)                                                                \
  template F abs_max<F>(const F*, int64_t);                                                   \
  template void fp8_quantize<F>(F*, const F*, int64_t, float, Fp8Format);                     \
  template void fp8_linear_forward<F>(F*, const F*, const F*, const F*, int64_t, int64_t,     \
                                      int64_t, F);                                            \
  template void fp8_linear_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*,    \
                                       int64_t, int64_t, int64_t, F, F);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

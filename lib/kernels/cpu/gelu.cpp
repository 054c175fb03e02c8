// GELU, tanh approximation: gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Written with the logistic function, 0.5 (1 + tanh(u)) = sigma(2u) = 1 / (1 + exp(-2u)), so
// that one vectorised exp is the only transcendental:
//   gelu(x)  = x * sigma
//   gelu'(x) = sigma + x * sigma' ,  sigma' = 2 sigma (1 - sigma) du/dx,
//   du/dx    = sqrt(2/pi) (1 + 3 * 0.044715 x^2).

#include <type_traits>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCoeff = 0.044715;
// exp(-2u) is capped at exp(80): sigma then is ~1.8e-35 instead of a subnormal (x < ~ -10).
constexpr double kMaxExpArg = 80.0;
constexpr int64_t kParallelMin = 1 << 15;
// simdlen(16): 512-bit vectors where the core has them (GCC's default for -march=native on
// these Xeons is 256). GELU is compute-bound in cache: 0.67 -> 0.51 ns an element on one core;
// elementwise, so the same bits either way.
// `if (parallel : ...)`: a bare `if` on `parallel for simd` applies to the simd construct too,
// and a false one turns the vectorisation off (OpenMP 5.0): calls below kParallelMin ran scalar,
// 10-12x slower an element.

// What a kernel stores: its fp32 result, or with round_bf16 that result rounded to bf16 (the
// CPU's bf16 precision keeps its activations so: bf16_gemm.hpp's branch-free rounding), in the
// same pass rather than in a pass of its own.
template <bool kRound, typename T>
inline T stored(T y) {
  if constexpr (kRound && std::is_same_v<T, float>)
    return detail::rounded_to_bf16(y);
  else
    return y;
}

template <bool kRound, typename T>
void gelu_forward_pass(T* out, const T* inp, int64_t N) {
  const T a = T(kSqrt2OverPi);
  const T b = T(kCoeff);
#pragma omp parallel for simd simdlen(16) schedule(static) if (parallel : N >= kParallelMin)
  for (int64_t i = 0; i < N; i++) {
    const T x = inp[i];
    const T u = a * (x + b * x * x * x);
    const T sigma = T(1) / (T(1) + detail::exp_fast(detail::min_fast(T(-2) * u, T(kMaxExpArg))));
    out[i] = stored<kRound>(x * sigma);
  }
}

template <bool kRound, typename T>
void gelu_backward_pass(T* dinp, const T* inp, const T* dout, int64_t N) {
  const T a = T(kSqrt2OverPi);
  const T b = T(kCoeff);
#pragma omp parallel for simd simdlen(16) schedule(static) if (parallel : N >= kParallelMin)
  for (int64_t i = 0; i < N; i++) {
    const T x = inp[i];
    const T x2 = x * x;
    const T u = a * (x + b * x2 * x);
    const T du = a * (T(1) + T(3) * b * x2);
    const T sigma = T(1) / (T(1) + detail::exp_fast(detail::min_fast(T(-2) * u, T(kMaxExpArg))));
    dinp[i] = stored<kRound>(dout[i] * (sigma + x * T(2) * sigma * (T(1) - sigma) * du));
  }
}

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t N, bool round_bf16) {
  if (round_bf16)
    gelu_forward_pass<true>(out, inp, N);
  else
    gelu_forward_pass<false>(out, inp, N);
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t N, bool round_bf16) {
  if (round_bf16)
    gelu_backward_pass<true>(dinp, inp, dout, N);
  else
    gelu_backward_pass<false>(dinp, inp, dout, N);
}

#define TRIDENT_INSTANTIATE(T)                                 \
  template void gelu_forward<T>(T*, const T*, int64_t, bool);  \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t, bool);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

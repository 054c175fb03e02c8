// SwiGLU on the fused gate/up projection: row [gate (Fh) | up (Fh)] -> silu(gate) * up.
// With sigma = 1 / (1 + exp(-a)) (one vectorised exp, as in gelu.cpp):
//   silu(a)  = a * sigma,   silu'(a) = sigma * (1 + a * (1 - sigma)),
//   dgate = dout * up * silu'(gate),   dup = dout * silu(gate).
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {
// exp(-a) is capped at exp(80): sigma then is ~1.8e-35 instead of a float subnormal (a < -80),
// where silu(a) ~ a * exp(a) is 0 to float precision anyway.
constexpr double kMaxExpArg = 80.0;
constexpr int64_t kParallelMin = 1 << 15;  // elements; smaller calls stay single-threaded

template <typename T>
inline T sigmoid(T a) {
  return T(1) / (T(1) + detail::exp_fast(detail::min_fast(-a, T(kMaxExpArg))));
}
}  // namespace

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t Fh) {
#pragma omp parallel for schedule(static) if (N * Fh >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const T* gate = gate_up + n * 2 * Fh;
    const T* up = gate + Fh;
    T* o = out + n * Fh;
#pragma omp simd
    for (int64_t i = 0; i < Fh; i++) o[i] = gate[i] * sigmoid(gate[i]) * up[i];
  }
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t Fh) {
#pragma omp parallel for schedule(static) if (N * Fh >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const T* gate = gate_up + n * 2 * Fh;
    const T* up = gate + Fh;
    const T* g = dout + n * Fh;
    T* dgate = dgate_up + n * 2 * Fh;
    T* dup = dgate + Fh;
#pragma omp simd
    for (int64_t i = 0; i < Fh; i++) {
      const T a = gate[i];
      const T sigma = sigmoid(a);
      dgate[i] = g[i] * up[i] * (sigma * (T(1) + a * (T(1) - sigma)));
      dup[i] = g[i] * (a * sigma);
    }
  }
}

#define TRIDENT_INSTANTIATE(T)                                              \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);          \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

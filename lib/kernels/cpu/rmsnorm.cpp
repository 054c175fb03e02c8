// RMSNorm over the last dimension (Hugging Face LlamaRMSNorm):
//   rstd = 1 / sqrt(mean_c(x^2) + eps),   y = weight * (x * rstd).
// The mean of squares is accumulated in double (Acc) also for float: HF computes it in fp32
// on fp32 inputs, but a double sum costs nothing here and makes the float path agree with the
// double one to a rounding of rstd.
#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/cpu/ops.hpp"

namespace trident::cpu {

namespace {
// Rows per partial sum of dweight in the backward. A fixed chunking (not one chunk per
// thread) makes the result independent of the thread count as well as reproducible.
constexpr int64_t kRowsPerChunk = 32;
using Acc = double;
}  // namespace

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const T* x = inp + n * C;
    T* o = out + n * C;
    Acc ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; c++) ss += Acc(x[c]) * Acc(x[c]);
    const T s = static_cast<T>(1.0 / std::sqrt(ss / Acc(C) + eps));
#pragma omp simd
    for (int64_t c = 0; c < C; c++) o[c] = weight[c] * (x[c] * s);
    rstd[n] = s;
  }
}

// With xhat = x * rstd and g = weight * dout (the gradient w.r.t. xhat):
//   dx = rstd * (g - xhat * mean_c(g * xhat))
// (the mean is the gradient through rstd; unlike LayerNorm there is no mean term).
// dweight += dout * xhat summed over rows: per-chunk partials, then reduced in chunk order.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C) {
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  // [chunks, C] partial sums of dweight, every element written before it is read.
  const std::unique_ptr<T[]> partial(new T[static_cast<size_t>(chunks * C)]);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; k++) {
      T* pw = partial.get() + k * C;
      std::fill(pw, pw + C, T(0));
      const int64_t n1 = std::min(N, (k + 1) * kRowsPerChunk);
      for (int64_t n = k * kRowsPerChunk; n < n1; n++) {
        const T* x = inp + n * C;
        const T* g = dout + n * C;
        T* dx = dinp + n * C;
        const T s = rstd[n];
        Acc sum_gx = 0;
#pragma omp simd reduction(+ : sum_gx)
        for (int64_t c = 0; c < C; c++) sum_gx += Acc(weight[c] * g[c]) * Acc(x[c] * s);
        const T mean_gx = static_cast<T>(sum_gx / Acc(C));
#pragma omp simd
        for (int64_t c = 0; c < C; c++) {
          const T xhat = x[c] * s;
          pw[c] += g[c] * xhat;
          dx[c] = s * (weight[c] * g[c] - xhat * mean_gx);
        }
      }
    }
    // (implicit barrier) reduce the chunk partials in chunk order, parallel over columns.
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; c++) {
      T w = 0;
      for (int64_t k = 0; k < chunks; k++) w += partial[k * C + c];
      dweight[c] += w;
    }
  }
}

#define TRIDENT_INSTANTIATE(T)                                                                \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);    \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, \
                                    int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

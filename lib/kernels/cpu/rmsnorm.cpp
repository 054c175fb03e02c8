// RMSNorm over the last dimension (Hugging Face LlamaRMSNorm):
//   rstd = 1 / sqrt(mean_c(x^2) + eps),   y = weight * (x * rstd).
// The mean of squares is accumulated in double (Acc) also for float: HF computes it in fp32
// on fp32 inputs, but a double sum costs nothing here and makes the float path agree with the
// double one to a rounding of rstd.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {

struct NormPartials;  // rmsnorm_backward's per-chunk partial sums (thread_scratch)

// Rows per partial sum of dweight in the backward. A fixed chunking (not one chunk per
// thread) makes the result independent of the thread count as well as reproducible.
constexpr int64_t kRowsPerChunk = 32;
using Acc = double;
}  // namespace

// One row: out[C] = weight * (x * rstd); returns rstd.
template <typename T>
inline void rmsnorm_row(T* o, T& rstd, const T* x, const T* weight, int64_t C, double eps) {
  Acc ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t c = 0; c < C; c++) ss += Acc(x[c]) * Acc(x[c]);
  const T s = static_cast<T>(1.0 / std::sqrt(ss / Acc(C) + eps));
#pragma omp simd
  for (int64_t c = 0; c < C; c++) o[c] = weight[c] * (x[c] * s);
  rstd = s;
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) rmsnorm_row(out + n * C, rstd[n], inp + n * C, weight, C, eps);
}

// The residual add and the norm of its result, one row at a time while the row is in L1.
template <typename T>
void add_rmsnorm_forward(T* out, T* rstd, T* residual, const T* x, const T* weight, int64_t N,
                         int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    T* r = residual + n * C;
    const T* xr = x + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) r[c] += xr[c];
    rmsnorm_row(out + n * C, rstd[n], r, weight, C, eps);
  }
}

// With xhat = x * rstd and g = weight * dout (the gradient w.r.t. xhat):
//   dx = rstd * (g - xhat * mean_c(g * xhat))
// (the mean is the gradient through rstd; unlike LayerNorm there is no mean term).
// dweight += dout * xhat summed over rows: per-chunk partials, then reduced in chunk order.
// kAddToDinp: dinp += the row gradient instead of dinp = (the residual stream's gradient).
template <bool kAddToDinp, typename T>
void rmsnorm_backward_rows(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                           const T* rstd, int64_t N, int64_t C) {
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  // [chunks, C] partial sums of dweight, every element written before it is read.
  T* const partial = thread_scratch<NormPartials, T>(static_cast<size_t>(chunks * C));
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; k++) {
      T* pw = partial + k * C;
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
        detail::row_gradient_into<kAddToDinp>(dx, C, [&](int64_t c0, int64_t len, T* o) {
#pragma omp simd
          for (int64_t j = 0; j < len; j++) {
            const int64_t c = c0 + j;
            const T xhat = x[c] * s;
            pw[c] += g[c] * xhat;
            o[j] = s * (weight[c] * g[c] - xhat * mean_gx);
          }
        });
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

template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C, bool add_to_dinp) {
  if (add_to_dinp)
    rmsnorm_backward_rows<true>(dinp, dweight, dout, inp, weight, rstd, N, C);
  else
    rmsnorm_backward_rows<false>(dinp, dweight, dout, inp, weight, rstd, N, C);
}

#define TRIDENT_INSTANTIATE(T)                                                                \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);    \
  template void add_rmsnorm_forward<T>(T*, T*, T*, const T*, const T*, int64_t, int64_t,     \
                                       double);                                              \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, \
                                    int64_t, bool);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

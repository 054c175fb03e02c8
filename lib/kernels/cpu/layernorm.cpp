// LayerNorm over the last dimension, eps = 1e-5.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {

struct NormPartials;  // layernorm_backward's per-chunk partial sums (thread_scratch)

constexpr double kEps = 1e-5;
// Rows per partial sum of dweight/dbias in the backward. A fixed chunking (not one chunk per
// thread) makes the result independent of the thread count as well as reproducible.
constexpr int64_t kRowsPerChunk = 32;
}  // namespace

// One row: out[C] = (x - mean) * rstd * weight + bias; returns {mean, rstd}.
template <typename T>
inline void layernorm_row(T* o, T& mean, T& rstd, const T* x, const T* weight, const T* bias,
                          int64_t C) {
  // Two passes (mean, then the centred second moment): no cancellation.
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < C; c++) sum += x[c];
  const T m = sum / T(C);
  T var = 0;
#pragma omp simd reduction(+ : var)
  for (int64_t c = 0; c < C; c++) {
    const T d = x[c] - m;
    var += d * d;
  }
  const T s = T(1) / std::sqrt(var / T(C) + T(kEps));
#pragma omp simd
  for (int64_t c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
  mean = m;
  rstd = s;
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++)
    layernorm_row(out + n * C, mean[n], rstd[n], inp + n * C, weight, bias, C);
}

// The residual add and the norm of its result, one row at a time while the row is in L1.
template <typename T>
void add_layernorm_forward(T* out, T* mean, T* rstd, T* residual, const T* x, const T* weight,
                           const T* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    T* r = residual + n * C;
    const T* xr = x + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) r[c] += xr[c];
    layernorm_row(out + n * C, mean[n], rstd[n], r, weight, bias, C);
  }
}

// With xhat = (x - mean) * rstd and g = weight * dout (the gradient w.r.t. xhat):
//   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
// (the two means are the gradients through mean and rstd). dweight += dout * xhat,
// dbias += dout, summed over rows: per-chunk partials, then reduced in chunk order.
// kAddToDinp: dinp += the row gradient instead of dinp = (the residual stream's gradient).
template <bool kAddToDinp, typename T>
void layernorm_backward_rows(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                             const T* weight, const T* mean, const T* rstd, int64_t N,
                             int64_t C) {
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  // [chunks][dweight | dbias] partial sums, every element written before it is read.
  T* const partial = thread_scratch<NormPartials, T>(static_cast<size_t>(chunks * 2 * C));
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; k++) {
      T* pw = partial + k * 2 * C;
      T* pb = pw + C;
      for (int64_t c = 0; c < C; c++) pw[c] = pb[c] = T(0);
      const int64_t n1 = std::min(N, (k + 1) * kRowsPerChunk);
      for (int64_t n = k * kRowsPerChunk; n < n1; n++) {
        const T* x = inp + n * C;
        const T* g = dout + n * C;
        T* dx = dinp + n * C;
        const T m = mean[n];
        const T s = rstd[n];
        T sum_g = 0;
        T sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t c = 0; c < C; c++) {
          const T xhat = (x[c] - m) * s;
          const T gw = weight[c] * g[c];
          sum_g += gw;
          sum_gx += gw * xhat;
        }
        const T mean_g = sum_g / T(C);
        const T mean_gx = sum_gx / T(C);
        detail::row_gradient_into<kAddToDinp>(dx, C, [&](int64_t c0, int64_t len, T* o) {
#pragma omp simd
          for (int64_t j = 0; j < len; j++) {
            const int64_t c = c0 + j;
            const T xhat = (x[c] - m) * s;
            const T gc = g[c];
            pw[c] += gc * xhat;
            pb[c] += gc;
            o[j] = s * (weight[c] * gc - mean_g - xhat * mean_gx);
          }
        });
      }
    }
    // (implicit barrier) reduce the chunk partials in chunk order, parallel over columns.
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; c++) {
      T w = 0;
      T b = 0;
      for (int64_t k = 0; k < chunks; k++) {
        w += partial[k * 2 * C + c];
        b += partial[k * 2 * C + C + c];
      }
      dweight[c] += w;
      dbias[c] += b;
    }
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t N, int64_t C,
                        bool add_to_dinp) {
  if (add_to_dinp)
    layernorm_backward_rows<true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  else
    layernorm_backward_rows<false>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

#define TRIDENT_INSTANTIATE(T)                                                                \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t,      \
                                     int64_t);                                               \
  template void add_layernorm_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*,       \
                                         int64_t, int64_t);                                  \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,    \
                                      const T*, int64_t, int64_t, bool);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

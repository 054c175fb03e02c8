// Linear layer in torch layout (weight [OC, C]): one GEMM per product, OpenBLAS threads inside.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {
struct BiasSums;  // linear_backward's per-thread bias sums (thread_scratch)
}  // namespace

// out = scale (inp @ weight^T) + bias. With beta = 0 OpenBLAS first zero-fills `out`; writing the
// bias rows instead and calling with beta = 1 makes the bias add free.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC, T scale) {
  T beta = T(0);
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) std::memcpy(out + n * OC, bias, sizeof(T) * OC);
    beta = T(1);
  }
  gemm<T>(false, true, N, OC, C, scale, inp, C, weight, C, beta, out, OC);
}

// dinp = dinp_scale (dout @ weight) (overwrite);  dweight += dweight_scale (dout^T @ inp);
// dbias += sum_n dout[n]
// (accumulate). Any of dinp, dweight, dbias may be nullptr: the split backward of the
// zero-bubble schedules computes dinp alone first and dweight, dbias later.
// dbias: threads split the columns and sum the rows in order (deterministic for any thread
// count) into a local double sum (N can be many thousand rows), added to dbias once.
template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC, T dinp_scale, T dweight_scale) {
  if (dbias != nullptr) {
    constexpr int64_t kAlign = 64 / sizeof(T);
    const int64_t blocks = (OC + kAlign - 1) / kAlign;
#pragma omp parallel
    {
      const detail::Range rb =
          detail::split_range(blocks, omp_get_num_threads(), omp_get_thread_num());
      const int64_t c0 = rb.begin * kAlign;
      const int64_t c1 = std::min(OC, rb.end * kAlign);
      if (c1 > c0) {
        const int64_t w = c1 - c0;
        double* a = thread_scratch<BiasSums, double>(static_cast<size_t>(w));
        std::fill(a, a + w, 0.0);
        for (int64_t n = 0; n < N; n++) {
          const T* g = dout + n * OC + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; c++) a[c] += static_cast<double>(g[c]);
        }
#pragma omp simd
        for (int64_t c = 0; c < w; c++) dbias[c0 + c] += static_cast<T>(a[c]);
      }
    }
  }
  if (dweight != nullptr)
    gemm<T>(true, false, OC, C, N, dweight_scale, dout, OC, inp, C, T(1), dweight, C);
  if (dinp != nullptr)
    gemm<T>(false, false, N, C, OC, dinp_scale, dout, OC, weight, C, T(0), dinp, C);
}

#define TRIDENT_INSTANTIATE(T)                                                                  \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,  \
                                  T);                                                          \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t,  \
                                   int64_t, T, T);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

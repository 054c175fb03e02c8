// Residual stream additions (memory bound: one pass, vectorised, threads split statically).
#include "kernels/cpu/ops.hpp"

namespace trident::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
// `if (parallel : ...)`: a bare `if` would also apply to the simd construct and make the
// calls below kParallelMin scalar (OpenMP 5.0).
}  // namespace

template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t N) {
#pragma omp parallel for simd schedule(static) if (parallel : N >= kParallelMin)
  for (int64_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

template <typename T>
void add_inplace(T* acc, const T* x, int64_t N) {
#pragma omp parallel for simd schedule(static) if (parallel : N >= kParallelMin)
  for (int64_t i = 0; i < N; i++) acc[i] += x[i];
}

#define TRIDENT_INSTANTIATE(T)                                      \
  template void add_forward<T>(T*, const T*, const T*, int64_t);    \
  template void add_inplace<T>(T*, const T*, int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

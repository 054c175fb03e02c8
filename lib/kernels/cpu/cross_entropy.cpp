// Vocab-parallel softmax cross-entropy in three local passes (see ops.hpp), the second of which
// may keep its exponentials for the backward. Each rank holds
// logit columns [vocab_begin, vocab_begin + Vl); only the first `valid` of them are real vocab
// entries, the rest (columns >= vocab_size) are padding and are never read for the loss.
// Rows are independent, so the loops are row-parallel and trivially deterministic.
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vecmath.hpp"
#include "util/error.hpp"

namespace trident::cpu {

namespace {
// Number of real (non-padding) vocab columns among this rank's Vl columns.
inline int64_t valid_columns(int64_t Vl, int64_t vocab_begin, int64_t vocab_size) {
  return std::clamp<int64_t>(vocab_size - vocab_begin, 0, Vl);
}
// Local column of the target, or -1 when another rank (or nobody) holds it.
inline int64_t local_target(int32_t target, int64_t vocab_begin, int64_t valid) {
  const int64_t v = static_cast<int64_t>(target) - vocab_begin;
  return (v >= 0 && v < valid) ? v : -1;
}
// sum_v exp(l[v] - m) over the row's `valid` columns, accumulated in double (up to ~50k of
// them); with e, each exp(l[v] - m) is also kept in e[v] (e may alias l).
template <typename T>
double exp_sum_row(const T* l, T m, int64_t valid, T* e) {
  double acc = 0.0;
  if (e == nullptr) {
#pragma omp simd reduction(+ : acc)
    for (int64_t v = 0; v < valid; v++) acc += static_cast<double>(detail::exp_fast(l[v] - m));
  } else {
#pragma omp simd reduction(+ : acc)
    for (int64_t v = 0; v < valid; v++) {
      const T x = detail::exp_fast(l[v] - m);
      e[v] = x;
      acc += static_cast<double>(x);
    }
  }
  return acc;
}
// One row's gradient from its kept exponentials: d[v] = e[v] * dloss / sum_exp over the valid
// columns (d may alias e), 0 on the padding, - dloss at the local target column tl (if any).
template <typename T>
void gradient_row_from_exps(T* d, const T* e, int64_t valid, int64_t Vl, T g, T sum_exp,
                            int64_t tl) {
  const T scale = g / sum_exp;
#pragma omp simd
  for (int64_t v = 0; v < valid; v++) d[v] = e[v] * scale;
  std::fill(d + valid, d + Vl, T(0));
  if (tl >= 0) d[tl] -= g;
}
}  // namespace

template <typename T>
void cross_entropy_local_max(T* row_max, const T* logits, int64_t N, int64_t Vl,
                             int64_t vocab_begin, int64_t vocab_size) {
  const int64_t valid = valid_columns(Vl, vocab_begin, vocab_size);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const T* l = logits + n * Vl;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t v = 0; v < valid; v++) mx = mx > l[v] ? mx : l[v];  // (std::max: not vectorised)
    row_max[n] = mx;
  }
}

template <typename T>
void cross_entropy_local_sums(T* sums, const T* logits, const int32_t* targets, const T* row_max,
                              int64_t N, int64_t Vl, int64_t vocab_begin, int64_t vocab_size,
                              T* exps) {
  const int64_t valid = valid_columns(Vl, vocab_begin, vocab_size);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const T* l = logits + n * Vl;  // may alias exps: the target logit is read first
    const int64_t tl = local_target(targets[n], vocab_begin, valid);
    sums[N + n] = tl >= 0 ? l[tl] : T(0);
    sums[n] = static_cast<T>(exp_sum_row(l, row_max[n], valid,
                                         exps == nullptr ? nullptr : exps + n * Vl));
  }
}

template <typename T>
void cross_entropy_loss(T* losses, const T* row_max, const T* sums, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= 4096)
  for (int64_t n = 0; n < N; n++) losses[n] = std::log(sums[n]) + row_max[n] - sums[N + n];
}

// dlogits[n, v] = dloss[n] * (exp(logit - max) / sum_exp - [v == target]); one pass, in place.
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const T* row_max,
                            const T* sums, const T* dloss, int64_t N, int64_t Vl,
                            int64_t vocab_begin, int64_t vocab_size) {
  const int64_t valid = valid_columns(Vl, vocab_begin, vocab_size);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const T* l = logits + n * Vl;  // may alias d: every column is read before it is written
    T* d = dlogits + n * Vl;
    const T m = row_max[n];
    const T g = dloss[n];
    const T scale = g / sums[n];
#pragma omp simd
    for (int64_t v = 0; v < valid; v++) d[v] = detail::exp_fast(l[v] - m) * scale;
    std::fill(d + valid, d + Vl, T(0));
    const int64_t tl = local_target(targets[n], vocab_begin, valid);
    if (tl >= 0) d[tl] -= g;
  }
}

template <typename T>
void cross_entropy_backward_kept(T* dlogits, const T* exps, const int32_t* targets, const T* sums,
                                 const T* dloss, int64_t N, int64_t Vl, int64_t vocab_begin,
                                 int64_t vocab_size) {
  const int64_t valid = valid_columns(Vl, vocab_begin, vocab_size);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++)
    gradient_row_from_exps(dlogits + n * Vl, exps + n * Vl, valid, Vl, dloss[n], sums[n],
                           local_target(targets[n], vocab_begin, valid));
}

// The loops are those of the three passes and the backward above, one row at a time; with the
// gradient, the exp-sum loop keeps each exp(logit - max) in dlogits for the backward to scale.
template <typename T>
void cross_entropy_fused(T* losses, T* row_max, T* sums, T* dlogits, const T* logits,
                         const int32_t* targets, const T* dloss, int64_t N, int64_t Vl,
                         int64_t vocab_size, bool bf16_rows, uint16_t* dlogits_bits) {
  const int64_t valid = valid_columns(Vl, 0, vocab_size);
  if (bf16_rows && (!std::is_same_v<T, float> || dlogits != logits))
    throw Error("cross_entropy_fused: bf16_rows needs float logits rounded in place (dlogits = "
                "logits)");
  if (dlogits_bits != nullptr && (!bf16_rows || dloss == nullptr))
    throw Error("cross_entropy_fused: dlogits_bits needs bf16_rows and the gradient");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    if constexpr (std::is_same_v<T, float>)
      if (bf16_rows) round_to_bf16_values(dlogits + n * Vl, Vl);
    const T* l = logits + n * Vl;  // may alias d: every column is read before it is written
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t v = 0; v < valid; v++) m = m > l[v] ? m : l[v];
    const int64_t tl = local_target(targets[n], 0, valid);
    sums[N + n] = tl >= 0 ? l[tl] : T(0);
    // With the gradient, each exp(logit - max) is kept in d for it: one exp per column.
    T* d = dlogits == nullptr ? nullptr : dlogits + n * Vl;
    row_max[n] = m;
    sums[n] = static_cast<T>(exp_sum_row(l, m, valid, d));
    losses[n] = std::log(sums[n]) + row_max[n] - sums[N + n];
    if (d != nullptr) gradient_row_from_exps(d, d, valid, Vl, dloss[n], sums[n], tl);
    if constexpr (std::is_same_v<T, float>) {
      if (dlogits_bits != nullptr)  // the rounding and the bits in one pass over the row
        detail::round_to_bf16_values_and_bits(d, Vl, dlogits_bits + n * Vl);
      else if (bf16_rows)
        round_to_bf16_values(d, Vl);
    }
  }
}

#define TRIDENT_INSTANTIATE(T)                                                                \
  template void cross_entropy_local_max<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t); \
  template void cross_entropy_local_sums<T>(T*, const T*, const int32_t*, const T*, int64_t,  \
                                            int64_t, int64_t, int64_t, T*);                   \
  template void cross_entropy_backward_kept<T>(T*, const T*, const int32_t*, const T*,          \
                                               const T*, int64_t, int64_t, int64_t, int64_t);  \
  template void cross_entropy_loss<T>(T*, const T*, const T*, int64_t);                       \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, const T*, const T*,   \
                                          const T*, int64_t, int64_t, int64_t, int64_t); \
  template void cross_entropy_fused<T>(T*, T*, T*, T*, const T*, const int32_t*, const T*,    \
                                       int64_t, int64_t, int64_t, bool, uint16_t*);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

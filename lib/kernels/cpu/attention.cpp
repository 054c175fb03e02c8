// Causal multi-head self-attention on the fused qkv activations.
//
// Per (batch b, head h), with Q, K, V the [T, HS] views of qkv (row stride 3*NH*HS, no copies):
//   S = scale * Q K^T,  P = softmax_causal(S) (saved in att),  O = P V.
// The T rows are cut into blocks of kBlock rows; row block i only needs the key/value columns
// [0, end of block i), so the GEMMs skip the all-masked upper blocks (about half the flops).
// Tasks (b, h, block) run in an OpenMP loop, each calling single-threaded OpenBLAS GEMMs
// (OpenBLAS' OpenMP build does not fork inside a parallel region). Every task writes a disjoint
// part of the outputs with a fixed sequence of operations, so the results do not depend on the
// schedule: dynamic scheduling (largest tasks first) balances the triangular work and stays
// deterministic.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {

constexpr int64_t kBlock = 128;

// row[0, len) <- softmax(row[0, len));  row[len, T) <- 0.  (Loops run to a length, not to
// `s <= t`, which GCC does not vectorise.)
template <typename T>
inline void causal_softmax_row(T* row, int64_t len, int64_t T_) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t s = 0; s < len; s++) mx = mx > row[s] ? mx : row[s];  // (std::max: scalar code)
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < len; s++) {
    const T e = detail::exp_fast(row[s] - mx);
    row[s] = e;
    sum += e;
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (int64_t s = 0; s < len; s++) row[s] *= inv;
  std::fill(row + len, row + T_, T(0));
}

// Softmax backward of one row: d[s] <- p[s] * (d[s] - sum_s' p[s'] d[s']) for s < len, where d
// holds dP on entry and dS on exit; d[len, end) <- 0.
template <typename T>
inline void softmax_backward_row(T* d, const T* p, int64_t len, int64_t end) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t s = 0; s < len; s++) dot += p[s] * d[s];
#pragma omp simd
  for (int64_t s = 0; s < len; s++) d[s] = p[s] * (d[s] - dot);
  std::fill(d + len, d + end, T(0));
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t NH,
                       int64_t HS) {
  const int64_t C = NH * HS;
  const int64_t C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
  const int64_t blocks = (T_ + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < BH * blocks; task++) {
    const int64_t i = blocks - 1 - task / BH;  // largest (last) row blocks first
    const int64_t bh = task % BH;
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const int64_t r0 = i * kBlock;
    const int64_t r1 = std::min(T_, r0 + kBlock);
    const T* q = qkv + b * T_ * C3 + h * HS;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* P = att + bh * T_ * T_;
    // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
    gemm<T>(false, true, r1 - r0, r1, HS, scale, q + r0 * C3, C3, k, C3, T(0), P + r0 * T_, T_);
    for (int64_t t = r0; t < r1; t++) causal_softmax_row(P + t * T_, t + 1, T_);
    // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
    gemm<T>(false, false, r1 - r0, HS, r1, T(1), P + r0 * T_, T_, v, C3, T(0),
            out + (b * T_ + r0) * C + h * HS, C);
  }
}

// With G = dO (the output gradient):
//   dV = P^T G,   dP = G V^T,   dS = P * (dP - rowsum(P * dP))   (softmax backward),
//   dQ = scale * dS K,   dK = scale * dS^T Q.
// Phase 1 (tasks over row blocks i): dP and dS of rows [r0, r1) into scratch, then dQ rows.
// Phase 2 (tasks over column blocks j, after all of phase 1): dK and dV rows [c0, c1) need
// dS and P in rows t >= c0 of columns [c0, c1), i.e. row blocks i >= j.
template <typename T>
void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                        int64_t B, int64_t T_, int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  const int64_t C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
  const int64_t blocks = (T_ + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BH * blocks; task++) {
      const int64_t i = blocks - 1 - task / BH;
      const int64_t bh = task % BH;
      const int64_t b = bh / NH;
      const int64_t h = bh % NH;
      const int64_t r0 = i * kBlock;
      const int64_t r1 = std::min(T_, r0 + kBlock);
      const T* k = qkv + b * T_ * C3 + h * HS + C;
      const T* v = k + C;
      const T* g = dout + b * T_ * C + h * HS;
      const T* P = att + bh * T_ * T_;
      T* dS = scratch + bh * T_ * T_;
      T* dq = dqkv + b * T_ * C3 + h * HS;
      // dP[r0:r1, 0:r1] = G[r0:r1] V[0:r1]^T
      gemm<T>(false, true, r1 - r0, r1, HS, T(1), g + r0 * C, C, v, C3, T(0), dS + r0 * T_, T_);
      // dS; its masked entries up to column r1 are zeroed: the GEMMs below read them.
      for (int64_t t = r0; t < r1; t++) softmax_backward_row(dS + t * T_, P + t * T_, t + 1, r1);
      // dQ[r0:r1] = scale * dS[r0:r1, 0:r1] K[0:r1]
      gemm<T>(false, false, r1 - r0, HS, r1, scale, dS + r0 * T_, T_, k, C3, T(0), dq + r0 * C3,
              C3);
    }
    // (implicit barrier)
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BH * blocks; task++) {
      const int64_t j = task / BH;  // first column blocks have the most rows below them
      const int64_t bh = task % BH;
      const int64_t b = bh / NH;
      const int64_t h = bh % NH;
      const int64_t c0 = j * kBlock;
      const int64_t c1 = std::min(T_, c0 + kBlock);
      const T* q = qkv + b * T_ * C3 + h * HS;
      const T* g = dout + b * T_ * C + h * HS;
      const T* P = att + bh * T_ * T_;
      const T* dS = scratch + bh * T_ * T_;
      T* dk = dqkv + b * T_ * C3 + h * HS + C;
      T* dv = dk + C;
      // dK[c0:c1] = scale * dS[c0:T, c0:c1]^T Q[c0:T]
      gemm<T>(true, false, c1 - c0, HS, T_ - c0, scale, dS + c0 * T_ + c0, T_, q + c0 * C3, C3,
              T(0), dk + c0 * C3, C3);
      // dV[c0:c1] = P[c0:T, c0:c1]^T G[c0:T]
      gemm<T>(true, false, c1 - c0, HS, T_ - c0, T(1), P + c0 * T_ + c0, T_, g + c0 * C, C, T(0),
              dv + c0 * C3, C3);
    }
  }
}

#define TRIDENT_INSTANTIATE(T)                                                               \
  template void attention_forward<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t); \
  template void attention_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                      int64_t, int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

// Causal grouped-query self-attention on the fused qkv activations.
//
// qkv rows hold [q of NH heads | k of KVH heads | v of KVH heads] (row stride CQ =
// (NH+2*KVH)*HS); query head h reads kv head h / G, G = NH/KVH query heads per kv head.
// Per (batch b, head h), with Q, K, V the [T, HS] views of qkv (row stride CQ, no copies):
//   S = scale * Q K^T,  P = softmax_causal(S) (saved in att),  O = P V.
// The T rows are cut into blocks of kBlock rows; row block i only needs the key/value columns
// [0, end of block i), so the GEMMs skip the all-masked upper blocks (about half the flops).
// Tasks (b, h, block) run in an OpenMP loop, each calling single-threaded OpenBLAS GEMMs
// (OpenBLAS' OpenMP build does not fork inside a parallel region). Every task writes a disjoint
// part of the outputs with a fixed sequence of operations, so the results do not depend on the
// schedule: dynamic scheduling (largest tasks first) balances the triangular work and stays
// deterministic. With KVH == NH every GEMM is the call the multi-head kernel made, so MHA
// results are unchanged bit for bit.
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
template <typename F>
inline void causal_softmax_row(F* row, int64_t len, int64_t T) {
  F mx = -std::numeric_limits<F>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t s = 0; s < len; s++) mx = mx > row[s] ? mx : row[s];  // (std::max: scalar code)
  F sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < len; s++) {
    const F e = detail::exp_fast(row[s] - mx);
    row[s] = e;
    sum += e;
  }
  const F inv = F(1) / sum;
#pragma omp simd
  for (int64_t s = 0; s < len; s++) row[s] *= inv;
  std::fill(row + len, row + T, F(0));
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


// Offsets into qkv[B,T,CQ] and out/dout[B,T,C] of one (batch, head) pair.
struct Layout {
  int64_t T, NH, KVH, HS;
  int64_t CQ;  // qkv row stride (NH + 2*KVH) * HS
  int64_t C;   // out row stride NH * HS
  int64_t G;   // query heads per kv head
  Layout(int64_t T_, int64_t NH_, int64_t KVH_, int64_t HS_)
      : T(T_), NH(NH_), KVH(KVH_), HS(HS_), CQ((NH_ + 2 * KVH_) * HS_), C(NH_ * HS_),
        G(NH_ / KVH_) {}
  int64_t q(int64_t b, int64_t h) const { return b * T * CQ + h * HS; }
  // k and v of kv head j
  int64_t k(int64_t b, int64_t j) const { return b * T * CQ + (NH + j) * HS; }
  int64_t v(int64_t b, int64_t j) const { return b * T * CQ + (NH + KVH + j) * HS; }
  int64_t o(int64_t b, int64_t h) const { return b * T * C + h * HS; }
};

}  // namespace

template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int64_t B, int64_t T, int64_t NH,
                       int64_t KVH, int64_t HS) {
  const Layout L(T, NH, KVH, HS);
  const int64_t CQ = L.CQ;
  const F scale = F(1) / std::sqrt(F(HS));
  const int64_t blocks = (T + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < BH * blocks; task++) {
    const int64_t i = blocks - 1 - task / BH;  // largest (last) row blocks first
    const int64_t bh = task % BH;
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const int64_t r0 = i * kBlock;
    const int64_t r1 = std::min(T, r0 + kBlock);
    const F* q = qkv + L.q(b, h);
    const F* k = qkv + L.k(b, h / L.G);
    const F* v = qkv + L.v(b, h / L.G);
    F* P = att + bh * T * T;
    // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
    gemm<F>(false, true, r1 - r0, r1, HS, scale, q + r0 * CQ, CQ, k, CQ, F(0), P + r0 * T, T);
    for (int64_t t = r0; t < r1; t++) causal_softmax_row(P + t * T, t + 1, T);
    // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
    gemm<F>(false, false, r1 - r0, HS, r1, F(1), P + r0 * T, T, v, CQ, F(0),
            out + L.o(b, h) + r0 * L.C, L.C);
  }
}

namespace {

// Phase 1 of the backward for rows [r0, r1) of one (b, h): dP = G V^T and dS (softmax
// backward) into dS, then dQ[r0:r1] = scale * dS K.
template <typename F>
void backward_rows(F* dq, F* dS, const F* g, const F* k, const F* v, const F* P, int64_t r0,
                   int64_t r1, const Layout& L, F scale) {
  const int64_t T = L.T, CQ = L.CQ, C = L.C, HS = L.HS;
  // dP[r0:r1, 0:r1] = G[r0:r1] V[0:r1]^T
  gemm<F>(false, true, r1 - r0, r1, HS, F(1), g + r0 * C, C, v, CQ, F(0), dS + r0 * T, T);
  // dS; its masked entries up to column r1 are zeroed: the GEMMs below read them.
  for (int64_t t = r0; t < r1; t++) softmax_backward_row(dS + t * T, P + t * T, t + 1, r1);
  // dQ[r0:r1] = scale * dS[r0:r1, 0:r1] K[0:r1]
  gemm<F>(false, false, r1 - r0, HS, r1, scale, dS + r0 * T, T, k, CQ, F(0), dq + r0 * CQ, CQ);
}

// Phase 2: the dK (want_v false) or dV (want_v true) rows [c0, c1) of kv head j in batch b,
// summed over the query heads h of the group in head order (the first overwrites, the others
// accumulate through the GEMM's beta = 1):
//   dK[c0:c1] += scale * dS_h[c0:T, c0:c1]^T Q_h[c0:T],   dV[c0:c1] += P_h[c0:T, c0:c1]^T G_h[c0:T]
template <typename F>
void backward_kv_columns(F* dqkv, const F* scratch, const F* dout, const F* qkv, const F* att,
                         int64_t b, int64_t j, bool want_v, int64_t c0, int64_t c1,
                         const Layout& L, F scale) {
  const int64_t T = L.T, CQ = L.CQ, C = L.C, HS = L.HS;
  F* dkv = dqkv + (want_v ? L.v(b, j) : L.k(b, j)) + c0 * CQ;
  for (int64_t h = j * L.G; h < (j + 1) * L.G; h++) {
    const int64_t bh = b * L.NH + h;
    const F beta = h == j * L.G ? F(0) : F(1);
    if (want_v) {
      const F* P = att + bh * T * T;
      const F* g = dout + L.o(b, h);
      gemm<F>(true, false, c1 - c0, HS, T - c0, F(1), P + c0 * T + c0, T, g + c0 * C, C, beta,
              dkv, CQ);
    } else {
      const F* dS = scratch + bh * T * T;
      const F* q = qkv + L.q(b, h);
      gemm<F>(true, false, c1 - c0, HS, T - c0, scale, dS + c0 * T + c0, T, q + c0 * CQ, CQ,
              beta, dkv, CQ);
    }
  }
}

}  // namespace

// With G = dO (the output gradient):
//   dV = P^T G,   dP = G V^T,   dS = P * (dP - rowsum(P * dP))   (softmax backward),
//   dQ = scale * dS K,   dK = scale * dS^T Q.
// Phase 1 (tasks over (b, h, row block i)): dP and dS of rows [r0, r1) into scratch, then dQ.
// Phase 2 (tasks over (b, kv head, column block j, k or v), after all of phase 1): dK and dV
// rows [c0, c1) need dS and P in rows t >= c0 of columns [c0, c1), i.e. row blocks i >= j, of
// every query head of the group. One task owns its dK (or dV) rows and sums the heads in head
// order, so there are no races and the sum order is fixed.
template <typename F>
void attention_backward(F* dqkv, F* scratch, const F* dout, const F* qkv, const F* att,
                        int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS) {
  const Layout L(T, NH, KVH, HS);
  const F scale = F(1) / std::sqrt(F(HS));
  const int64_t blocks = (T + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
  const int64_t BKV2 = B * KVH * 2;  // (b, kv head, k|v)
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BH * blocks; task++) {
      const int64_t i = blocks - 1 - task / BH;
      const int64_t bh = task % BH;
      const int64_t b = bh / NH;
      const int64_t h = bh % NH;
      const int64_t r0 = i * kBlock;
      const int64_t r1 = std::min(T, r0 + kBlock);
      backward_rows(dqkv + L.q(b, h), scratch + bh * T * T, dout + L.o(b, h),
                    qkv + L.k(b, h / L.G), qkv + L.v(b, h / L.G), att + bh * T * T, r0, r1, L,
                    scale);
    }
    // (implicit barrier)
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BKV2 * blocks; task++) {
      const int64_t j = task / BKV2;  // first column blocks have the most rows below them
      const int64_t r = task % BKV2;
      const int64_t b = r / (2 * KVH);
      const int64_t kvh = (r / 2) % KVH;
      const int64_t c0 = j * kBlock;
      const int64_t c1 = std::min(T, c0 + kBlock);
      backward_kv_columns(dqkv, scratch, dout, qkv, att, b, kvh, r % 2 == 1, c0, c1, L, scale);
    }
  }
}

#define TRIDENT_INSTANTIATE(F)                                                               \
  template void attention_forward<F>(F*, F*, const F*, int64_t, int64_t, int64_t, int64_t,  \
                                     int64_t);                                               \
  template void attention_backward<F>(F*, F*, const F*, const F*, const F*, int64_t, int64_t, \
                                      int64_t, int64_t, int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

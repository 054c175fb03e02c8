// Causal grouped-query self-attention on the fused qkv activations, blocked with an online
// softmax (flash-attention style): no T x T matrix exists, forward or backward.
//
// qkv rows hold [q of NH heads | k of KVH heads | v of KVH heads] (row stride CQ =
// (NH+2*KVH)*HS); query head h reads kv head h / G, G = NH/KVH query heads per kv head.
// Per (batch b, head h), with Q, K, V the [T, HS] views of qkv (row stride CQ, no copies):
//   S = scale * Q K^T,  P = softmax_causal(S),  O = P V,  lse[t] = log sum_s exp(S[t, s]).
// Rows and columns are cut into blocks of kBlock; a query block only visits the key blocks up
// to the diagonal (the all-masked upper blocks are skipped: about half the flops), so every
// GEMM is a [kBlock x kBlock x HS] one on views of qkv / out and a kBlock^2 scratch.
// Only lse ([B, NH, T]) is saved for the backward, which recomputes P block by block from Q,
// K and lse.
// Packed documents (doc_start): row t sees the columns [doc_start[t], t]; a row block starts at
// the key block holding its rows' first document start (first_key_block), so the blocks
// wholly before its documents are skipped too, forward and backward alike.
//
// Tasks run in OpenMP loops, each calling single-threaded OpenBLAS GEMMs (OpenBLAS' OpenMP
// build does not fork inside a parallel region). Every task writes a disjoint part of the
// outputs with a fixed sequence of operations, so the results do not depend on the schedule
// or the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/attention_blocks.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/online_softmax.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {

using namespace attention_blocks;

// Per-thread scratch of the forward (thread_scratch: kept from call to call): one score block
// and the running row statistics.
struct ForwardScores;
struct ForwardStats;
template <typename F>
struct ForwardScratch {
  F* s = thread_scratch<ForwardScores, F>(kBlock * kBlock);
  F* m = thread_scratch<ForwardStats, F>(2 * kBlock);
  F* l = m + kBlock;
};

// Rows [r0, r1) of one (b, h): o (out of the head, row stride C) and lse (of the head, [T]).
// O accumulates in place: each key block's P V adds to the output rescaled by exp(m_old - m_new);
// the rows are divided by their sums at the end.
// doc_start: the sequence's [T] (nullptr: none).
template <typename F>
void forward_row_block(F* o, F* lse, const F* q, const F* k, const F* v, const int32_t* doc_start,
                       int64_t r0, int64_t r1, const Layout& L, F scale, bool bf16_operands,
                       ForwardScratch<F>& w) {
  const int64_t R = r1 - r0, CQ = L.CQ, C = L.C, HS = L.HS;
  F* s = w.s;
  const int64_t c_first = first_key_block(doc_start, r0, r1);
  for (int64_t c0 = c_first; c0 < r1; c0 += kBlock) {
    const int64_t n = std::min(L.T, c0 + kBlock) - c0;
    const bool first = c0 == c_first;
    // S = scale * Q[r0:r1] K[c0:c0+n]^T
    gemm<F>(false, true, R, n, HS, scale, q + r0 * CQ, CQ, k + c0 * CQ, CQ, F(0), s, kBlock);
    for (int64_t r = 0; r < R; r++) {
      const Visible vis = visible_columns(r0 + r, c0, n, doc_start);
      const F shrink = online_softmax_block_row(s + r * kBlock, vis.begin, vis.end, n, w.m[r],
                                                w.l[r], first);
      if constexpr (std::is_same_v<F, float>)
        if (bf16_operands) round_to_bf16_values(s + r * kBlock, n);
      if (first) continue;  // the output rows are written (beta = 0) below
      F* orow = o + (r0 + r) * C;
#pragma omp simd
      for (int64_t i = 0; i < HS; i++) orow[i] *= shrink;
    }
    // O[r0:r1] (+)= P V[c0:c0+n]
    gemm<F>(false, false, R, HS, n, F(1), s, kBlock, v + c0 * CQ, CQ, first ? F(0) : F(1),
            o + r0 * C, C);
  }
  for (int64_t r = 0; r < R; r++) {
    F* orow = o + (r0 + r) * C;
    const F inv = F(1) / w.l[r];
#pragma omp simd
    for (int64_t i = 0; i < HS; i++) orow[i] *= inv;
    lse[r0 + r] = w.m[r] + std::log(w.l[r]);
  }
}

}  // namespace

// Tasks (b, h, row block), largest (last) row blocks first: dynamic scheduling balances the
// triangular work.
template <typename F>
void attention_forward(F* out, F* lse, const F* qkv, int64_t B, int64_t T, int64_t NH,
                       int64_t KVH, int64_t HS, const int32_t* doc_start, bool bf16_operands) {
  const Layout L(T, NH, KVH, HS);
  const F scale = F(1) / std::sqrt(F(HS));
  const int64_t blocks = (T + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
#pragma omp parallel
  {
    ForwardScratch<F> scratch;  // once per thread and call
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BH * blocks; task++) {
      const int64_t i = blocks - 1 - task / BH;
      const int64_t bh = task % BH;
      const int64_t b = bh / NH;
      const int64_t h = bh % NH;
      const int64_t r0 = i * kBlock;
      const int64_t r1 = std::min(T, r0 + kBlock);
      forward_row_block(out + L.o(b, h), lse + bh * T, qkv + L.q(b, h), qkv + L.k(b, h / L.G),
                        qkv + L.v(b, h / L.G), doc_start ? doc_start + b * T : nullptr, r0, r1,
                        L, scale, bf16_operands, scratch);
    }
  }
}

namespace {

// Per-thread scratch of the backward (thread_scratch: kept from call to call): P and dP/dS of
// one block, D of the group's heads.
struct BackwardBlocks;
struct BackwardRowDots;
template <typename F>
struct BackwardScratch {
  F* p = thread_scratch<BackwardBlocks, F>(2 * kBlock * kBlock);
  F* ds = p + kBlock * kBlock;
  F* d;
  explicit BackwardScratch(int64_t group_rows)
      : d(thread_scratch<BackwardRowDots, F>(static_cast<size_t>(group_rows))) {}
};

// Block (query rows [r0, r0+R), key columns [c0, c0+n)) of one query head h of the task's kv
// head: P from the saved lse, then
//   dV[c0:] += P^T dO,  dS = P * (dO V^T - D),  dK[c0:] += scale dS^T Q,  dQ[r0:] += scale dS K.
// `first_kv`: the first contribution to these dK/dV rows (overwrite); likewise `first_q` for
// dQ (the row block's first key block). doc_start: the sequence's [T] (nullptr: none).
template <typename F>
void backward_block(F* dq, F* dk, F* dv, const F* q, const F* k, const F* v, const F* g,
                    const F* lse, const F* d, const int32_t* doc_start, int64_t r0, int64_t R,
                    int64_t c0, int64_t n, bool first_kv, bool first_q, const Layout& L, F scale,
                    bool bf16_operands, BackwardScratch<F>& w) {
  const int64_t CQ = L.CQ, C = L.C, HS = L.HS;
  F* p = w.p;
  F* ds = w.ds;
  gemm<F>(false, true, R, n, HS, scale, q + r0 * CQ, CQ, k + c0 * CQ, CQ, F(0), p, kBlock);
  for (int64_t r = 0; r < R; r++) {
    F* row = p + r * kBlock;
    const Visible vis = visible_columns(r0 + r, c0, n, doc_start);
    const F m = lse[r0 + r];
#pragma omp simd
    for (int64_t c = vis.begin; c < vis.end; c++) row[c] = detail::exp_fast(row[c] - m);
    // Masked columns: [0, begin) and [end, n), where begin may lie beyond the block.
    const int64_t begin = std::min(vis.begin, n), end = std::max(begin, vis.end);
    std::fill(row, row + begin, F(0));
    std::fill(row + end, row + n, F(0));
    if constexpr (std::is_same_v<F, float>)
      if (bf16_operands) round_to_bf16_values(row, n);
  }
  const F beta_kv = first_kv ? F(0) : F(1);
  gemm<F>(true, false, n, HS, R, F(1), p, kBlock, g + r0 * C, C, beta_kv, dv + c0 * CQ, CQ);
  gemm<F>(false, true, R, n, HS, F(1), g + r0 * C, C, v + c0 * CQ, CQ, F(0), ds, kBlock);
  for (int64_t r = 0; r < R; r++) {
    F* drow = ds + r * kBlock;
    const F* prow = p + r * kBlock;
    const F dr = d[r0 + r];
#pragma omp simd
    for (int64_t c = 0; c < n; c++) drow[c] = prow[c] * (drow[c] - dr);  // 0 where masked
    if constexpr (std::is_same_v<F, float>)
      if (bf16_operands) round_to_bf16_values(drow, n);
  }
  gemm<F>(true, false, n, HS, R, scale, ds, kBlock, q + r0 * CQ, CQ, beta_kv, dk + c0 * CQ, CQ);
  gemm<F>(false, false, R, HS, n, scale, ds, kBlock, k + c0 * CQ, CQ, first_q ? F(0) : F(1),
          dq + r0 * CQ, CQ);
}

// Everything of kv head j in batch b: dK, dV of the head and dQ of its G query heads. Key
// blocks in order; per key block the query heads in head order, each over the query blocks at
// and below the diagonal (those that see the key block: with documents, not the query blocks
// whose documents all start after it). So dK/dV rows sum over (head, query block) and dQ rows
// over key blocks, always in the same order, and no other task writes these rows. Every key
// block has its diagonal query block (row s sees column s), so dK/dV are always written.
template <typename F>
void backward_kv_head(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                      const int32_t* doc_start, int64_t b, int64_t j, const Layout& L, F scale,
                      bool bf16_operands, BackwardScratch<F>& w) {
  const int64_t T = L.T;
  for (int64_t hl = 0; hl < L.G; hl++) {
    const int64_t h = j * L.G + hl;
    rowwise_dot(w.d + hl * T, dout + L.o(b, h), out + L.o(b, h), L);
  }
  for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
    const int64_t n = std::min(T, c0 + kBlock) - c0;
    bool first_kv = true;
    for (int64_t hl = 0; hl < L.G; hl++) {
      const int64_t h = j * L.G + hl;
      for (int64_t r0 = c0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(T, r0 + kBlock);
        const int64_t c_first = first_key_block(doc_start, r0, r1);
        if (c0 < c_first) continue;  // every row's document starts after this key block
        backward_block(dqkv + L.q(b, h), dqkv + L.k(b, j), dqkv + L.v(b, j), qkv + L.q(b, h),
                       qkv + L.k(b, j), qkv + L.v(b, j), dout + L.o(b, h),
                       lse + (b * L.NH + h) * T, w.d + hl * T, doc_start, r0, r1 - r0, c0, n,
                       first_kv, c0 == c_first, L, scale, bf16_operands, w);
        first_kv = false;
      }
    }
  }
}

}  // namespace

// Tasks (b, kv head): five block GEMMs per visited block (S, dV, dP, dK, dQ), the flash
// attention backward's count, with no reduction across tasks.
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                        int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS,
                        const int32_t* doc_start, bool bf16_operands) {
  const Layout L(T, NH, KVH, HS);
  const F scale = F(1) / std::sqrt(F(HS));
#pragma omp parallel
  {
    BackwardScratch<F> scratch(L.G * T);  // once per thread and call
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KVH; task++) {
      const int64_t b = task / KVH;
      backward_kv_head(dqkv, dout, qkv, out, lse, doc_start ? doc_start + b * T : nullptr, b,
                       task % KVH, L, scale, bf16_operands, scratch);
    }
  }
}

#define TRIDENT_INSTANTIATE(F)                                                                \
  template void attention_forward<F>(F*, F*, const F*, int64_t, int64_t, int64_t, int64_t,   \
                                     int64_t, const int32_t*, bool);                          \
  template void attention_backward<F>(F*, const F*, const F*, const F*, const F*, int64_t,    \
                                      int64_t, int64_t, int64_t, int64_t, const int32_t*, bool);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

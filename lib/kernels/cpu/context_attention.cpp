// Context-parallel (ring) attention: the kernels a rank runs on the key/value blocks of the other
// ranks of its context group, and the packing of its own block.
//
// A rank's local attention is attention_forward / attention_backward (attention.cpp); each
// other rank's block kv[B,Tl,KVC] (KVC = 2*KVH*HS: [k of kv heads | v of kv heads] per row)
// then contributes keys that a range of the local query rows sees entirely (no mask: the
// caller picks the ranges). Per (b, h) with Q the [Tl, HS] view of qkv (row stride CQ) and K, V
// the views of kv (row stride KVC), over query rows [q0, q0+Tq) and key rows [k0, k0+Tk):
//   forward   S = scale Q K^T, the block's O_blk = softmax(S) V and lse_blk (online softmax,
//             blocks of kBlock as attention.cpp), merged into the running (out, lse):
//             lse' = log(exp(lse) + exp(lse_blk)), out' = out e^(lse-lse') + O_blk e^(lse_blk-lse')
//   backward  with the final (out, lse): P = exp(S - lse), D = rowsum(dO * out),
//             dV += P^T dO, dS = P * (dO V^T - D), dK += scale dS^T Q, dQ += scale dS K
// (the flash-attention backward with the global lse: P is the block's part of the row's
// softmax over all the keys the row sees, so the blocks' gradients add up to the whole one).
//
// Packed documents (doc_start: each query row's document start, key_positions: each block row's
// position, both in the whole sequence): row t sees the block's keys at positions >=
// doc_start[t], a suffix of the block since the positions do not decrease; blocks before a row
// block's documents are skipped, and a row that sees no key of the block leaves out and lse.
//
// Tasks run in OpenMP loops calling single-threaded GEMMs, as in attention.cpp: forward tasks
// (b, h, row block), backward tasks (b, kv head) with the group's query heads inside; each task
// writes disjoint rows with a fixed sequence of operations, so the results do not depend on the
// schedule or the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/online_softmax.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

template <typename F>
void kv_pack(F* kv, const F* qkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS) {
  const int64_t CQ = (NH + 2 * KVH) * HS, KVC = 2 * KVH * HS;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++)
    std::memcpy(kv + n * KVC, qkv + n * CQ + NH * HS, sizeof(F) * KVC);
}

template <typename F>
void kv_unpack(F* dqkv, const F* dkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS) {
  const int64_t CQ = (NH + 2 * KVH) * HS, KVC = 2 * KVH * HS;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++)
    std::memcpy(dqkv + n * CQ + NH * HS, dkv + n * KVC, sizeof(F) * KVC);
}

namespace {

constexpr int64_t kBlock = 128;

// The key rows of [c0, c1) that a row whose document starts at position `start` sees: from the
// first at a position >= start (an offset from c0; c1 - c0 when none). No documents: all.
struct KeyMask {
  const int32_t* positions = nullptr;  // [Tl] the block rows' positions; nullptr: no documents
  int64_t begin(int32_t start, int64_t c0, int64_t c1) const {
    if (!positions) return 0;
    return std::lower_bound(positions + c0, positions + c1, start) - (positions + c0);
  }
};

// The smallest document start of rows [r0, r1) of one sequence (`starts`: its [Tl]).
inline int32_t min_start(const int32_t* starts, int64_t r0, int64_t r1) {
  return *std::min_element(starts + r0, starts + r1);
}

// Offsets into qkv[B,Tl,CQ], kv[B,Tl,KVC] and out/dout[B,Tl,C] of one (batch, head) pair.
struct RingLayout {
  int64_t Tl, NH, KVH, HS;
  int64_t CQ;   // qkv row stride (NH + 2*KVH) * HS
  int64_t KVC;  // kv row stride 2 * KVH * HS
  int64_t C;    // out row stride NH * HS
  int64_t G;    // query heads per kv head
  RingLayout(int64_t Tl_, int64_t NH_, int64_t KVH_, int64_t HS_)
      : Tl(Tl_), NH(NH_), KVH(KVH_), HS(HS_), CQ((NH_ + 2 * KVH_) * HS_), KVC(2 * KVH_ * HS_),
        C(NH_ * HS_), G(NH_ / KVH_) {}
  int64_t q(int64_t b, int64_t h) const { return b * Tl * CQ + h * HS; }
  // k and v of kv head j in the block
  int64_t k(int64_t b, int64_t j) const { return b * Tl * KVC + j * HS; }
  int64_t v(int64_t b, int64_t j) const { return b * Tl * KVC + (KVH + j) * HS; }
  int64_t o(int64_t b, int64_t h) const { return b * Tl * C + h * HS; }
  int64_t row_stats(int64_t b, int64_t h) const { return (b * NH + h) * Tl; }  // lse
};

// Per-thread scratch of the forward: one score block, the running row statistics and the
// block's unnormalised output rows.
struct MergeScores;
struct MergeStats;
struct MergeRows;
template <typename F>
struct MergeScratch {
  F* s = thread_scratch<MergeScores, F>(kBlock * kBlock);
  F* m = thread_scratch<MergeStats, F>(2 * kBlock);
  F* l = m + kBlock;
  F* ob;
  explicit MergeScratch(int64_t HS)
      : ob(thread_scratch<MergeRows, F>(static_cast<size_t>(kBlock * HS))) {}
};

// Row t's merge of the block's unnormalised output ob (sum of exp(S - m) v) and statistics
// (m, l) into orow / lse_t. lse_t = -inf: no keys before, the block's result is taken as is.
template <typename F>
void merge_row(F* orow, F& lse_t, const F* ob, F m, F l, int64_t HS) {
  if (!(l > F(0))) return;  // no key of the block is visible to the row (documents)
  const F lse_blk = m + std::log(l);
  const F prev = lse_t;
  if (prev == -std::numeric_limits<F>::infinity()) {
    const F inv = F(1) / l;
#pragma omp simd
    for (int64_t i = 0; i < HS; i++) orow[i] = ob[i] * inv;
    lse_t = lse_blk;
    return;
  }
  const F hi = std::max(prev, lse_blk);
  const F merged = hi + std::log1p(std::exp(-std::abs(prev - lse_blk)));
  const F w_prev = std::exp(prev - merged);
  const F w_blk = std::exp(lse_blk - merged) / l;  // also normalises ob
#pragma omp simd
  for (int64_t i = 0; i < HS; i++) orow[i] = orow[i] * w_prev + ob[i] * w_blk;
  lse_t = merged;
}

// Query rows [r0, r1) of one (b, h) over the key rows [k0, k1) of the block: o (out of the head,
// row stride C) and lse (of the head, [Tl]) merged in place. starts: the sequence's document
// starts [Tl] (nullptr: none).
template <typename F>
void merge_forward_rows(F* o, F* lse, const F* q, const F* k, const F* v, const int32_t* starts,
                        const KeyMask& mask, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                        const RingLayout& L, F scale, MergeScratch<F>& w) {
  const int64_t R = r1 - r0, CQ = L.CQ, KVC = L.KVC, HS = L.HS;
  F* s = w.s;
  // The key blocks before the rows' first visible key are skipped.
  const int64_t c_first =
      starts ? k0 + mask.begin(min_start(starts, r0, r1), k0, k1) / kBlock * kBlock : k0;
  if (c_first >= k1) return;  // no row sees any key of the block
  for (int64_t c0 = c_first; c0 < k1; c0 += kBlock) {
    const int64_t n = std::min(k1, c0 + kBlock) - c0;
    const bool first = c0 == c_first;
    // S = scale * Q[r0:r1] K[c0:c0+n]^T
    gemm<F>(false, true, R, n, HS, scale, q + r0 * CQ, CQ, k + c0 * KVC, KVC, F(0), s, kBlock);
    for (int64_t r = 0; r < R; r++) {
      const int64_t begin = starts ? mask.begin(starts[r0 + r], c0, c0 + n) : 0;
      const F shrink =
          online_softmax_block_row(s + r * kBlock, begin, n, n, w.m[r], w.l[r], first);
      if (first) continue;  // ob is written (beta = 0) below
      F* brow = w.ob + r * HS;
#pragma omp simd
      for (int64_t i = 0; i < HS; i++) brow[i] *= shrink;
    }
    // Ob (+)= P V[c0:c0+n]
    gemm<F>(false, false, R, HS, n, F(1), s, kBlock, v + c0 * KVC, KVC, first ? F(0) : F(1),
            w.ob, HS);
  }
  for (int64_t r = 0; r < R; r++)
    merge_row(o + (r0 + r) * L.C, lse[r0 + r], w.ob + r * HS, w.m[r], w.l[r], HS);
}

}  // namespace

template <typename F>
void attention_merge_forward(F* out, F* lse, const F* qkv, const F* kv, int64_t B, int64_t Tl,
                             int64_t q0, int64_t Tq, int64_t k0, int64_t Tk, int64_t NH,
                             int64_t KVH, int64_t HS, const int32_t* doc_start,
                             const int32_t* key_positions) {
  if (Tq <= 0 || Tk <= 0) return;
  const KeyMask mask{doc_start ? key_positions : nullptr};
  const RingLayout L(Tl, NH, KVH, HS);
  const F scale = F(1) / std::sqrt(F(HS));
  const int64_t blocks = (Tq + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
#pragma omp parallel
  {
    MergeScratch<F> scratch(HS);  // once per thread and call
#pragma omp for schedule(static)
    for (int64_t task = 0; task < BH * blocks; task++) {
      const int64_t bh = task / blocks;
      const int64_t b = bh / NH;
      const int64_t h = bh % NH;
      const int64_t r0 = q0 + (task % blocks) * kBlock;
      const int64_t r1 = std::min(q0 + Tq, r0 + kBlock);
      merge_forward_rows(out + L.o(b, h), lse + L.row_stats(b, h), qkv + L.q(b, h),
                         kv + L.k(b, h / L.G), kv + L.v(b, h / L.G),
                         doc_start ? doc_start + b * Tl : nullptr, mask, r0, r1, k0, k0 + Tk, L,
                         scale, scratch);
    }
  }
}

namespace {

// Per-thread scratch of the backward: P and dP/dS of one block, D of the group's heads.
struct MergeBackwardBlocks;
struct MergeBackwardRowDots;
template <typename F>
struct MergeBackwardScratch {
  F* p = thread_scratch<MergeBackwardBlocks, F>(2 * kBlock * kBlock);
  F* ds = p + kBlock * kBlock;
  F* d;
  explicit MergeBackwardScratch(int64_t group_rows)
      : d(thread_scratch<MergeBackwardRowDots, F>(static_cast<size_t>(group_rows))) {}
};

// d[t - r0] = sum_i dO[t, i] O[t, i] for the rows [r0, r1) of one head (row stride C).
template <typename F>
void rowwise_dot(F* d, const F* dout, const F* out, int64_t r0, int64_t r1,
                 const RingLayout& L) {
  for (int64_t t = r0; t < r1; t++) {
    const F* g = dout + t * L.C;
    const F* o = out + t * L.C;
    F dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < L.HS; i++) dot += g[i] * o[i];
    d[t - r0] = dot;
  }
}

// Block (query rows [r0, r0+R), key rows [c0, c0+n)) of one query head of the task's kv head;
// lse_rows and d_rows start at row r0; starts (documents) is the sequence's [Tl]. Everything
// accumulates (beta = 1).
template <typename F>
void merge_backward_block(F* dq, F* dk, F* dv, const F* q, const F* k, const F* v, const F* g,
                          const F* lse_rows, const F* d_rows, const int32_t* starts,
                          const KeyMask& mask, int64_t r0, int64_t R, int64_t c0, int64_t n,
                          const RingLayout& L, F scale, MergeBackwardScratch<F>& w) {
  const int64_t CQ = L.CQ, KVC = L.KVC, C = L.C, HS = L.HS;
  F* p = w.p;
  F* ds = w.ds;
  gemm<F>(false, true, R, n, HS, scale, q + r0 * CQ, CQ, k + c0 * KVC, KVC, F(0), p, kBlock);
  for (int64_t r = 0; r < R; r++) {
    F* row = p + r * kBlock;
    const F m = lse_rows[r];
    const int64_t begin = starts ? mask.begin(starts[r0 + r], c0, c0 + n) : 0;
    std::fill(row, row + begin, F(0));  // keys before the row's document
#pragma omp simd
    for (int64_t c = begin; c < n; c++) row[c] = detail::exp_fast(row[c] - m);
  }
  gemm<F>(true, false, n, HS, R, F(1), p, kBlock, g + r0 * C, C, F(1), dv + c0 * KVC, KVC);
  gemm<F>(false, true, R, n, HS, F(1), g + r0 * C, C, v + c0 * KVC, KVC, F(0), ds, kBlock);
  for (int64_t r = 0; r < R; r++) {
    F* drow = ds + r * kBlock;
    const F* prow = p + r * kBlock;
    const F dr = d_rows[r];
#pragma omp simd
    for (int64_t c = 0; c < n; c++) drow[c] = prow[c] * (drow[c] - dr);
  }
  gemm<F>(true, false, n, HS, R, scale, ds, kBlock, q + r0 * CQ, CQ, F(1), dk + c0 * KVC, KVC);
  gemm<F>(false, false, R, HS, n, scale, ds, kBlock, k + c0 * KVC, KVC, F(1), dq + r0 * CQ, CQ);
}

// Everything of kv head j in batch b: its dK, dV rows [k0, k1) of dkv and dQ rows [q0, q1) of its
// G query heads. Key blocks in order; per key block the query heads in head order, each over
// the query blocks in order (attention.cpp's backward_kv_head without the diagonal).
template <typename F>
void merge_backward_kv_head(F* dqkv, F* dkv, const F* dout, const F* qkv, const F* kv,
                            const F* out, const F* lse, const int32_t* starts,
                            const KeyMask& mask, int64_t b, int64_t j, int64_t q0, int64_t q1,
                            int64_t k0, int64_t k1, const RingLayout& L, F scale,
                            MergeBackwardScratch<F>& w) {
  const int64_t Tq = q1 - q0;
  for (int64_t hl = 0; hl < L.G; hl++) {
    const int64_t h = j * L.G + hl;
    rowwise_dot(w.d + hl * Tq, dout + L.o(b, h), out + L.o(b, h), q0, q1, L);
  }
  for (int64_t c0 = k0; c0 < k1; c0 += kBlock) {
    const int64_t n = std::min(k1, c0 + kBlock) - c0;
    for (int64_t hl = 0; hl < L.G; hl++) {
      const int64_t h = j * L.G + hl;
      for (int64_t r0 = q0; r0 < q1; r0 += kBlock) {
        const int64_t r1 = std::min(q1, r0 + kBlock);
        // Every row's document starts after this key block: nothing to add.
        if (starts && mask.begin(min_start(starts, r0, r1), c0, c0 + n) >= n) continue;
        merge_backward_block(dqkv + L.q(b, h), dkv + L.k(b, j), dkv + L.v(b, j), qkv + L.q(b, h),
                             kv + L.k(b, j), kv + L.v(b, j), dout + L.o(b, h),
                             lse + L.row_stats(b, h) + r0, w.d + hl * Tq + (r0 - q0), starts,
                             mask, r0, r1 - r0, c0, n, L, scale, w);
      }
    }
  }
}

}  // namespace

template <typename F>
void attention_merge_backward(F* dqkv, F* dkv, const F* dout, const F* qkv, const F* kv,
                              const F* out, const F* lse, int64_t B, int64_t Tl, int64_t q0,
                              int64_t Tq, int64_t k0, int64_t Tk, int64_t NH, int64_t KVH,
                              int64_t HS, const int32_t* doc_start,
                              const int32_t* key_positions) {
  if (Tq <= 0 || Tk <= 0) return;
  const RingLayout L(Tl, NH, KVH, HS);
  const KeyMask mask{doc_start ? key_positions : nullptr};
  const F scale = F(1) / std::sqrt(F(HS));
#pragma omp parallel
  {
    MergeBackwardScratch<F> scratch(L.G * Tq);  // once per thread and call
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KVH; task++) {
      const int64_t b = task / KVH;
      merge_backward_kv_head(dqkv, dkv, dout, qkv, kv, out, lse,
                             doc_start ? doc_start + b * Tl : nullptr, mask, b, task % KVH, q0,
                             q0 + Tq, k0, k0 + Tk, L, scale, scratch);
    }
  }
}

#define TRIDENT_INSTANTIATE(F)                                                                 \
  template void kv_pack<F>(F*, const F*, int64_t, int64_t, int64_t, int64_t);                 \
  template void kv_unpack<F>(F*, const F*, int64_t, int64_t, int64_t, int64_t);               \
  template void attention_merge_forward<F>(F*, F*, const F*, const F*, int64_t, int64_t,      \
                                           int64_t, int64_t, int64_t, int64_t, int64_t,       \
                                           int64_t, int64_t, const int32_t*, const int32_t*); \
  template void attention_merge_backward<F>(F*, F*, const F*, const F*, const F*, const F*,   \
                                            const F*, int64_t, int64_t, int64_t, int64_t,     \
                                            int64_t, int64_t, int64_t, int64_t, int64_t,      \
                                            const int32_t*, const int32_t*);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

// Causal grouped-query attention with its products on oneDNN's bf16 matmul (AMX tiles where the
// core has them): the attention of train.precision = "bf16" with the oneDNN engine
// (model/cpu_bf16_kernels.hpp). Same inputs, outputs, masks and rounding points as
// attention.cpp with bf16_operands (P and dS rounded to bf16 before the products that read
// them, row sums and the softmax in fp32); what differs is the size of the products.
//
// A matmul call costs about 8 us here whatever its size, and AMX only pays off on long
// products: a 128 x 128 x 64 block per call (attention.cpp's tiling) made the 124M step slower
// than the FMAs. So a task takes a 128-row query block against all the keys it sees, up to
// kKeyChunk at a time, in one call per product:
//   forward   S = scale Q K^T [R x n x HS], P = exp(S - m) in bf16, O (+)= P V [R x HS x n];
//   backward  P = exp(scale Q K^T - lse), dV += P^T dO [n x HS x R], dP = dO V^T,
//             dS = P * (dP - D) in bf16, dK += scale dS^T Q [n x HS x R],
//             dQ (+)= scale dS K [R x HS x n].
// Sequences longer than kKeyChunk take several chunks with the online softmax across them, as
// attention.cpp does across its blocks. q, k, v and dO are bf16 values already (the kernel set
// rounds every activation it stores); their bits are taken once per call into shared scratch.
//
// Determinism: a forward task (b, h, row block) writes its rows only; a backward task (b, kv
// head j) writes dK, dV of j and dQ of j's query heads only, summing in a fixed order (query
// head, row block, chunk). The results do not depend on the schedule or the thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_blocks.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/online_softmax.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {

using attention_blocks::first_key_block;
using attention_blocks::kBlock;
using attention_blocks::Layout;
using attention_blocks::rowwise_dot;
using attention_blocks::Visible;
using attention_blocks::visible_columns;
using detail::bf16_bits;
using detail::rounded_to_bf16;

// Keys per product. 1024 takes a GPT-2 sequence in one chunk; the scratch of a backward task is
// 12 bytes per (row, key): 1.5 MB.
constexpr int64_t kKeyChunk = 1024;

// The passes over a row of scores, each fused with the rounding of what it writes: a row of
// P or dS is read once and written once, as bf16 bits (and P also as its rounded values, which
// dS reads), never as an fp32 row rounded by a pass of its own. (The forward's: the online
// softmax of online_softmax.hpp storing bf16 bits.)

// Backward: P = bf16(exp(s - lse)) over the visible [begin, end), 0 elsewhere, in place (its
// rounded values) and as bits.
inline void probabilities_row(float* s, int64_t begin, int64_t end, int64_t n, float lse,
                              uint16_t* p16) {
  begin = std::min(begin, n);
  end = std::max(begin, end);
  std::fill(s, s + begin, 0.0f);
  std::fill(p16, p16 + begin, uint16_t{0});
#pragma omp simd
  for (int64_t c = begin; c < end; c++) {
    const uint16_t bits = bf16_bits(detail::exp_fast(s[c] - lse));
    p16[c] = bits;
    s[c] = bf16_to_float(bits);
  }
  std::fill(s + end, s + n, 0.0f);
  std::fill(p16 + end, p16 + n, uint16_t{0});
}

// Backward: dS = bf16(P * (dP - D)) as bits (0 where P is).
inline void score_gradient_row(const float* p, const float* dp, float d, int64_t n,
                               uint16_t* ds16) {
#pragma omp simd
  for (int64_t c = 0; c < n; c++) ds16[c] = bf16_bits(p[c] * (dp[c] - d));
}

// The bits of x[B, T, heads * HS] head-major, [B, heads, T, HS]: the products' operands dense
// (oneDNN's AMX matmul writes a dense output only, and a query block's rows of one head are
// contiguous here). Into the calling thread's scratch of tag Tag, shared with the tasks for the
// call. By tiles of 32 rows: their reads stay in cache while every head's part is written out
// contiguously (one head at a time down all T rows reads with a stride of a whole row, and one
// row at a time across the heads writes to as many streams: each ran at a third of the memory's
// speed).
template <typename Tag>
const uint16_t* head_major_bits(const float* x, int64_t B, int64_t T, int64_t heads, int64_t HS) {
  constexpr int64_t kRows = 32;
  uint16_t* bits = thread_scratch<Tag, uint16_t>(static_cast<size_t>(B * T * heads * HS));
  const int64_t tiles = (T + kRows - 1) / kRows;
#pragma omp parallel for schedule(static)
  for (int64_t tile = 0; tile < B * tiles; tile++) {
    const int64_t b = tile / tiles, t0 = tile % tiles * kRows, t1 = std::min(T, t0 + kRows);
    for (int64_t h = 0; h < heads; h++) {
      const float* src = x + b * T * heads * HS + h * HS;
      uint16_t* dst = bits + (b * heads + h) * T * HS;
      for (int64_t t = t0; t < t1; t++) {
#pragma omp simd
        for (int64_t i = 0; i < HS; i++) dst[t * HS + i] = bf16_bits(src[t * heads * HS + i]);
      }
    }
  }
  return bits;
}

struct QkvBits;
struct DoutBits;
struct ForwardScores;
struct ForwardScoreBits;
struct ForwardRows;
struct ForwardStats;

// Offsets of one head's [T, HS] bits in head_major_bits' arrays: qkv's (heads NH + 2 KVH: q of
// the NH query heads, k and v of the KVH kv heads, as in qkv's rows) and dO's (NH heads).
struct HeadMajor {
  int64_t T, NH, KVH, HS;
  int64_t head(int64_t b, int64_t slot) const { return (b * (NH + 2 * KVH) + slot) * T * HS; }
  int64_t q(int64_t b, int64_t h) const { return head(b, h); }
  int64_t k(int64_t b, int64_t j) const { return head(b, NH + j); }
  int64_t v(int64_t b, int64_t j) const { return head(b, NH + KVH + j); }
  int64_t g(int64_t b, int64_t h) const { return (b * NH + h) * T * HS; }
};

// Rows [r0, r1) of query head h (q16, k16, v16: its [T, HS] bits) into o (row stride C) and
// lse ([T] of the head). Every product reads and writes dense arrays (ld = its columns): the
// scores [R, n], their bits, and the output rows [R, HS], copied into o at the end.
void forward_row_block(float* o, float* lse, const uint16_t* q16, const uint16_t* k16,
                       const uint16_t* v16, const int32_t* doc_start, int64_t r0, int64_t r1,
                       const Layout& L, float scale) {
  const int64_t R = r1 - r0, C = L.C, HS = L.HS;
  float* s = thread_scratch<ForwardScores, float>(kBlock * kKeyChunk);
  uint16_t* p16 = thread_scratch<ForwardScoreBits, uint16_t>(kBlock * kKeyChunk);
  float* acc = thread_scratch<ForwardRows, float>(static_cast<size_t>(kBlock * HS));
  float* m = thread_scratch<ForwardStats, float>(2 * kBlock);
  float* l = m + kBlock;
  const int64_t c_first = first_key_block(doc_start, r0, r1);
  for (int64_t c0 = c_first; c0 < r1; c0 += kKeyChunk) {
    const int64_t n = std::min(r1, c0 + kKeyChunk) - c0;
    const bool first = c0 == c_first;
    // S = scale Q[r0:r1] K[c0:c0+n]^T
    gemm_bf16_rounded(false, true, R, n, HS, scale, q16 + r0 * HS, HS, k16 + c0 * HS, HS, 0.0f,
                      s, n);
    for (int64_t r = 0; r < R; r++) {
      const float* row = s + r * n;
      const Visible vis = visible_columns(r0 + r, c0, n, doc_start);
      const float shrink =
          online_softmax_block_row_into(row, vis.begin, vis.end, n, m[r], l[r], first,
                                        p16 + r * n, [](float e) { return bf16_bits(e); });
      if (first) continue;  // written (beta = 0) by the product below
      float* arow = acc + r * HS;
#pragma omp simd
      for (int64_t i = 0; i < HS; i++) arow[i] *= shrink;
    }
    // O[r0:r1] (+)= P V[c0:c0+n]
    gemm_bf16_rounded(false, false, R, HS, n, 1.0f, p16, n, v16 + c0 * HS, HS,
                      first ? 0.0f : 1.0f, acc, HS);
  }
  for (int64_t r = 0; r < R; r++) {
    float* orow = o + (r0 + r) * C;
    const float* arow = acc + r * HS;
    const float inv = 1.0f / l[r];
#pragma omp simd
    for (int64_t i = 0; i < HS; i++) orow[i] = rounded_to_bf16(arow[i] * inv);
    lse[r0 + r] = m[r] + std::log(l[r]);
  }
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                            int64_t NH, int64_t KVH, int64_t HS, const int32_t* doc_start) {
  require_bf16_gemm();  // here, not inside the tasks' parallel region
  const Layout L(T, NH, KVH, HS);
  const HeadMajor H{T, NH, KVH, HS};
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const uint16_t* qkv16 = head_major_bits<QkvBits>(qkv, B, T, NH + 2 * KVH, HS);
  const int64_t blocks = (T + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
  // Tasks (b, h, row block), the largest (last) row blocks first: dynamic scheduling balances
  // the triangle.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < BH * blocks; task++) {
    const int64_t i = blocks - 1 - task / BH;
    const int64_t bh = task % BH;
    const int64_t b = bh / NH, h = bh % NH;
    forward_row_block(out + L.o(b, h), lse + bh * T, qkv16 + H.q(b, h), qkv16 + H.k(b, h / L.G),
                      qkv16 + H.v(b, h / L.G), doc_start ? doc_start + b * T : nullptr,
                      i * kBlock, std::min(T, (i + 1) * kBlock), L, scale);
  }
}

namespace {

struct BackwardP;
struct BackwardPBits;
struct BackwardDs;
struct BackwardDsBits;
struct BackwardKvSums;
struct BackwardQRows;
struct BackwardRowDots;

// One backward task's operands: the [T, HS] bits of a query head's q and dO and of its kv
// head's k and v, the head's lse and D ([T]); and its dense fp32 sums: dK, dV of the kv head
// ([T, HS] each) and dQ of the row block ([R, HS]).
struct HeadViews {
  const uint16_t *q16, *k16, *v16, *g16;
  const float *lse, *d;
  float *dk, *dv, *dq;
};

// Query rows [r0, r1) of one query head against the keys they see, in chunks: adds to dK, dV
// (the chunk's rows) and writes dQ of the rows into v.dq.
void backward_row_block(const HeadViews& v, const int32_t* doc_start, int64_t r0, int64_t r1,
                        float scale, int64_t HS) {
  const int64_t R = r1 - r0;
  float* p = thread_scratch<BackwardP, float>(kBlock * kKeyChunk);
  uint16_t* p16 = thread_scratch<BackwardPBits, uint16_t>(kBlock * kKeyChunk);
  float* ds = thread_scratch<BackwardDs, float>(kBlock * kKeyChunk);
  uint16_t* ds16 = thread_scratch<BackwardDsBits, uint16_t>(kBlock * kKeyChunk);
  const int64_t c_first = first_key_block(doc_start, r0, r1);
  for (int64_t c0 = c_first; c0 < r1; c0 += kKeyChunk) {
    const int64_t n = std::min(r1, c0 + kKeyChunk) - c0;
    // P = exp(scale Q K^T - lse), 0 where masked, in bf16
    gemm_bf16_rounded(false, true, R, n, HS, scale, v.q16 + r0 * HS, HS, v.k16 + c0 * HS, HS,
                      0.0f, p, n);
    for (int64_t r = 0; r < R; r++) {
      float* row = p + r * n;
      const Visible vis = visible_columns(r0 + r, c0, n, doc_start);
      probabilities_row(row, vis.begin, vis.end, n, v.lse[r0 + r], p16 + r * n);
    }
    // dV[c0:c0+n] += P^T dO[r0:r1]
    gemm_bf16_rounded(true, false, n, HS, R, 1.0f, p16, n, v.g16 + r0 * HS, HS, 1.0f,
                      v.dv + c0 * HS, HS);
    // dP = dO[r0:r1] V[c0:c0+n]^T, then dS = P * (dP - D) in bf16 (0 where masked: P is)
    gemm_bf16_rounded(false, true, R, n, HS, 1.0f, v.g16 + r0 * HS, HS, v.v16 + c0 * HS, HS,
                      0.0f, ds, n);
    for (int64_t r = 0; r < R; r++)
      score_gradient_row(p + r * n, ds + r * n, v.d[r0 + r], n, ds16 + r * n);
    // dK[c0:c0+n] += scale dS^T Q[r0:r1];  dQ[r0:r1] (+)= scale dS K[c0:c0+n]
    gemm_bf16_rounded(true, false, n, HS, R, scale, ds16, n, v.q16 + r0 * HS, HS, 1.0f,
                      v.dk + c0 * HS, HS);
    gemm_bf16_rounded(false, false, R, HS, n, scale, ds16, n, v.k16 + c0 * HS, HS,
                      c0 == c_first ? 0.0f : 1.0f, v.dq, HS);
  }
}

// rows x HS of a dense array into rows of stride ld, rounded to bf16 (the stored gradients).
void store_rows(float* dst, int64_t ld, const float* src, int64_t rows, int64_t HS) {
  for (int64_t t = 0; t < rows; t++) {
#pragma omp simd
    for (int64_t i = 0; i < HS; i++) dst[t * ld + i] = rounded_to_bf16(src[t * HS + i]);
  }
}

// Everything of kv head j in batch b: dK, dV of the head (summed over its query heads in head
// order and their row blocks in order) and dQ of its query heads.
void backward_kv_head(float* dqkv, const float* dout, const float* out, const float* lse,
                      const uint16_t* qkv16, const uint16_t* dout16, const int32_t* doc_start,
                      int64_t b, int64_t j, const Layout& L, const HeadMajor& H, float scale) {
  const int64_t T = L.T, HS = L.HS, CQ = L.CQ;
  float* dk = thread_scratch<BackwardKvSums, float>(static_cast<size_t>(2 * T * HS));
  float* dv = dk + T * HS;
  std::fill(dk, dk + 2 * T * HS, 0.0f);
  float* dq = thread_scratch<BackwardQRows, float>(static_cast<size_t>(kBlock * HS));
  float* d = thread_scratch<BackwardRowDots, float>(static_cast<size_t>(T));
  for (int64_t hl = 0; hl < L.G; hl++) {
    const int64_t h = j * L.G + hl;
    rowwise_dot(d, dout + L.o(b, h), out + L.o(b, h), L);
    const HeadViews views{qkv16 + H.q(b, h), qkv16 + H.k(b, j), qkv16 + H.v(b, j),
                          dout16 + H.g(b, h), lse + (b * L.NH + h) * T, d, dk, dv, dq};
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock);
      backward_row_block(views, doc_start, r0, r1, scale, HS);
      store_rows(dqkv + L.q(b, h) + r0 * CQ, CQ, dq, r1 - r0, HS);
    }
  }
  store_rows(dqkv + L.k(b, j), CQ, dk, T, HS);
  store_rows(dqkv + L.v(b, j), CQ, dv, T, HS);
}

}  // namespace

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                             int64_t HS, const int32_t* doc_start) {
  require_bf16_gemm();
  const Layout L(T, NH, KVH, HS);
  const HeadMajor H{T, NH, KVH, HS};
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const uint16_t* qkv16 = head_major_bits<QkvBits>(qkv, B, T, NH + 2 * KVH, HS);
  const uint16_t* dout16 = head_major_bits<DoutBits>(dout, B, T, NH, HS);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < B * KVH; task++) {
    const int64_t b = task / KVH;
    backward_kv_head(dqkv, dout, out, lse, qkv16, dout16, doc_start ? doc_start + b * T : nullptr,
                     b, task % KVH, L, H, scale);
  }
}

}  // namespace trident::cpu

#pragma once
// What the two causal attention kernels share (attention.cpp: fp32 products on 128 x 128
// blocks; attention_bf16.cpp: bf16 products of a query block against many keys): the views of
// a head in qkv / out, the columns a row sees, and the softmax backward's row dots.
#include <algorithm>
#include <cstdint>

namespace trident::cpu::attention_blocks {

// Rows of a query block (both kernels), and the unit key ranges start on.
constexpr int64_t kBlock = 128;

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

// Columns of key range [c0, c0 + n) that query row t sees: [begin, end) of the range, s <= t
// (end) and s >= the row's document start (begin; 0 without documents).
struct Visible {
  int64_t begin, end;
};
inline Visible visible_columns(int64_t t, int64_t c0, int64_t n, const int32_t* doc_start) {
  const int64_t begin = doc_start ? std::max<int64_t>(0, doc_start[t] - c0) : 0;
  return {begin, std::min(n, t - c0 + 1)};
}

// The first key block any of the rows [r0, r1) sees: the block of their smallest document start
// (0 without documents). The forward starts there and the backward overwrites dQ there.
inline int64_t first_key_block(const int32_t* doc_start, int64_t r0, int64_t r1) {
  if (!doc_start) return 0;
  int64_t lo = r0;
  for (int64_t t = r0; t < r1; t++) lo = std::min<int64_t>(lo, doc_start[t]);
  return lo / kBlock * kBlock;
}

// d[t] = sum_i dO[t, i] O[t, i] for the T rows of one head (row stride C): the softmax
// backward's rowsum(P * dP), since rowsum(P * (dO V^T)) = rowsum(dO * (P V)).
template <typename F>
void rowwise_dot(F* d, const F* dout, const F* out, const Layout& L) {
  for (int64_t t = 0; t < L.T; t++) {
    const F* g = dout + t * L.C;
    const F* o = out + t * L.C;
    F dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < L.HS; i++) dot += g[i] * o[i];
    d[t] = dot;
  }
}

}  // namespace trident::cpu::attention_blocks

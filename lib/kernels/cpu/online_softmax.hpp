#pragma once
// The online softmax of one row of one key block, shared by the attention kernels
// (attention.cpp: causal, within documents; attention_bf16.cpp: the same, storing bf16 bits;
// context_attention.cpp: a ring block, unmasked).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

// One key block of row t's online softmax. s[0, n) holds the block's scaled scores, of which
// the columns [begin, end) are visible (the rest masked: causal beyond end, another document
// before begin); m and l are the row's running max and sum of exp(S - m) over the earlier blocks
// (`first`: there are none). On return out[0, n) = store(exp(s - m_new)) (Out{0} where masked;
// out may be s itself), m = m_new, l = the sum (of the unstored exps) including this block; the
// result is exp(m_old - m_new), by which the row's output accumulated so far must shrink. A row
// that has seen no visible column yet keeps m = -inf, l = 0 (a block before its document): its
// output so far is 0, and shrinking it by 0 (or 1 while it stays empty) keeps it 0.
template <typename F, typename Out, typename Store>
inline F online_softmax_block_row_into(const F* s, int64_t begin, int64_t end, int64_t n, F& m,
                                       F& l, bool first, Out* out, Store store) {
  if (begin >= end) {  // nothing visible in this block
    std::fill(out, out + n, Out{0});
    if (!first) return F(1);
    m = -std::numeric_limits<F>::infinity();
    l = F(0);
    return F(0);
  }
  F mx = first ? -std::numeric_limits<F>::infinity() : m;
#pragma omp simd reduction(max : mx)
  for (int64_t c = begin; c < end; c++) mx = mx > s[c] ? mx : s[c];  // (std::max: scalar code)
  F sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = begin; c < end; c++) {
    const F e = detail::exp_fast(s[c] - mx);
    out[c] = store(e);
    sum += e;
  }
  std::fill(out, out + begin, Out{0});
  std::fill(out + end, out + n, Out{0});
  const F shrink = first ? F(0) : detail::exp_fast(m - mx);
  l = first ? sum : l * shrink + sum;
  m = mx;
  return shrink;
}

// The same in place: s[0, n) = exp(s - m_new), 0 where masked.
template <typename F>
inline F online_softmax_block_row(F* s, int64_t begin, int64_t end, int64_t n, F& m, F& l,
                                  bool first) {
  return online_softmax_block_row_into(s, begin, end, n, m, l, first, s, [](F e) { return e; });
}

}  // namespace trident::cpu

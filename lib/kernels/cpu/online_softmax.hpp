#pragma once
// The online softmax of one row of one key block, shared by the attention kernels
// (attention.cpp: causal, context_attention.cpp: a ring block, unmasked).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

// One key block of row t's online softmax. s[0, len) holds the block's scaled scores (the
// rest of the n columns are masked); m and l are the row's running max and sum of exp(S - m)
// over the earlier blocks (`first`: there are none). On return s[0, n) = exp(s - m_new) (0 where
// masked), m = m_new, l = the sum including this block; the result is exp(m_old - m_new), by
// which the row's output accumulated so far must shrink.
template <typename F>
inline F online_softmax_block_row(F* s, int64_t len, int64_t n, F& m, F& l, bool first) {
  F mx = first ? -std::numeric_limits<F>::infinity() : m;
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < len; c++) mx = mx > s[c] ? mx : s[c];  // (std::max: scalar code)
  F sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < len; c++) {
    const F e = detail::exp_fast(s[c] - mx);
    s[c] = e;
    sum += e;
  }
  std::fill(s + len, s + n, F(0));
  const F shrink = first ? F(0) : detail::exp_fast(m - mx);
  l = first ? sum : l * shrink + sum;
  m = mx;
  return shrink;
}

}  // namespace trident::cpu

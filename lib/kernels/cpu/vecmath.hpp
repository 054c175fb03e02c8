#pragma once
// Private helpers of the CPU kernels (not part of the kernel interface).
//
// exp_fast: exp(x) that GCC vectorises inside `omp simd` loops. glibc only declares its vector
// expf/tanhf when compiling with -ffast-math, which we do not use, so the float path is a
// Cephes-style expf (Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 polynomial,
// 2^n built from the exponent bits): relative error < 2 ulp on [-87.3, 88.3], exactly 0 below
// -87.3 (where expf would be subnormal), saturating at exp(88.3) ~ 2.2e38 above (the kernels
// only take exp of arguments <= 80), NaN in -> NaN out. The double instantiation (used by
// the gradient tests, not by the trainer) calls std::exp.
//
// split_range: static contiguous chunks (the column ranges of the column-parallel reductions).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace trident::cpu::detail {

// Branch-free selections. Under GCC's default -ftrapping-math a float `?:` or std::min/max
// becomes control flow that the if-conversion refuses (the loop then stays scalar); selecting
// bits with integer masks built from the comparisons vectorises.
inline float select_f32(bool cond, float a, float b) {
  const int32_t m = cond ? -1 : 0;
  return std::bit_cast<float>((std::bit_cast<int32_t>(a) & m) | (std::bit_cast<int32_t>(b) & ~m));
}
inline float clamp_f32(float x, float lo, float hi) {
  const int32_t below = x < lo ? -1 : 0;
  const int32_t above = x > hi ? -1 : 0;
  const int32_t bits = (std::bit_cast<int32_t>(x) & ~(below | above)) |
                       (std::bit_cast<int32_t>(lo) & below) | (std::bit_cast<int32_t>(hi) & above);
  return std::bit_cast<float>(bits);
}

inline float exp_fast_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float xc = clamp_f32(x, -87.3f, 88.3f);
  const float n = (xc * kLog2e + kRound) - kRound;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return select_f32(x < -87.3f, 0.0f, y * scale);
}

template <typename T>
inline T exp_fast(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp_fast_f32(x);
  } else {
    return std::exp(x);
  }
}

// min(x, hi) that keeps float loops vectorisable.
template <typename T>
inline T min_fast(T x, T hi) {
  if constexpr (std::is_same_v<T, float>) {
    return select_f32(x > hi, hi, x);
  } else {
    return std::min(x, hi);
  }
}

// A norm's row of input gradient into dinp[0, C), in blocks of 256 columns: columns(c0, len, o)
// computes columns [c0, c0 + len) into o[0, len). kAdd: o is a block in L1, then added to dinp
// (rounded first: dinp += s * (...) would contract into one FMA and differ from the
// overwrite-then-add it replaces); otherwise o is dinp + c0.
template <bool kAdd, typename T, typename Columns>
inline void row_gradient_into(T* dinp, int64_t C, Columns&& columns) {
  constexpr int64_t kBlock = 256;
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t len = std::min(kBlock, C - c0);
    T block[kBlock];
    T* o = kAdd ? block : dinp + c0;
    columns(c0, len, o);
    if constexpr (kAdd) {
#pragma omp simd
      for (int64_t j = 0; j < len; j++) dinp[c0 + j] += block[j];
    }
  }
}

// [begin, end) of chunk `i` when n items are split into `parts` near-equal contiguous chunks.
struct Range {
  int64_t begin;
  int64_t end;
};
inline Range split_range(int64_t n, int64_t parts, int64_t i) {
  const int64_t base = n / parts;
  const int64_t rem = n % parts;
  const int64_t begin = i * base + std::min(i, rem);
  return {begin, begin + base + (i < rem ? 1 : 0)};
}

}  // namespace trident::cpu::detail

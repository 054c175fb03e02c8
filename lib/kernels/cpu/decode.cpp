// The decoding kernels (generation with a key/value cache, Transformer::forward_decode): rotary
// embeddings of rows at given positions, and the attention of one new query row per sequence
// over the keys and values cached for it. The rotation's transpose at given positions serves the
// context-parallel backward (a rank's rows are two chunks of the sequence).
//
// Both follow their training twins (rope.cpp, attention.cpp): angles t * theta^(-2i/HS) with
// cos/sin and the rotation in double; scores scaled by 1/sqrt(HS) in F, softmax with
// exp_fast. Each (row, head) is computed by one thread from its own inputs: deterministic for
// any thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {

// Rotates the q and k heads of row n by the angles of position positions[n]; sign = -1 rotates
// back (the transpose: only the sign of sin changes).
template <typename F>
void rope_rotate_at(F* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                    int64_t HS, double theta, double sign) {
  const int64_t half = HS / 2, CQ = (NH + 2 * KVH) * HS;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; i++)
    inv_freq[i] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(HS));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const double t = static_cast<double>(positions[n]);
    for (int64_t i = 0; i < half; i++) {
      const double angle = t * inv_freq[i];
      const double c = std::cos(angle), s = sign * std::sin(angle);
      for (int64_t h = 0; h < NH + KVH; h++) {
        F* x = qkv + n * CQ + h * HS;
        const double a = x[i], b = x[i + half];
        x[i] = static_cast<F>(a * c - b * s);
        x[i + half] = static_cast<F>(b * c + a * s);
      }
    }
  }
}

}  // namespace

template <typename F>
void rope_forward_at(F* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                     int64_t HS, double theta) {
  rope_rotate_at(qkv, positions, N, NH, KVH, HS, theta, 1.0);
}

// The context-parallel backward: a rank's rows are at the positions of its two chunks.
template <typename F>
void rope_backward_at(F* dqkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                      int64_t HS, double theta) {
  rope_rotate_at(dqkv, positions, N, NH, KVH, HS, theta, -1.0);
}

template <typename F>
void kv_cache_attention(F* out, F* k_cache, F* v_cache, const F* qkv, const int32_t* positions,
                        int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS) {
  const int64_t CQ = (NH + 2 * KVH) * HS, G = NH / KVH;
  // The new keys and values first: every query head of a group reads its kv head's.
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < KVH; j++) {
      const int64_t slot = ((b * KVH + j) * Tmax + positions[b]) * HS;
      const F* row = qkv + b * CQ;
      for (int64_t i = 0; i < HS; i++) {
        k_cache[slot + i] = row[(NH + j) * HS + i];
        v_cache[slot + i] = row[(NH + KVH + j) * HS + i];
      }
    }
  const F scale = F(1) / std::sqrt(F(HS));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; bh++) {
    const int64_t b = bh / NH, h = bh % NH, len = positions[b] + 1;
    const F* q = qkv + b * CQ + h * HS;
    const F* keys = k_cache + (b * KVH + h / G) * Tmax * HS;
    const F* values = v_cache + (b * KVH + h / G) * Tmax * HS;
    std::vector<F> p(static_cast<size_t>(len));
    F mx = -std::numeric_limits<F>::infinity();
    for (int64_t s = 0; s < len; s++) {
      F dot = 0;
      for (int64_t i = 0; i < HS; i++) dot += q[i] * keys[s * HS + i];
      p[s] = dot * scale;
      mx = mx > p[s] ? mx : p[s];
    }
    F sum = 0;
    for (int64_t s = 0; s < len; s++) sum += (p[s] = detail::exp_fast(p[s] - mx));
    const F inv = F(1) / sum;
    F* o = out + b * NH * HS + h * HS;
    for (int64_t i = 0; i < HS; i++) o[i] = 0;
    for (int64_t s = 0; s < len; s++) {
      const F w = p[s] * inv;
      for (int64_t i = 0; i < HS; i++) o[i] += w * values[s * HS + i];
    }
  }
}

#define TRIDENT_INSTANTIATE(F)                                                               \
  template void rope_forward_at<F>(F*, const int32_t*, int64_t, int64_t, int64_t, int64_t,  \
                                   double);                                                  \
  template void rope_backward_at<F>(F*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                    double);                                                 \
  template void kv_cache_attention<F>(F*, F*, F*, const F*, const int32_t*, int64_t, int64_t, \
                                      int64_t, int64_t, int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

// Rotary position embeddings, "rotate half" convention (Hugging Face Llama), in place on the q
// and k heads of the fused qkv activations [B,T,(NH+2*KVH)*HS].
//
// Within a head, pair i < HS/2 is (x[i], x[i+HS/2]), rotated by the angle t * inv_freq[i],
// inv_freq[i] = theta^(-2i/HS), t = row % T. The cos/sin tables [T, HS/2] are built once per
// call in double (angles reach t ~ 1e4 rad, where one float ulp is ~1e-3 rad), and the
// rotation itself is done in double and rounded once to F. The backward is the transpose of
// the rotation, i.e. the rotation by -angle: only the sign of sin changes. Every element is
// written by one thread from its own inputs: deterministic for any thread count.
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.hpp"

namespace trident::cpu {

namespace {

struct RopeTables {
  int64_t half;
  std::vector<double> cos, sin;  // [T, half]
};

RopeTables rope_tables(int64_t T, int64_t HS, double theta) {
  const int64_t half = HS / 2;
  RopeTables tab{half, std::vector<double>(T * half), std::vector<double>(T * half)};
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; i++)
    inv_freq[i] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(HS));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < half; i++) {
      const double angle = static_cast<double>(t) * inv_freq[i];
      tab.cos[t * half + i] = std::cos(angle);
      tab.sin[t * half + i] = std::sin(angle);
    }
  return tab;
}

// Rotates one head x[HS] by the angles of cos/sin[half]; sign = -1 rotates back.
template <typename F>
inline void rotate_head(F* x, const double* cos, const double* sin, int64_t half, double sign) {
  F* lo = x;
  F* hi = x + half;
#pragma omp simd
  for (int64_t i = 0; i < half; i++) {
    const double a = lo[i];
    const double b = hi[i];
    const double s = sign * sin[i];
    lo[i] = static_cast<F>(a * cos[i] - b * s);
    hi[i] = static_cast<F>(b * cos[i] + a * s);
  }
}

// The q heads and the k heads are contiguous (NH + KVH heads at the start of each row).
template <typename F>
void rope_apply(F* qkv, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS, double theta,
                double sign) {
  const RopeTables tab = rope_tables(T, HS, theta);
  const int64_t CQ = (NH + 2 * KVH) * HS;
  const int64_t heads = NH + KVH;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T; row++) {
    const int64_t t = row % T;
    const double* c = tab.cos.data() + t * tab.half;
    const double* s = tab.sin.data() + t * tab.half;
    for (int64_t h = 0; h < heads; h++) rotate_head(qkv + row * CQ + h * HS, c, s, tab.half, sign);
  }
}

}  // namespace

template <typename F>
void rope_forward(F* qkv, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS,
                  double theta) {
  rope_apply(qkv, B, T, NH, KVH, HS, theta, 1.0);
}

template <typename F>
void rope_backward(F* dqkv, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS,
                   double theta) {
  rope_apply(dqkv, B, T, NH, KVH, HS, theta, -1.0);
}

#define TRIDENT_INSTANTIATE(F)                                                                 \
  template void rope_forward<F>(F*, int64_t, int64_t, int64_t, int64_t, int64_t, double);     \
  template void rope_backward<F>(F*, int64_t, int64_t, int64_t, int64_t, int64_t, double);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

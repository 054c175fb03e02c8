// Linear layer in torch layout (weight [OC, C]): one GEMM per product, OpenBLAS threads inside.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

namespace {
struct BiasSums;         // linear_backward's per-thread bias sums (thread_scratch)
struct WeightGradBlock;  // a block of the transposed weight gradient (thread_scratch)

// Elements of a block of the transposed weight gradient: 2 MiB of floats, in cache while it is
// added into the weight gradient; at least 1024 output columns a block (a GEMM of fewer ran
// slower).
constexpr int64_t kWeightGradBlockElements = int64_t{1} << 19;
constexpr int64_t kMinWeightGradBlock = 1024;

// dweight [OC, C] += scale dout^T inp for a layer whose output is wider than its input
// (OC > C: the LM head, the MLP's first layer, qkv), formed transposed a block of output
// columns at a time: S [C, w] = scale inp^T dout[:, o0:o0 + w] (overwrite), then
// dweight[o0 + j][c] += S[c][j]. The same sums over the N rows, in a product whose output's
// long side is its rows: oneDNN's sgemm ran the LM head's 50304 x 256 x 512 TN at 186-198
// GFLOP/s on one Zen 5 thread and 300-330 on two, its transposed 256 x 2048 x 512 blocks at
// 237-243 and 416-439 (bench_sgemm; GPT-2 124M's 50304 x 768 x 1024 neutral to +5 %; the
// MLP's 1024 x 256 x 512 194 against 235 on one thread). Where OC <= C the plain product is
// as fast or faster (768 x 3072: 226 against 221), so it stays.
template <typename T>
void weight_grad_by_blocks(T* dweight, const T* dout, const T* inp, int64_t N, int64_t C,
                           int64_t OC, T scale) {
  const int64_t block =
      std::min(OC, std::max(kMinWeightGradBlock, kWeightGradBlockElements / C / 64 * 64));
  T* s = thread_scratch<WeightGradBlock, T>(static_cast<size_t>(C * block));
  constexpr int64_t kTile = 16;  // 16 x 16 tiles: a tile's lines of S and of dweight in cache
  for (int64_t o0 = 0; o0 < OC; o0 += block) {
    const int64_t w = std::min(block, OC - o0);
    gemm<T>(true, false, C, w, N, scale, inp, C, dout + o0, OC, T(0), s, w);
    const int64_t row_tiles = (w + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (w * C >= (int64_t{1} << 15))
    for (int64_t jt = 0; jt < row_tiles; ++jt)
      for (int64_t c0 = 0; c0 < C; c0 += kTile) {
        const int64_t j1 = std::min(w, (jt + 1) * kTile), c1 = std::min(C, c0 + kTile);
        for (int64_t j = jt * kTile; j < j1; ++j) {
          T* row = dweight + (o0 + j) * C;
          for (int64_t c = c0; c < c1; ++c) row[c] += s[c * w + j];
        }
      }
  }
}
}  // namespace

// out = scale (inp @ weight^T) + bias. With beta = 0 OpenBLAS first zero-fills `out`; writing the
// bias rows instead and calling with beta = 1 makes the bias add free.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC, T scale) {
  T beta = T(0);
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) std::memcpy(out + n * OC, bias, sizeof(T) * OC);
    beta = T(1);
  }
  gemm<T>(false, true, N, OC, C, scale, inp, C, weight, C, beta, out, OC);
}

// dinp = dinp_scale (dout @ weight) (overwrite);  dweight += dweight_scale (dout^T @ inp);
// dbias += sum_n dout[n]
// (accumulate). Any of dinp, dweight, dbias may be nullptr: the split backward of the
// zero-bubble schedules computes dinp alone first and dweight, dbias later.
// dbias: threads split the columns and sum the rows in order (deterministic for any thread
// count) into a local double sum (N can be many thousand rows), added to dbias once.
template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC, T dinp_scale, T dweight_scale) {
  if (dbias != nullptr) {
    constexpr int64_t kAlign = 64 / sizeof(T);
    const int64_t blocks = (OC + kAlign - 1) / kAlign;
#pragma omp parallel
    {
      const detail::Range rb =
          detail::split_range(blocks, omp_get_num_threads(), omp_get_thread_num());
      const int64_t c0 = rb.begin * kAlign;
      const int64_t c1 = std::min(OC, rb.end * kAlign);
      if (c1 > c0) {
        const int64_t w = c1 - c0;
        double* a = thread_scratch<BiasSums, double>(static_cast<size_t>(w));
        std::fill(a, a + w, 0.0);
        for (int64_t n = 0; n < N; n++) {
          const T* g = dout + n * OC + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; c++) a[c] += static_cast<double>(g[c]);
        }
#pragma omp simd
        for (int64_t c = 0; c < w; c++) dbias[c0 + c] += static_cast<T>(a[c]);
      }
    }
  }
  if (dweight != nullptr) {
    if (OC > C)
      weight_grad_by_blocks(dweight, dout, inp, N, C, OC, dweight_scale);
    else
      gemm<T>(true, false, OC, C, N, dweight_scale, dout, OC, inp, C, T(1), dweight, C);
  }
  if (dinp != nullptr)
    gemm<T>(false, false, N, C, OC, dinp_scale, dout, OC, weight, C, T(0), dinp, C);
}

#define TRIDENT_INSTANTIATE(T)                                                                  \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,  \
                                  T);                                                          \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t,  \
                                   int64_t, T, T);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

// Token and position embeddings (vocab-parallel token table: this rank holds rows
// [vocab_begin, vocab_begin + rows) of the padded vocabulary).
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace trident::cpu {

template <typename T>
void token_embedding_forward(T* out, const int32_t* ids, const T* wte, int64_t N, int64_t C,
                             int64_t vocab_begin, int64_t rows) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const int64_t r = static_cast<int64_t>(ids[n]) - vocab_begin;
    T* o = out + n * C;
    if (r >= 0 && r < rows) {
      std::memcpy(o, wte + r * C, sizeof(T) * C);
    } else {
      std::fill(o, o + C, T(0));
    }
  }
}

// Repeated ids make a row-parallel scatter racy, so the threads split the COLUMNS: each owns a
// column range of every table row and visits the tokens in order n = 0..N-1. Every element of
// dwte is thus summed in token order whatever the thread count (bitwise reproducible).
template <typename T>
void token_embedding_backward(T* dwte, const T* dout, const int32_t* ids, int64_t N, int64_t C,
                              int64_t vocab_begin, int64_t rows) {
  constexpr int64_t kAlign = 64 / sizeof(T);  // one cache line per chunk boundary
  const int64_t blocks = (C + kAlign - 1) / kAlign;
#pragma omp parallel
  {
    const int64_t parts = omp_get_num_threads();
    const detail::Range rb = detail::split_range(blocks, parts, omp_get_thread_num());
    const int64_t c0 = rb.begin * kAlign;
    const int64_t c1 = std::min(C, rb.end * kAlign);
    for (int64_t n = 0; n < N; n++) {
      const int64_t r = static_cast<int64_t>(ids[n]) - vocab_begin;
      if (r < 0 || r >= rows) continue;
      T* dst = dwte + r * C;
      const T* src = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
    }
  }
}

template <typename T>
void position_embedding_forward(T* out, const T* wpe, int64_t B, int64_t T_, int64_t C) {
  position_embedding_forward_rows(out, wpe, 0, B * T_, T_, C);
}

template <typename T>
void position_embedding_forward_rows(T* out, const T* wpe, int64_t first_row, int64_t rows,
                                     int64_t T_, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; i++) {
    T* o = out + i * C;
    const T* w = wpe + ((first_row + i) % T_) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) o[c] += w[c];
  }
}

// dwpe[t] += sum_b dout[b, t]: parallel over positions, batch summed in order.
template <typename T>
void position_embedding_backward(T* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T_; t++) {
    T* d = dwpe + t * C;
    for (int64_t b = 0; b < B; b++) {
      const T* g = dout + (b * T_ + t) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) d[c] += g[c];
    }
  }
}

// Rows at arbitrary positions (context parallelism: a rank holds two chunks of each sequence).
template <typename T>
void position_embedding_forward_at(T* out, const T* wpe, const int32_t* positions, int64_t N,
                                   int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    T* o = out + n * C;
    const T* w = wpe + static_cast<int64_t>(positions[n]) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) o[c] += w[c];
  }
}

// Positions may repeat (every sequence of the batch has them): column ranges per thread, rows
// in order, as token_embedding_backward.
template <typename T>
void position_embedding_backward_at(T* dwpe, const T* dout, const int32_t* positions, int64_t N,
                                    int64_t C) {
  constexpr int64_t kAlign = 64 / sizeof(T);
  const int64_t blocks = (C + kAlign - 1) / kAlign;
#pragma omp parallel
  {
    const int64_t parts = omp_get_num_threads();
    const detail::Range rb = detail::split_range(blocks, parts, omp_get_thread_num());
    const int64_t c0 = rb.begin * kAlign;
    const int64_t c1 = std::min(C, rb.end * kAlign);
    for (int64_t n = 0; n < N; n++) {
      T* dst = dwpe + static_cast<int64_t>(positions[n]) * C;
      const T* src = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
    }
  }
}

#define TRIDENT_INSTANTIATE(T)                                                                  \
  template void token_embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t,     \
                                           int64_t, int64_t);                                  \
  template void token_embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t,    \
                                            int64_t, int64_t);                                 \
  template void position_embedding_forward<T>(T*, const T*, int64_t, int64_t, int64_t);        \
  template void position_embedding_forward_rows<T>(T*, const T*, int64_t, int64_t, int64_t,    \
                                                   int64_t);                                   \
  template void position_embedding_backward<T>(T*, const T*, int64_t, int64_t, int64_t);      \
  template void position_embedding_forward_at<T>(T*, const T*, const int32_t*, int64_t,        \
                                                 int64_t);                                     \
  template void position_embedding_backward_at<T>(T*, const T*, const int32_t*, int64_t,       \
                                                  int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu

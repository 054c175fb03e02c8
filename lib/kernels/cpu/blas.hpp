#pragma once
// Row-major GEMM for float (sgemm) and double (dgemm), so every kernel can be instantiated in
// double for gradient checks. C[M,N] = alpha * op(A) op(B) + beta * C.
#include <cstdint>

namespace trident::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Threads used by OpenBLAS and by our OpenMP loops in this process.
void set_num_threads(int threads);
int num_threads();

}  // namespace trident::cpu

// Row-major GEMM on OpenBLAS (OpenMP build). Called outside a parallel region, OpenBLAS uses
// the thread count set by set_num_threads; called inside an OpenMP parallel region (the
// attention kernels call it per (batch, head, block) task) it runs single-threaded, because
// the OpenMP build of OpenBLAS checks omp_in_parallel() (checked with OpenBLAS 0.3.21: a
// 1024x1024x64 sgemm inside a 2-thread parallel region runs at the 1-thread rate, outside it
// at twice that).
#include "kernels/cpu/blas.hpp"

#include <cblas.h>
#include <omp.h>

#include <type_traits>

namespace trident::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(M), static_cast<blasint>(N),
                static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B,
                static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
  } else {
    static_assert(std::is_same_v<T, double>);
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(M), static_cast<blasint>(N),
                static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B,
                static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                           int64_t, const double*, int64_t, double, double*, int64_t);

void set_num_threads(int threads) {
  if (threads < 1) threads = 1;
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace trident::cpu

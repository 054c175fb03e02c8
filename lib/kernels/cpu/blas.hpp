#pragma once
// Row-major GEMM for float (sgemm) and double (dgemm), so every kernel can be instantiated in
// double for gradient checks. C[M,N] = alpha * op(A) op(B) + beta * C. float runs on oneDNN
// (or OpenBLAS, TRIDENT_SGEMM=openblas), double on OpenBLAS (docs/gemm.md).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/cpu/cpu_features.hpp"

namespace trident::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Threads among which the float GEMM splits C's columns, each running a single-threaded
// GEMM on its block (1: not split; oneDNN's own threading runs): for op(A) = A, op(B) = B^T
// (a linear layer's forward) on oneDNN, outside a parallel region, blocks of at least 128
// columns. Why: blas.cpp.
int sgemm_column_split_threads(bool trans_a, bool trans_b, int64_t N);

// The library of the float GEMM, from the environment variable TRIDENT_SGEMM: "onednn" (also
// when unset or empty) or "openblas". Read once per process; any other value ends the process
// with one error line (settle_gemm_kernel reads it first, before MPI_Init).
enum class SgemmLibrary { onednn, openblas };
inline constexpr const char* kSgemmVariable = "TRIDENT_SGEMM";
std::optional<SgemmLibrary> parse_sgemm_library(std::string_view value);
SgemmLibrary sgemm_library();

// The library that runs one float product op(A) op(B), given the process's choice: the choice
// itself, except that under oneDNN a product A^T B (a weight gradient) runs on OpenBLAS when
// oneDNN's widest JIT ISA is AVX2 (`onednn_avx2_widest`). oneDNN 2.6's AVX2 sgemm runs some of
// those products at half its rate (1024x256x1024 A^T B at 43-54 GFLOP/s against 95-110 for the
// others and OpenBLAS's), measured in docs/gemm.md ("Aᵀ·B on AVX2 cores"). A pure function.
SgemmLibrary sgemm_library_for_product(SgemmLibrary library, bool onednn_avx2_widest,
                                       bool trans_a, bool trans_b);
// "oneDNN 2.6.3", and oneDNN's widest JIT ISA in this process in its own spelling
// ("avx512_core_bf16", "avx512_core_amx", "avx2", ...; "?" for one this code does not know).
std::string onednn_version();
std::string onednn_isa_name();

// True when oneDNN's widest JIT ISA in this process is AVX2 (avx2 or avx2_vnni: no AVX-512),
// e.g. AMD Zen 3 or ONEDNN_MAX_CPU_ISA=AVX2. Asked once per process.
bool onednn_avx2_widest();

// Threads used by OpenBLAS, oneDNN and our OpenMP loops in this process.
void set_num_threads(int threads);
int num_threads();

// ---- Which GEMM runs, chosen before OpenBLAS's first call (docs/gemm.md).

// What start-up does about the OpenBLAS kernel, given the core, the environment and the kernel
// OpenBLAS picked alone. A pure function (tested for every kind of machine).
//   user_coretype  OPENBLAS_CORETYPE as found ("" unset)
//   marker         TRIDENT_GEMM_KERNEL as found ("" unset): set by Trident before it re-runs
//                  itself, "forced:KERNEL:DETECTED" or "rejected:KERNEL:DETECTED", or when
//                  that failed "unforced:KERNEL:REASON"
struct GemmKernelPlan {
  enum class Action {
    keep,           // the loaded kernel stays
    force_reexec,   // set OPENBLAS_CORETYPE=coretype and run this program again
    verify_forced,  // this run has Trident's kernel: check its results, else undo it
  } action = Action::keep;
  std::string coretype;  // force_reexec / verify_forced: the kernel
  std::string source;    // why this kernel, for the start-up line
};
GemmKernelPlan plan_gemm_kernel(const CpuFeatures& f, std::string_view user_coretype,
                                std::string_view marker, std::string_view detected);

// First thing in main, before MPI_Init and before any other thread: checks TRIDENT_SGEMM and
// carries out plan_gemm_kernel (OpenBLAS's kernel serves dgemm, sgemm under
// TRIDENT_SGEMM=openblas, and A^T B on AVX2-only cores). OpenBLAS reads OPENBLAS_CORETYPE once,
// when it is loaded (before main), so forcing a kernel means running the program again (execv of
// /proc/self/exe, same pid, arguments, open files and environment plus the two variables): at
// most twice, the second time only when the forced kernel computed a wrong result on this core.
void settle_gemm_kernel(char** argv);

// True when sgemm and dgemm match a plain reference on a few odd shapes (all transpositions).
bool gemm_results_correct();

// "sgemm oneDNN 2.6.3 (avx512_core_bf16), dgemm OpenBLAS 0.3.21 (DYNAMIC_ARCH ...), kernel
// SkylakeX (chosen by Trident ...), core AVX-512 (AuthenticAMD family 26 model 2)": what GEMM
// runs on, for the start-up line.
std::string gemm_description();

// A ~15 ms measurement on one thread: sgemm 512^3 and the core's FMA throughput at its widest
// usable vector (both best of a few runs, so that contention lowers both alike).
struct GemmSpeedProbe {
  double gemm_gflops = 0.0;
  double fma_gflops = 0.0;  // 0: no FMA vectors usable, nothing to compare with
  int vector_bits = 0;
};
GemmSpeedProbe probe_gemm_speed();
// The warning line when the probe's GEMM reaches under `min_fraction` of the FMA throughput,
// "" otherwise.
std::string gemm_speed_warning(const GemmSpeedProbe& p, double min_fraction = 0.5);

}  // namespace trident::cpu

// Row-major GEMM. float: oneDNN's dnnl_sgemm (its JIT kernels for the core's widest ISA; A^T B
// on OpenBLAS where that ISA is AVX2: sgemm_library_for_product), or OpenBLAS with
// TRIDENT_SGEMM=openblas; double (the gradient checks only): OpenBLAS, since
// oneDNN has no dgemm. Why oneDNN for float: docs/gemm.md (measured on Intel and AMD cores).
// Both are OpenMP builds over the same libgomp: called outside a parallel region they use the
// thread count set by set_num_threads; called inside one (the attention kernels call GEMM per
// (batch, head, block) task) they run single-threaded (both check omp_in_parallel(); checked
// with a 1024x1024x64 sgemm inside a 2-thread region: the 1-thread rate, outside it twice
// that, for OpenBLAS 0.3.21 and oneDNN 2.6).
#include "kernels/cpu/blas.hpp"

#include "kernels/cpu/vecmath.hpp"
#include "util/test_hooks.hpp"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <type_traits>
#include <vector>

namespace trident::cpu {

std::optional<SgemmLibrary> parse_sgemm_library(std::string_view value) {
  if (value.empty() || value == "onednn") return SgemmLibrary::onednn;
  if (value == "openblas") return SgemmLibrary::openblas;
  return std::nullopt;
}

SgemmLibrary sgemm_library() {
  // Read once: the choice holds for the whole process (it is the process's libraries').
  static const SgemmLibrary library = [] {
    const char* v = std::getenv(kSgemmVariable);
    const std::optional<SgemmLibrary> parsed = parse_sgemm_library(v != nullptr ? v : "");
    if (!parsed) {
      // Before MPI_Init (settle_gemm_kernel asks first): one line, from the first rank only.
      const char* rank = std::getenv("PMI_RANK");
      if (rank == nullptr || std::string_view(rank) == "0")
        std::fprintf(stderr, "trident: error: %s=%s: must be onednn (the default) or openblas\n",
                     kSgemmVariable, v);
      std::exit(2);
    }
    return *parsed;
  }();
  return library;
}

SgemmLibrary sgemm_library_for_product(SgemmLibrary library, bool onednn_avx2_widest,
                                       bool trans_a, bool trans_b) {
  if (library == SgemmLibrary::onednn && onednn_avx2_widest && trans_a && !trans_b)
    return SgemmLibrary::openblas;
  return library;
}

bool onednn_avx2_widest() {
  static const bool avx2 = [] {
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return isa == dnnl_cpu_isa_avx2 || isa == dnnl_cpu_isa_avx2_vnni;
  }();
  return avx2;
}

namespace {

// Shapes and leading dimensions are the callers' own (valid by construction), so the only
// failure left is an allocation inside oneDNN: a hard error, not a silent zero.
void onednn_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  if (dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta,
                 C, ldc) != dnnl_success) {
    std::fprintf(stderr, "trident: error: dnnl_sgemm failed on %lldx%lldx%lld\n",
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K));
    std::abort();
  }
}

// C = op(A) B^T with op(A) = A (a linear layer's forward, x W^T, and the LM head's) runs split
// by columns of C: each thread a single-threaded oneDNN GEMM on its rows of B (its block of
// output features). Measured on AMD Zen 4 with 2 threads (bench_sgemm: oneDNN threading the
// whole product, against each thread its half with --in-parallel), GFLOP/s: the LM head's
// chunk 160x50304x256 161-172 -> 190, GPT-2's 160x50304x768 163 -> 192, Llama 3's head
// 64x128256x256 117 -> 160, the layers' 1024x768x768 186 -> 198 and 1024x3072x768 195 -> 205.
// The backward's products (A^T B, A B) gained nothing that way (TN lost 10 %) and keep
// oneDNN's own threading. Each block is at least kMinSplitColumns wide, its edges on 64-byte
// lines of C; the static split keeps results the same from call to call at one thread count.
constexpr int64_t kMinSplitColumns = 128;
constexpr int64_t kSplitAlign = 16;  // floats in 64 bytes

void onednn_sgemm_by_columns(int threads, int64_t M, int64_t N, int64_t K, float alpha,
                             const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                             float* C, int64_t ldc) {
  const int64_t lines = (N + kSplitAlign - 1) / kSplitAlign;
#pragma omp parallel num_threads(threads)
  {
    // Inside the region oneDNN runs single-threaded (it checks omp_in_parallel()).
    const detail::Range r = detail::split_range(lines, omp_get_num_threads(), omp_get_thread_num());
    const int64_t n0 = r.begin * kSplitAlign, n1 = std::min(N, r.end * kSplitAlign);
    if (n1 > n0)
      onednn_sgemm(false, true, M, n1 - n0, K, alpha, A, lda, B + n0 * ldb, ldb, beta, C + n0,
                   ldc);
  }
}

}  // namespace

int sgemm_column_split_threads(bool trans_a, bool trans_b, int64_t N) {
  if (sgemm_library() != SgemmLibrary::onednn || trans_a || !trans_b || omp_in_parallel())
    return 1;
  return static_cast<int>(std::clamp<int64_t>(N / kMinSplitColumns, 1, omp_get_max_threads()));
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_library_for_product(sgemm_library(), onednn_avx2_widest(), trans_a, trans_b) ==
        SgemmLibrary::onednn) {
      const int threads = sgemm_column_split_threads(trans_a, trans_b, N);
      if (threads > 1)
        onednn_sgemm_by_columns(threads, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      else
        onednn_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
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

// ---- Kernel choice

namespace {

constexpr const char* kMarkerVariable = "TRIDENT_GEMM_KERNEL";

// "forced:SkylakeX:Haswell" -> {"forced", "SkylakeX", "Haswell"}; the third field is what
// OpenBLAS picked alone (forced, rejected) or why running again failed (unforced).
struct Marker {
  std::string state, kernel, detail;
};
Marker parse_marker(std::string_view m) {
  Marker out;
  const size_t a = m.find(':');
  if (a == std::string_view::npos) return out;
  const size_t b = m.find(':', a + 1);
  out.state = std::string(m.substr(0, a));
  out.kernel = std::string(m.substr(a + 1, b == std::string_view::npos ? m.npos : b - a - 1));
  if (b != std::string_view::npos) out.detail = std::string(m.substr(b + 1));
  return out;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Replaces this process by the same program with the same arguments; returns only on failure.
// It runs the file /proc/self/exe links to, not the link: the kernel names a process after the
// file it executes, and "exe" would hide the ranks from ps, pkill and the job tools that look
// for "trident" (tests/tools/test_chaos.py finds the ranks it kills by that name).
void reexec(char** argv) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::error_code ec;  // as train/backend.cpp finds the executable
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  execv(ec ? "/proc/self/exe" : exe.c_str(), argv);
}

}  // namespace

GemmKernelPlan plan_gemm_kernel(const CpuFeatures& f, std::string_view user_coretype,
                                std::string_view marker, std::string_view detected) {
  using Action = GemmKernelPlan::Action;
  const Marker m = parse_marker(marker);
  // Trident's own earlier run set both variables: this run checks the kernel it forced.
  if (m.state == "forced" && !m.kernel.empty() && user_coretype == m.kernel)
    return {Action::verify_forced, m.kernel,
            "chosen by Trident for this " + isa_name(f) + " core; OpenBLAS alone picks " +
                (m.detail.empty() ? "another" : m.detail)};
  if (!user_coretype.empty())
    return {Action::keep, "", "OPENBLAS_CORETYPE=" + std::string(user_coretype) + " as set"};
  if (m.state == "rejected")
    return {Action::keep, "",
            "OpenBLAS's own choice: " + m.kernel + " computed wrong results on this core"};
  if (m.state == "unforced")
    return {Action::keep, "",
            "OpenBLAS's own choice: running again with OPENBLAS_CORETYPE=" + m.kernel +
                " failed: " + m.detail};
  const std::string want = choose_openblas_coretype(f, detected);
  if (want.empty()) return {Action::keep, "", "OpenBLAS's own choice"};
  return {Action::force_reexec, want, ""};
}

void settle_gemm_kernel(char** argv) {
  using Action = GemmKernelPlan::Action;
  sgemm_library();  // a bad TRIDENT_SGEMM ends the run here, before anything else
  // Tests: TRIDENT_TEST_GEMM_CORENAME pretends OpenBLAS picked that kernel alone (to reach the
  // re-run on any machine); TRIDENT_TEST_GEMM_WRONG=1 pretends the forced kernel's results
  // were wrong.
  const std::string pretend = test_hook(TestHook::GemmCorename);
  const std::string detected = pretend.empty() ? openblas_get_corename() : pretend;
  const GemmKernelPlan plan = plan_gemm_kernel(
      read_cpu_features(), env_or_empty("OPENBLAS_CORETYPE"), env_or_empty(kMarkerVariable),
      detected);
  if (plan.action == Action::force_reexec) {
    const std::string marker = "forced:" + plan.coretype + ":" + detected;
    setenv("OPENBLAS_CORETYPE", plan.coretype.c_str(), 1);
    setenv(kMarkerVariable, marker.c_str(), 1);
    reexec(argv);
    // Still here: the kernel stays OpenBLAS's own; the marker says why, for the start-up line.
    const std::string why = std::strerror(errno);
    unsetenv("OPENBLAS_CORETYPE");
    setenv(kMarkerVariable, ("unforced:" + plan.coretype + ":" + why).c_str(), 1);
    return;
  }
  if (plan.action == Action::verify_forced &&
      (test_hook(TestHook::GemmWrong) == "1" || !gemm_results_correct())) {
    // A kernel that computes wrong results here is not kept: back to OpenBLAS's own choice.
    const std::string marker = "rejected:" + plan.coretype + ":" + detected;
    unsetenv("OPENBLAS_CORETYPE");
    setenv(kMarkerVariable, marker.c_str(), 1);
    reexec(argv);
    const std::string why = std::strerror(errno);
    std::fprintf(stderr, "trident: error: the GEMM kernel %s computes wrong results on this "
                         "core and running again without it failed: %s\n",
                 plan.coretype.c_str(), why.c_str());
    std::exit(1);
  }
}

namespace {

// max |C - reference| / max |reference| for one op(A) op(B) product of random matrices.
template <typename T>
double gemm_relative_error(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  std::mt19937 rng(static_cast<unsigned>(M * 131 + N * 7 + K + ta * 2 + tb));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
  for (auto& x : a) x = static_cast<T>(u(rng));
  for (auto& x : b) x = static_cast<T>(u(rng));
  std::vector<T> c(static_cast<size_t>(M * N), T(1));
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  gemm<T>(ta, tb, M, N, K, T(1), a.data(), lda, b.data(), ldb, T(0), c.data(), N);
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0.0;
      for (int64_t k = 0; k < K; ++k)
        ref += static_cast<double>(ta ? a[k * lda + i] : a[i * lda + k]) *
               static_cast<double>(tb ? b[j * ldb + k] : b[k * ldb + j]);
      worst = std::max(worst, std::fabs(static_cast<double>(c[i * N + j]) - ref));
      scale = std::max(scale, std::fabs(ref));
    }
  return worst / std::max(scale, 1e-30);
}

}  // namespace

bool gemm_results_correct() {
  // Odd sizes reach the kernels' edge cases; 67 x 97 x 45 spans several register blocks.
  // About 2.5 M multiply-adds of reference in all: a few ms at start-up.
  const int64_t shapes[][3] = {{7, 5, 3}, {37, 53, 71}, {67, 97, 45}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      if (!(gemm_relative_error<float>(ta, tb, s[0], s[1], s[2]) < 1e-5)) return false;
      if (!(gemm_relative_error<double>(ta, tb, s[0], s[1], s[2]) < 1e-13)) return false;
    }
  return true;
}

namespace {

// "oneDNN 2.6.3 (JIT kernels up to avx512_core_bf16)": the version and the widest ISA oneDNN
// may use here (its fp32 GEMM kernels are AVX-512 or AVX2 ones; AMX serves bf16/int8 only).
std::string onednn_description() {
  return onednn_version() + " (JIT kernels up to " + onednn_isa_name() + ")";
}

}  // namespace

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

std::string onednn_isa_name() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "?";
  }
}

std::string gemm_description() {
  const CpuFeatures f = read_cpu_features();
  // How the kernel was chosen: settle_gemm_kernel left it in the environment.
  const GemmKernelPlan plan =
      plan_gemm_kernel(f, env_or_empty("OPENBLAS_CORETYPE"), env_or_empty(kMarkerVariable),
                       openblas_get_corename());
  const std::string source =
      plan.action == GemmKernelPlan::Action::force_reexec ? "OpenBLAS's own choice" : plan.source;
  std::string config = openblas_get_config();
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64": the kernel it names
  // is the one OpenBLAS picked alone; the one in use is openblas_get_corename().
  const std::string libraries =
      sgemm_library() == SgemmLibrary::onednn
          ? "sgemm " + onednn_description() +
                (onednn_avx2_widest() ? " with A^T B on OpenBLAS" : "") + ", dgemm " + config
          : "sgemm and dgemm " + config + " (" + kSgemmVariable + "=openblas as set)";
  return libraries + ", kernel " + openblas_get_corename() + " (" + source + "), core " +
         isa_name(f) + " (" + f.vendor + " family " + std::to_string(f.family) + " model " +
         std::to_string(f.model) + ")";
}

GemmSpeedProbe probe_gemm_speed() {
  GemmSpeedProbe p;
  p.vector_bits = fma_vector_bits(read_cpu_features());
  if (p.vector_bits > 0) p.fma_gflops = fma_peak_gflops(p.vector_bits, 0.005);

  const int saved_threads = num_threads();
  set_num_threads(1);
  const int64_t n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  double best_s = 1e300;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best_s = std::min(best_s,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  set_num_threads(saved_threads);
  p.gemm_gflops = 2.0 * n * n * n / best_s * 1e-9;
  return p;
}

std::string gemm_speed_warning(const GemmSpeedProbe& p, double min_fraction) {
  if (p.fma_gflops <= 0.0 || p.gemm_gflops >= min_fraction * p.fma_gflops) return "";
  char line[512];
  std::snprintf(line, sizeof line,
                "trident: warning: sgemm runs at %.0f GFLOP/s on one thread, %.2f of the %.0f "
                "GFLOP/s that this core's %d-bit FMAs reach: the GEMM library does not use the "
                "core's vector width (see the gemm line above; docs/gemm.md)",
                p.gemm_gflops, p.gemm_gflops / p.fma_gflops, p.fma_gflops, p.vector_bits);
  return line;
}

}  // namespace trident::cpu

// The GEMM kernel choice (kernels/cpu/cpu_features.hpp, kernels/cpu/blas.hpp) as pure
// functions of CPU flags and environment, for every kind of machine the project runs on, plus
// the checks that run on this machine's core.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/cpu_features.hpp"

namespace trident::cpu {
namespace {

CpuFeatures avx2_core(const char* vendor, int family) {
  CpuFeatures f;
  f.vendor = vendor;
  f.family = family;
  f.fma = f.avx = f.avx2 = f.os_ymm = true;
  return f;
}

CpuFeatures avx512_core(const char* vendor, int family) {
  CpuFeatures f = avx2_core(vendor, family);
  f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = f.os_zmm = true;
  return f;
}

TEST(GemmChoice, IntelAvx512LeftOnPrescottGetsSkylakeX) {
  // OpenBLAS 0.3.21 on a Xeon newer than it knows: the generic Prescott kernel.
  EXPECT_EQ(choose_openblas_coretype(avx512_core("GenuineIntel", 6), "Prescott"), "SkylakeX");
  EXPECT_EQ(choose_openblas_coretype(avx512_core("GenuineIntel", 6), "Haswell"), "SkylakeX");
}

TEST(GemmChoice, Zen4And5LeftOnHaswellGetSkylakeX) {
  EXPECT_EQ(choose_openblas_coretype(avx512_core("AuthenticAMD", 25), "Haswell"), "SkylakeX");
  EXPECT_EQ(choose_openblas_coretype(avx512_core("AuthenticAMD", 26), "Zen"), "SkylakeX");
}

TEST(GemmChoice, Avx512KernelAlreadyPickedIsKept) {
  for (const char* k : {"SkylakeX", "skylakex", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(choose_openblas_coretype(avx512_core("AuthenticAMD", 26), k), "") << k;
}

TEST(GemmChoice, Zen3Avx2KeepsZenOrHaswellAndLeavesPrescott) {
  const CpuFeatures zen3 = avx2_core("AuthenticAMD", 25);
  EXPECT_EQ(choose_openblas_coretype(zen3, "Zen"), "");
  EXPECT_EQ(choose_openblas_coretype(zen3, "Haswell"), "");
  EXPECT_EQ(choose_openblas_coretype(zen3, "Prescott"), "Haswell");
  EXPECT_EQ(choose_openblas_coretype(zen3, "Sandybridge"), "Haswell");
}

TEST(GemmChoice, Avx512WithoutOsZmmStateIsAvx2) {
  // CPUID lists AVX-512 but the OS does not save zmm registers (XCR0): the instructions would
  // fault, so the core counts as AVX2.
  CpuFeatures f = avx512_core("GenuineIntel", 6);
  f.os_zmm = false;
  EXPECT_FALSE(avx512_usable(f));
  EXPECT_EQ(fma_vector_bits(f), 256);
  EXPECT_EQ(choose_openblas_coretype(f, "Prescott"), "Haswell");
  EXPECT_EQ(choose_openblas_coretype(f, "Haswell"), "");
}

TEST(GemmChoice, EachAvx512SubsetFlagIsNeeded) {
  bool CpuFeatures::*flags[] = {&CpuFeatures::avx512f, &CpuFeatures::avx512bw,
                                &CpuFeatures::avx512dq, &CpuFeatures::avx512vl};
  for (auto flag : flags) {
    CpuFeatures f = avx512_core("GenuineIntel", 6);
    f.*flag = false;
    EXPECT_FALSE(avx512_usable(f));
    EXPECT_EQ(choose_openblas_coretype(f, "Prescott"), "Haswell");
  }
}

TEST(GemmChoice, NoAvx2OrNoOsYmmStateForcesNothing) {
  CpuFeatures old;
  old.vendor = "GenuineIntel";
  old.avx = true;
  EXPECT_EQ(fma_vector_bits(old), 0);
  EXPECT_EQ(choose_openblas_coretype(old, "Sandybridge"), "");
  CpuFeatures no_os = avx512_core("GenuineIntel", 6);
  no_os.os_ymm = no_os.os_zmm = false;
  EXPECT_EQ(choose_openblas_coretype(no_os, "Prescott"), "");
  EXPECT_EQ(isa_name(no_os), "no AVX2/FMA");
}

using Action = GemmKernelPlan::Action;

TEST(GemmKernelPlan, ForcesAndRerunsWhenOpenBlasPickedANarrowerKernel) {
  const auto p = plan_gemm_kernel(avx512_core("GenuineIntel", 6), "", "", "Prescott");
  EXPECT_EQ(p.action, Action::force_reexec);
  EXPECT_EQ(p.coretype, "SkylakeX");
}

TEST(GemmKernelPlan, UsersOwnCoretypeIsRespected) {
  const auto p = plan_gemm_kernel(avx512_core("GenuineIntel", 6), "Haswell", "", "Haswell");
  EXPECT_EQ(p.action, Action::keep);
  EXPECT_NE(p.source.find("OPENBLAS_CORETYPE=Haswell"), std::string::npos) << p.source;
  // A marker left by Trident for another kernel does not make the user's value Trident's.
  const auto q = plan_gemm_kernel(avx512_core("GenuineIntel", 6), "Haswell",
                                  "forced:SkylakeX:Prescott", "Haswell");
  EXPECT_EQ(q.action, Action::keep);
}

TEST(GemmKernelPlan, TheRerunVerifiesTheForcedKernel) {
  const auto p = plan_gemm_kernel(avx512_core("AuthenticAMD", 26), "SkylakeX",
                                  "forced:SkylakeX:Haswell", "SkylakeX");
  EXPECT_EQ(p.action, Action::verify_forced);
  EXPECT_EQ(p.coretype, "SkylakeX");
  EXPECT_NE(p.source.find("OpenBLAS alone picks Haswell"), std::string::npos) << p.source;
}

TEST(GemmKernelPlan, ARejectedKernelIsNotForcedAgain) {
  const auto p = plan_gemm_kernel(avx512_core("GenuineIntel", 6), "",
                                  "rejected:SkylakeX:Prescott", "Prescott");
  EXPECT_EQ(p.action, Action::keep);
  EXPECT_NE(p.source.find("SkylakeX computed wrong results"), std::string::npos) << p.source;
}

TEST(GemmKernelPlan, AFailedRerunIsReportedAndNotRetried) {
  const auto p = plan_gemm_kernel(avx512_core("GenuineIntel", 6), "",
                                  "unforced:SkylakeX:Permission denied", "Prescott");
  EXPECT_EQ(p.action, Action::keep);
  EXPECT_NE(p.source.find("OPENBLAS_CORETYPE=SkylakeX failed: Permission denied"),
            std::string::npos)
      << p.source;
}

TEST(GemmKernelPlan, KeepsAFittingKernel) {
  const auto p = plan_gemm_kernel(avx2_core("AuthenticAMD", 25), "", "", "Zen");
  EXPECT_EQ(p.action, Action::keep);
  EXPECT_EQ(p.source, "OpenBLAS's own choice");
}

TEST(GemmSpeedWarning, WarnsOnlyFarBelowTheFmaThroughput) {
  GemmSpeedProbe slow{30.0, 260.0, 512};
  const std::string w = gemm_speed_warning(slow);
  EXPECT_NE(w.find("trident: warning: sgemm runs at 30 GFLOP/s"), std::string::npos) << w;
  EXPECT_NE(w.find("0.12 of the 260 GFLOP/s"), std::string::npos) << w;
  EXPECT_EQ(gemm_speed_warning({230.0, 260.0, 512}), "");
  EXPECT_EQ(gemm_speed_warning({1.0, 0.0, 0}), "");  // nothing to compare with
}

// ---- On this machine's core.

TEST(SgemmLibrary, OneDnnByDefaultOpenBlasWhenAskedNothingElse) {
  EXPECT_EQ(parse_sgemm_library(""), SgemmLibrary::onednn);
  EXPECT_EQ(parse_sgemm_library("onednn"), SgemmLibrary::onednn);
  EXPECT_EQ(parse_sgemm_library("openblas"), SgemmLibrary::openblas);
  for (const char* bad : {"mkl", "OpenBLAS", "oneDNN", "dnnl", " onednn"})
    EXPECT_FALSE(parse_sgemm_library(bad).has_value()) << bad;
}

// Under oneDNN, A^T B runs on OpenBLAS where oneDNN's widest ISA is AVX2; nothing else moves.
TEST(SgemmLibrary, ATransposedBRunsOnOpenBlasWhereOneDnnIsAvx2Only) {
  const SgemmLibrary onednn = SgemmLibrary::onednn, openblas = SgemmLibrary::openblas;
  int checked = 0;
  for (const bool avx2 : {false, true})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        const bool moved = avx2 && ta && !tb;
        EXPECT_EQ(sgemm_library_for_product(onednn, avx2, ta, tb), moved ? openblas : onednn)
            << "avx2 " << avx2 << " trans_a " << ta << " trans_b " << tb;
        EXPECT_EQ(sgemm_library_for_product(openblas, avx2, ta, tb), openblas);
        checked += 2;
      }
  EXPECT_EQ(checked, 16);
}

// sgemm of this process's library (oneDNN unless TRIDENT_SGEMM=openblas) and OpenBLAS's dgemm.
TEST(GemmThisCore, LinkedGemmMatchesTheReference) { EXPECT_TRUE(gemm_results_correct()); }

// A linear layer's forward (x W^T) on two threads: split by columns of C, each thread its block
// (blas.cpp). Views (leading dimensions past the sizes), alpha and beta, an N that is not a
// multiple of the 16-float lines; the columns past N are not touched, two calls agree to the
// bit, and the result matches a double reference.
TEST(GemmThisCore, ColumnSplitOfTheForwardProductMatchesTheReference) {
  const int saved = num_threads();
  set_num_threads(2);
  const int64_t M = 7, N = 1001, K = 33, lda = 40, ldb = 35, ldc = 1010;
  EXPECT_EQ(sgemm_column_split_threads(true, false, N), 1);  // backward products: not split
  EXPECT_EQ(sgemm_column_split_threads(false, false, N), 1);
  EXPECT_EQ(sgemm_column_split_threads(false, true, 255), 1);  // too few columns for two
  const int split = sgemm_column_split_threads(false, true, N);
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    EXPECT_EQ(sgemm_column_split_threads(false, true, N), 1);  // inside a region: never
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(M * lda), b(N * ldb), c0(M * ldc);
  for (auto* v : {&a, &b, &c0})
    for (float& x : *v) x = u(rng);
  std::vector<float> c1 = c0, c2 = c0;
  gemm<float>(false, true, M, N, K, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c1.data(), ldc);
  gemm<float>(false, true, M, N, K, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c2.data(), ldc);
  set_num_threads(saved);
  if (sgemm_library() == SgemmLibrary::onednn) EXPECT_EQ(split, 2);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0);
  int64_t compared = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= N) {
        EXPECT_EQ(c1[at], c0[at]) << "column " << j << " past N was written";
        continue;
      }
      double ref = c0[at];
      for (int64_t k = 0; k < K; ++k)
        ref += 0.5 * static_cast<double>(a[i * lda + k]) * static_cast<double>(b[j * ldb + k]);
      worst = std::max(worst, std::fabs(c1[at] - ref));
      ++compared;
    }
  EXPECT_EQ(compared, M * N);
  EXPECT_LT(worst, 1e-5 * K);
}

TEST(GemmThisCore, FeaturesAgreeWithTheCompiler) {
  const CpuFeatures f = read_cpu_features();
#if defined(__x86_64__)
  EXPECT_FALSE(f.vendor.empty());
#if defined(__AVX2__) && defined(__FMA__)
  // Built with -march=native: the compiler saw AVX2 + FMA on this core.
  EXPECT_TRUE(avx2_usable(f));
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
  EXPECT_TRUE(avx512_usable(f));
#endif
#else
  GTEST_SKIP() << "not an x86-64 build";
#endif
}

TEST(GemmThisCore, FmaThroughputIsMeasuredAtTheUsableWidths) {
  const CpuFeatures f = read_cpu_features();
  if (!avx2_usable(f)) GTEST_SKIP() << "no AVX2/FMA on this core";
  EXPECT_GT(fma_peak_gflops(256, 0.01), 1.0);
  if (avx512_usable(f)) EXPECT_GT(fma_peak_gflops(512, 0.01), 1.0);
  else EXPECT_EQ(fma_peak_gflops(512, 0.01), 0.0);
}

}  // namespace
}  // namespace trident::cpu

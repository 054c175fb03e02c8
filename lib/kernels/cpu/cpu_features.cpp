#include "kernels/cpu/cpu_features.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define TRIDENT_X86 1
#endif

namespace trident::cpu {

namespace {

#ifdef TRIDENT_X86
// XCR0 read with the raw instruction: the xgetbv intrinsic needs -mxsave on the whole file.
unsigned long long read_xcr0() {
  unsigned int lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
#endif

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  for (auto n : names)
    if (equals_ignoring_case(name, n)) return true;
  return false;
}

}  // namespace

CpuFeatures read_cpu_features() {
  CpuFeatures f;
#ifdef TRIDENT_X86
  unsigned int a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned int max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;

  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf)
                ? base_model + static_cast<int>(((a >> 16) & 0xf) << 4)
                : base_model;
  f.fma = (c >> 12) & 1;
  f.avx = (c >> 28) & 1;
  const bool osxsave = (c >> 27) & 1;
  if (osxsave) {
    const unsigned long long xcr0 = read_xcr0();
    f.os_ymm = (xcr0 & 0x6) == 0x6;
    f.os_zmm = f.os_ymm && (xcr0 & 0xe0) == 0xe0;
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = (a >> 5) & 1;
  }
#endif
  return f;
}

bool avx2_usable(const CpuFeatures& f) { return f.avx && f.avx2 && f.fma && f.os_ymm; }

bool avx512_usable(const CpuFeatures& f) {
  return avx2_usable(f) && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.os_zmm;
}

int fma_vector_bits(const CpuFeatures& f) {
  return avx512_usable(f) ? 512 : avx2_usable(f) ? 256 : 0;
}

std::string isa_name(const CpuFeatures& f) {
  return avx512_usable(f) ? "AVX-512" : avx2_usable(f) ? "AVX2" : "no AVX2/FMA";
}

std::string choose_openblas_coretype(const CpuFeatures& f, std::string_view detected) {
  // OpenBLAS kernels (0.3.21 names) with AVX-512 GEMM, and those with at least AVX2 GEMM.
  if (avx512_usable(f))
    return is_one_of(detected, {"SkylakeX", "Cooperlake", "SapphireRapids"}) ? "" : "SkylakeX";
  if (avx2_usable(f))
    return is_one_of(detected, {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})
               ? ""
               : "Haswell";
  return "";
}

#ifdef TRIDENT_X86
namespace {

// 12 independent accumulators: more than latency (4) x FMA ports (2) in flight on every
// current x86 core, so the loop runs at FMA throughput. acc = acc * a + b stays bounded.
// One function per width, each compiled for its ISA (the intrinsics must inline).
constexpr int kAccumulators = 12;

// Seconds on the wall clock, or of this thread's CPU time (time slices spent elsewhere on a
// shared core do not count).
double now_s(bool cpu_time) {
  if (cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double gflops_of(long iters, int lanes, double seconds) {
  return 2.0 * kAccumulators * lanes * static_cast<double>(iters) / seconds * 1e-9;
}

__attribute__((target("avx512f"))) double fma512_gflops(long iters, bool cpu_time) {
  __m512 acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_set1_ps(1.0f + 0.001f * j);
  const __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  const double t0 = now_s(cpu_time);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  const double g = gflops_of(iters, 16, now_s(cpu_time) - t0);
  float sink = 0.0f;
  for (int j = 0; j < kAccumulators; ++j) sink += _mm512_cvtss_f32(acc[j]);
  volatile float keep = sink;
  (void)keep;
  return g;
}

__attribute__((target("avx2,fma"))) double fma256_gflops(long iters, bool cpu_time) {
  __m256 acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm256_set1_ps(1.0f + 0.001f * j);
  const __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  const double t0 = now_s(cpu_time);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  const double g = gflops_of(iters, 8, now_s(cpu_time) - t0);
  float sink = 0.0f;
  for (int j = 0; j < kAccumulators; ++j) sink += _mm256_cvtss_f32(acc[j]);
  volatile float keep = sink;
  (void)keep;
  return g;
}

// vdpbf16ps: per fp32 lane acc += a0 b0 + a1 b1. The inputs are 1 and 2^-24 (bf16 bits
// 0x3f80, 0x3380): the accumulators grow by 2^-23 a step, far from overflow and denormals.
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot512_gflops(long iters,
                                                                       bool cpu_time) {
  __m512 acc[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_set1_ps(0.001f * j);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380);
  const double t0 = now_s(cpu_time);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kAccumulators; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  }
  const double g = gflops_of(iters, 32, now_s(cpu_time) - t0);  // 16 lanes x 2 products
  float sink = 0.0f;
  for (int j = 0; j < kAccumulators; ++j) sink += _mm512_cvtss_f32(acc[j]);
  volatile float keep = sink;
  (void)keep;
  return g;
}

// Best of five runs of about `seconds` / 5 each, sized from a short first run of `run`.
template <typename Run>
double best_rate(Run run, double flop_per_iter, double seconds) {
  double best = run(2000);
  const double per_iter_s = flop_per_iter / (best * 1e9);
  const long iters = std::max(1000L, static_cast<long>(seconds / 5 / per_iter_s));
  for (int r = 0; r < 5; ++r) best = std::max(best, run(iters));
  return best;
}

}  // namespace
#endif

double bf16_dot_peak_gflops(double seconds, bool cpu_time) {
#ifdef TRIDENT_X86
  const CpuFeatures f = read_cpu_features();
  if (!avx512_usable(f) || !f.avx512bf16) return 0.0;
  return best_rate([&](long iters) { return bf16_dot512_gflops(iters, cpu_time); },
                   2.0 * kAccumulators * 32, seconds);
#else
  (void)seconds;
  (void)cpu_time;
  return 0.0;
#endif
}

double fma_peak_gflops(int vector_bits, double seconds, bool cpu_time) {
#ifdef TRIDENT_X86
  const CpuFeatures f = read_cpu_features();
  if (vector_bits == 512 && !avx512_usable(f)) return 0.0;
  if (vector_bits == 256 && !avx2_usable(f)) return 0.0;
  if (vector_bits != 512 && vector_bits != 256) return 0.0;
  auto run = [&](long iters) {
    return vector_bits == 512 ? fma512_gflops(iters, cpu_time) : fma256_gflops(iters, cpu_time);
  };
  // Size a run to a fifth of the budget from a short first one, then keep the best of five:
  // on a shared core, contention only ever lowers a run.
  return best_rate(run, 2.0 * kAccumulators * (vector_bits / 32), seconds);
#else
  (void)vector_bits;
  (void)seconds;
  (void)cpu_time;
  return 0.0;
#endif
}

}  // namespace trident::cpu

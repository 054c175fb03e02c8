#pragma once
// What the x86 core offers for GEMM (CPUID + XGETBV), and the OpenBLAS kernel Trident asks for
// on it. The choice is a pure function of the flags so that it is tested for every kind of
// machine the project runs on (Intel AVX-512, AMD Zen 3 AVX2, AMD Zen 4/5 AVX-512) on any one.
#include <string>
#include <string_view>

namespace trident::cpu {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  int family = 0;      // display family (base + extended), e.g. 6 Intel, 25 Zen 3/4, 26 Zen 5
  int model = 0;       // display model (base + extended << 4)
  bool fma = false, avx = false, avx2 = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  // bf16 dot products: AVX512-BF16 (vdpbf16ps) and AMX's bf16 tiles (CPUID only: whether the
  // OS grants the tile state is oneDNN's to ask, bf16_gemm.hpp).
  bool avx512bf16 = false, amx_bf16 = false;
  // XCR0 via XGETBV: the OS saves and restores the ymm (bits 1, 2) and zmm/opmask state
  // (bits 5, 6, 7). Without it the instructions fault even when CPUID lists them.
  bool os_ymm = false, os_zmm = false;
};

// The executing core's flags.
CpuFeatures read_cpu_features();

// AVX2 + FMA with the OS saving ymm state.
bool avx2_usable(const CpuFeatures& f);
// AVX-512 F/BW/DQ/VL (what OpenBLAS's SkylakeX kernels use) with the OS saving zmm state.
bool avx512_usable(const CpuFeatures& f);
// Widest usable FMA vector in bits: 512, 256 or 0 (no FMA vectors usable).
int fma_vector_bits(const CpuFeatures& f);
// "AVX-512", "AVX2" or "no AVX2/FMA".
std::string isa_name(const CpuFeatures& f);

// The OpenBLAS kernel (an OPENBLAS_CORETYPE value) that Trident forces on this core, or ""
// to keep OpenBLAS's own choice `detected` (openblas_get_corename(), any case). OpenBLAS 0.3.21
// leaves AVX-512 unused on cores newer than it knows (Zen 4/5 -> Haswell; recent Xeons ->
// Prescott, no AVX at all): an AVX-512 core gets SkylakeX, an AVX2 core Haswell, each only
// when the detected kernel is narrower. bench/README.md has the measurements behind this.
std::string choose_openblas_coretype(const CpuFeatures& f, std::string_view detected);

// FLOP/s of independent fp32 FMAs at `vector_bits` (512 or 256) on this thread, best of a few
// short runs of about `seconds` in all: what the core's vector units reach, clock included.
// 0 when that width is not usable here. cpu_time: timed by this thread's CPU time, not the
// wall clock (for benchmarks on cores shared with other jobs).
double fma_peak_gflops(int vector_bits, double seconds, bool cpu_time = false);

// The same for AVX512-BF16's dot product vdpbf16ps on zmm registers (4 FLOP per fp32 lane:
// two bf16 products added to the accumulator): what a bf16 GEMM without AMX can reach.
// 0 without AVX512-BF16.
double bf16_dot_peak_gflops(double seconds, bool cpu_time = false);

}  // namespace trident::cpu

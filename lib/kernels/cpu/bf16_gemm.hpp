#pragma once
// Row-major GEMM with bf16 inputs and fp32 accumulation on the CPU, through oneDNN's matmul
// primitive: C[M,N] = alpha * op(A) op(B) + beta * C, op(A) M x K, op(B) K x N, C fp32.
// oneDNN runs it with AMX tiles on cores that have them and AVX512-BF16 dot products
// (vdpbf16ps) on the others; a core with neither is refused, never emulated in fp32 behind
// the caller's back (docs/gemm.md, "bf16 on the CPU").
//
// The trainer's linear layers call it as cpu::gemm is called (kernels/cpu/linear.cpp):
//   forward  y = x W^T      NT  (M tokens, N out features, K in features), beta 0 or 1 (bias)
//   dX       dX = dY W      NN  overwrite (beta 0)
//   dW       dW += dY^T X   TN  accumulate (beta 1)
#include <bit>
#include <cstdint>
#include <string>

#include "util/bf16.hpp"

namespace trident::cpu {

namespace detail {
// The bits of trident::float_to_bf16 (util/bf16.hpp) written without a branch so that the loops
// vectorize: round to nearest even by adding 0x7fff plus the lowest kept bit, and NaN kept NaN
// by setting the quiet bit instead. Not vcvtneps2bf16: it flushes denormal inputs to zero (on
// a Xeon 0x00010000, the bf16 value 0x0001, gives 0x0000), which the GPU's __float2bfloat16_rn
// does not.
inline uint32_t rounded_bf16_bits(uint32_t u) {
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}
// The same on a float: its bf16 bits (their value: util/bf16.hpp's bf16_to_float).
inline uint16_t bf16_bits(float x) {
  return static_cast<uint16_t>(rounded_bf16_bits(std::bit_cast<uint32_t>(x)));
}
// x rounded to bf16, as a float (what the CPU's bf16 kernels store).
inline float rounded_to_bf16(float x) { return bf16_to_float(bf16_bits(x)); }
// x[i] rounded to bf16 in place and bits[i] its bits, for i < n, on the calling thread.
inline void round_to_bf16_values_and_bits(float* x, int64_t n, uint16_t* bits) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    bits[i] = bf16_bits(x[i]);
    x[i] = bf16_to_float(bits[i]);
  }
}
}  // namespace detail

// True when oneDNN's bf16 matmul runs on native bf16 instructions here: AVX512-BF16 or AMX
// (oneDNN's effective ISA, so ONEDNN_MAX_CPU_ISA=AVX512_CORE makes it false on any core).
bool bf16_gemm_available();

// True when that is AMX (oneDNN's effective ISA avx512_core_amx).
bool bf16_gemm_has_amx();

// How fast this core multiplies bf16 against fp32: the AVX512-BF16 dot product's peak
// (vdpbf16ps, 4 FLOP an fp32 lane) and the fp32 FMA's (512-bit), each the best of short runs on
// this thread's CPU time (cpu_features.hpp), in GFLOP/s; 0 and 0 without AVX512-BF16.
struct Bf16DotRate {
  double dot_gflops = 0.0, fma_gflops = 0.0;
  double ratio() const { return fma_gflops > 0.0 ? dot_gflops / fma_gflops : 0.0; }
};
// Measured once per process (about 60 ms, on the first call) and kept: a property of the core.
const Bf16DotRate& bf16_dot_rate();

// The dot product's lead over the FMAs from which oneDNN's bf16 matmul outruns the fp32 GEMM
// on bf16 values. Measured: 0.5x on an AVX512-BF16 Xeon without AMX (family 6 model 207; the
// bf16 matmul at half the sgemm), 1.84x on Zen 5 (family 26 model 2; the matmul at 1.6-1.9x
// the sgemm, the GPT-2 124M bf16 step 1.6x faster on it): 1.3 lies well apart from both.
constexpr double kBf16DotLead = 1.3;

// The rule train.cpu_bf16_gemm = "auto" follows, pure: oneDNN's bf16 matmul where it runs
// natively (`available`) and either on AMX tiles or on dot products at least kBf16DotLead x
// the FMAs' rate; else the FMA engine.
bool bf16_products_outpace_fp32(bool available, bool amx, const Bf16DotRate& rate);
// That rule on this core (its rate measured once, only when it decides).
bool bf16_gemm_outpaces_fp32();

// Throws trident::Error (one line: what the core lacks) unless bf16_gemm_available(): what every
// bf16 product checks first, and what a kernel calling them from an OpenMP region checks before
// it (an exception must not leave a parallel region).
void require_bf16_gemm();

// What runs the bf16 GEMM, for the `gemm:` start-up line: "bf16 oneDNN 2.6.3 matmul
// brg:avx512_core_bf16 (AVX512-BF16, no AMX)", or "bf16 unavailable: ..." with the reason.
// The implementation name is the one oneDNN picks for a 256 x 256 x 256 product here.
std::string bf16_gemm_description();

// fp32 inputs, rounded to bf16 (nearest, ties to even; NaN stays NaN: util/bf16.hpp, the bits
// of the GPU's __float2bfloat16_rn) into per-thread scratch, then multiplied. A (lda) holds
// op(A) as M x K (trans_a: K x M), B (ldb) op(B) as K x N (trans_b: N x K), C is M x N (ldc).
// beta = 0 overwrites C (its old contents, NaN included, are not read); any other beta scales
// it. bias (optional, [N] fp32) is added to every row in the product's epilogue, before alpha:
// C = alpha (op(A) op(B) + bias) + beta C (the linear layers' bias, alpha 1: no pass of its own).
// Throws trident::Error (one line) when !bf16_gemm_available().
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc, const float* bias = nullptr);

// The same product on inputs already in bf16 (the upper 16 bits of a float, as util/bf16.hpp):
// what a trainer pays when the weights are rounded once per step into a bf16 copy.
void gemm_bf16_rounded(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                       float beta, float* C, int64_t ldc, const float* bias = nullptr);

// The product with B already in bf16 and A in fp32 (rounded into scratch as gemm_bf16 does): the
// linear layers' products with a weight, whose bf16 copy is made once per update
// (model/cpu_bf16_kernels.hpp's packed weights) rather than at every call.
void gemm_bf16_b_rounded(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         float alpha, const float* A, int64_t lda, const uint16_t* B,
                         int64_t ldb, float beta, float* C, int64_t ldc,
                         const float* bias = nullptr);

// A linear layer's backward products from one bf16 copy of dY [N, OC] (rounded once for both):
// dW [OC, C] += dY^T X when dw, dX [N, C] = dY W when dx. dY is read from dy_bits when given
// (its bf16 bits), else rounded from dy; W [OC, C] likewise from w_bits, else from w.
void linear_backward_bf16(float* dx, float* dw, const float* dy, const uint16_t* dy_bits,
                          const float* x, const float* w, const uint16_t* w_bits, int64_t N,
                          int64_t C, int64_t OC);

// out[i] = bf16(in[i]) for i < n (dense), threaded over blocks of n outside a parallel region.
void round_to_bf16(const float* in, int64_t n, uint16_t* out);

// out[r * cols + c] = bf16(in[r * ld + c]) for a rows x cols block (dense output), threaded
// over rows outside a parallel region.
void round_to_bf16(const float* in, int64_t rows, int64_t cols, int64_t ld, uint16_t* out);

// x[i] = the float value of bf16(x[i]) for i < n, in place (the same rounding: nearest even,
// NaN kept NaN): the CPU's bf16 precision keeps its bf16 activations as these values in fp32
// storage (model/cpu_bf16_kernels.hpp). Threaded over large n outside a parallel region.
void round_to_bf16_values(float* x, int64_t n);
// dst[i] = the float value of bf16(src[i]) for i < n: the copy and the rounding in one pass.
void round_to_bf16_values(float* dst, const float* src, int64_t n);
// out[i] = the float value of the bf16 bits[i] for i < n (exact), threaded over large n outside
// a parallel region.
void bf16_bits_to_values(const uint16_t* bits, int64_t n, float* out);

}  // namespace trident::cpu

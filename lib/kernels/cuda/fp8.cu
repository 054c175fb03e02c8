// FP8 quantisation on the GPU (train.precision = "fp8"): the amax a tensor's scale comes from,
// the FP8 codes of x * scale that the FP8 GEMMs take, and for the backward the codes written
// transposed in the same pass (Transformer Engine's cast-transpose).
// The conversion is the hardware's saturating one (__nv_cvt_float_to_fp8 with
// __NV_SATFINITE), which util/fp8.hpp's float_to_fp8 reproduces on the host for the CPU
// reference; test_cuda_kernels' CudaFp8 cases hold the two to the same bits.
#include <cuda_fp8.h>

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.hpp"

namespace trident::cuda {

namespace {

// *amax_bits = the larger of itself and a warp's m, by one atomic from its first lane: m the
// bits of |x| values. Non-negative floats order as their bit patterns do, and a NaN's |x| (sign
// cleared) has bits above +infinity's: an integer max over the bits is the float max with NaN
// dominating, and it does not depend on the order the threads meet (deterministic).
__device__ __forceinline__ void warp_max_into(unsigned* amax_bits, unsigned m) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(amax_bits, m);
}

template <typename T>
__global__ void abs_max_kernel(unsigned* __restrict__ amax_bits, const T* __restrict__ in,
                               int64_t n) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    m = max(m, __float_as_uint(fabsf(detail::to_f32(in[i]))));
  warp_max_into(amax_bits, m);
}

// One element's code, x * scale in `kind` (the hardware's saturating conversion), with |x|'s
// bits taken into the thread's running amax m.
__device__ __forceinline__ uint8_t quantize_one(float x, float scale,
                                                __nv_fp8_interpretation_t kind, unsigned& m) {
  m = max(m, __float_as_uint(fabsf(x)));
  return __nv_cvt_float_to_fp8(x * scale, __NV_SATFINITE, kind);
}

// The hardware conversion's name of a format.
__nv_fp8_interpretation_t nv_kind(Fp8Format format) {
  return format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

// amax_bits nullptr: no amax (the scale came from it already, or from a delayed history);
// scale_ptr (or nullptr: `scale`): the scale in device memory, the current recipe's.
template <typename T>
__global__ void fp8_quantize_kernel(uint8_t* __restrict__ out, const T* __restrict__ in,
                                    int64_t n, float scale, const float* __restrict__ scale_ptr,
                                    __nv_fp8_interpretation_t kind,
                                    unsigned* __restrict__ amax_bits) {
  if (scale_ptr) scale = *scale_ptr;
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = quantize_one(detail::to_f32(in[i]), scale, kind, m);
  if (amax_bits) warp_max_into(amax_bits, m);
}

// The codes of in[rows, cols] * scale written transposed, out_t[cols, rows], and (out, or
// nullptr) row-major in the same pass: 32 x 32 tiles through shared memory (a padded row: no
// bank conflicts), 32 x 8 threads each reading four values of a tile's rows and writing four
// codes of its columns; the amax as fp8_quantize_kernel takes it.
template <typename T>
__global__ void fp8_quantize_transposed_kernel(uint8_t* __restrict__ out_t,
                                               uint8_t* __restrict__ out,
                                               const T* __restrict__ in, int64_t rows,
                                               int64_t cols, float scale,
                                               const float* __restrict__ scale_ptr,
                                               __nv_fp8_interpretation_t kind,
                                               unsigned* __restrict__ amax_bits) {
  __shared__ uint8_t tile[32][33];
  if (scale_ptr) scale = *scale_ptr;
  const int64_t c0 = blockIdx.x * 32LL, r0 = blockIdx.y * 32LL;
  unsigned m = 0;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const uint8_t code = quantize_one(detail::to_f32(in[r * cols + c]), scale, kind, m);
      tile[i][threadIdx.x] = code;
      if (out) out[r * cols + c] = code;
    }
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;  // out_t row c, column r
    if (c < cols && r < rows) out_t[c * rows + r] = tile[threadIdx.x][i];
  }
  if (amax_bits) warp_max_into(amax_bits, m);
}

// scale[i] = fp8_scale(amax[i], 1, format, margin) (util/fp8.hpp), the same IEEE
// operations: max_finite / amax / 2^margin where amax > 0 and finite and the quotient finite,
// else 1 (the current recipe has no previous scale).
__global__ void fp8_scales_kernel(float* __restrict__ scale, const float* __restrict__ amax,
                                  int64_t n, float max_finite, float two_to_margin) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float a = amax[i];
  float s = 1.0f;
  if (a > 0.0f && isfinite(a)) {
    const float q = __fdiv_rn(__fdiv_rn(max_finite, a), two_to_margin);
    if (isfinite(q)) s = q;
  }
  scale[i] = s;
}

// *out = 1 / (*a * *b): an FP8 GEMM's output factor from its operands' scales.
__global__ void fp8_dequant_kernel(float* out, const float* a, const float* b) {
  *out = __fdiv_rn(1.0f, __fmul_rn(*a, *b));
}

}  // namespace

void fp8_scales(float* scale, const float* amax, int64_t n, Fp8Format format, int margin,
                cudaStream_t stream) {
  detail::check_dims(n >= 0 && margin >= 0 && margin < 64, "fp8_scales: n < 0 or a bad margin");
  if (n == 0) return;
  fp8_scales_kernel<<<detail::grid_for(n, 256), 256, 0, stream>>>(
      scale, amax, n, fp8_spec(format).max_finite, std::ldexp(1.0f, margin));
  CUDA_CHECK_LAUNCH();
}

void fp8_dequant(float* out, const float* a, const float* b, cudaStream_t stream) {
  fp8_dequant_kernel<<<1, 1, 0, stream>>>(out, a, b);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void abs_max(float* amax, const T* in, int64_t n, cudaStream_t stream) {
  detail::check_dims(n >= 0, "abs_max: n < 0");
  CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n == 0) return;
  abs_max_kernel<T><<<detail::grid_for(n, 256, 1024), 256, 0, stream>>>(
      reinterpret_cast<unsigned*>(amax), in, n);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void fp8_quantize(uint8_t* out, const T* in, int64_t n, float scale, Fp8Format format,
                  cudaStream_t stream, float* amax, const float* scale_ptr) {
  detail::check_dims(n >= 0, "fp8_quantize: n < 0");
  if (n == 0) return;
  fp8_quantize_kernel<T><<<detail::grid_for(n, 256), 256, 0, stream>>>(
      out, in, n, scale, scale_ptr, nv_kind(format), reinterpret_cast<unsigned*>(amax));
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void fp8_quantize_transposed(uint8_t* out_t, uint8_t* out, const T* in, int64_t rows,
                             int64_t cols, float scale, Fp8Format format, cudaStream_t stream,
                             float* amax, const float* scale_ptr) {
  detail::check_dims(rows >= 0 && cols >= 0, "fp8_quantize_transposed: negative size");
  if (rows == 0 || cols == 0) return;
  detail::check_dims((cols + 31) / 32 <= INT_MAX && (rows + 31) / 32 <= 65535,
                     "fp8_quantize_transposed: too many rows (> 65535 * 32)");
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  fp8_quantize_transposed_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(
      out_t, out, in, rows, cols, scale, scale_ptr, nv_kind(format),
      reinterpret_cast<unsigned*>(amax));
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                              \
  template void abs_max<T>(float*, const T*, int64_t, cudaStream_t);                        \
  template void fp8_quantize<T>(uint8_t*, const T*, int64_t, float, Fp8Format, cudaStream_t, \
                                float*, const float*);                                      \
  template void fp8_quantize_transposed<T>(uint8_t*, uint8_t*, const T*, int64_t, int64_t,   \
                                           float, Fp8Format, cudaStream_t, float*,           \
                                           const float*);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

#pragma once
// Device buffers of the GPU benchmarks (gpu_gemm_ceiling.cu, gpu_attention.cu) filled with
// uniform values in [-1, 1) from an integer hash of the index: no host copy, the same values on
// every run.
#include <cuda_bf16.h>

#include <cstdint>

template <typename S>
__global__ void fill_uniform(S* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;  // integer hash
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    const float v = static_cast<float>(x) * (2.0f / 4294967296.0f) - 1.0f;
    if constexpr (sizeof(S) == 2) {
      p[i] = __float2bfloat16_rn(v);
    } else {
      p[i] = v;
    }
  }
}

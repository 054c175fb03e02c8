#pragma once
// Probes of the Hopper building blocks the wgmma attention stands on, one assumption each, for
// tests/test_cuda_wgmma.cpp: where a failure of the attention test
// (CudaAttention.WgmmaMatchesMmaSyncAndTheCpu) comes from, in one run. Each runs one block on
// the current device (compute capability 9.0: attention_wgmma_available) with the helpers of
// sm90.cuh and the layouts of gmma_layout.hpp, exactly as the attention kernels use them.
// Device pointers; synchronous (the default stream, then a check).
#include <cuda_bf16.h>

#include <cstdint>

namespace trident::cuda {

// TMA: the tile of `rows` x `cols` (multiples of 64, cols <= 128, rows <= 128) at (row0, col0)
// of a [1][T][C] bf16 tensor, loaded as the kernels load tiles (64 x 64 boxes, 128-byte
// swizzle; rows past T as zeros) into shared memory, whose bytes are copied to smem_out
// (rows * cols * 2 bytes): gmma::tile_address says where each element should be.
void wgmma_probe_tma(unsigned char* smem_out, const __nv_bfloat16* data, int T, int64_t C,
                     int row0, int col0, int rows, int cols);

// wgmma with both operands K-major in shared memory (S = Q K^T): out[64][N] (fp32, row-major) =
// A[a_row0 .. a_row0 + 64)[0 .. K) B[0 .. N)[0 .. K)^T, A a [128][K] and B an [N][K] row-major
// bf16 matrix, each loaded by TMA; N and K in {64, 128}, a_row0 in {0, 64}.
void wgmma_probe_ss(float* out, const __nv_bfloat16* a, const __nv_bfloat16* b, int N, int K,
                    int a_row0);

// wgmma with A in registers and B MN-major in shared memory (O += P V): out[64][N] = P[64][K]
// V[K][N], P fp32 [64][K] rounded to bf16 into the A fragments, V a [K][N] row-major bf16
// matrix loaded by TMA; N and K in {64, 128}.
void wgmma_probe_rs(float* out, const float* p, const __nv_bfloat16* v, int N, int K);

}  // namespace trident::cuda

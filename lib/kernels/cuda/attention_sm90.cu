// Causal (grouped-query) attention forward for Hopper (sm_90a): wgmma, TMA, and a producer warp
// that keeps the K/V tiles in flight (FlashAttention-3's structure, without its intra-warpgroup
// overlap of softmax and GEMMs). Layouts and the result are those of attention_bf16.cu's
// forward (attention.cuh); that kernel stays for other GPUs, for HS = 32, and as the reference
// the tests hold this one to.
//
// Block = three warpgroups for kBlockM = 128 query rows of one (b, head):
//  * warpgroup 0 (the producer; setmaxnreg.dec to 24 registers): one thread issues the TMA
//    loads, Q once and then each K/V tile into one of kStages buffers, waiting on that buffer's
//    `empty` barrier before it refills it;
//  * warpgroups 1 and 2 (the consumers; setmaxnreg.inc to 240), 64 query rows each: per key
//    tile S = Q K^T (wgmma, both operands in shared memory, K-major), the mask and the online
//    softmax in registers (exp2 domain, as attention_bf16.cu), P rounded to bf16 in registers
//    as the A operand of O += P V (V MN-major, wgmma's transposed B), then the buffer's `empty`
//    barrier.
// TMA writes each tile as boxes of 64 rows x 64 columns with the 128-byte swizzle, the layout the
// descriptors read (gmma_layout.hpp; tests/test_gmma_layout.cpp checks the two against each
// other); rows past T come in as zeros. Tiles of keys: 128 (HS 64) or 64 (HS 128, so that S, P
// and O fit the consumers' registers). Key tiles wholly after a warpgroup's last row are
// skipped by it; the diagonal tiles (and every tile with packed documents) are masked.
// The wgmma code is compiled for sm_90a only (the other targets get a trap); the host runs it
// on compute capability 9.0 and not otherwise (attention_wgmma_available).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/gmma_layout.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TRIDENT_SM90A 1
#else
#define TRIDENT_SM90A 0
#endif

namespace trident::cuda::detail {

namespace {

using bf16_t = __nv_bfloat16;
namespace gm = gmma;

constexpr int kBlockM = 128;        // query rows per block: two consumer warpgroups of 64
// K/V buffers. Four keep TMA three tiles ahead and, with Q, take 144 KB (HS 64) or 160 KB
// (HS 128) of shared memory: one block per SM, which setmaxnreg's register budget assumes
// (24 + 2 x 240 registers a thread for 384 threads: the whole register file).
constexpr int kStages = 4;
constexpr int kThreads = 3 * 128;   // producer warpgroup + 2 consumer warpgroups
constexpr int kBox = 64;            // TMA box: 64 rows x 64 columns (128-byte rows)
template <int HS>
__host__ __device__ constexpr int block_n() {
  return HS == 64 ? 128 : 64;
}
template <int HS>
__host__ __device__ constexpr uint32_t q_bytes() {
  return uint32_t(kBlockM) * HS * 2;
}
template <int HS>
__host__ __device__ constexpr uint32_t kv_bytes() {
  return uint32_t(block_n<HS>()) * HS * 2;
}
// Shared memory: Q | K[kStages] | V[kStages] | barriers, from a 1024-aligned base.
template <int HS>
__host__ __device__ constexpr uint32_t barrier_offset() {
  return q_bytes<HS>() + 2 * kStages * kv_bytes<HS>();
}
constexpr uint32_t kBarriers = 1 + 3 * kStages;  // full Q; full K, full V, empty per stage
template <int HS>
__host__ __device__ constexpr size_t smem_bytes() {
  return barrier_offset<HS>() + 8 * kBarriers + 1024;  // + room to align the base
}

#if TRIDENT_SM90A
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------- mbarriers and TMA
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// One box of the [B][T][C3] tensor map at (column, row, batch) into shared memory at dst,
// completing `bytes` on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int col, int row,
                                         int batch, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(batch), "r"(bar)
      : "memory");
}
// A tile of `rows` x HS at (row0, col0): boxes of 64 x 64, the layout gmma::tile_address reads.
template <int HS>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* map, int rows,
                                              int col0, int row0, int batch, uint32_t bar) {
#pragma unroll
  for (int cb = 0; cb < HS / kBox; cb++)
    for (int rb = 0; rb < rows / kBox; rb++)
      tma_load(dst + uint32_t(cb * rows + rb * kBox) * gm::kRowBytes, map, col0 + cb * kBox,
               row0 + rb * kBox, batch, bar);
}

// ---------------------------------------------------------------- wgmma
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// After wgmma_wait_all: the registers an asynchronous wgmma wrote or read are not touched by
// the compiler across it (their asm statements said they were consumed at the issue).
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int r = 0; r < 4; r++) asm volatile("" : "+r"(a[i][r])::"memory");
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]; A and B K-major in shared memory.
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 64] += A[64 x 16] B[16 x 64]; A in registers, B MN-major in shared memory.
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4],
                                              uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// D[64 x 128] (+)= A[64 x 16] B[16 x 128]; A and B K-major in shared memory.
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 128] += A[64 x 16] B[16 x 128]; A in registers, B MN-major in shared memory.
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4],
                                              uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, int acc) {
  if constexpr (N == 64) {
    wgmma_ss_n64(d, da, db, acc);
  } else {
    wgmma_ss_n128(d, da, db, acc);
  }
}
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (N == 64) {
    wgmma_rs_n64(d, a, db);
  } else {
    wgmma_rs_n128(d, a, db);
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
#endif  // TRIDENT_SM90A

// ------------------------------------------------------------------------------- forward
template <int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ CUtensorMap qkv_map, bf16_t* __restrict__ out,
                         float* __restrict__ lse, const int32_t* __restrict__ doc_start, int T,
                         int NH, int KVH) {
#if TRIDENT_SM90A
  constexpr int BN = block_n<HS>();
  constexpr int NS = BN / 2, NO = HS / 2;  // accumulators per thread: S, O
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t q_s = base, k_s = base + q_bytes<HS>();
  const uint32_t v_s = k_s + kStages * kv_bytes<HS>();
  const uint32_t bars = base + barrier_offset<HS>();
  const uint32_t full_q = bars;
  auto full_k = [&](int s) { return bars + 8u * (1 + s); };
  auto full_v = [&](int s) { return bars + 8u * (1 + kStages + s); };
  auto empty = [&](int s) { return bars + 8u * (1 + 2 * kStages + s); };

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int kvh = h / (NH / KVH);
  const int tile = gridDim.y - 1 - blockIdx.y;  // largest tiles first
  const int q0 = tile * kBlockM;
  const int64_t doc_row = int64_t(b) * T;
  const int kt_first = kDocs ? doc_start[doc_row + q0] / BN : 0;
  const int kt_last = min(q0 + kBlockM - 1, T - 1) / BN;
  const int tiles = kt_last - kt_first + 1;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(full_q, 1);
    for (int s = 0; s < kStages; s++) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty(s), 8);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x == 0) {
      const int q_col = h * HS, k_col = (NH + kvh) * HS, v_col = (NH + KVH + kvh) * HS;
      mbar_expect_tx(full_q, q_bytes<HS>());
      tma_load_tile<HS>(q_s, &qkv_map, kBlockM, q_col, q0, b, full_q);
      for (int it = 0; it < tiles; it++) {
        const int s = it % kStages, k0 = (kt_first + it) * BN;
        if (it >= kStages) mbar_wait(empty(s), uint32_t(it / kStages - 1) & 1u);
        mbar_expect_tx(full_k(s), kv_bytes<HS>());
        tma_load_tile<HS>(k_s + s * kv_bytes<HS>(), &qkv_map, BN, k_col, k0, b, full_k(s));
        mbar_expect_tx(full_v(s), kv_bytes<HS>());
        tma_load_tile<HS>(v_s + s * kv_bytes<HS>(), &qkv_map, BN, v_col, k0, b, full_v(s));
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int cw = wg - 1;  // consumer warpgroup: rows [64 cw, 64 cw + 64) of the block
  const int tw = threadIdx.x % 128, lane = tw % 32;
  const int c = lane & 3;
  const int row0 = 64 * cw;  // first row of the warpgroup in the tile
  const int t0 = q0 + gm::acc_row(tw, 0), t1 = q0 + gm::acc_row(tw, 2);
  const int wg_last = q0 + row0 + 63;  // the warpgroup's last row
  const float scale_log2 = rsqrtf(static_cast<float>(HS)) * kLog2e;
  const int first0 = kDocs && t0 < T ? doc_start[doc_row + t0] : 0;
  const int first1 = kDocs && t1 < T ? doc_start[doc_row + t1] : 0;

  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; i++) o[i] = 0.f;
  float s[NS];
#pragma unroll
  for (int i = 0; i < NS; i++) s[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  mbar_wait(full_q, 0);

  for (int it = 0; it < tiles; it++) {
    const int st = it % kStages, k0 = (kt_first + it) * BN;
    const uint32_t phase = uint32_t(it / kStages) & 1u;
    const uint32_t kt_s = k_s + st * kv_bytes<HS>(), vt_s = v_s + st * kv_bytes<HS>();
    if (k0 > wg_last) {  // every key of the tile is after this warpgroup's rows
      if (lane == 0) mbar_arrive(empty(st));
      continue;
    }
    // S = Q K^T
    mbar_wait(full_k(st), phase);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++)
      wgmma_ss<BN>(s, gm::encode(gm::k_major_desc(q_s, kBlockM, row0, ks)),
                   gm::encode(gm::k_major_desc(kt_s, BN, 0, ks)), ks > 0);
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(s);

    // Scale into the log2 domain, mask (keys after the row, past T, before the row's
    // document) where a key can be masked, row maxima.
    const bool masked = kDocs || k0 + BN - 1 > q0 + row0;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < NS / 4; i++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = k0 + gm::acc_col(tw, i, e);
        const int t = e < 2 ? t0 : t1;
        const int first = e < 2 ? first0 : first1;
        float v = s[4 * i + e] * scale_log2;
        if (masked && !(col <= t && col < T && col >= first)) v = -INFINITY;
        s[4 * i + e] = v;
        if (e < 2) {
          mx0 = fmaxf(mx0, v);
        } else {
          mx1 = fmaxf(mx1, v);
        }
      }
    }
    // A row whose document starts in a later tile has no visible key yet (mn = -inf): its
    // exponentials are taken against 0, a = p = 0 (as attention_bf16.cu).
    const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
    const float base0 = mn0 == -INFINITY ? 0.f : mn0;
    const float base1 = mn1 == -INFINITY ? 0.f : mn1;
    const float a0 = exp2f(m0 - base0), a1 = exp2f(m1 - base1);
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int i = 0; i < NS / 4; i++) {
      s[4 * i + 0] = exp2f(s[4 * i + 0] - base0);
      s[4 * i + 1] = exp2f(s[4 * i + 1] - base0);
      s[4 * i + 2] = exp2f(s[4 * i + 2] - base1);
      s[4 * i + 3] = exp2f(s[4 * i + 3] - base1);
      rs0 += s[4 * i + 0] + s[4 * i + 1];
      rs1 += s[4 * i + 2] + s[4 * i + 3];
    }
    l0 = l0 * a0 + rs0;
    l1 = l1 * a1 + rs1;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int i = 0; i < NO / 4; i++) {
      o[4 * i + 0] *= a0;
      o[4 * i + 1] *= a0;
      o[4 * i + 2] *= a1;
      o[4 * i + 3] *= a1;
    }
    // O += P V: P's accumulators are the A operand as they are (gmma_layout.hpp).
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
#pragma unroll
      for (int r = 0; r < 4; r++)
        pa[j][r] = pack_bf16(s[gm::acc_for_a(j, r, 0)], s[gm::acc_for_a(j, r, 1)]);
    mbar_wait(full_v(st), phase);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
      wgmma_rs<HS>(o, pa[j], gm::encode(gm::mn_major_desc(vt_s, BN, j)));
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(o);
    fence_regs(pa);
    if (lane == 0) mbar_arrive(empty(st));  // this warp is done with the stage's K and V
  }

  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  const int64_t C = int64_t(NH) * HS;
  if (t0 < T) {
    bf16_t* row = out + (int64_t(b) * T + t0) * C + int64_t(h) * HS;
#pragma unroll
    for (int i = 0; i < NO / 4; i++)
      *reinterpret_cast<uint32_t*>(row + gm::acc_col(tw, i, 0)) =
          pack_bf16(o[4 * i] * inv0, o[4 * i + 1] * inv0);
    if (c == 0) lse[int64_t(bh) * T + t0] = m0 * kLn2 + logf(l0);
  }
  if (t1 < T) {
    bf16_t* row = out + (int64_t(b) * T + t1) * C + int64_t(h) * HS;
#pragma unroll
    for (int i = 0; i < NO / 4; i++)
      *reinterpret_cast<uint32_t*>(row + gm::acc_col(tw, i, 2)) =
          pack_bf16(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    if (c == 0) lse[int64_t(bh) * T + t1] = m1 * kLn2 + logf(l1);
  }
#else
  (void)out, (void)lse, (void)doc_start, (void)T, (void)NH, (void)KVH;
  __trap();  // not built for this architecture; attention_wgmma_available() said no
#endif
}

// ---------------------------------------------------------------- host side
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw Error("attention (sm90): the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// qkv as a [B][T][C3] tensor of bf16, boxes of 64 rows x 64 columns, 128-byte swizzle; rows
// past T (a box at the end of a sequence) read as zeros.
CUtensorMap qkv_tensor_map(const bf16_t* qkv, int B, int T, int64_t C3) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {cuuint64_t(C3), cuuint64_t(T), cuuint64_t(B)};
  const cuuint64_t strides[2] = {cuuint64_t(C3) * 2, cuuint64_t(C3) * 2 * cuuint64_t(T)};
  const cuuint32_t box[3] = {kBox, kBox, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16_t*>(qkv), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("attention (sm90): cuTensorMapEncodeTiled failed (code " + std::to_string(r) +
                ")");
  return map;
}

template <int HS>
void forward_sm90_hs(bf16_t* out, float* lse, const bf16_t* qkv, const int32_t* doc_start, int B,
                     int T, int NH, int KVH, cudaStream_t stream) {
  const CUtensorMap map = qkv_tensor_map(qkv, B, T, int64_t(NH + 2 * KVH) * HS);
  const auto kernel =
      doc_start ? attn_fwd_sm90_kernel<HS, true> : attn_fwd_sm90_kernel<HS, false>;
  prepare_smem(kernel, smem_bytes<HS>());
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((T + kBlockM - 1) / kBlockM));
  kernel<<<grid, kThreads, smem_bytes<HS>(), stream>>>(map, out, lse, doc_start, T, NH, KVH);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_wgmma_supported(int HS) {
  if (HS != 64 && HS != 128) return false;
  int dev = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;  // sm_90a code runs on exactly 9.0
}

void attention_forward_sm90(bf16_t* out, float* lse, const bf16_t* qkv, const int32_t* doc_start,
                            int B, int T, int NH, int KVH, int HS, cudaStream_t stream) {
  check_dims((T + kBlockM - 1) / kBlockM <= 65535, "attention: T too large");
  check_dims(int64_t(NH + 2 * KVH) * HS * 2 * int64_t(T) < (int64_t(1) << 40),
             "attention (sm90): a sequence past TMA's 2^40-byte stride");
  switch (HS) {
    case 64: forward_sm90_hs<64>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    case 128: forward_sm90_hs<128>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    default: check_dims(false, "attention (sm90): HS must be 64 or 128");
  }
}

}  // namespace trident::cuda::detail

#pragma once
// Hopper (sm_90a) building blocks of the wgmma attention kernels (attention_sm90.cu, forward;
// attention_sm90_bwd.cu, backward), nvcc only: mbarriers, TMA tile loads in the layout of
// gmma_layout.hpp, the wgmma instructions the kernels use, and the host's tensor maps.
// The device code exists only when compiling for sm_90a (TRIDENT_SM90A); the kernels' bodies
// are a trap on the other targets, and the host runs them on compute capability 9.0 only.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gmma_layout.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TRIDENT_SM90A 1
#else
#define TRIDENT_SM90A 0
#endif

namespace trident::cuda::detail::sm90 {

using bf16_t = __nv_bfloat16;
namespace gm = gmma;

constexpr int kBox = 64;  // TMA box: 64 rows x 64 columns (128-byte rows, the swizzle's width)

// The warp-specialised kernels' registers a thread: launched at kLaunchRegisters (384 threads,
// __launch_bounds__(384, 1)), the producer warpgroup drops to kProducerRegisters and the two
// consumers rise to kConsumerRegisters. setmaxnreg.inc waits until the block's pool holds what
// it asks for, so the producer's release must cover the consumers' rise: a kernel compiled to
// fewer registers would wait for ever (check_launch_registers refuses it before its launch).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240, kLaunchRegisters = 168;
static_assert(128 * (kLaunchRegisters - kProducerRegisters) >=
                  256 * (kConsumerRegisters - kLaunchRegisters),
              "the producer's registers do not cover the consumers'");
static_assert(384 * kLaunchRegisters <= 65536 && 128 * kProducerRegisters +
                                                         256 * kConsumerRegisters <= 65536,
              "more registers than an SM has");

// The mbarriers of a producer/consumer pipeline of kStages buffers in shared memory at `base`:
// `loaded` (what is loaded once: Q, or K and V), kFull "full" barriers a stage (the loads of
// that stage's buffers complete on them: one, or K and V apart) and one `empty` a stage (one
// arrival from each of the 8 consumer warps frees it). The producer waits for the buffer's
// previous use to be freed before it refills it; use u of a stage completes phase u of its
// barriers, so the waits alternate parity.
template <int kStages, int kFull>
struct Pipeline {
  static constexpr uint32_t kBytes = 8 * (1 + (kFull + 1) * kStages);
  uint32_t base;
  __host__ __device__ uint32_t loaded() const { return base; }
  __host__ __device__ uint32_t full(int s, int which = 0) const {
    return base + 8u * uint32_t(1 + which * kStages + s);
  }
  __host__ __device__ uint32_t empty(int s) const {
    return base + 8u * uint32_t(1 + kFull * kStages + s);
  }
  static __host__ __device__ int stage(int it) { return it % kStages; }
  static __host__ __device__ uint32_t phase(int it) { return uint32_t(it / kStages) & 1u; }
#if TRIDENT_SM90A
  // Thread 0 initialises the barriers; every thread of the block calls it (a __syncthreads).
  __device__ void init() const;
  // Producer, before it loads iteration `it` into its stage: that stage's previous use freed.
  __device__ void acquire(int it) const;
  // Consumer warp, done with iteration `it`'s stage.
  __device__ void release(int it) const;
#endif
};

#if TRIDENT_SM90A
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The first 1024-aligned shared-memory address at or after `smem` (the swizzle's atoms must be
// 1024-aligned; the kernels ask for 1024 bytes more than they use).
__device__ __forceinline__ uint32_t aligned_smem_base(const void* smem) {
  return (smem_addr(smem) + 1023u) & ~1023u;
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
// One box of a [B][T][C] tensor map at (column, row, batch) into shared memory at dst,
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

template <int kStages, int kFull>
__device__ __forceinline__ void Pipeline<kStages, kFull>::init() const {
  if (threadIdx.x == 0) {
    mbar_init(loaded(), 1);
    for (int s = 0; s < kStages; s++) {
      for (int w = 0; w < kFull; w++) mbar_init(full(s, w), 1);
      mbar_init(empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}
template <int kStages, int kFull>
__device__ __forceinline__ void Pipeline<kStages, kFull>::acquire(int it) const {
  if (it >= kStages) mbar_wait(empty(stage(it)), uint32_t(it / kStages - 1) & 1u);
}
template <int kStages, int kFull>
__device__ __forceinline__ void Pipeline<kStages, kFull>::release(int it) const {
  if (threadIdx.x % 32 == 0) mbar_arrive(empty(stage(it)));
}

// A consumer warpgroup passing over tile `it` without using it: it waits for the tile to be
// loaded before releasing its buffer. A release without that wait could run ahead: a
// warpgroup that skips tiles could arrive for the stage's next use before the other one has
// arrived for this use, and its arrivals would complete the empty barrier's phase on their
// own, letting the producer overwrite a buffer the other warpgroup still reads. Waiting for
// `full` orders every arrival for a use after the producer's acquire of it, so each phase of
// `empty` counts one use's arrivals.
template <int kStages, int kFull>
__device__ __forceinline__ void skip(const Pipeline<kStages, kFull>& bars, int it) {
#pragma unroll
  for (int f = 0; f < kFull; f++) mbar_wait(bars.full(bars.stage(it), f), bars.phase(it));
  bars.release(it);
}

// A block of `rows` query rows of one (b, head) and the key tiles of `bn` keys it visits: from
// the tile of its first row's document start (packed documents, kDocs) to the tile of its last
// row. Grid: x = b NH + h, y = the row tile counted from the end (the largest blocks first).
struct QueryBlock {
  int b, h, kvh, q0, kt_first, tiles;
  int64_t doc_row;  // b T: the block's sequence in doc_start
  template <bool kDocs>
  __device__ static QueryBlock at(int rows, int bn, int T, int NH, int KVH,
                                  const int32_t* doc_start) {
    QueryBlock q;
    q.b = int(blockIdx.x) / NH;
    q.h = int(blockIdx.x) % NH;
    q.kvh = q.h / (NH / KVH);
    q.q0 = int(gridDim.y - 1 - blockIdx.y) * rows;
    q.doc_row = int64_t(q.b) * T;
    q.kt_first = kDocs ? doc_start[q.doc_row + q.q0] / bn : 0;
    q.tiles = min(q.q0 + rows - 1, T - 1) / bn - q.kt_first + 1;
    return q;
  }
};

// Warp specialisation: the producer warpgroup gives its registers to the two consumers
// (24 + 2 x 240 a thread for 384 threads: the whole register file, one block per SM).
__device__ __forceinline__ void become_producer() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
}
__device__ __forceinline__ void become_consumer() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
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

// The wgmma forms the kernels use, m64nNk16 with fp32 accumulators (N / 2 registers a thread,
// gmma_layout.hpp's map), bf16 operands:
//   wgmma_ss<N>:    D (+)= A B, A and B K-major in shared memory (S = Q K^T);
//   wgmma_ss_tt<N>: D (+)= A B, A and B MN-major in shared memory (the atomic dQ = dS K);
//   wgmma_rs<N>:    D += A B, A in four registers, B MN-major in shared memory (O += P V);
// N = 64 or 128, one specialisation each. (+)=: `accumulate` 0 overwrites D. The operand lists
// are spelled by the macros below.
template <int N>
__device__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate);
template <int N>
__device__ void wgmma_ss_tt(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                            int accumulate);
template <int N>
__device__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b);
#define TRIDENT_ACC8(d, i)                                                                  \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define TRIDENT_ACC32(d) \
  TRIDENT_ACC8(d, 0), TRIDENT_ACC8(d, 8), TRIDENT_ACC8(d, 16), TRIDENT_ACC8(d, 24)
#define TRIDENT_ACC64(d)                                                         \
  TRIDENT_ACC32(d), TRIDENT_ACC8(d, 32), TRIDENT_ACC8(d, 40), TRIDENT_ACC8(d, 48), \
      TRIDENT_ACC8(d, 56)
#define TRIDENT_REGS32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TRIDENT_REGS64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// Shared-memory A and B (descriptors %A, %B), scale-d from %P, transposes TA, TB (0 or 1).
#define TRIDENT_WGMMA_SS(name, n, regs, acc, A, B, P, TA, TB)                                   \
  template <>                                                                                   \
  __device__ __forceinline__ void name<n>(float (&d)[n / 2], uint64_t desc_a, uint64_t desc_b,  \
                                          int accumulate) {                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 " regs ", %" #A       \
                 ", %" #B ", p, 1, 1, " #TA ", " #TB ";\n}\n"                                    \
                 : acc(d)                                                                       \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                  \
  }
// Register A (%A0 .. %A0 + 3), shared-memory B transposed (%B), accumulating (%P holds 1).
#define TRIDENT_WGMMA_RS(name, n, regs, acc, A0, A1, A2, A3, B, P)                              \
  template <>                                                                                   \
  __device__ __forceinline__ void name<n>(float (&d)[n / 2], const uint32_t (&a)[4],            \
                                          uint64_t desc_b) {                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 " regs               \
                 ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"          \
                 : acc(d)                                                                       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));            \
  }
TRIDENT_WGMMA_SS(wgmma_ss, 64, TRIDENT_REGS32, TRIDENT_ACC32, 32, 33, 34, 0, 0)
TRIDENT_WGMMA_SS(wgmma_ss, 128, TRIDENT_REGS64, TRIDENT_ACC64, 64, 65, 66, 0, 0)
TRIDENT_WGMMA_SS(wgmma_ss_tt, 64, TRIDENT_REGS32, TRIDENT_ACC32, 32, 33, 34, 1, 1)
TRIDENT_WGMMA_SS(wgmma_ss_tt, 128, TRIDENT_REGS64, TRIDENT_ACC64, 64, 65, 66, 1, 1)
TRIDENT_WGMMA_RS(wgmma_rs, 64, TRIDENT_REGS32, TRIDENT_ACC32, 32, 33, 34, 35, 36, 37)
TRIDENT_WGMMA_RS(wgmma_rs, 128, TRIDENT_REGS64, TRIDENT_ACC64, 64, 65, 66, 67, 68, 69)
#undef TRIDENT_WGMMA_RS
#undef TRIDENT_WGMMA_SS
#undef TRIDENT_REGS64
#undef TRIDENT_REGS32
#undef TRIDENT_ACC64
#undef TRIDENT_ACC32
#undef TRIDENT_ACC8

// Ordinary stores to shared memory made visible to the wgmma that reads them next (the async
// proxy), and the 128 threads of a warpgroup met at named barrier `id` (1 + the warpgroup: 0 is
// __syncthreads').
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}
#endif  // TRIDENT_SM90A

// ---------------------------------------------------------------- host side
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
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

// Before a warp-specialised kernel's first launch: its compiled register count is the one
// the setmaxnreg budget above assumes (another toolchain, -maxrregcount or -G could lower it,
// and the consumers would then hang rather than fail).
template <typename Kernel>
void check_launch_registers(Kernel kernel, const char* name) {
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  if (attributes.numRegs < kLaunchRegisters)
    throw Error(std::string("attention (sm90): ") + name + " was compiled to " +
                std::to_string(attributes.numRegs) + " registers a thread, under the " +
                std::to_string(kLaunchRegisters) +
                " its warp specialisation needs (setmaxnreg would wait for ever)");
}

// A [B][T][C] bf16 tensor (qkv, C = C3; dout, C = NH HS) for TMA: boxes of 64 rows x 64
// columns, 128-byte swizzle; rows past T (a box at the end of a sequence) read as zeros.
inline CUtensorMap bf16_tensor_map(const bf16_t* data, int B, int T, int64_t C) {
  CUtensorMap map{};
  check_dims(C * 2 * int64_t(T) < (int64_t(1) << 40) && C % 8 == 0,
             "attention (sm90): a sequence past TMA's 2^40-byte stride, or rows not 16-byte "
             "multiples");
  const cuuint64_t dims[3] = {cuuint64_t(C), cuuint64_t(T), cuuint64_t(B)};
  const cuuint64_t strides[2] = {cuuint64_t(C) * 2, cuuint64_t(C) * 2 * cuuint64_t(T)};
  const cuuint32_t box[3] = {kBox, kBox, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16_t*>(data), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("attention (sm90): cuTensorMapEncodeTiled failed (code " + std::to_string(r) +
                ")");
  return map;
}

}  // namespace trident::cuda::detail::sm90

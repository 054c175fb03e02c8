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
// descriptors read (gmma_layout.hpp; tests/test_kernels_gmma_layout.cpp checks the two against
// each other); rows past T come in as zeros. Tiles of keys: 128 (HS 64) or 64 (HS 128, so that S, P
// and O fit the consumers' registers). Key tiles wholly after a warpgroup's last row are
// skipped by it; the diagonal tiles (and every tile with packed documents) are masked.
// The wgmma code is compiled for sm_90a only (the other targets get a trap); the host runs it
// on compute capability 9.0 and not otherwise (attention_wgmma_available).
#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/sm90.cuh"

namespace trident::cuda::detail {

namespace {

using namespace sm90;

constexpr int kBlockM = 128;        // query rows per block: two consumer warpgroups of 64
// K/V buffers: four keep TMA three tiles ahead; with Q, 144 KB (HS 64) or 160 KB (HS 128).
constexpr int kStages = 4;
// Producer warpgroup + 2 consumer warpgroups. Launched at 168 registers a thread (ptxas's
// budget for 384 threads; sm90::check_launch_registers), 64,512 of the SM's 65,536: one block
// per SM, so setmaxnreg's 24 + 2 x 240 (the whole register file) is always there to take.
constexpr int kThreads = 3 * 128;
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
using Barriers = Pipeline<kStages, 2>;  // loaded: Q; full: K (0) and V (1) apart
template <int HS>
__host__ __device__ constexpr size_t smem_bytes() {
  return barrier_offset<HS>() + Barriers::kBytes + 1024;  // + room to align the base
}

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
  const uint32_t base = aligned_smem_base(smem_raw);
  const uint32_t q_s = base, k_s = base + q_bytes<HS>();
  const uint32_t v_s = k_s + kStages * kv_bytes<HS>();
  const Barriers bars{base + barrier_offset<HS>()};

  const auto [b, h, kvh, q0, kt_first, tiles, doc_row] =
      QueryBlock::at<kDocs>(kBlockM, BN, T, NH, KVH, doc_start);
  const int bh = b * NH + h;
  const int wg = threadIdx.x / 128;

  bars.init();

  if (wg == 0) {  // ------------------------------------------------ producer
    become_producer();
    if (threadIdx.x == 0) {
      const int q_col = h * HS, k_col = (NH + kvh) * HS, v_col = (NH + KVH + kvh) * HS;
      mbar_expect_tx(bars.loaded(), q_bytes<HS>());
      tma_load_tile<HS>(q_s, &qkv_map, kBlockM, q_col, q0, b, bars.loaded());
      for (int it = 0; it < tiles; it++) {
        const int s = Barriers::stage(it), k0 = (kt_first + it) * BN;
        bars.acquire(it);
        mbar_expect_tx(bars.full(s, 0), kv_bytes<HS>());
        tma_load_tile<HS>(k_s + s * kv_bytes<HS>(), &qkv_map, BN, k_col, k0, b, bars.full(s, 0));
        mbar_expect_tx(bars.full(s, 1), kv_bytes<HS>());
        tma_load_tile<HS>(v_s + s * kv_bytes<HS>(), &qkv_map, BN, v_col, k0, b, bars.full(s, 1));
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  become_consumer();
  const int cw = wg - 1;  // consumer warpgroup: rows [64 cw, 64 cw + 64) of the block
  const int tw = threadIdx.x % 128, c = tw % 4;
  const int row0 = 64 * cw;  // first row of the warpgroup in the tile
  const int t0 = q0 + gm::block_acc_row(cw, tw, 0), t1 = q0 + gm::block_acc_row(cw, tw, 2);
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
  mbar_wait(bars.loaded(), 0);

  for (int it = 0; it < tiles; it++) {
    const int st = Barriers::stage(it), k0 = (kt_first + it) * BN;
    const uint32_t kt_s = k_s + st * kv_bytes<HS>(), vt_s = v_s + st * kv_bytes<HS>();
    if (k0 > wg_last) {  // every key of the tile is after this warpgroup's rows
      skip(bars, it);
      continue;
    }
    // S = Q K^T
    mbar_wait(bars.full(st, 0), Barriers::phase(it));
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
    mbar_wait(bars.full(st, 1), Barriers::phase(it));
    // The rescaled O and the packed P are written before the fence (wgmma.fence orders a
    // thread's register writes before the wgmma that reads them; the compiler must not sink
    // the writes past it).
    fence_regs(o);
    fence_regs(pa);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
      wgmma_rs<HS>(o, pa[j], gm::encode(gm::mn_major_desc(vt_s, BN, j)));
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(o);
    fence_regs(pa);
    bars.release(it);  // this warp is done with the stage's K and V
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

template <int HS>
void forward_sm90_hs(bf16_t* out, float* lse, const bf16_t* qkv, const int32_t* doc_start, int B,
                     int T, int NH, int KVH, cudaStream_t stream) {
  const CUtensorMap map = sm90::bf16_tensor_map(qkv, B, T, int64_t(NH + 2 * KVH) * HS);
  const auto kernel =
      doc_start ? attn_fwd_sm90_kernel<HS, true> : attn_fwd_sm90_kernel<HS, false>;
  prepare_smem(kernel, smem_bytes<HS>());
  check_launch_registers(kernel, "the forward kernel");
  const dim3 grid(static_cast<unsigned>(B * NH),
                  static_cast<unsigned>((T + kBlockM - 1) / kBlockM));
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
  switch (HS) {
    case 64: forward_sm90_hs<64>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    case 128: forward_sm90_hs<128>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    default: check_dims(false, "attention (sm90): HS must be 64 or 128");
  }
}

}  // namespace trident::cuda::detail

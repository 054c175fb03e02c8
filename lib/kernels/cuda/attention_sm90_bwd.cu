// Causal (grouped-query) attention backward for Hopper (sm_90a): attention_bf16.cu's backward
// (the same mathematics, P and dS rounded to bf16 as the A operands of the second GEMMs) on
// wgmma with TMA loads and a producer warp, as the forward in attention_sm90.cu: the
// deterministic two passes, and the atomic-dQ form (train.deterministic = false).
//
//  * dK/dV pass, block = 128 keys of one (b, kv head): warpgroup 0 loads K and V once and then,
//    for each query head of the kv head in head order and each query tile of 64 that can see
//    the keys, Q and dO into one of kStages buffers (TMA); warpgroups 1 and 2 own 64 keys each:
//    S^T = K Q^T and dP^T = V dO^T (wgmma, shared-memory operands, K-major), P^T and
//    dS^T = P^T (dP^T - delta) in registers, then dV += P^T dO and dK += dS^T Q with P^T and
//    dS^T as register A operands and dO, Q read MN-major (transposed B). dK and dV stay in
//    registers over all the query heads (a fixed order) and are written once.
//  * dQ pass, block = 128 query rows of one (b, head): Q and dO loaded once, each key tile up to
//    the diagonal into kStages buffers; per tile S = Q K^T, dP = dO V^T, dS in registers, and
//    dQ += dS K (K MN-major), written once.
//  * atomic dQ (kAtomicDq): the dK/dV pass also stores its dS^T (bf16, as dK's A operand) to
//    shared memory in the MN-major layout, multiplies dQ_part = dS K over its 64 keys (wgmma
//    with both operands transposed) and adds dQ_part to the fp32 accumulator [B,T,NH,HS] with
//    atomicAdd; a conversion scales it into dqkv, and there is no dQ pass. The order the adds
//    land in varies, so dQ's last bits do; dK and dV are the deterministic pass's bit for bit.
// Query tiles (dK/dV) or key tiles (dQ) wholly on the masked side of a warpgroup's rows are
// skipped by it. Packed documents: the dQ pass starts at the block's first document, the dK/dV
// pass masks (as attention_bf16.cu).
#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/sm90.cuh"

namespace trident::cuda::detail {

namespace {

using namespace sm90;

constexpr int kThreads = 3 * 128;  // producer warpgroup + 2 consumer warpgroups (as the forward)
constexpr int kStages = 2;
constexpr int kKeys = 128;     // dK/dV pass: keys per block (64 per consumer warpgroup)
constexpr int kQueries = 64;   // dK/dV pass: queries per tile
constexpr int kRows = 128;     // dQ pass: query rows per block
template <int HS>
__host__ __device__ constexpr int dq_block_n() {  // dQ pass: keys per tile (registers, as fwd)
  return HS == 64 ? 128 : 64;
}
__host__ __device__ constexpr uint32_t tile_bytes(int rows, int HS) {
  return uint32_t(rows) * HS * 2;
}
// dK/dV pass shared memory: K | V | Q[kStages] | dO[kStages] | dS^T[2 warpgroups] (the atomic
// dQ's) | barriers (1024-aligned base).
constexpr uint32_t kDsBytes = uint32_t(64) * kQueries * 2;  // a warpgroup's 64 keys x 64 queries
template <int HS>
__host__ __device__ constexpr uint32_t dkdv_ds_at() {
  return 2 * tile_bytes(kKeys, HS) + 2 * kStages * tile_bytes(kQueries, HS);
}
template <int HS>
__host__ __device__ constexpr uint32_t dkdv_barriers_at() {
  return dkdv_ds_at<HS>() + 2 * kDsBytes;
}
// dQ pass: Q | dO | K[kStages] | V[kStages] | barriers.
template <int HS>
__host__ __device__ constexpr uint32_t dq_barriers_at() {
  return 2 * tile_bytes(kRows, HS) + 2 * kStages * tile_bytes(dq_block_n<HS>(), HS);
}
// loaded: K and V (dK/dV pass) or Q and dO (dQ pass); full: the stage's two tiles together.
using Barriers = Pipeline<kStages, 1>;

// ------------------------------------------------------------------ backward: dK and dV
template <int HS, bool kDocs, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads, 1)
    attn_bwd_dkdv_sm90_kernel(const __grid_constant__ CUtensorMap qkv_map,
                              const __grid_constant__ CUtensorMap dout_map,
                              bf16_t* __restrict__ dqkv, const float* __restrict__ lse,
                              const float* __restrict__ delta,
                              const int32_t* __restrict__ doc_start, float* __restrict__ dq_accum,
                              int T, int NH, int KVH) {
#if TRIDENT_SM90A
  constexpr int NS = kQueries / 2, NA = HS / 2;  // accumulators a thread: S^T (dP^T), dK (dV)
  constexpr uint32_t KV = tile_bytes(kKeys, HS), QT = tile_bytes(kQueries, HS);
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);  // (the dS stores' generic pointers)
  const uint32_t base = aligned_smem_base(smem_raw);
  const uint32_t k_s = base, v_s = base + KV, q_s = base + 2 * KV;
  const uint32_t do_s = q_s + kStages * QT;
  const Barriers bars{base + dkdv_barriers_at<HS>()};

  const int b = blockIdx.x / KVH, kvh = blockIdx.x % KVH;
  const int heads = NH / KVH;
  const int k0 = blockIdx.y * kKeys;  // small key tiles (most work) first
  const int nqt = (T + kQueries - 1) / kQueries, qt_first = k0 / kQueries;
  const int per_head = nqt - qt_first, iters = heads * per_head;
  const int wg = threadIdx.x / 128;

  bars.init();

  if (wg == 0) {  // ------------------------------------------------ producer
    become_producer();
    if (threadIdx.x == 0) {
      mbar_expect_tx(bars.loaded(), 2 * KV);
      tma_load_tile<HS>(k_s, &qkv_map, kKeys, (NH + kvh) * HS, k0, b, bars.loaded());
      tma_load_tile<HS>(v_s, &qkv_map, kKeys, (NH + KVH + kvh) * HS, k0, b, bars.loaded());
      for (int it = 0; it < iters; it++) {
        const int s = Barriers::stage(it), h = kvh * heads + it / per_head;
        const int q0 = (qt_first + it % per_head) * kQueries;
        bars.acquire(it);
        mbar_expect_tx(bars.full(s), 2 * QT);
        tma_load_tile<HS>(q_s + s * QT, &qkv_map, kQueries, h * HS, q0, b, bars.full(s));
        tma_load_tile<HS>(do_s + s * QT, &dout_map, kQueries, h * HS, q0, b, bars.full(s));
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  become_consumer();
  const int cw = wg - 1;  // keys [64 cw, 64 cw + 64) of the block
  const int tw = threadIdx.x % 128;
  const int key0 = k0 + gm::block_acc_row(cw, tw, 0), key1 = k0 + gm::block_acc_row(cw, tw, 2);
  const float scale = rsqrtf(static_cast<float>(HS));
  const float scale_log2 = scale * kLog2e;
  const int64_t doc_row = int64_t(b) * T;

  float dk[NA], dv[NA], sT[NS], dpT[NS];
  float dq[kAtomicDq ? NA : 1];  // the atomic dQ's product, [64 queries][HS]
  const uint32_t ds_s = base + dkdv_ds_at<HS>() + cw * kDsBytes;
#pragma unroll
  for (int i = 0; i < NA; i++) dk[i] = dv[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (kAtomicDq ? NA : 1); i++) dq[i] = 0.f;
#pragma unroll
  for (int i = 0; i < NS; i++) sT[i] = dpT[i] = 0.f;
  mbar_wait(bars.loaded(), 0);

  for (int it = 0; it < iters; it++) {
    const int s = Barriers::stage(it), h = kvh * heads + it / per_head;
    const int q0 = (qt_first + it % per_head) * kQueries;
    if (q0 + kQueries - 1 < k0 + 64 * cw) {  // every query of the tile is before these keys
      skip(bars, it);
      continue;
    }
    const uint32_t qt_s = q_s + s * QT, dot_s = do_s + s * QT;
    mbar_wait(bars.full(s), Barriers::phase(it));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
      wgmma_ss<kQueries>(sT, gm::encode(gm::k_major_desc(k_s, kKeys, 64 * cw, ks)),
                         gm::encode(gm::k_major_desc(qt_s, kQueries, 0, ks)), ks > 0);
      wgmma_ss<kQueries>(dpT, gm::encode(gm::k_major_desc(v_s, kKeys, 64 * cw, ks)),
                         gm::encode(gm::k_major_desc(dot_s, kQueries, 0, ks)), ks > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(sT);
    fence_regs(dpT);
    // P^T and dS^T = P^T (dP^T - delta): queries before the key, past T (lse = inf) and whose
    // document starts after the key give 0.
    const int64_t bh = int64_t(b) * NH + h;
#pragma unroll
    for (int i = 0; i < NS / 4; i++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int t = q0 + gm::acc_col(tw, i, e);
        const float L = t < T ? lse[bh * T + t] * kLog2e : INFINITY;
        const float D = t < T ? delta[bh * T + t] : 0.f;
        const int first = kDocs && t < T ? doc_start[doc_row + t] : 0;
#pragma unroll
        for (int r = 0; r < 2; r++) {  // rows key0 (e), key1 (e + 2)
          const int idx = 4 * i + e + 2 * r, key = r == 0 ? key0 : key1;
          const bool visible = t >= key && (!kDocs || key >= first);
          const float p = visible ? exp2f(sT[idx] * scale_log2 - L) : 0.f;
          sT[idx] = p;
          dpT[idx] = p * (dpT[idx] - D);
        }
      }
    }
    uint32_t pa[kQueries / 16][4], da[kQueries / 16][4];
#pragma unroll
    for (int j = 0; j < kQueries / 16; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        pa[j][r] = pack_bf16(sT[gm::acc_for_a(j, r, 0)], sT[gm::acc_for_a(j, r, 1)]);
        da[j][r] = pack_bf16(dpT[gm::acc_for_a(j, r, 0)], dpT[gm::acc_for_a(j, r, 1)]);
      }
    if constexpr (kAtomicDq) {
      // dS^T [64 keys][64 queries] into this warpgroup's buffer (key = row, so wgmma reads it
      // as the MN-major A of dQ = dS K); the previous tile's dQ product has read it (waited).
      warpgroup_barrier(1 + cw);
#pragma unroll
      for (int j = 0; j < kQueries / 16; j++)
#pragma unroll
        for (int r = 0; r < 4; r++)
          *reinterpret_cast<uint32_t*>(
              smem_raw + (ds_s - raw) +
              gm::tile_address(0, 64, gm::a_row(tw, r), 16 * j + gm::a_col(tw, r, 0))) =
              da[j][r];
      fence_async_shared();
      warpgroup_barrier(1 + cw);
    }
    // dV += P^T dO and dK += dS^T Q (dO and Q [query][d]: MN-major B operands). Every register
    // the products read is written before the fence (as in the forward).
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(pa);
    fence_regs(da);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kQueries / 16; j++) {
      wgmma_rs<HS>(dv, pa[j], gm::encode(gm::mn_major_desc(dot_s, kQueries, j)));
      wgmma_rs<HS>(dk, da[j], gm::encode(gm::mn_major_desc(qt_s, kQueries, j)));
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(pa);
    fence_regs(da);
    bars.release(it);
    if constexpr (kAtomicDq) {
      // dQ_part [64 queries][HS] = dS [queries][64 keys] K [64 keys][HS] (A = dS^T's buffer,
      // B = this warpgroup's rows of K, both MN-major), after dK and dV so that P's and dS's
      // registers are free for its accumulators.
      fence_regs(dq);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 64 / 16; j++)
        wgmma_ss_tt<HS>(dq, gm::encode(gm::mn_major_desc(ds_s, 64, j)),
                        gm::encode(gm::mn_major_desc(k_s + 64 * cw * gm::kRowBytes, kKeys, j)),
                        j > 0);
      wgmma_commit();
      wgmma_wait_all();
      fence_regs(dq);
      // Unscaled (the conversion scales), rows past T dropped.
      float* acc = dq_accum + int64_t(b) * T * NH * HS + int64_t(h) * HS;
#pragma unroll
      for (int i = 0; i < HS / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int t = q0 + gm::acc_row(tw, e);
          if (t < T) atomicAdd(acc + int64_t(t) * NH * HS + gm::acc_col(tw, i, e), dq[4 * i + e]);
        }
    }
  }

  const int64_t C3 = int64_t(NH + 2 * KVH) * HS;
  const int64_t dk_col = int64_t(NH + kvh) * HS, dv_col = int64_t(NH + KVH + kvh) * HS;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = r == 0 ? key0 : key1;
    if (key >= T) continue;
    bf16_t* row = dqkv + (int64_t(b) * T + key) * C3;
#pragma unroll
    for (int i = 0; i < NA / 4; i++) {
      const int col = gm::acc_col(tw, i, 0), idx = 4 * i + 2 * r;
      *reinterpret_cast<uint32_t*>(row + dk_col + col) =
          pack_bf16(dk[idx] * scale, dk[idx + 1] * scale);
      *reinterpret_cast<uint32_t*>(row + dv_col + col) = pack_bf16(dv[idx], dv[idx + 1]);
    }
  }
#else
  (void)dqkv, (void)lse, (void)delta, (void)doc_start, (void)dq_accum, (void)T, (void)NH,
      (void)KVH;
  __trap();  // not built for this architecture; attention_wgmma_available() said no
#endif
}

// ------------------------------------------------------------------------ backward: dQ
template <int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads, 1)
    attn_bwd_dq_sm90_kernel(const __grid_constant__ CUtensorMap qkv_map,
                            const __grid_constant__ CUtensorMap dout_map,
                            bf16_t* __restrict__ dqkv, const float* __restrict__ lse,
                            const float* __restrict__ delta, const int32_t* __restrict__ doc_start,
                            int T, int NH, int KVH) {
#if TRIDENT_SM90A
  constexpr int BN = dq_block_n<HS>();
  constexpr int NS = BN / 2, NQ = HS / 2;  // accumulators a thread: S (dP), dQ
  constexpr uint32_t QT = tile_bytes(kRows, HS), KT = tile_bytes(BN, HS);
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = aligned_smem_base(smem_raw);
  const uint32_t q_s = base, do_s = base + QT, k_s = base + 2 * QT;
  const uint32_t v_s = k_s + kStages * KT;
  const Barriers bars{base + dq_barriers_at<HS>()};

  const auto [b, h, kvh, q0, kt_first, tiles, doc_row] =
      QueryBlock::at<kDocs>(kRows, BN, T, NH, KVH, doc_start);
  const int bh = b * NH + h;
  const int wg = threadIdx.x / 128;

  bars.init();

  if (wg == 0) {  // ------------------------------------------------ producer
    become_producer();
    if (threadIdx.x == 0) {
      mbar_expect_tx(bars.loaded(), 2 * QT);
      tma_load_tile<HS>(q_s, &qkv_map, kRows, h * HS, q0, b, bars.loaded());
      tma_load_tile<HS>(do_s, &dout_map, kRows, h * HS, q0, b, bars.loaded());
      for (int it = 0; it < tiles; it++) {
        const int s = Barriers::stage(it), kt0 = (kt_first + it) * BN;
        bars.acquire(it);
        mbar_expect_tx(bars.full(s), 2 * KT);
        tma_load_tile<HS>(k_s + s * KT, &qkv_map, BN, (NH + kvh) * HS, kt0, b, bars.full(s));
        tma_load_tile<HS>(v_s + s * KT, &qkv_map, BN, (NH + KVH + kvh) * HS, kt0, b,
                          bars.full(s));
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  become_consumer();
  const int cw = wg - 1;
  const int tw = threadIdx.x % 128;
  const int row0 = 64 * cw;
  const int t0 = q0 + gm::block_acc_row(cw, tw, 0), t1 = q0 + gm::block_acc_row(cw, tw, 2);
  const int wg_last = q0 + row0 + 63;
  const float scale = rsqrtf(static_cast<float>(HS));
  const float scale_log2 = scale * kLog2e;
  const int first0 = kDocs && t0 < T ? doc_start[doc_row + t0] : 0;
  const int first1 = kDocs && t1 < T ? doc_start[doc_row + t1] : 0;
  const float L0 = t0 < T ? lse[int64_t(bh) * T + t0] * kLog2e : INFINITY;
  const float L1 = t1 < T ? lse[int64_t(bh) * T + t1] * kLog2e : INFINITY;
  const float D0 = t0 < T ? delta[int64_t(bh) * T + t0] : 0.f;
  const float D1 = t1 < T ? delta[int64_t(bh) * T + t1] : 0.f;

  float dq[NQ], sc[NS], dp[NS];
#pragma unroll
  for (int i = 0; i < NQ; i++) dq[i] = 0.f;
#pragma unroll
  for (int i = 0; i < NS; i++) sc[i] = dp[i] = 0.f;
  mbar_wait(bars.loaded(), 0);

  for (int it = 0; it < tiles; it++) {
    const int s = Barriers::stage(it), kt0 = (kt_first + it) * BN;
    if (kt0 > wg_last) {  // every key of the tile is after this warpgroup's rows
      skip(bars, it);
      continue;
    }
    const uint32_t kt_s = k_s + s * KT, vt_s = v_s + s * KT;
    mbar_wait(bars.full(s), Barriers::phase(it));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
      wgmma_ss<BN>(sc, gm::encode(gm::k_major_desc(q_s, kRows, row0, ks)),
                   gm::encode(gm::k_major_desc(kt_s, BN, 0, ks)), ks > 0);
      wgmma_ss<BN>(dp, gm::encode(gm::k_major_desc(do_s, kRows, row0, ks)),
                   gm::encode(gm::k_major_desc(vt_s, BN, 0, ks)), ks > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(sc);
    fence_regs(dp);
#pragma unroll
    for (int i = 0; i < NS / 4; i++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = kt0 + gm::acc_col(tw, i, e);
        const int t = e < 2 ? t0 : t1;
        const bool visible = key <= t && key >= (e < 2 ? first0 : first1);
        const float p = visible ? exp2f(sc[4 * i + e] * scale_log2 - (e < 2 ? L0 : L1)) : 0.f;
        dp[4 * i + e] = p * (dp[4 * i + e] - (e < 2 ? D0 : D1));
      }
    }
    uint32_t da[BN / 16][4];
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
#pragma unroll
      for (int r = 0; r < 4; r++)
        da[j][r] = pack_bf16(dp[gm::acc_for_a(j, r, 0)], dp[gm::acc_for_a(j, r, 1)]);
    // dQ += dS K (K [key][d]: the MN-major B operand).
    fence_regs(dq);
    fence_regs(da);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
      wgmma_rs<HS>(dq, da[j], gm::encode(gm::mn_major_desc(kt_s, BN, j)));
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(dq);
    fence_regs(da);
    bars.release(it);
  }

  const int64_t C3 = int64_t(NH + 2 * KVH) * HS;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = r == 0 ? t0 : t1;
    if (t >= T) continue;
    bf16_t* row = dqkv + (int64_t(b) * T + t) * C3 + int64_t(h) * HS;
#pragma unroll
    for (int i = 0; i < NQ / 4; i++) {
      const int idx = 4 * i + 2 * r;
      *reinterpret_cast<uint32_t*>(row + gm::acc_col(tw, i, 0)) =
          pack_bf16(dq[idx] * scale, dq[idx + 1] * scale);
    }
  }
#else
  (void)dqkv, (void)lse, (void)delta, (void)doc_start, (void)T, (void)NH, (void)KVH;
  __trap();
#endif
}

template <int HS, bool kAtomicDq>
auto dkdv_kernel(bool docs) {
  return docs ? attn_bwd_dkdv_sm90_kernel<HS, true, kAtomicDq>
              : attn_bwd_dkdv_sm90_kernel<HS, false, kAtomicDq>;
}

template <int HS>
void backward_sm90_hs(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse,
                      const float* delta, const int32_t* doc_start, float* dq_accum, int B, int T,
                      int NH, int KVH, cudaStream_t stream) {
  const CUtensorMap qkv_map = bf16_tensor_map(qkv, B, T, int64_t(NH + 2 * KVH) * HS);
  const CUtensorMap dout_map = bf16_tensor_map(dout, B, T, int64_t(NH) * HS);
  const size_t smem1 = dkdv_barriers_at<HS>() + Barriers::kBytes + 1024;  // + alignment room
  const auto dkdv = dq_accum ? dkdv_kernel<HS, true>(doc_start != nullptr)
                             : dkdv_kernel<HS, false>(doc_start != nullptr);
  prepare_smem(dkdv, smem1);
  check_launch_registers(dkdv, "the dK/dV kernel");
  const dim3 grid_kv(static_cast<unsigned>(B * KVH),
                     static_cast<unsigned>((T + kKeys - 1) / kKeys));
  if (dq_accum)
    CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, sizeof(float) * B * T * NH * HS, stream));
  dkdv<<<grid_kv, kThreads, smem1, stream>>>(qkv_map, dout_map, dqkv, lse, delta, doc_start,
                                              dq_accum, T, NH, KVH);
  CUDA_CHECK_LAUNCH();
  if (dq_accum) {
    dq_from_accum(dqkv, dq_accum, int64_t(B) * T, int64_t(NH) * HS, int64_t(NH + 2 * KVH) * HS,
                  rsqrtf(static_cast<float>(HS)), stream);
    return;
  }
  const size_t smem2 = dq_barriers_at<HS>() + Barriers::kBytes + 1024;
  const auto dq =
      doc_start ? attn_bwd_dq_sm90_kernel<HS, true> : attn_bwd_dq_sm90_kernel<HS, false>;
  prepare_smem(dq, smem2);
  check_launch_registers(dq, "the dQ kernel");
  const dim3 grid_q(static_cast<unsigned>(B * NH), static_cast<unsigned>((T + kRows - 1) / kRows));
  dq<<<grid_q, kThreads, smem2, stream>>>(qkv_map, dout_map, dqkv, lse, delta, doc_start, T, NH,
                                          KVH);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_backward_sm90(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv,
                             const float* lse, const float* delta, const int32_t* doc_start,
                             float* dq_accum, int B, int T, int NH, int KVH, int HS,
                             cudaStream_t stream) {
  check_dims((T + kKeys - 1) / kKeys <= 65535, "attention: T too large");
  switch (HS) {
    case 64:
      backward_sm90_hs<64>(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, B, T, NH, KVH,
                           stream);
      break;
    case 128:
      backward_sm90_hs<128>(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, B, T, NH, KVH,
                            stream);
      break;
    default: check_dims(false, "attention (sm90): HS must be 64 or 128");
  }
}

}  // namespace trident::cuda::detail

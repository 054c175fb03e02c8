// Flash-attention-style causal (grouped-query) attention on bf16 tensor cores
// (FlashAttention-2 structure). Layouts in attention.cuh; query head h reads kv head
// h / (NH/KVH).
//
// mma.sync.m16n8k16 (bf16 x bf16 -> fp32) with the fragment layouts of the PTX ISA, for lane
// = 4 g + c (g = groupID 0..7, c = thread in group 0..3):
//   A (16x16, row-major): a[0] = A[g][2c..2c+1],   a[1] = A[g+8][2c..2c+1],
//                         a[2] = A[g][2c+8..2c+9], a[3] = A[g+8][2c+8..2c+9]
//   B (16x8, "col"):      b[0] = B[2c..2c+1][g],   b[1] = B[2c+8..2c+9][g]
//   C/D (16x8 fp32):      d[0..1] = D[g][2c..2c+1], d[2..3] = D[g+8][2c..2c+1]
// (two bf16 per 32-bit register, the lower column / row in the low half). The accumulators of
// two adjacent 16x8 score tiles are exactly the A fragment of a 16x16 tile, so P (and dS) go
// from the first GEMM's accumulators to the second GEMM's A operand in registers.
// A operands and the B operands whose k index runs along a shared row (K in S = Q K^T, V in
// dP = dO V^T, ...) are read with 32-bit shared loads; rows are padded by 8 bf16 (16 bytes) so
// that the 8 groups hit distinct banks. B operands whose k index runs down the rows (V in
// O = P V, dO and Q in dV/dK, K in dQ) come from the same row-major tiles through
// ldmatrix.x4.trans (no transposed copies). Global -> shared copies are 16-byte cp.async,
// double-buffered: the next K/V (or Q/dO) tile is in flight while the current one is used.
//
// Tiles: 64 query rows x 64 keys; 4 warps per block, each owning 16 rows (or 16 keys).
//  * forward: block = query tile; online softmax in the exp2 domain on the accumulators.
//  * backward pass 1: block = key tile of one kv head; for each of its query heads in head
//    order, S^T = K Q^T and dP^T = V dO^T per query tile at or below the diagonal;
//    dV += P^T dO, dK += dS^T Q (fp32 accumulators in registers, summed over the query heads,
//    written once).
//  * backward pass 2: block = query tile; S = Q K^T, dP = dO V^T; dQ += dS K.
// No atomics; every output element is owned by one thread.
// The faster, non-deterministic backward (train.deterministic = false; kAtomicDq): pass 1 also
// forms dQ += dS K for its key tile (dS through shared memory, as the A operand of rows =
// queries) and adds it to an fp32 accumulator [B,T,NH,HS] with atomicAdd, so S and dP are
// computed once instead of twice and pass 2 is a conversion (scale, bf16). The order of the
// atomic adds varies from run to run: dQ's last bits do.
// Packed documents (doc_start [B,T], nullptr: none): row t sees keys [doc_start[t], t]. The
// forward and the dQ pass start at the key tile of the query tile's first row's document
// (doc_start is non-decreasing), so the tiles before it are neither loaded nor multiplied; the
// dK/dV pass masks. A row with no visible key in a tile keeps m = -inf and is rescaled by 0.
#include <cstdint>

#include "kernels/cuda/attention.cuh"

namespace trident::cuda::detail {

namespace {

using bf16_t = __nv_bfloat16;

constexpr int kBlk = 64;       // query rows per tile = keys per tile
constexpr int kThreads = 128;  // 4 warps x 16 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld32(const bf16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major tile with pitch P.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16_t* tile, int P, int r0,
                                       int k0, int g, int c) {
  const bf16_t* p0 = tile + (r0 + g) * P + k0 + 2 * c;
  const bf16_t* p1 = p0 + 8 * P;
  a[0] = ld32(p0);
  a[1] = ld32(p1);
  a[2] = ld32(p0 + 8);
  a[3] = ld32(p1 + 8);
}

// A fragments of a 16x16 tile taken from the accumulators of two adjacent 16x8 tiles.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// ---------------------------------------------------------------- async copies, ldmatrix
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte global -> shared copy; zero-fills when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rows [r0, r0 + 64) x HS of a global matrix (row pitch ld elements; rows >= T zero-filled)
// into a row-major shared tile [64][HS + 8], asynchronously (cp.async, 16 bytes per copy).
template <int HS>
__device__ __forceinline__ void load_tile_async(bf16_t* tile, const bf16_t* src, int64_t ld,
                                                int r0, int T) {
  constexpr int kChunks = HS / 8;
  constexpr int P = HS + 8;
  for (int idx = threadIdx.x; idx < kBlk * kChunks; idx += kThreads) {
    const int r = idx / kChunks, ch = idx % kChunks, t = r0 + r;
    const bool valid = t < T;
    const bf16_t* g = src + (valid ? int64_t(t) * ld : 0) + ch * 8;
    cp_async16(tile + r * P + ch * 8, g, valid);
  }
}

// B fragments for two adjacent n8 tiles (columns n0 .. n0 + 15) of a 16 x 16 k-slice (rows
// k0 .. k0 + 15) of a row-major shared tile M[k][n] (pitch P), i.e. B[k][n] = M[k][n]:
// ldmatrix.trans of the four 8x8 blocks gives lane (g, c) the pairs M[2c..2c+1][g].
//   b[0], b[1]: columns n0 .. n0 + 7 (k rows 0-7, 8-15);  b[2], b[3]: columns n0 + 8 .. n0 + 15.
__device__ __forceinline__ void ldsm_b_pair_trans(uint32_t (&b)[4], const bf16_t* M, int P,
                                                  int k0, int n0, int lane) {
  const int mat = lane >> 3, r = lane & 7;
  const bf16_t* p = M + (k0 + (mat & 1) * 8 + r) * P + n0 + (mat >> 1) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(smem_addr(p))
               : "memory");
}

// ------------------------------------------------------------------------------- forward
// Q tile once; K/V tiles double-buffered (the copy of tile kt + 1 overlaps the math on kt).
template <int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_bf16_kernel(bf16_t* __restrict__ out, float* __restrict__ lse,
                         const bf16_t* __restrict__ qkv, const int32_t* __restrict__ doc_start,
                         int T, int NH, int KVH) {
  if (!kDocs) doc_start = nullptr;  // a constant: the masks compile away
  constexpr int P = HS + 8, KC = HS / 16, DT = HS / 8, TILE = kBlk * P;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem_raw);  // [64][P]
  bf16_t* Ks = Qs + TILE;                             // [2][64][P]
  bf16_t* Vs = Ks + 2 * TILE;                         // [2][64][P]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int kvh = h / (NH / KVH);
  const int tile = gridDim.y - 1 - blockIdx.y;  // largest tiles first
  const int q0 = tile * kBlk;
  const int64_t C = int64_t(NH) * HS, C3 = int64_t(NH + 2 * KVH) * HS;
  const bf16_t* rows = qkv + int64_t(b) * T * C3;
  const bf16_t* qbase = rows + int64_t(h) * HS;
  const bf16_t* kbase = rows + int64_t(NH + kvh) * HS;
  const bf16_t* vbase = rows + int64_t(NH + KVH + kvh) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3, wr = warp * 16;
  const float scale_log2 = rsqrtf(static_cast<float>(HS)) * kLog2e;

  const int64_t doc_row = int64_t(b) * T;
  const int kt_first = doc_start ? doc_start[doc_row + q0] / kBlk : 0;
  load_tile_async<HS>(Qs, qbase, C3, q0, T);
  load_tile_async<HS>(Ks, kbase, C3, kt_first * kBlk, T);
  load_tile_async<HS>(Vs, vbase, C3, kt_first * kBlk, T);
  cp_async_commit();

  uint32_t qf[KC][4];
  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int t0 = q0 + wr + g, t1 = t0 + 8;
  // The rows' first visible keys (their documents' starts).
  const int first0 = doc_start && t0 < T ? doc_start[doc_row + t0] : 0;
  const int first1 = doc_start && t1 < T ? doc_start[doc_row + t1] : 0;

  for (int kt = kt_first; kt <= tile; kt++) {
    const int k0 = kt * kBlk, st = (kt - kt_first) & 1;
    if (kt < tile) {  // prefetch the next K/V tile into the other stage
      load_tile_async<HS>(Ks + (st ^ 1) * TILE, kbase, C3, k0 + kBlk, T);
      load_tile_async<HS>(Vs + (st ^ 1) * TILE, vbase, C3, k0 + kBlk, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == kt_first) {
#pragma unroll
      for (int kc = 0; kc < KC; kc++) load_a(qf[kc], Qs, P, wr, kc * 16, g, c);
    }
    const bf16_t* Kt = Ks + st * TILE;
    const bf16_t* Vt = Vs + st * TILE;
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int kc = 0; kc < KC; kc++) {
        const bf16_t* kp = Kt + (nt * 8 + g) * P + kc * 16 + 2 * c;
        mma_bf16(s[nt], qf[kc], ld32(kp), ld32(kp + 8));
      }
    }
    // Scale into the log2 domain, mask (s > t, keys past T, keys before the row's document),
    // row maxima.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = k0 + nt * 8 + 2 * c + (e & 1);
        const int t = e < 2 ? t0 : t1;
        const int first = e < 2 ? first0 : first1;
        const float v = (col <= t && col < T && col >= first) ? s[nt][e] * scale_log2 : -INFINITY;
        s[nt][e] = v;
        if (e < 2) {
          mx0 = fmaxf(mx0, v);
        } else {
          mx1 = fmaxf(mx1, v);
        }
      }
    }
    // Without documents every row has a valid key in every tile it visits (key k0 <= q0 <= t),
    // so mn is finite; with them a row whose document starts in a later tile has none yet
    // (mn = -inf), and its exponentials are taken against 0: a = p = 0.
    const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
    const float base0 = kDocs && mn0 == -INFINITY ? 0.f : mn0;
    const float base1 = kDocs && mn1 == -INFINITY ? 0.f : mn1;
    const float a0 = exp2f(m0 - base0), a1 = exp2f(m1 - base1);
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      s[nt][0] = exp2f(s[nt][0] - base0);
      s[nt][1] = exp2f(s[nt][1] - base0);
      s[nt][2] = exp2f(s[nt][2] - base1);
      s[nt][3] = exp2f(s[nt][3] - base1);
      rs0 += s[nt][0] + s[nt][1];
      rs1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * a0 + rs0;
    l1 = l1 * a1 + rs1;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
      o[dt][0] *= a0;
      o[dt][1] *= a0;
      o[dt][2] *= a1;
      o[dt][3] *= a1;
    }
    // O += P V (P from the accumulators; B[k = key][n = d] = V[key][d] via ldmatrix.trans).
#pragma unroll
    for (int kc2 = 0; kc2 < kBlk / 16; kc2++) {
      uint32_t pa[4];
      acc_to_a(pa, s[2 * kc2], s[2 * kc2 + 1]);
#pragma unroll
      for (int dt = 0; dt < DT; dt += 2) {
        uint32_t vb[4];
        ldsm_b_pair_trans(vb, Vt, P, kc2 * 16, dt * 8, lane);
        mma_bf16(o[dt], pa, vb[0], vb[1]);
        mma_bf16(o[dt + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  if (t0 < T) {
    bf16_t* row = out + (int64_t(b) * T + t0) * C + int64_t(h) * HS;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * c) =
          pack_bf16(o[dt][0] * inv0, o[dt][1] * inv0);
    if (c == 0) lse[int64_t(bh) * T + t0] = m0 * kLn2 + logf(l0);
  }
  if (t1 < T) {
    bf16_t* row = out + (int64_t(b) * T + t1) * C + int64_t(h) * HS;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * c) =
          pack_bf16(o[dt][2] * inv1, o[dt][3] * inv1);
    if (c == 0) lse[int64_t(bh) * T + t1] = m1 * kLn2 + logf(l1);
  }
}

// ------------------------------------------------------------------ backward: dK and dV
// K/V tile once; Q/dO tiles (with their lse and delta) double-buffered.
// kAtomicDq: dQ into dq_accum too (above); otherwise dq_accum is unused.
template <int HS, bool kDocs, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_bf16_kernel(bf16_t* __restrict__ dqkv, const bf16_t* __restrict__ dout,
                              const bf16_t* __restrict__ qkv, const float* __restrict__ lse,
                              const float* __restrict__ delta,
                              const int32_t* __restrict__ doc_start, float* __restrict__ dq_accum,
                              int T, int NH, int KVH) {
  if (!kDocs) doc_start = nullptr;  // a constant: the masks compile away
  constexpr int P = HS + 8, KC = HS / 16, DT = HS / 8, TILE = kBlk * P;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem_raw);  // [64][P]  this block's keys
  bf16_t* Vs = Ks + TILE;                             // [64][P]
  bf16_t* Qs = Vs + TILE;                             // [2][64][P]  query tiles
  bf16_t* Gs = Qs + 2 * TILE;                         // [2][64][P]  dO tiles
  float* Ls = reinterpret_cast<float*>(Gs + 2 * TILE);  // [2][64] lse * log2(e)
  float* Ds = Ls + 2 * kBlk;                            // [2][64] delta
  int* Fs = reinterpret_cast<int*>(Ds + 2 * kBlk);      // [2][64] first visible key
  constexpr int PS = kBlk + 8;                          // dS row pitch (kAtomicDq)
  bf16_t* dSs = reinterpret_cast<bf16_t*>(Fs + 2 * kBlk);  // [64 queries][PS] (kAtomicDq)
  const int b = blockIdx.x / KVH, kvh = blockIdx.x % KVH;  // block = (b, kv head, key tile)
  const int heads = NH / KVH;                                // query heads per kv head
  const int kt = blockIdx.y;  // small key tiles (most work) first
  const int k0 = kt * kBlk;
  const int64_t C = int64_t(NH) * HS, C3 = int64_t(NH + 2 * KVH) * HS;
  const bf16_t* rows = qkv + int64_t(b) * T * C3;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3, wk = warp * 16;
  const float scale = rsqrtf(static_cast<float>(HS));
  const float scale_log2 = scale * kLog2e;

  // Iteration `it` visits query head kvh*heads + it / per_head, query tile kt + it % per_head:
  // the kv head's query heads in head order, each over its tiles in order. The dK/dV sums over
  // the heads happen in the accumulators (fixed order, one write at the end); with heads = 1
  // this is the multi-head loop over qt = kt .. nqt-1. The prefetch crosses head boundaries.
  const int nqt = (T + kBlk - 1) / kBlk, per_head = nqt - kt, iters = heads * per_head;
  auto load_stage = [&](int it, int st) {
    const int h = kvh * heads + it / per_head, bh = b * NH + h;
    const int q0 = (kt + it % per_head) * kBlk;
    load_tile_async<HS>(Qs + st * TILE, rows + int64_t(h) * HS, C3, q0, T);
    load_tile_async<HS>(Gs + st * TILE, dout + int64_t(b) * T * C + int64_t(h) * HS, C, q0, T);
    if (threadIdx.x < kBlk) {
      const int t = q0 + threadIdx.x;
      Ls[st * kBlk + threadIdx.x] = t < T ? lse[int64_t(bh) * T + t] * kLog2e : INFINITY;
      Ds[st * kBlk + threadIdx.x] = t < T ? delta[int64_t(bh) * T + t] : 0.f;
      if (kDocs) Fs[st * kBlk + threadIdx.x] = t < T ? doc_start[int64_t(b) * T + t] : 0;
    }
  };
  load_tile_async<HS>(Ks, rows + int64_t(NH + kvh) * HS, C3, k0, T);
  load_tile_async<HS>(Vs, rows + int64_t(NH + KVH + kvh) * HS, C3, k0, T);
  load_stage(0, 0);
  cp_async_commit();
  const int s0 = k0 + wk + g, s1 = s0 + 8;  // this thread's key rows

  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; dt++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[dt][e] = dv[dt][e] = 0.f;

  for (int it = 0; it < iters; it++) {
    const int q0 = (kt + it % per_head) * kBlk, st = it & 1;
    if (it + 1 < iters) {
      load_stage(it + 1, st ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t* Q = Qs + st * TILE;
    const bf16_t* G = Gs + st * TILE;
    const float* L = Ls + st * kBlk;
    const float* D = Ds + st * kBlk;
    const int* F = Fs + st * kBlk;
    // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys x 64 queries.
    float sT[8][4], dpT[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) sT[nt][e] = dpT[nt][e] = 0.f;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
      uint32_t ka[4], va[4];
      load_a(ka, Ks, P, wk, kc * 16, g, c);
      load_a(va, Vs, P, wk, kc * 16, g, c);
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const bf16_t* qp = Q + (nt * 8 + g) * P + kc * 16 + 2 * c;
        mma_bf16(sT[nt], ka, ld32(qp), ld32(qp + 8));
        const bf16_t* gp = G + (nt * 8 + g) * P + kc * 16 + 2 * c;
        mma_bf16(dpT[nt], va, ld32(gp), ld32(gp + 8));
      }
    }
    // P^T and dS^T = P^T (dP^T - delta); queries t < key s, queries whose document starts after
    // key s (and t >= T: L = inf) give 0.
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int qc = nt * 8 + 2 * c + (e & 1);
        const int key = e < 2 ? s0 : s1;
        const int t = q0 + qc;
        const bool visible = t >= key && (!kDocs || key >= F[qc]);
        const float p = visible ? exp2f(sT[nt][e] * scale_log2 - L[qc]) : 0.f;
        sT[nt][e] = p;
        dpT[nt][e] = p * (dpT[nt][e] - D[qc]);
      }
    }
    // dV += P^T dO and dK += dS^T Q (B[k = query][n = d] = dO / Q [query][d], ldmatrix.trans).
#pragma unroll
    for (int kc2 = 0; kc2 < kBlk / 16; kc2++) {
      uint32_t pa[4], da[4];
      acc_to_a(pa, sT[2 * kc2], sT[2 * kc2 + 1]);
      acc_to_a(da, dpT[2 * kc2], dpT[2 * kc2 + 1]);
#pragma unroll
      for (int dt = 0; dt < DT; dt += 2) {
        uint32_t gb[4], qb[4];
        ldsm_b_pair_trans(gb, G, P, kc2 * 16, dt * 8, lane);
        mma_bf16(dv[dt], pa, gb[0], gb[1]);
        mma_bf16(dv[dt + 1], pa, gb[2], gb[3]);
        ldsm_b_pair_trans(qb, Q, P, kc2 * 16, dt * 8, lane);
        mma_bf16(dk[dt], da, qb[0], qb[1]);
        mma_bf16(dk[dt + 1], da, qb[2], qb[3]);
      }
    }
    if constexpr (kAtomicDq) {
      // dS (rows = queries) into shared memory: this warp's 16 keys of every query, rounded to
      // bf16 as the dK product's A operand above was.
#pragma unroll
      for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          dSs[(nt * 8 + 2 * c + (e & 1)) * PS + wk + g + (e < 2 ? 0 : 8)] =
              __float2bfloat16_rn(dpT[nt][e]);
      __syncthreads();
      // dQ[warp's 16 queries] += dS K (B[k = key][n = d] = K[key][d], ldmatrix.trans), then
      // added to the accumulator (unscaled; the conversion scales).
      float dq[DT][4];
#pragma unroll
      for (int dt = 0; dt < DT; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
#pragma unroll
      for (int kc2 = 0; kc2 < kBlk / 16; kc2++) {
        uint32_t sa[4];
        load_a(sa, dSs, PS, warp * 16, kc2 * 16, g, c);
#pragma unroll
        for (int dt = 0; dt < DT; dt += 2) {
          uint32_t kb[4];
          ldsm_b_pair_trans(kb, Ks, P, kc2 * 16, dt * 8, lane);
          mma_bf16(dq[dt], sa, kb[0], kb[1]);
          mma_bf16(dq[dt + 1], sa, kb[2], kb[3]);
        }
      }
      const int h = kvh * heads + it / per_head;
      const int t0 = q0 + warp * 16 + g, t1 = t0 + 8;
      float* acc0 = dq_accum + ((int64_t(b) * T + t0) * NH + h) * HS;
      float* acc1 = acc0 + int64_t(8) * NH * HS;
#pragma unroll
      for (int dt = 0; dt < DT; dt++) {
        if (t0 < T) {
          atomicAdd(acc0 + dt * 8 + 2 * c, dq[dt][0]);
          atomicAdd(acc0 + dt * 8 + 2 * c + 1, dq[dt][1]);
        }
        if (t1 < T) {
          atomicAdd(acc1 + dt * 8 + 2 * c, dq[dt][2]);
          atomicAdd(acc1 + dt * 8 + 2 * c + 1, dq[dt][3]);
        }
      }
    }
    __syncthreads();  // this stage (and dSs) is refilled by the next iteration
  }
  const int64_t dk_col = int64_t(NH + kvh) * HS, dv_col = int64_t(NH + KVH + kvh) * HS;
  if (s0 < T) {
    bf16_t* row = dqkv + (int64_t(b) * T + s0) * C3;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
      *reinterpret_cast<uint32_t*>(row + dk_col + dt * 8 + 2 * c) =
          pack_bf16(dk[dt][0] * scale, dk[dt][1] * scale);
      *reinterpret_cast<uint32_t*>(row + dv_col + dt * 8 + 2 * c) =
          pack_bf16(dv[dt][0], dv[dt][1]);
    }
  }
  if (s1 < T) {
    bf16_t* row = dqkv + (int64_t(b) * T + s1) * C3;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
      *reinterpret_cast<uint32_t*>(row + dk_col + dt * 8 + 2 * c) =
          pack_bf16(dk[dt][2] * scale, dk[dt][3] * scale);
      *reinterpret_cast<uint32_t*>(row + dv_col + dt * 8 + 2 * c) =
          pack_bf16(dv[dt][2], dv[dt][3]);
    }
  }
}

// ------------------------------------------------------------------------ backward: dQ
// Q/dO tile once; K/V tiles double-buffered.
template <int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_bf16_kernel(bf16_t* __restrict__ dqkv, const bf16_t* __restrict__ dout,
                            const bf16_t* __restrict__ qkv, const float* __restrict__ lse,
                            const float* __restrict__ delta, const int32_t* __restrict__ doc_start,
                            int T, int NH, int KVH) {
  if (!kDocs) doc_start = nullptr;  // a constant: the masks compile away
  constexpr int P = HS + 8, KC = HS / 16, DT = HS / 8, TILE = kBlk * P;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem_raw);  // [64][P]
  bf16_t* Gs = Qs + TILE;                             // [64][P]  dO
  bf16_t* Ks = Gs + TILE;                             // [2][64][P]
  bf16_t* Vs = Ks + 2 * TILE;                         // [2][64][P]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int kvh = h / (NH / KVH);
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kBlk;
  const int64_t C = int64_t(NH) * HS, C3 = int64_t(NH + 2 * KVH) * HS;
  const bf16_t* rows = qkv + int64_t(b) * T * C3;
  const bf16_t* qbase = rows + int64_t(h) * HS;
  const bf16_t* kbase = rows + int64_t(NH + kvh) * HS;
  const bf16_t* vbase = rows + int64_t(NH + KVH + kvh) * HS;
  const bf16_t* gbase = dout + int64_t(b) * T * C + int64_t(h) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3, wr = warp * 16;
  const float scale = rsqrtf(static_cast<float>(HS));
  const float scale_log2 = scale * kLog2e;

  const int64_t doc_row = int64_t(b) * T;
  const int kt_first = doc_start ? doc_start[doc_row + q0] / kBlk : 0;
  load_tile_async<HS>(Qs, qbase, C3, q0, T);
  load_tile_async<HS>(Gs, gbase, C, q0, T);
  load_tile_async<HS>(Ks, kbase, C3, kt_first * kBlk, T);
  load_tile_async<HS>(Vs, vbase, C3, kt_first * kBlk, T);
  cp_async_commit();
  const int t0 = q0 + wr + g, t1 = t0 + 8;
  const int first0 = doc_start && t0 < T ? doc_start[doc_row + t0] : 0;
  const int first1 = doc_start && t1 < T ? doc_start[doc_row + t1] : 0;
  const float L0 = t0 < T ? lse[int64_t(bh) * T + t0] * kLog2e : INFINITY;
  const float L1 = t1 < T ? lse[int64_t(bh) * T + t1] * kLog2e : INFINITY;
  const float D0 = t0 < T ? delta[int64_t(bh) * T + t0] : 0.f;
  const float D1 = t1 < T ? delta[int64_t(bh) * T + t1] : 0.f;

  float dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;

  for (int kt = kt_first; kt <= qt; kt++) {
    const int k0 = kt * kBlk, st = (kt - kt_first) & 1;
    if (kt < qt) {
      load_tile_async<HS>(Ks + (st ^ 1) * TILE, kbase, C3, k0 + kBlk, T);
      load_tile_async<HS>(Vs + (st ^ 1) * TILE, vbase, C3, k0 + kBlk, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t* K = Ks + st * TILE;
    const bf16_t* V = Vs + st * TILE;
    float sc[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) sc[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
      uint32_t qa[4], ga[4];
      load_a(qa, Qs, P, wr, kc * 16, g, c);
      load_a(ga, Gs, P, wr, kc * 16, g, c);
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const bf16_t* kp = K + (nt * 8 + g) * P + kc * 16 + 2 * c;
        mma_bf16(sc[nt], qa, ld32(kp), ld32(kp + 8));
        const bf16_t* vp = V + (nt * 8 + g) * P + kc * 16 + 2 * c;
        mma_bf16(dp[nt], ga, ld32(vp), ld32(vp + 8));
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int s = k0 + nt * 8 + 2 * c + (e & 1);
        const int t = e < 2 ? t0 : t1;
        const bool visible = s <= t && s >= (e < 2 ? first0 : first1);
        const float p = visible ? exp2f(sc[nt][e] * scale_log2 - (e < 2 ? L0 : L1)) : 0.f;
        dp[nt][e] = p * (dp[nt][e] - (e < 2 ? D0 : D1));
      }
    }
    // dQ += dS K (B[k = key][n = d] = K[key][d], ldmatrix.trans).
#pragma unroll
    for (int kc2 = 0; kc2 < kBlk / 16; kc2++) {
      uint32_t da[4];
      acc_to_a(da, dp[2 * kc2], dp[2 * kc2 + 1]);
#pragma unroll
      for (int dt = 0; dt < DT; dt += 2) {
        uint32_t kb[4];
        ldsm_b_pair_trans(kb, K, P, kc2 * 16, dt * 8, lane);
        mma_bf16(dq[dt], da, kb[0], kb[1]);
        mma_bf16(dq[dt + 1], da, kb[2], kb[3]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  if (t0 < T) {
    bf16_t* row = dqkv + (int64_t(b) * T + t0) * C3 + int64_t(h) * HS;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * c) =
          pack_bf16(dq[dt][0] * scale, dq[dt][1] * scale);
  }
  if (t1 < T) {
    bf16_t* row = dqkv + (int64_t(b) * T + t1) * C3 + int64_t(h) * HS;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * c) =
          pack_bf16(dq[dt][2] * scale, dq[dt][3] * scale);
  }
}

// dqkv's q columns [B*T rows][NH*HS] = scale * dq_accum (the atomic backward's second pass).
__global__ void dq_from_accum_kernel(bf16_t* __restrict__ dqkv, const float* __restrict__ acc,
                                     int64_t rows, int64_t C, int64_t C3, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * C;
       i += int64_t(gridDim.x) * blockDim.x)
    dqkv[i / C * C3 + i % C] = __float2bfloat16_rn(acc[i] * scale);
}

template <int HS>
constexpr size_t tile_bytes() {
  return sizeof(bf16_t) * kBlk * (HS + 8);
}

template <int HS>
void forward_hs(bf16_t* out, float* lse, const bf16_t* qkv, const int32_t* doc_start, int B,
                int T, int NH, int KVH, cudaStream_t stream) {
  const size_t smem = 5 * tile_bytes<HS>();  // Q + 2 stages of K, V
  const auto forward = doc_start ? attn_fwd_bf16_kernel<HS, true> : attn_fwd_bf16_kernel<HS, false>;
  prepare_smem(forward, smem);
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((T + kBlk - 1) / kBlk));
  forward<<<grid, kThreads, smem, stream>>>(out, lse, qkv, doc_start, T, NH, KVH);
  CUDA_CHECK_LAUNCH();
}

template <int HS>
void backward_hs(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse,
                 const float* delta, const int32_t* doc_start, float* dq_accum, int B, int T,
                 int NH, int KVH, cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((T + kBlk - 1) / kBlk);
  const dim3 grid_kv(static_cast<unsigned>(B * KVH), tiles);  // pass 1: per kv head
  const dim3 grid_q(static_cast<unsigned>(B * NH), tiles);    // pass 2: per query head
  // K, V + 2 stages of Q, dO (+ lse, delta, first visible key; dS with the atomic dQ)
  const size_t smem1 = 6 * tile_bytes<HS>() + 4 * kBlk * sizeof(float) + 2 * kBlk * sizeof(int) +
                       (dq_accum ? sizeof(bf16_t) * kBlk * (kBlk + 8) : 0);
  const auto dkdv =
      dq_accum ? (doc_start ? attn_bwd_dkdv_bf16_kernel<HS, true, true>
                            : attn_bwd_dkdv_bf16_kernel<HS, false, true>)
               : (doc_start ? attn_bwd_dkdv_bf16_kernel<HS, true, false>
                            : attn_bwd_dkdv_bf16_kernel<HS, false, false>);
  prepare_smem(dkdv, smem1);
  if (dq_accum)
    CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, sizeof(float) * B * T * NH * HS, stream));
  dkdv<<<grid_kv, kThreads, smem1, stream>>>(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, T,
                                             NH, KVH);
  CUDA_CHECK_LAUNCH();
  if (dq_accum) {
    dq_from_accum(dqkv, dq_accum, int64_t(B) * T, int64_t(NH) * HS, int64_t(NH + 2 * KVH) * HS,
                  rsqrtf(static_cast<float>(HS)), stream);
    return;
  }
  const size_t smem2 = 6 * tile_bytes<HS>();  // Q, dO + 2 stages of K, V
  const auto dq =
      doc_start ? attn_bwd_dq_bf16_kernel<HS, true> : attn_bwd_dq_bf16_kernel<HS, false>;
  prepare_smem(dq, smem2);
  dq<<<grid_q, kThreads, smem2, stream>>>(dqkv, dout, qkv, lse, delta, doc_start, T, NH, KVH);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void dq_from_accum(bf16_t* dqkv, const float* acc, int64_t rows, int64_t C, int64_t C3,
                   float scale, cudaStream_t stream) {
  dq_from_accum_kernel<<<grid_for(rows * C, 256), 256, 0, stream>>>(dqkv, acc, rows, C, C3,
                                                                    scale);
  CUDA_CHECK_LAUNCH();
}

void attention_forward_impl(bf16_t* out, float* lse, const bf16_t* qkv, const int32_t* doc_start,
                            int B, int T, int NH, int KVH, int HS, cudaStream_t stream) {
  check_dims((T + kBlk - 1) / kBlk <= 65535, "attention: T too large");
  switch (HS) {
    case 32: forward_hs<32>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    case 64: forward_hs<64>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    case 128: forward_hs<128>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    default: check_dims(false, "attention: HS must be 32, 64 or 128");
  }
}

void attention_backward_impl(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv,
                             const float* lse, const float* delta, const int32_t* doc_start,
                             float* dq_accum, int B, int T, int NH, int KVH, int HS,
                             cudaStream_t stream) {
  check_dims((T + kBlk - 1) / kBlk <= 65535, "attention: T too large");
  switch (HS) {
    case 32:
      backward_hs<32>(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, B, T, NH, KVH, stream);
      break;
    case 64:
      backward_hs<64>(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, B, T, NH, KVH, stream);
      break;
    case 128:
      backward_hs<128>(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, B, T, NH, KVH, stream);
      break;
    default: check_dims(false, "attention: HS must be 32, 64 or 128");
  }
}

}  // namespace trident::cuda::detail

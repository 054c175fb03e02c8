// Flash-attention-style causal (grouped-query) attention in exact fp32 on the SIMT cores (the
// parity path). Layouts in attention.cuh; query head h reads kv head h / (NH/KVH).
//
// Tiles of 32 query rows x 32 keys in shared memory; 8 warps per block.
//  * forward (block = one query tile of one (b, h)): each warp owns 4 query rows; lane j scores
//    key j of the tile for its rows, an online softmax (running max m, per-lane partial sums l)
//    rescales the output accumulators, and O += P V with P broadcast by warp shuffles (each lane
//    owns HS/32 output columns). Saves lse = m + log(l).
//  * backward, pass 1 (block = one key tile of one kv head): each warp owns 4 keys; for each
//    query head of the kv head in head order, lane t takes query row t of each query tile at or
//    below the diagonal, recomputes P = exp(scale q.k - lse) and dS = P (dO.v - delta), and
//    accumulates dV += P^T dO and dK += dS^T Q in registers (summed over the query heads there,
//    written once).
//  * backward, pass 2 (block = one query tile): each warp owns 4 rows; lane s takes key s of
//    each key tile, recomputes P and dS, and accumulates dQ += dS K.
// No atomics: every output element is owned by one thread, summed in a fixed order.
// Packed documents (doc_start [B,T], nullptr: none): row t sees keys [doc_start[t], t]; the
// forward and the dQ pass start at the key tile of the query tile's first row's document
// (doc_start is non-decreasing), the dK/dV pass masks. A row with no visible key in a tile
// keeps m = -inf, and the online softmax then rescales by 0 instead of exp(-inf + inf).
// Shared rows read "one row per lane" are padded to HS + 1 floats (no bank conflicts).
#include "kernels/cuda/attention.cuh"

namespace trident::cuda::detail {

namespace {

constexpr int kTile = 32;     // query rows per tile = keys per tile
constexpr int kThreads = 256; // 8 warps
constexpr int kPerWarp = 4;   // rows (or keys) per warp: 8 warps x 4 = 32

template <int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_f32_kernel(float* __restrict__ out, float* __restrict__ lse,
                        const float* __restrict__ qkv, const int32_t* __restrict__ doc_start,
                        int T, int NH, int KVH) {
  if (!kDocs) doc_start = nullptr;  // a constant: the masks compile away
  constexpr int DPL = HS / 32, KP = HS + 1;
  extern __shared__ float smem[];
  float* Qs = smem;               // [kTile][HS]   (broadcast reads)
  float* Ks = Qs + kTile * HS;    // [kTile][KP]   (one row per lane)
  float* Vs = Ks + kTile * KP;    // [kTile][HS]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int kvh = h / (NH / KVH);
  const int tile = gridDim.y - 1 - blockIdx.y;  // largest tiles first
  const int q0 = tile * kTile;
  const int64_t C = int64_t(NH) * HS, C3 = int64_t(NH + 2 * KVH) * HS;
  const float* rows = qkv + int64_t(b) * T * C3;
  const float* qbase = rows + int64_t(h) * HS;
  const float* kbase = rows + int64_t(NH + kvh) * HS;
  const float* vbase = rows + int64_t(NH + KVH + kvh) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = rsqrtf(static_cast<float>(HS));

  for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
    const int r = idx / HS, d = idx % HS, t = q0 + r;
    Qs[idx] = t < T ? qbase[int64_t(t) * C3 + d] : 0.f;
  }
  float m[kPerWarp], l[kPerWarp], o[kPerWarp][DPL];
  int first[kPerWarp];  // each row's first visible key (its document's start)
#pragma unroll
  for (int rr = 0; rr < kPerWarp; rr++) {
    m[rr] = -INFINITY;
    l[rr] = 0.f;
    const int t = q0 + warp * kPerWarp + rr;
    first[rr] = doc_start && t < T ? doc_start[int64_t(b) * T + t] : 0;
#pragma unroll
    for (int k = 0; k < DPL; k++) o[rr][k] = 0.f;
  }
  const int kt_first = doc_start ? doc_start[int64_t(b) * T + q0] / kTile : 0;

  for (int kt = kt_first; kt <= tile; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
      const int r = idx / HS, d = idx % HS, s = k0 + r;
      const bool in = s < T;
      Ks[r * KP + d] = in ? kbase[int64_t(s) * C3 + d] : 0.f;
      Vs[r * HS + d] = in ? vbase[int64_t(s) * C3 + d] : 0.f;
    }
    __syncthreads();
    float sc[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) sc[rr] = 0.f;
#pragma unroll 8
    for (int d = 0; d < HS; d++) {
      const float kv = Ks[lane * KP + d];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; rr++) sc[rr] += Qs[(warp * kPerWarp + rr) * HS + d] * kv;
    }
    const int s = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) {
      const int t = q0 + warp * kPerWarp + rr;
      const float x = (s <= t && s < T && s >= first[rr]) ? sc[rr] * scale : -INFINITY;
      const float mn = fmaxf(m[rr], warp_max(x));  // -inf: no visible key yet (documents)
      const float base = kDocs && mn == -INFINITY ? 0.f : mn;
      const float alpha = expf(m[rr] - base);
      const float p = expf(x - base);
      l[rr] = l[rr] * alpha + p;
      m[rr] = mn;
#pragma unroll
      for (int k = 0; k < DPL; k++) o[rr][k] *= alpha;
      sc[rr] = p;
    }
#pragma unroll 4
    for (int j = 0; j < kTile; j++) {
      float v[DPL];
#pragma unroll
      for (int k = 0; k < DPL; k++) v[k] = Vs[j * HS + lane + 32 * k];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; rr++) {
        const float pj = __shfl_sync(0xffffffffu, sc[rr], j);
#pragma unroll
        for (int k = 0; k < DPL; k++) o[rr][k] += pj * v[k];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kPerWarp; rr++) {
    const int t = q0 + warp * kPerWarp + rr;
    const float L = warp_sum(l[rr]);
    if (t < T) {
      const float inv = 1.f / L;
      float* orow = out + (int64_t(b) * T + t) * C + int64_t(h) * HS;
#pragma unroll
      for (int k = 0; k < DPL; k++) orow[lane + 32 * k] = o[rr][k] * inv;
      if (lane == 0) lse[int64_t(bh) * T + t] = m[rr] + logf(L);
    }
  }
}

template <int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_f32_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                             const float* __restrict__ qkv, const float* __restrict__ lse,
                             const float* __restrict__ delta,
                             const int32_t* __restrict__ doc_start, int T, int NH, int KVH) {
  if (!kDocs) doc_start = nullptr;  // a constant: the masks compile away
  constexpr int DPL = HS / 32, P = HS + 1;
  extern __shared__ float smem[];
  float* Ks = smem;                // [kTile][HS] (warp-uniform reads)
  float* Vs = Ks + kTile * HS;     // [kTile][HS]
  float* Qs = Vs + kTile * HS;     // [kTile][P]
  float* dOs = Qs + kTile * P;     // [kTile][P]
  float* Ls = dOs + kTile * P;     // [kTile]
  float* Ds = Ls + kTile;          // [kTile]
  const int b = blockIdx.x / KVH, kvh = blockIdx.x % KVH;  // block = (b, kv head, key tile)
  const int G = NH / KVH;                                    // query heads per kv head
  const int kt = blockIdx.y;  // small key tiles (most query tiles) first
  const int k0 = kt * kTile;
  const int64_t C = int64_t(NH) * HS, C3 = int64_t(NH + 2 * KVH) * HS;
  const float* rows = qkv + int64_t(b) * T * C3;
  const float* kbase = rows + int64_t(NH + kvh) * HS;
  const float* vbase = rows + int64_t(NH + KVH + kvh) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = rsqrtf(static_cast<float>(HS));

  for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
    const int r = idx / HS, d = idx % HS, s = k0 + r;
    const bool in = s < T;
    Ks[idx] = in ? kbase[int64_t(s) * C3 + d] : 0.f;
    Vs[idx] = in ? vbase[int64_t(s) * C3 + d] : 0.f;
  }
  float dk[kPerWarp][DPL], dv[kPerWarp][DPL];
#pragma unroll
  for (int kk = 0; kk < kPerWarp; kk++)
#pragma unroll
    for (int k = 0; k < DPL; k++) dk[kk][k] = dv[kk][k] = 0.f;

  // Iteration `it` visits query head kvh*G + it / per_head, query tile kt + it % per_head: the
  // kv head's query heads in head order, each over its tiles in order. The dK/dV sums over the
  // heads happen in these registers (fixed order, one write at the end); with G = 1 this is the
  // multi-head loop over qt = kt .. nqt-1.
  const int nqt = (T + kTile - 1) / kTile, per_head = nqt - kt;
  for (int it = 0; it < G * per_head; it++) {
    const int h = kvh * G + it / per_head, bh = b * NH + h;
    const int q0 = (kt + it % per_head) * kTile;
    const float* qbase = rows + int64_t(h) * HS;
    const float* gbase = dout + int64_t(b) * T * C + int64_t(h) * HS;
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
      const int r = idx / HS, d = idx % HS, t = q0 + r;
      const bool in = t < T;
      Qs[r * P + d] = in ? qbase[int64_t(t) * C3 + d] : 0.f;
      dOs[r * P + d] = in ? gbase[int64_t(t) * C + d] : 0.f;
    }
    if (threadIdx.x < kTile) {
      const int t = q0 + threadIdx.x;
      Ls[threadIdx.x] = t < T ? lse[int64_t(bh) * T + t] : INFINITY;
      Ds[threadIdx.x] = t < T ? delta[int64_t(bh) * T + t] : 0.f;
    }
    __syncthreads();
    float qk[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int kk = 0; kk < kPerWarp; kk++) qk[kk] = dp[kk] = 0.f;
#pragma unroll 8
    for (int d = 0; d < HS; d++) {
      const float qv = Qs[lane * P + d], gv = dOs[lane * P + d];
#pragma unroll
      for (int kk = 0; kk < kPerWarp; kk++) {
        qk[kk] += qv * Ks[(warp * kPerWarp + kk) * HS + d];
        dp[kk] += gv * Vs[(warp * kPerWarp + kk) * HS + d];
      }
    }
    const int t = q0 + lane;
    const float Lt = Ls[lane], Dt = Ds[lane];
    const int first = doc_start && t < T ? doc_start[int64_t(b) * T + t] : 0;
    float pk[kPerWarp], dsk[kPerWarp];
#pragma unroll
    for (int kk = 0; kk < kPerWarp; kk++) {
      const int s = k0 + warp * kPerWarp + kk;
      const float p = (t >= s && t < T && s >= first) ? expf(qk[kk] * scale - Lt) : 0.f;
      pk[kk] = p;
      dsk[kk] = p * (dp[kk] - Dt);
    }
#pragma unroll 4
    for (int j = 0; j < kTile; j++) {
      float gv[DPL], qv[DPL];
#pragma unroll
      for (int k = 0; k < DPL; k++) {
        gv[k] = dOs[j * P + lane + 32 * k];
        qv[k] = Qs[j * P + lane + 32 * k];
      }
#pragma unroll
      for (int kk = 0; kk < kPerWarp; kk++) {
        const float pj = __shfl_sync(0xffffffffu, pk[kk], j);
        const float dsj = __shfl_sync(0xffffffffu, dsk[kk], j);
#pragma unroll
        for (int k = 0; k < DPL; k++) {
          dv[kk][k] += pj * gv[k];
          dk[kk][k] += dsj * qv[k];
        }
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < kPerWarp; kk++) {
    const int s = k0 + warp * kPerWarp + kk;
    if (s < T) {
      float* row = dqkv + (int64_t(b) * T + s) * C3;
      float* dkrow = row + int64_t(NH + kvh) * HS;
      float* dvrow = row + int64_t(NH + KVH + kvh) * HS;
#pragma unroll
      for (int k = 0; k < DPL; k++) {
        dkrow[lane + 32 * k] = dk[kk][k] * scale;
        dvrow[lane + 32 * k] = dv[kk][k];
      }
    }
  }
}

template <int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_f32_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                           const float* __restrict__ qkv, const float* __restrict__ lse,
                           const float* __restrict__ delta, const int32_t* __restrict__ doc_start,
                           int T, int NH, int KVH) {
  if (!kDocs) doc_start = nullptr;  // a constant: the masks compile away
  constexpr int DPL = HS / 32, P = HS + 1;
  extern __shared__ float smem[];
  float* Qs = smem;               // [kTile][HS] (warp-uniform reads)
  float* dOs = Qs + kTile * HS;   // [kTile][HS]
  float* Ks = dOs + kTile * HS;   // [kTile][P]
  float* Vs = Ks + kTile * P;     // [kTile][P]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int kvh = h / (NH / KVH);
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kTile;
  const int64_t C = int64_t(NH) * HS, C3 = int64_t(NH + 2 * KVH) * HS;
  const float* rows = qkv + int64_t(b) * T * C3;
  const float* qbase = rows + int64_t(h) * HS;
  const float* kbase = rows + int64_t(NH + kvh) * HS;
  const float* vbase = rows + int64_t(NH + KVH + kvh) * HS;
  const float* gbase = dout + int64_t(b) * T * C + int64_t(h) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = rsqrtf(static_cast<float>(HS));

  for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
    const int r = idx / HS, d = idx % HS, t = q0 + r;
    const bool in = t < T;
    Qs[idx] = in ? qbase[int64_t(t) * C3 + d] : 0.f;
    dOs[idx] = in ? gbase[int64_t(t) * C + d] : 0.f;
  }
  float Lr[kPerWarp], Dr[kPerWarp], dq[kPerWarp][DPL];
  int first[kPerWarp];  // each row's first visible key (its document's start)
#pragma unroll
  for (int rr = 0; rr < kPerWarp; rr++) {
    const int t = q0 + warp * kPerWarp + rr;
    Lr[rr] = t < T ? lse[int64_t(bh) * T + t] : INFINITY;
    Dr[rr] = t < T ? delta[int64_t(bh) * T + t] : 0.f;
    first[rr] = doc_start && t < T ? doc_start[int64_t(b) * T + t] : 0;
#pragma unroll
    for (int k = 0; k < DPL; k++) dq[rr][k] = 0.f;
  }
  const int kt_first = doc_start ? doc_start[int64_t(b) * T + q0] / kTile : 0;

  for (int kt = kt_first; kt <= qt; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
      const int r = idx / HS, d = idx % HS, s = k0 + r;
      const bool in = s < T;
      Ks[r * P + d] = in ? kbase[int64_t(s) * C3 + d] : 0.f;
      Vs[r * P + d] = in ? vbase[int64_t(s) * C3 + d] : 0.f;
    }
    __syncthreads();
    float qk[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) qk[rr] = dp[rr] = 0.f;
#pragma unroll 8
    for (int d = 0; d < HS; d++) {
      const float kv = Ks[lane * P + d], vv = Vs[lane * P + d];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; rr++) {
        qk[rr] += Qs[(warp * kPerWarp + rr) * HS + d] * kv;
        dp[rr] += dOs[(warp * kPerWarp + rr) * HS + d] * vv;
      }
    }
    const int s = k0 + lane;
    float ds[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) {
      const int t = q0 + warp * kPerWarp + rr;
      const float p = (s <= t && s < T && s >= first[rr]) ? expf(qk[rr] * scale - Lr[rr]) : 0.f;
      ds[rr] = p * (dp[rr] - Dr[rr]);
    }
#pragma unroll 4
    for (int j = 0; j < kTile; j++) {
      float kv[DPL];
#pragma unroll
      for (int k = 0; k < DPL; k++) kv[k] = Ks[j * P + lane + 32 * k];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; rr++) {
        const float dsj = __shfl_sync(0xffffffffu, ds[rr], j);
#pragma unroll
        for (int k = 0; k < DPL; k++) dq[rr][k] += dsj * kv[k];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kPerWarp; rr++) {
    const int t = q0 + warp * kPerWarp + rr;
    if (t < T) {
      float* row = dqkv + (int64_t(b) * T + t) * C3 + int64_t(h) * HS;
#pragma unroll
      for (int k = 0; k < DPL; k++) row[lane + 32 * k] = dq[rr][k] * scale;
    }
  }
}

template <int HS>
void forward_hs(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                int NH, int KVH, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (kTile * HS + kTile * (HS + 1) + kTile * HS);
  const auto forward = doc_start ? attn_fwd_f32_kernel<HS, true> : attn_fwd_f32_kernel<HS, false>;
  prepare_smem(forward, smem);
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((T + kTile - 1) / kTile));
  forward<<<grid, kThreads, smem, stream>>>(out, lse, qkv, doc_start, T, NH, KVH);
  CUDA_CHECK_LAUNCH();
}

template <int HS>
void backward_hs(float* dqkv, const float* dout, const float* qkv, const float* lse,
                 const float* delta, const int32_t* doc_start, int B, int T, int NH, int KVH,
                 cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((T + kTile - 1) / kTile);
  const dim3 grid_kv(static_cast<unsigned>(B * KVH), tiles);  // pass 1: per kv head
  const dim3 grid_q(static_cast<unsigned>(B * NH), tiles);    // pass 2: per query head
  const size_t smem1 = sizeof(float) * (2 * kTile * HS + 2 * kTile * (HS + 1) + 2 * kTile);
  const auto dkdv =
      doc_start ? attn_bwd_dkdv_f32_kernel<HS, true> : attn_bwd_dkdv_f32_kernel<HS, false>;
  prepare_smem(dkdv, smem1);
  dkdv<<<grid_kv, kThreads, smem1, stream>>>(dqkv, dout, qkv, lse, delta, doc_start, T, NH, KVH);
  CUDA_CHECK_LAUNCH();
  const size_t smem2 = sizeof(float) * (2 * kTile * HS + 2 * kTile * (HS + 1));
  const auto dq = doc_start ? attn_bwd_dq_f32_kernel<HS, true> : attn_bwd_dq_f32_kernel<HS, false>;
  prepare_smem(dq, smem2);
  dq<<<grid_q, kThreads, smem2, stream>>>(dqkv, dout, qkv, lse, delta, doc_start, T, NH, KVH);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward_impl(float* out, float* lse, const float* qkv, const int32_t* doc_start,
                            int B, int T, int NH, int KVH, int HS, cudaStream_t stream) {
  check_dims((T + kTile - 1) / kTile <= 65535, "attention: T too large");
  switch (HS) {
    case 32: forward_hs<32>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    case 64: forward_hs<64>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    case 128: forward_hs<128>(out, lse, qkv, doc_start, B, T, NH, KVH, stream); break;
    default: check_dims(false, "attention: HS must be 32, 64 or 128");
  }
}

void attention_backward_impl(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* delta, const int32_t* doc_start, int B, int T, int NH,
                             int KVH, int HS, cudaStream_t stream) {
  check_dims((T + kTile - 1) / kTile <= 65535, "attention: T too large");
  switch (HS) {
    case 32:
      backward_hs<32>(dqkv, dout, qkv, lse, delta, doc_start, B, T, NH, KVH, stream);
      break;
    case 64:
      backward_hs<64>(dqkv, dout, qkv, lse, delta, doc_start, B, T, NH, KVH, stream);
      break;
    case 128:
      backward_hs<128>(dqkv, dout, qkv, lse, delta, doc_start, B, T, NH, KVH, stream);
      break;
    default: check_dims(false, "attention: HS must be 32, 64 or 128");
  }
}

}  // namespace trident::cuda::detail

// Context-parallel (ring) attention on the GPU: the twins of kernels/cpu/context_attention.cpp
// (contracts in kernels/cpu/ops.hpp, "context parallelism"), storage T float or bf16, arithmetic
// fp32. The saved state is attention_forward's: lse[B,NH,Tl], the natural-log logsumexp of the
// scaled scores of each query row, so the ring's step 0 (attention_forward on the local rows)
// and the merges below compose.
//
// A block of another rank's keys is seen whole by the query rows it is merged into (the caller
// picks the ranges), so these are attention_f32.cu's SIMT kernels without the causal mask, on
// query rows [q0, q0+Tq) of qkv[B,Tl,CQ] and key rows [k0, k0+Tk) of kv[B,Tl,KVC]
// (KVC = 2*KVH*HS: [k of kv heads | v of kv heads] per row). Tiles of 32 rows x 32 keys in
// shared memory (fp32), 8 warps per block, each warp owning 4 rows (or keys):
//  * merge forward (block = one query tile of one (b, h)): the online softmax of the block's
//    keys (running max m, per-lane partial sums l), O_blk = P V; then per row
//      lse' = log(exp(lse) + exp(lse_blk)), out' = out exp(lse - lse') + O_blk exp(lse_blk - lse')
//    (lse = -inf: no keys before, out' = O_blk), as the CPU's merge_row.
//  * merge backward, from the FINAL out and lse: delta = rowsum(dout * out) per (b, h, row) into
//    scratch; pass 1 (block = one key tile of one (b, kv head)) loops over the kv head's query
//    heads in head order, each over its query tiles in order, recomputing P = exp(scale q.k -
//    lse) and dS = P (dO.v - delta), and accumulates dV += P^T dO, dK += scale dS^T Q in
//    registers, then adds them to dkv once; pass 2 (block = one query tile of one (b, h)) loops
//    over the key tiles in order and adds dQ = scale dS K to dqkv once.
// Deterministic: no atomics; every output element is read, updated and written by one thread,
// its sum taken in a fixed order that depends on the shapes only (bitwise reproducible run to
// run on one GPU model). The order differs from the CPU's (blocked GEMMs), so the two agree to
// rounding, not to the bit.
#include "kernels/cuda/attention.cuh"

namespace trident::cuda {

namespace {

constexpr int kTile = 32;      // query rows per tile = keys per tile
constexpr int kThreads = 256;  // 8 warps
constexpr int kPerWarp = 4;    // rows (or keys) per warp: 8 warps x 4 = 32
// Two blocks per SM: up to 128 registers a thread. Left to itself ptxas gave sm_80 64-80 and
// spilled the backward's accumulators (4-16 bytes).
constexpr int kMinBlocks = 2;

// The strides of one ring call: qkv rows CQ = (NH + 2 KVH) HS, kv rows KVC = 2 KVH HS, out and
// dout rows C = NH HS; the local sequence has Tl rows.
struct Ring {
  int Tl, NH, KVH;
  int q0, Tq, k0, Tk;  // query rows [q0, q0+Tq), key rows [k0, k0+Tk) of the block
  int64_t CQ, KVC, C;
};

Ring make_ring(int64_t Tl, int64_t q0, int64_t Tq, int64_t k0, int64_t Tk, int64_t NH,
               int64_t KVH, int64_t HS) {
  return {static_cast<int>(Tl), static_cast<int>(NH), static_cast<int>(KVH),
          static_cast<int>(q0), static_cast<int>(Tq), static_cast<int>(k0),
          static_cast<int>(Tk), (NH + 2 * KVH) * HS, 2 * KVH * HS, NH * HS};
}

// Shape checks shared by the merges: the attention's (attention.cuh) and the ranges inside the
// local sequence. Returns false when there is nothing to do (an empty range).
bool check_ring_dims(int64_t B, int64_t Tl, int64_t q0, int64_t Tq, int64_t k0, int64_t Tk,
                     int64_t NH, int64_t KVH, int64_t HS, const char* what) {
  detail::check_attention_dims(B, Tl, NH, KVH, HS);
  detail::check_dims(q0 >= 0 && k0 >= 0 && Tq >= 0 && Tk >= 0 && q0 + Tq <= Tl && k0 + Tk <= Tl,
                     what);
  detail::check_dims((Tq + kTile - 1) / kTile <= 65535 && (Tk + kTile - 1) / kTile <= 65535,
                     "ring attention: Tq or Tk too large");
  return Tq > 0 && Tk > 0;
}

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    merge_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv,
                     const T* __restrict__ kv, Ring r) {
  using detail::to_f32;
  constexpr int DPL = HS / 32, KP = HS + 1;
  extern __shared__ float smem[];
  float* Qs = smem;             // [kTile][HS]   (broadcast reads)
  float* Ks = Qs + kTile * HS;  // [kTile][KP]   (one row per lane)
  float* Vs = Ks + kTile * KP;  // [kTile][HS]
  const int bh = blockIdx.x, b = bh / r.NH, h = bh % r.NH;
  const int kvh = h / (r.NH / r.KVH);
  const int t0 = r.q0 + blockIdx.y * kTile, t_end = r.q0 + r.Tq, s_end = r.k0 + r.Tk;
  const T* qbase = qkv + int64_t(b) * r.Tl * r.CQ + int64_t(h) * HS;
  const T* kbase = kv + int64_t(b) * r.Tl * r.KVC + int64_t(kvh) * HS;
  const T* vbase = kv + int64_t(b) * r.Tl * r.KVC + int64_t(r.KVH + kvh) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = rsqrtf(static_cast<float>(HS));

  for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
    const int row = idx / HS, d = idx % HS, t = t0 + row;
    Qs[idx] = t < t_end ? to_f32(qbase[int64_t(t) * r.CQ + d]) : 0.f;
  }
  float m[kPerWarp], l[kPerWarp], o[kPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kPerWarp; rr++) {
    m[rr] = -INFINITY;
    l[rr] = 0.f;
#pragma unroll
    for (int k = 0; k < DPL; k++) o[rr][k] = 0.f;
  }

  for (int s0 = r.k0; s0 < s_end; s0 += kTile) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
      const int row = idx / HS, d = idx % HS, s = s0 + row;
      const bool in = s < s_end;
      Ks[row * KP + d] = in ? to_f32(kbase[int64_t(s) * r.KVC + d]) : 0.f;
      Vs[row * HS + d] = in ? to_f32(vbase[int64_t(s) * r.KVC + d]) : 0.f;
    }
    __syncthreads();
    float sc[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) sc[rr] = 0.f;
#pragma unroll 8
    for (int d = 0; d < HS; d++) {
      const float kd = Ks[lane * KP + d];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; rr++) sc[rr] += Qs[(warp * kPerWarp + rr) * HS + d] * kd;
    }
    const bool key_in = s0 + lane < s_end;
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) {
      const float x = key_in ? sc[rr] * scale : -INFINITY;
      const float mn = fmaxf(m[rr], detail::warp_max(x));  // finite: key s0 is in every tile
      const float alpha = expf(m[rr] - mn);
      const float p = expf(x - mn);
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
    const int t = t0 + warp * kPerWarp + rr;
    const float L = detail::warp_sum(l[rr]);
    if (t >= t_end) continue;  // warp-uniform
    T* orow = out + (int64_t(b) * r.Tl + t) * r.C + int64_t(h) * HS;
    float* lse_t = lse + int64_t(bh) * r.Tl + t;
    const float lse_blk = m[rr] + logf(L);
    const float prev = *lse_t;
    float merged, w_prev, w_blk;
    if (prev == -INFINITY) {  // no keys before: the block's result as is
      merged = lse_blk;
      w_prev = 0.f;
      w_blk = 1.f / L;
    } else {
      merged = fmaxf(prev, lse_blk) + log1pf(expf(-fabsf(prev - lse_blk)));
      w_prev = expf(prev - merged);
      w_blk = expf(lse_blk - merged) / L;  // also normalises O_blk
    }
#pragma unroll
    for (int k = 0; k < DPL; k++) {
      T* e = orow + lane + 32 * k;
      const float before = prev == -INFINITY ? 0.f : to_f32(*e) * w_prev;
      *e = detail::from_f32<T>(before + o[rr][k] * w_blk);
    }
    __syncwarp();  // every lane has read lse[t] before it changes
    if (lane == 0) *lse_t = merged;
  }
}

// delta[(b*NH + h)*Tq + t - q0] = sum_d dout[b,t,h,d] * out[b,t,h,d] for t in [q0, q0+Tq): one
// warp per (b, t, h).
template <typename T>
__global__ void merge_delta_kernel(float* __restrict__ delta, const T* __restrict__ dout,
                                   const T* __restrict__ out, int B, Ring r, int HS) {
  const int64_t rows = int64_t(B) * r.Tq * r.NH;
  const int lane = threadIdx.x & 31;
  const int64_t warp = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (warp >= rows) return;
  const int h = static_cast<int>(warp % r.NH);
  const int64_t bt = warp / r.NH;  // b * Tq + (t - q0)
  const int64_t b = bt / r.Tq, i = bt % r.Tq;
  const int64_t row = (b * r.Tl + r.q0 + i) * r.C + int64_t(h) * HS;
  float acc = 0.f;
  for (int d = lane; d < HS; d += 32)
    acc += detail::to_f32(dout[row + d]) * detail::to_f32(out[row + d]);
  acc = detail::warp_sum(acc);
  if (lane == 0) delta[(b * r.NH + h) * r.Tq + i] = acc;
}

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    merge_bwd_dkdv_kernel(T* __restrict__ dkv, const T* __restrict__ dout,
                          const T* __restrict__ qkv, const T* __restrict__ kv,
                          const float* __restrict__ lse, const float* __restrict__ delta, Ring r) {
  using detail::to_f32;
  constexpr int DPL = HS / 32, P = HS + 1;
  extern __shared__ float smem[];
  float* Ks = smem;             // [kTile][HS] (warp-uniform reads)
  float* Vs = Ks + kTile * HS;  // [kTile][HS]
  float* Qs = Vs + kTile * HS;  // [kTile][P]
  float* dOs = Qs + kTile * P;  // [kTile][P]
  float* Ls = dOs + kTile * P;  // [kTile]
  float* Ds = Ls + kTile;       // [kTile]
  const int b = blockIdx.x / r.KVH, kvh = blockIdx.x % r.KVH;  // block = (b, kv head, key tile)
  const int G = r.NH / r.KVH;
  const int s0 = r.k0 + blockIdx.y * kTile, s_end = r.k0 + r.Tk, t_end = r.q0 + r.Tq;
  const T* qrows = qkv + int64_t(b) * r.Tl * r.CQ;
  const T* kbase = kv + int64_t(b) * r.Tl * r.KVC + int64_t(kvh) * HS;
  const T* vbase = kv + int64_t(b) * r.Tl * r.KVC + int64_t(r.KVH + kvh) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = rsqrtf(static_cast<float>(HS));

  for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
    const int row = idx / HS, d = idx % HS, s = s0 + row;
    const bool in = s < s_end;
    Ks[idx] = in ? to_f32(kbase[int64_t(s) * r.KVC + d]) : 0.f;
    Vs[idx] = in ? to_f32(vbase[int64_t(s) * r.KVC + d]) : 0.f;
  }
  float dk[kPerWarp][DPL], dv[kPerWarp][DPL];
#pragma unroll
  for (int kk = 0; kk < kPerWarp; kk++)
#pragma unroll
    for (int k = 0; k < DPL; k++) dk[kk][k] = dv[kk][k] = 0.f;

  // Iteration `it`: query head kvh*G + it / nqt, query tile it % nqt: the kv head's query heads
  // in head order, each over its tiles in order (the sums over the heads stay in registers).
  const int nqt = (r.Tq + kTile - 1) / kTile;
  for (int it = 0; it < G * nqt; it++) {
    const int h = kvh * G + it / nqt, bh = b * r.NH + h;
    const int t0 = r.q0 + (it % nqt) * kTile;
    const T* qbase = qrows + int64_t(h) * HS;
    const T* gbase = dout + int64_t(b) * r.Tl * r.C + int64_t(h) * HS;
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
      const int row = idx / HS, d = idx % HS, t = t0 + row;
      const bool in = t < t_end;
      Qs[row * P + d] = in ? to_f32(qbase[int64_t(t) * r.CQ + d]) : 0.f;
      dOs[row * P + d] = in ? to_f32(gbase[int64_t(t) * r.C + d]) : 0.f;
    }
    if (threadIdx.x < kTile) {
      const int t = t0 + threadIdx.x;
      const bool in = t < t_end;
      Ls[threadIdx.x] = in ? lse[int64_t(bh) * r.Tl + t] : INFINITY;
      Ds[threadIdx.x] = in ? delta[int64_t(bh) * r.Tq + (t - r.q0)] : 0.f;
    }
    __syncthreads();
    float qk[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int kk = 0; kk < kPerWarp; kk++) qk[kk] = dp[kk] = 0.f;
#pragma unroll 8
    for (int d = 0; d < HS; d++) {
      const float qd = Qs[lane * P + d], gd = dOs[lane * P + d];
#pragma unroll
      for (int kk = 0; kk < kPerWarp; kk++) {
        qk[kk] += qd * Ks[(warp * kPerWarp + kk) * HS + d];
        dp[kk] += gd * Vs[(warp * kPerWarp + kk) * HS + d];
      }
    }
    const bool row_in = t0 + lane < t_end;
    const float Lt = Ls[lane], Dt = Ds[lane];
    float pk[kPerWarp], dsk[kPerWarp];
#pragma unroll
    for (int kk = 0; kk < kPerWarp; kk++) {
      const bool key_in = s0 + warp * kPerWarp + kk < s_end;
      const float p = (row_in && key_in) ? expf(qk[kk] * scale - Lt) : 0.f;
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
    const int s = s0 + warp * kPerWarp + kk;
    if (s >= s_end) continue;
    T* row = dkv + (int64_t(b) * r.Tl + s) * r.KVC;
    T* dkrow = row + int64_t(kvh) * HS;
    T* dvrow = row + int64_t(r.KVH + kvh) * HS;
#pragma unroll
    for (int k = 0; k < DPL; k++) {
      const int c = lane + 32 * k;
      dkrow[c] = detail::from_f32<T>(to_f32(dkrow[c]) + dk[kk][k] * scale);
      dvrow[c] = detail::from_f32<T>(to_f32(dvrow[c]) + dv[kk][k]);
    }
  }
}

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    merge_bwd_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout,
                        const T* __restrict__ qkv, const T* __restrict__ kv,
                        const float* __restrict__ lse, const float* __restrict__ delta, Ring r) {
  using detail::to_f32;
  constexpr int DPL = HS / 32, P = HS + 1;
  extern __shared__ float smem[];
  float* Qs = smem;              // [kTile][HS] (warp-uniform reads)
  float* dOs = Qs + kTile * HS;  // [kTile][HS]
  float* Ks = dOs + kTile * HS;  // [kTile][P]
  float* Vs = Ks + kTile * P;    // [kTile][P]
  const int bh = blockIdx.x, b = bh / r.NH, h = bh % r.NH;
  const int kvh = h / (r.NH / r.KVH);
  const int t0 = r.q0 + blockIdx.y * kTile, t_end = r.q0 + r.Tq, s_end = r.k0 + r.Tk;
  const T* qbase = qkv + int64_t(b) * r.Tl * r.CQ + int64_t(h) * HS;
  const T* kbase = kv + int64_t(b) * r.Tl * r.KVC + int64_t(kvh) * HS;
  const T* vbase = kv + int64_t(b) * r.Tl * r.KVC + int64_t(r.KVH + kvh) * HS;
  const T* gbase = dout + int64_t(b) * r.Tl * r.C + int64_t(h) * HS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = rsqrtf(static_cast<float>(HS));

  for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
    const int row = idx / HS, d = idx % HS, t = t0 + row;
    const bool in = t < t_end;
    Qs[idx] = in ? to_f32(qbase[int64_t(t) * r.CQ + d]) : 0.f;
    dOs[idx] = in ? to_f32(gbase[int64_t(t) * r.C + d]) : 0.f;
  }
  float Lr[kPerWarp], Dr[kPerWarp], dq[kPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kPerWarp; rr++) {
    const int t = t0 + warp * kPerWarp + rr;
    const bool in = t < t_end;
    Lr[rr] = in ? lse[int64_t(bh) * r.Tl + t] : INFINITY;
    Dr[rr] = in ? delta[int64_t(bh) * r.Tq + (t - r.q0)] : 0.f;
#pragma unroll
    for (int k = 0; k < DPL; k++) dq[rr][k] = 0.f;
  }

  for (int s0 = r.k0; s0 < s_end; s0 += kTile) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads) {
      const int row = idx / HS, d = idx % HS, s = s0 + row;
      const bool in = s < s_end;
      Ks[row * P + d] = in ? to_f32(kbase[int64_t(s) * r.KVC + d]) : 0.f;
      Vs[row * P + d] = in ? to_f32(vbase[int64_t(s) * r.KVC + d]) : 0.f;
    }
    __syncthreads();
    float qk[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) qk[rr] = dp[rr] = 0.f;
#pragma unroll 8
    for (int d = 0; d < HS; d++) {
      const float kd = Ks[lane * P + d], vd = Vs[lane * P + d];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; rr++) {
        qk[rr] += Qs[(warp * kPerWarp + rr) * HS + d] * kd;
        dp[rr] += dOs[(warp * kPerWarp + rr) * HS + d] * vd;
      }
    }
    const bool key_in = s0 + lane < s_end;
    float ds[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; rr++) {
      const float p = key_in ? expf(qk[rr] * scale - Lr[rr]) : 0.f;  // Lr = inf: row outside
      ds[rr] = p * (dp[rr] - Dr[rr]);
    }
#pragma unroll 4
    for (int j = 0; j < kTile; j++) {
      float kj[DPL];
#pragma unroll
      for (int k = 0; k < DPL; k++) kj[k] = Ks[j * P + lane + 32 * k];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; rr++) {
        const float dsj = __shfl_sync(0xffffffffu, ds[rr], j);
#pragma unroll
        for (int k = 0; k < DPL; k++) dq[rr][k] += dsj * kj[k];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kPerWarp; rr++) {
    const int t = t0 + warp * kPerWarp + rr;
    if (t >= t_end) continue;
    T* row = dqkv + (int64_t(b) * r.Tl + t) * r.CQ + int64_t(h) * HS;
#pragma unroll
    for (int k = 0; k < DPL; k++) {
      const int c = lane + 32 * k;
      row[c] = detail::from_f32<T>(to_f32(row[c]) + dq[rr][k] * scale);
    }
  }
}

template <typename T, int HS>
void merge_forward_hs(T* out, float* lse, const T* qkv, const T* kv, int B, const Ring& r,
                      cudaStream_t stream) {
  const size_t smem = sizeof(float) * (kTile * HS + kTile * (HS + 1) + kTile * HS);
  detail::prepare_smem(merge_fwd_kernel<T, HS>, smem);
  const dim3 grid(static_cast<unsigned>(B * r.NH),
                  static_cast<unsigned>((r.Tq + kTile - 1) / kTile));
  merge_fwd_kernel<T, HS><<<grid, kThreads, smem, stream>>>(out, lse, qkv, kv, r);
  CUDA_CHECK_LAUNCH();
}

template <typename T, int HS>
void merge_backward_hs(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv,
                       const float* lse, const float* delta, int B, const Ring& r,
                       cudaStream_t stream) {
  const dim3 grid_kv(static_cast<unsigned>(B * r.KVH),
                     static_cast<unsigned>((r.Tk + kTile - 1) / kTile));
  const dim3 grid_q(static_cast<unsigned>(B * r.NH),
                    static_cast<unsigned>((r.Tq + kTile - 1) / kTile));
  const size_t smem1 = sizeof(float) * (2 * kTile * HS + 2 * kTile * (HS + 1) + 2 * kTile);
  detail::prepare_smem(merge_bwd_dkdv_kernel<T, HS>, smem1);
  merge_bwd_dkdv_kernel<T, HS><<<grid_kv, kThreads, smem1, stream>>>(dkv, dout, qkv, kv, lse,
                                                                      delta, r);
  CUDA_CHECK_LAUNCH();
  const size_t smem2 = sizeof(float) * (2 * kTile * HS + 2 * kTile * (HS + 1));
  detail::prepare_smem(merge_bwd_dq_kernel<T, HS>, smem2);
  merge_bwd_dq_kernel<T, HS><<<grid_q, kThreads, smem2, stream>>>(dqkv, dout, qkv, kv, lse,
                                                                  delta, r);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void kv_pack(T* kv, const T* qkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS,
             cudaStream_t stream) {
  detail::check_dims(N >= 0 && NH > 0 && KVH > 0 && HS > 0, "kv_pack: negative or empty size");
  if (N == 0) return;
  const size_t row = sizeof(T) * static_cast<size_t>(2 * KVH * HS);
  const size_t pitch = sizeof(T) * static_cast<size_t>((NH + 2 * KVH) * HS);
  CUDA_CHECK(cudaMemcpy2DAsync(kv, row, qkv + NH * HS, pitch, row,
                               static_cast<size_t>(N), cudaMemcpyDeviceToDevice, stream));
}

template <typename T>
void kv_unpack(T* dqkv, const T* dkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS,
               cudaStream_t stream) {
  detail::check_dims(N >= 0 && NH > 0 && KVH > 0 && HS > 0, "kv_unpack: negative or empty size");
  if (N == 0) return;
  const size_t row = sizeof(T) * static_cast<size_t>(2 * KVH * HS);
  const size_t pitch = sizeof(T) * static_cast<size_t>((NH + 2 * KVH) * HS);
  CUDA_CHECK(cudaMemcpy2DAsync(dqkv + NH * HS, pitch, dkv, row, row,
                               static_cast<size_t>(N), cudaMemcpyDeviceToDevice, stream));
}

template <typename T>
void attention_merge_forward(T* out, float* lse, const T* qkv, const T* kv, int64_t B,
                             int64_t Tl, int64_t q0, int64_t Tq, int64_t k0, int64_t Tk,
                             int64_t NH, int64_t KVH, int64_t HS, cudaStream_t stream) {
  if (!check_ring_dims(B, Tl, q0, Tq, k0, Tk, NH, KVH, HS,
                       "attention_merge_forward: the query and key ranges must lie in [0, Tl)"))
    return;
  const Ring r = make_ring(Tl, q0, Tq, k0, Tk, NH, KVH, HS);
  const int b = static_cast<int>(B);
  switch (HS) {
    case 32: merge_forward_hs<T, 32>(out, lse, qkv, kv, b, r, stream); break;
    case 64: merge_forward_hs<T, 64>(out, lse, qkv, kv, b, r, stream); break;
    default: merge_forward_hs<T, 128>(out, lse, qkv, kv, b, r, stream); break;  // checked
  }
}

size_t attention_merge_backward_workspace_bytes(int64_t B, int64_t Tq, int64_t NH) {
  return static_cast<size_t>(B * NH * Tq) * sizeof(float);
}

template <typename T>
void attention_merge_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv,
                              const T* out, const float* lse, int64_t B, int64_t Tl, int64_t q0,
                              int64_t Tq, int64_t k0, int64_t Tk, int64_t NH, int64_t KVH,
                              int64_t HS, cudaStream_t stream, void* workspace) {
  if (!check_ring_dims(B, Tl, q0, Tq, k0, Tk, NH, KVH, HS,
                       "attention_merge_backward: the query and key ranges must lie in [0, Tl)"))
    return;
  const Ring r = make_ring(Tl, q0, Tq, k0, Tk, NH, KVH, HS);
  const int b = static_cast<int>(B);
  detail::Scratch scratch(workspace, attention_merge_backward_workspace_bytes(B, Tq, NH), stream);
  float* delta = scratch.as<float>();
  merge_delta_kernel<T><<<detail::grid_for(B * Tq * NH, 8, INT32_MAX), 256, 0, stream>>>(
      delta, dout, out, b, r, static_cast<int>(HS));
  CUDA_CHECK_LAUNCH();
  switch (HS) {
    case 32: merge_backward_hs<T, 32>(dqkv, dkv, dout, qkv, kv, lse, delta, b, r, stream); break;
    case 64: merge_backward_hs<T, 64>(dqkv, dkv, dout, qkv, kv, lse, delta, b, r, stream); break;
    default:
      merge_backward_hs<T, 128>(dqkv, dkv, dout, qkv, kv, lse, delta, b, r, stream);
      break;  // checked
  }
}

#define TRIDENT_INSTANTIATE(T)                                                                 \
  template void kv_pack<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);    \
  template void kv_unpack<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);  \
  template void attention_merge_forward<T>(T*, float*, const T*, const T*, int64_t, int64_t,   \
                                           int64_t, int64_t, int64_t, int64_t, int64_t,        \
                                           int64_t, int64_t, cudaStream_t);                    \
  template void attention_merge_backward<T>(T*, T*, const T*, const T*, const T*, const T*,    \
                                            const float*, int64_t, int64_t, int64_t, int64_t,  \
                                            int64_t, int64_t, int64_t, int64_t, int64_t,       \
                                            cudaStream_t, void*);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

// Mixture-of-experts kernels on the GPU (kernels/cuda/ops.hpp; the CPU twins and the maths are
// kernels/cpu/moe.hpp and docs/moe.md). fp32 activations. The router, its losses and the
// per-row sums are computed in double like the CPU's, each sum in the CPU's order where one
// thread owns it (so the results match the CPU to rounding, and the top-k choice exactly on
// inputs without near ties). No atomics: deterministic.
//
// The dispatch plan is three small kernels over (sequence, expert) pairs: count the
// assignments, turn the counts into per-expert row offsets (one block), then hand out the rows
// in (token, choice) order. Each (sequence, expert) thread scans its sequence's assignments in
// order, which is what makes the capacity rule "the first `capacity` assignments of the
// sequence" and the row order identical to the CPU's. The grouped expert GEMMs are one cuBLAS
// linear per expert over its row range, empty experts skipped.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr int kThreads = 256;

// log(sum_e exp(row[e])) in double; p (when not nullptr) = softmax(row).
__device__ double softmax_row(double* p, const float* row, int64_t E) {
  double mx = -INFINITY;
  for (int64_t e = 0; e < E; e++) mx = fmax(mx, static_cast<double>(row[e]));
  double sum = 0.0;
  for (int64_t e = 0; e < E; e++) sum += exp(static_cast<double>(row[e]) - mx);
  if (p != nullptr)
    for (int64_t e = 0; e < E; e++) p[e] = exp(static_cast<double>(row[e]) - mx) / sum;
  return mx + log(sum);
}

// One thread per token. The K largest probabilities by repeated selection (strictly greater
// wins, so equal probabilities go to the lower expert first, like the CPU's partial sort).
__global__ void router_forward_kernel(float* probs, int32_t* expert, float* weight,
                                      const float* logits, int64_t N, int64_t E, int64_t K) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const float* row = logits + n * E;
  const double lse = softmax_row(nullptr, row, E);
  auto prob = [&](int64_t e) { return exp(static_cast<double>(row[e]) - lse); };
  for (int64_t e = 0; e < E; e++) probs[n * E + e] = static_cast<float>(prob(e));
  int32_t* chosen = expert + n * K;
  double total = 0.0;
  for (int64_t k = 0; k < K; k++) {
    int32_t best = -1;
    double best_p = -1.0;
    for (int64_t e = 0; e < E; e++) {
      bool taken = false;
      for (int64_t j = 0; j < k; j++) taken = taken || chosen[j] == e;
      const double p = prob(e);
      if (!taken && p > best_p) best = static_cast<int32_t>(e), best_p = p;
    }
    chosen[k] = best;
    total += best_p;
  }
  for (int64_t k = 0; k < K; k++) weight[n * K + k] = static_cast<float>(prob(chosen[k]) / total);
}

// One thread per token: the renormalisation's backward, then the softmax's.
__global__ void router_backward_kernel(float* dlogits, const float* dweight,
                                       const float* dprobs_extra, const float* probs,
                                       const int32_t* expert, const float* weight, int64_t N,
                                       int64_t E, int64_t K) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + n * E;
  double chosen = 0.0, gw = 0.0;
  for (int64_t k = 0; k < K; k++) {
    chosen += static_cast<double>(p[expert[n * K + k]]);
    gw += static_cast<double>(dweight[n * K + k]) * static_cast<double>(weight[n * K + k]);
  }
  // dp_e = extra + sum over the choices of e (an expert is chosen at most once per token).
  auto dprob = [&](int64_t e) {
    double d = dprobs_extra != nullptr ? static_cast<double>(dprobs_extra[n * E + e]) : 0.0;
    for (int64_t k = 0; k < K; k++)
      if (expert[n * K + k] == e) d += (static_cast<double>(dweight[n * K + k]) - gw) / chosen;
    return d;
  };
  double pdp = 0.0;
  for (int64_t e = 0; e < E; e++) pdp += static_cast<double>(p[e]) * dprob(e);
  for (int64_t e = 0; e < E; e++)
    dlogits[n * E + e] = static_cast<float>(static_cast<double>(p[e]) * (dprob(e) - pdp));
}

// Assignments of sequence b routed to expert e (before dropping), scanning in order.
__device__ int64_t sequence_count(const int32_t* expert, int64_t b, int64_t Tn, int64_t K,
                                  int64_t e) {
  const int32_t* ex = expert + b * Tn * K;
  int64_t c = 0;
  for (int64_t i = 0; i < Tn * K; i++) c += ex[i] == e;
  return c;
}

// One block per sequence; thread e: f_e P_e into shared memory, thread 0 sums them in expert
// order (the CPU's order).
__global__ void aux_loss_forward_kernel(float* aux, const float* probs, const int32_t* expert,
                                        int64_t Tn, int64_t E, int64_t K) {
  extern __shared__ double term[];  // [E]
  const int64_t b = blockIdx.x;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    double P = 0.0;
    for (int64_t t = 0; t < Tn; t++) P += static_cast<double>(probs[(b * Tn + t) * E + e]);
    const double f = static_cast<double>(sequence_count(expert, b, Tn, K, e)) /
                     static_cast<double>(Tn * K);
    term[e] = f * (P / static_cast<double>(Tn));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) sum += term[e];
    aux[b] = static_cast<float>(static_cast<double>(E) * sum);
  }
}

// One block per sequence, a thread per expert: dprobs[t, e] += daux[b] * E * f[b, e] / T.
__global__ void aux_loss_backward_kernel(float* dprobs, const float* daux,
                                         const int32_t* expert, int64_t Tn, int64_t E,
                                         int64_t K) {
  const int64_t b = blockIdx.x;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    const double f = static_cast<double>(sequence_count(expert, b, Tn, K, e)) /
                     static_cast<double>(Tn * K);
    const float g = static_cast<float>(static_cast<double>(daux[b]) * static_cast<double>(E) *
                                       f / static_cast<double>(Tn));
    for (int64_t t = 0; t < Tn; t++) dprobs[(b * Tn + t) * E + e] += g;
  }
}

// One block per sequence: the mean over its tokens of logsumexp^2 (a fixed reduction tree).
__global__ void z_loss_forward_kernel(float* z, const float* logits, int64_t Tn, int64_t E) {
  __shared__ double shared[33];
  const int64_t b = blockIdx.x;
  double sum = 0.0;
  for (int64_t t = threadIdx.x; t < Tn; t += blockDim.x) {
    const double lse = softmax_row(nullptr, logits + (b * Tn + t) * E, E);
    sum += lse * lse;
  }
  sum = detail::block_reduce(sum, shared, detail::SumOp{}, 0.0);
  if (threadIdx.x == 0) z[b] = static_cast<float>(sum / static_cast<double>(Tn));
}

// One thread per token: dlogits[n, e] += dz[b] * 2 * lse * softmax[e] / T.
__global__ void z_loss_backward_kernel(float* dlogits, const float* dz, const float* logits,
                                       int64_t N, int64_t Tn, int64_t E) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const float* row = logits + n * E;
  const double lse = softmax_row(nullptr, row, E);
  const double g = static_cast<double>(dz[n / Tn]) * 2.0 * lse / static_cast<double>(Tn);
  for (int64_t e = 0; e < E; e++)
    dlogits[n * E + e] += static_cast<float>(g * exp(static_cast<double>(row[e]) - lse));
}

// ---------------------------------------------------------------- dispatch plan
// Plan pass 1, one block per sequence, a thread per expert: count[b, e].
__global__ void plan_count_kernel(int64_t* count, const int32_t* expert, int64_t Tn, int64_t E,
                                  int64_t K) {
  const int64_t b = blockIdx.x;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    count[b * E + e] = sequence_count(expert, b, Tn, K, e);
}

// Plan pass 2, one block: load[e] = sum_b count; the kept rows min(count, capacity) give each
// expert's offsets; base[b, e] (in place of count) = the row where sequence b's kept
// assignments to e start.
__global__ void plan_offsets_kernel(int64_t* offsets, int64_t* load, int64_t* count, int64_t B,
                                    int64_t E, int64_t capacity) {
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t routed = 0, kept = 0;
    for (int64_t b = 0; b < B; b++) {
      const int64_t c = count[b * E + e];
      routed += c;
      count[b * E + e] = kept;  // the kept rows of the sequences before b
      kept += capacity == 0 || c < capacity ? c : capacity;
    }
    load[e] = routed;
    offsets[e + 1] = kept;  // made cumulative below
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int64_t e = 0; e < E; e++) offsets[e + 1] += offsets[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    for (int64_t b = 0; b < B; b++) count[b * E + e] += offsets[e];
}

// Plan pass 3, one block per sequence, a thread per expert: the expert's assignments of the
// sequence in (token, choice) order get consecutive rows from base[b, e] until `capacity`.
__global__ void plan_slots_kernel(int64_t* slot, int64_t* slot_token, const int64_t* base,
                                  const int32_t* expert, int64_t Tn, int64_t E, int64_t K,
                                  int64_t capacity) {
  const int64_t b = blockIdx.x;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t row = base[b * E + e], taken = 0;
    for (int64_t i = b * Tn * K; i < (b + 1) * Tn * K; i++) {
      if (expert[i] != e) continue;
      if (capacity != 0 && taken >= capacity) {
        slot[i] = -1;
        continue;
      }
      slot[i] = row;
      slot_token[row] = i / K;
      row++;
      taken++;
    }
  }
}

// ---------------------------------------------------------------- permutation
// dst[m] = src[index[m]] (gather) or dst[index[m]] = src[m] (scatter), one thread per element.
template <bool kScatter>
__global__ void move_rows_kernel(float* dst, const float* src, const int64_t* index, int64_t M,
                                 int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * C;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / C, c = i % C;
    if (kScatter)
      dst[index[m] * C + c] = src[i];
    else
      dst[i] = src[index[m] * C + c];
  }
}

// out[n, c] = sum over token n's kept assignments k (in k order) of w_k * rows[slot[n, k], c],
// w_k = weight[n, k] (nullptr: 1, exact). One thread per element.
__global__ void sum_assigned_rows_kernel(float* out, const float* rows, const int64_t* slot,
                                         const float* weight, int64_t N, int64_t K, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    float acc = 0.f;
    for (int64_t k = 0; k < K; k++) {
      const int64_t s = slot[n * K + k];
      if (s < 0) continue;
      const float w = weight != nullptr ? weight[n * K + k] : 1.f;
      acc += w * rows[s * C + c];
    }
    out[i] = acc;
  }
}

// One warp per assignment (n, k): dy[slot] = w * dout[n]; dweight = dot(dout[n], y[slot]) in
// double (a fixed shuffle tree).
__global__ void unpermute_backward_kernel(float* dy, float* dweight, const float* dout,
                                          const float* y, const int64_t* slot,
                                          const float* weight, int64_t N, int64_t K, int64_t C) {
  const int64_t a = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (a >= N * K) return;  // whole warps leave together (blockDim is a multiple of 32)
  const int64_t s = slot[a];
  if (s < 0) {
    if (lane == 0) dweight[a] = 0.f;
    return;
  }
  const float w = weight[a];
  const float* g = dout + (a / K) * C;
  const float* src = y + s * C;
  float* d = dy + s * C;
  double dot = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    d[c] = w * g[c];
    dot += static_cast<double>(g[c]) * static_cast<double>(src[c]);
  }
  dot = detail::warp_sum(dot);
  if (lane == 0) dweight[a] = static_cast<float>(dot);
}

unsigned row_blocks(int64_t n) { return detail::grid_for(n, kThreads); }

void check_router_dims(int64_t N, int64_t E, int64_t K) {
  detail::check_dims(N >= 0 && E > 0 && K > 0 && K <= E && E <= INT32_MAX,
                     "moe router: N >= 0, 0 < K <= E");
}

}  // namespace

void moe_router_forward(float* probs, int32_t* expert, float* weight, const float* logits,
                        int64_t N, int64_t E, int64_t K, cudaStream_t stream) {
  check_router_dims(N, E, K);
  if (N == 0) return;
  router_forward_kernel<<<row_blocks(N), kThreads, 0, stream>>>(probs, expert, weight, logits,
                                                                 N, E, K);
  CUDA_CHECK_LAUNCH();
}

void moe_router_backward(float* dlogits, const float* dweight, const float* dprobs_extra,
                         const float* probs, const int32_t* expert, const float* weight,
                         int64_t N, int64_t E, int64_t K, cudaStream_t stream) {
  check_router_dims(N, E, K);
  if (N == 0) return;
  router_backward_kernel<<<row_blocks(N), kThreads, 0, stream>>>(
      dlogits, dweight, dprobs_extra, probs, expert, weight, N, E, K);
  CUDA_CHECK_LAUNCH();
}

void moe_aux_loss_forward(float* aux, const float* probs, const int32_t* expert, int64_t B,
                          int64_t Tn, int64_t E, int64_t K, cudaStream_t stream) {
  check_router_dims(B * Tn, E, K);
  detail::check_dims(E <= 4096, "moe_aux_loss_forward: E <= 4096 (shared memory)");
  if (B == 0) return;
  aux_loss_forward_kernel<<<static_cast<unsigned>(B), kThreads, E * sizeof(double), stream>>>(
      aux, probs, expert, Tn, E, K);
  CUDA_CHECK_LAUNCH();
}

void moe_aux_loss_backward(float* dprobs, const float* daux, const int32_t* expert, int64_t B,
                           int64_t Tn, int64_t E, int64_t K, cudaStream_t stream) {
  check_router_dims(B * Tn, E, K);
  if (B == 0) return;
  aux_loss_backward_kernel<<<static_cast<unsigned>(B), kThreads, 0, stream>>>(dprobs, daux,
                                                                             expert, Tn, E, K);
  CUDA_CHECK_LAUNCH();
}

void moe_z_loss_forward(float* z, const float* logits, int64_t B, int64_t Tn, int64_t E,
                        cudaStream_t stream) {
  check_router_dims(B * Tn, E, 1);
  if (B == 0) return;
  z_loss_forward_kernel<<<static_cast<unsigned>(B), kThreads, 0, stream>>>(z, logits, Tn, E);
  CUDA_CHECK_LAUNCH();
}

void moe_z_loss_backward(float* dlogits, const float* dz, const float* logits, int64_t B,
                         int64_t Tn, int64_t E, cudaStream_t stream) {
  check_router_dims(B * Tn, E, 1);
  if (B == 0) return;
  z_loss_backward_kernel<<<row_blocks(B * Tn), kThreads, 0, stream>>>(dlogits, dz, logits,
                                                                       B * Tn, Tn, E);
  CUDA_CHECK_LAUNCH();
}

size_t moe_dispatch_plan_workspace_bytes(int64_t B, int64_t E) {
  return detail::align_up(static_cast<size_t>(B * E) * sizeof(int64_t)) +
         detail::align_up(static_cast<size_t>(E) * sizeof(int64_t));
}

int64_t moe_dispatch_plan(int64_t* slot, int64_t* slot_token, int64_t* offsets,
                          int64_t* load_host, const int32_t* expert, int64_t B, int64_t Tn,
                          int64_t E, int64_t K, int64_t capacity, cudaStream_t stream,
                          void* workspace) {
  check_router_dims(B * Tn, E, K);
  detail::check_dims(capacity >= 0 && B <= INT32_MAX, "moe_dispatch_plan: capacity >= 0");
  detail::Scratch scratch(workspace, moe_dispatch_plan_workspace_bytes(B, E), stream);
  int64_t* count = scratch.as<int64_t>();
  int64_t* load =
      scratch.as<int64_t>(detail::align_up(static_cast<size_t>(B * E) * sizeof(int64_t)));
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(B, 1));
  if (B > 0) {
    plan_count_kernel<<<blocks, kThreads, 0, stream>>>(count, expert, Tn, E, K);
    CUDA_CHECK_LAUNCH();
  }
  plan_offsets_kernel<<<1, kThreads, 0, stream>>>(offsets, load, count, B, E, capacity);
  CUDA_CHECK_LAUNCH();
  if (B > 0) {
    plan_slots_kernel<<<blocks, kThreads, 0, stream>>>(slot, slot_token, count, expert, Tn, E, K,
                                                       capacity);
    CUDA_CHECK_LAUNCH();
  }
  // The row count sizes the expert GEMMs on the host: one small copy that waits for the stream.
  int64_t rows = 0;
  CUDA_CHECK(cudaMemcpyAsync(&rows, offsets + E, sizeof(int64_t), cudaMemcpyDeviceToHost,
                             stream));
  CUDA_CHECK(cudaMemcpyAsync(load_host, load, static_cast<size_t>(E) * sizeof(int64_t),
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return rows;
}

void moe_permute(float* xp, const float* x, const int64_t* slot_token, int64_t M, int64_t C,
                 cudaStream_t stream) {
  detail::check_dims(M >= 0 && C > 0, "moe_permute: M >= 0, C > 0");
  if (M == 0) return;
  move_rows_kernel<false><<<row_blocks(M * C), kThreads, 0, stream>>>(xp, x, slot_token, M, C);
  CUDA_CHECK_LAUNCH();
}

void moe_scatter_rows(float* out, const float* in, const int64_t* row, int64_t M, int64_t C,
                      cudaStream_t stream) {
  detail::check_dims(M >= 0 && C > 0, "moe_scatter_rows: M >= 0, C > 0");
  if (M == 0) return;
  move_rows_kernel<true><<<row_blocks(M * C), kThreads, 0, stream>>>(out, in, row, M, C);
  CUDA_CHECK_LAUNCH();
}

void moe_permute_backward(float* dx, const float* dxp, const int64_t* slot, int64_t N,
                          int64_t K, int64_t C, cudaStream_t stream) {
  detail::check_dims(N >= 0 && K > 0 && C > 0, "moe_permute_backward: N >= 0, K, C > 0");
  if (N == 0) return;
  sum_assigned_rows_kernel<<<row_blocks(N * C), kThreads, 0, stream>>>(dx, dxp, slot, nullptr,
                                                                        N, K, C);
  CUDA_CHECK_LAUNCH();
}

void moe_unpermute(float* out, const float* y, const int64_t* slot, const float* weight,
                   int64_t N, int64_t K, int64_t C, cudaStream_t stream) {
  detail::check_dims(N >= 0 && K > 0 && C > 0, "moe_unpermute: N >= 0, K, C > 0");
  if (N == 0) return;
  sum_assigned_rows_kernel<<<row_blocks(N * C), kThreads, 0, stream>>>(out, y, slot, weight, N,
                                                                        K, C);
  CUDA_CHECK_LAUNCH();
}

void moe_unpermute_backward(float* dy, float* dweight, const float* dout, const float* y,
                            const int64_t* slot, const float* weight, int64_t N, int64_t K,
                            int64_t C, cudaStream_t stream) {
  detail::check_dims(N >= 0 && K > 0 && C > 0, "moe_unpermute_backward: N >= 0, K, C > 0");
  if (N == 0) return;
  const int64_t threads = N * K * 32;  // a warp per assignment
  unpermute_backward_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads),
                              kThreads, 0, stream>>>(dy, dweight, dout, y, slot, weight, N, K,
                                                     C);
  CUDA_CHECK_LAUNCH();
}

void moe_expert_linear_forward(CublasContext& ctx, float* out, const float* inp, const float* w,
                               const float* b, const int64_t* offsets_host, int64_t E, int64_t C,
                               int64_t OC, cudaStream_t stream) {
  for (int64_t e = 0; e < E; e++) {
    const int64_t begin = offsets_host[e], rows = offsets_host[e + 1] - begin;
    if (rows == 0) continue;
    linear_forward(ctx, out + begin * OC, inp + begin * C, w + e * OC * C,
                   b != nullptr ? b + e * OC : nullptr, rows, C, OC, stream);
  }
}

void moe_expert_linear_backward(CublasContext& ctx, float* dinp, float* dw, float* db,
                                const float* dout, const float* inp, const float* w,
                                const int64_t* offsets_host, int64_t E, int64_t C, int64_t OC,
                                cudaStream_t stream, void* workspace) {
  for (int64_t e = 0; e < E; e++) {
    const int64_t begin = offsets_host[e], rows = offsets_host[e + 1] - begin;
    if (rows == 0) continue;
    linear_backward(ctx, dinp != nullptr ? dinp + begin * C : nullptr,
                    dw != nullptr ? dw + e * OC * C : nullptr,
                    db != nullptr ? db + e * OC : nullptr, dout + begin * OC, inp + begin * C,
                    w + e * OC * C, rows, C, OC, stream, workspace);
  }
}

}  // namespace trident::cuda

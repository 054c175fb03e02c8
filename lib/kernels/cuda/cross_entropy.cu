// Vocab-parallel softmax cross-entropy: the CPU's three local passes and the in-place backward,
// plus a fused single-rank forward (online softmax: one read of the logits). One block per row,
// fp32 statistics (exp sums reduced across the block in fp64), fixed reduction trees. The fused
// forward and the backward read (and write) rows in 16-byte packs when every row starts
// 16-byte aligned: they stream the LM head's logits, the largest tensor of a step.
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr int kThreads = 256;

__host__ __device__ inline int64_t valid_columns(int64_t Vl, int64_t vocab_begin,
                                                 int64_t vocab_size) {
  const int64_t v = vocab_size - vocab_begin;
  return v < 0 ? 0 : (v > Vl ? Vl : v);
}
__device__ inline int64_t local_target(int32_t target, int64_t vocab_begin, int64_t valid) {
  const int64_t v = static_cast<int64_t>(target) - vocab_begin;
  return (v >= 0 && v < valid) ? v : -1;
}

template <typename T>
__global__ void ce_local_max_kernel(float* __restrict__ row_max, const T* __restrict__ logits,
                                    int64_t Vl, int64_t valid) {
  __shared__ float sh[33];
  const int64_t n = blockIdx.x;
  const T* l = logits + n * Vl;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) mx = fmaxf(mx, detail::to_f32(l[v]));
  mx = detail::block_reduce(mx, sh, detail::MaxOp{}, -INFINITY);
  if (threadIdx.x == 0) row_max[n] = mx;
}

template <typename T>
__global__ void ce_local_sums_kernel(float* __restrict__ sums, const T* __restrict__ logits,
                                     const int32_t* __restrict__ targets,
                                     const float* __restrict__ row_max, int64_t N, int64_t Vl,
                                     int64_t vocab_begin, int64_t valid) {
  __shared__ double sh[33];
  const int64_t n = blockIdx.x;
  const T* l = logits + n * Vl;
  const float m = row_max[n];
  float acc = 0.f;
  for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) acc += expf(detail::to_f32(l[v]) - m);
  const double total = detail::block_reduce(static_cast<double>(acc), sh, detail::SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    sums[n] = static_cast<float>(total);
    const int64_t tl = local_target(targets[n], vocab_begin, valid);
    sums[N + n] = tl >= 0 ? detail::to_f32(l[tl]) : 0.f;
  }
}

__global__ void ce_loss_kernel(float* __restrict__ losses, const float* __restrict__ row_max,
                               const float* __restrict__ sums, int64_t N) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n < N) losses[n] = logf(sums[n]) + row_max[n] - sums[N + n];
}

// Online softmax of one thread's columns: s = sum exp(x - m), m the largest x seen.
struct OnlineSoftmax {
  float m = -INFINITY, s = 0.f;
  __device__ __forceinline__ void add(float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.f;  // (m = -inf: exp(-inf) = 0)
      m = x;
    } else {
      s += expf(x - m);
    }
  }
};

// kVector: columns [0, valid) in 16-byte packs as far as whole packs reach, the rest one by
// one (every row 16-byte aligned: the launcher checks).
template <typename T, bool kVector>
__global__ void ce_fused_forward_kernel(float* __restrict__ losses, float* __restrict__ row_max,
                                        float* __restrict__ sums, const T* __restrict__ logits,
                                        const int32_t* __restrict__ targets, int64_t N, int64_t Vl,
                                        int64_t valid) {
  __shared__ float shf[33];
  __shared__ double shd[33];
  const int64_t n = blockIdx.x;
  const T* l = logits + n * Vl;
  OnlineSoftmax part;
  int64_t scalar_begin = 0;
  if constexpr (kVector) {
    using P = detail::Pack<T>;
    const int64_t packs = valid / P::kSize;
    const P* lp = reinterpret_cast<const P*>(l);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P in = lp[p];
#pragma unroll
      for (int k = 0; k < P::kSize; k++) part.add(detail::to_f32(in.v[k]));
    }
    scalar_begin = packs * P::kSize;
  }
  for (int64_t v = scalar_begin + threadIdx.x; v < valid; v += blockDim.x)
    part.add(detail::to_f32(l[v]));
  const float m = part.m, s = part.s;
  const float M = detail::block_reduce(m, shf, detail::MaxOp{}, -INFINITY);
  const float scaled = (m == -INFINITY) ? 0.f : s * expf(m - M);
  const double total = detail::block_reduce(static_cast<double>(scaled), shd, detail::SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    const float sum = static_cast<float>(total);
    const int64_t tl = local_target(targets[n], 0, valid);
    const float tlogit = tl >= 0 ? detail::to_f32(l[tl]) : 0.f;
    row_max[n] = M;
    sums[n] = sum;
    sums[N + n] = tlogit;
    losses[n] = logf(sum) + M - tlogit;
  }
}

// Each column is read and then written by the same thread (kVector: each pack): dlogits may
// alias logits. kVector needs every row 16-byte aligned and Vl a whole number of packs.
__device__ __forceinline__ float ce_grad(float x, int64_t v, int64_t valid, int64_t tl, float m,
                                         float scale, float g) {
  if (v >= valid) return 0.f;
  const float out = expf(x - m) * scale;
  return v == tl ? out - g : out;
}

template <typename T, bool kVector>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const int32_t* __restrict__ targets,
                                   const float* __restrict__ row_max,
                                   const float* __restrict__ sums,
                                   const float* __restrict__ dloss, int64_t Vl,
                                   int64_t vocab_begin, int64_t valid) {
  const int64_t n = blockIdx.x;
  const T* l = logits + n * Vl;
  T* d = dlogits + n * Vl;
  const float m = row_max[n];
  const float g = dloss[n];
  const float scale = g / sums[n];
  const int64_t tl = local_target(targets[n], vocab_begin, valid);
  if constexpr (kVector) {
    using P = detail::Pack<T>;
    const P* lp = reinterpret_cast<const P*>(l);
    P* dp = reinterpret_cast<P*>(d);
    for (int64_t p = threadIdx.x; p < Vl / P::kSize; p += blockDim.x) {
      const P in = lp[p];
      P out;
#pragma unroll
      for (int k = 0; k < P::kSize; k++)
        out.v[k] = detail::from_f32<T>(
            ce_grad(detail::to_f32(in.v[k]), p * P::kSize + k, valid, tl, m, scale, g));
      dp[p] = out;
    }
  } else {
    for (int64_t v = threadIdx.x; v < Vl; v += blockDim.x)
      d[v] = detail::from_f32<T>(ce_grad(detail::to_f32(l[v]), v, valid, tl, m, scale, g));
  }
}

void check_ce(int64_t N, int64_t Vl, const char* what) {
  detail::check_dims(N >= 0 && Vl >= 0, what);
  detail::check_dims(N <= INT32_MAX, what);
}

}  // namespace

template <typename T>
void cross_entropy_local_max(float* row_max, const T* logits, int64_t N, int64_t Vl,
                             int64_t vocab_begin, int64_t vocab_size, cudaStream_t stream) {
  check_ce(N, Vl, "cross_entropy_local_max: bad sizes");
  if (N == 0) return;
  ce_local_max_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      row_max, logits, Vl, valid_columns(Vl, vocab_begin, vocab_size));
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_local_sums(float* sums, const T* logits, const int32_t* targets,
                              const float* row_max, int64_t N, int64_t Vl, int64_t vocab_begin,
                              int64_t vocab_size, cudaStream_t stream) {
  check_ce(N, Vl, "cross_entropy_local_sums: bad sizes");
  if (N == 0) return;
  ce_local_sums_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      sums, logits, targets, row_max, N, Vl, vocab_begin,
      valid_columns(Vl, vocab_begin, vocab_size));
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_loss(float* losses, const float* row_max, const float* sums, int64_t N,
                        cudaStream_t stream) {
  check_ce(N, 0, "cross_entropy_loss: bad sizes");
  if (N == 0) return;
  ce_loss_kernel<<<detail::grid_for(N, 256, INT32_MAX), 256, 0, stream>>>(losses, row_max, sums,
                                                                          N);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_forward_fused(float* losses, float* row_max, float* sums, const T* logits,
                                 const int32_t* targets, int64_t N, int64_t Vl,
                                 int64_t vocab_size, cudaStream_t stream) {
  check_ce(N, Vl, "cross_entropy_forward_fused: bad sizes");
  if (N == 0) return;
  const int64_t valid = valid_columns(Vl, 0, vocab_size);
  if (detail::rows_aligned16<T>(Vl, logits)) {
    ce_fused_forward_kernel<T, true><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, row_max, sums, logits, targets, N, Vl, valid);
  } else {
    ce_fused_forward_kernel<T, false><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, row_max, sums, logits, targets, N, Vl, valid);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets,
                            const float* row_max, const float* sums, const float* dloss,
                            int64_t N, int64_t Vl, int64_t vocab_begin, int64_t vocab_size,
                            cudaStream_t stream) {
  check_ce(N, Vl, "cross_entropy_backward: bad sizes");
  if (N == 0 || Vl == 0) return;
  const int64_t valid = valid_columns(Vl, vocab_begin, vocab_size);
  if (detail::rows_aligned16<T>(Vl, logits, dlogits)) {
    ce_backward_kernel<T, true><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        dlogits, logits, targets, row_max, sums, dloss, Vl, vocab_begin, valid);
  } else {
    ce_backward_kernel<T, false><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        dlogits, logits, targets, row_max, sums, dloss, Vl, vocab_begin, valid);
  }
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                                 \
  template void cross_entropy_local_max<T>(float*, const T*, int64_t, int64_t, int64_t,       \
                                           int64_t, cudaStream_t);                             \
  template void cross_entropy_local_sums<T>(float*, const T*, const int32_t*, const float*,   \
                                            int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template void cross_entropy_forward_fused<T>(float*, float*, float*, const T*,              \
                                               const int32_t*, int64_t, int64_t, int64_t,      \
                                               cudaStream_t);                                  \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, const float*,         \
                                          const float*, const float*, int64_t, int64_t,       \
                                          int64_t, int64_t, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

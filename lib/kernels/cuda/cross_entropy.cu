// Vocab-parallel softmax cross-entropy: the CPU's three local passes and the in-place backward,
// plus a fused single-rank forward (online softmax: one read of the logits) and the same with
// the gradient written in the same launch (one read and one write). One block per row,
// fp32 statistics (exp sums reduced across the block in fp64), fixed reduction trees. The fused
// forward and the backward read (and write) rows in 16-byte packs when every row starts
// 16-byte aligned: they stream the LM head's logits, the largest tensor of a step.
#include <atomic>
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
    } else if (x != -INFINITY) {
      // A -inf logit adds exp(-inf) = 0; computed, it would be exp(-inf - -inf) = NaN while m is
      // still -inf (the two-kernel path and the CPU's take the row's max first). NaN still adds.
      s += expf(x - m);
    }
  }
};

// Each column is read and then written by the same thread (kVector: each pack): dlogits may
// alias logits. kVector needs every row 16-byte aligned and Vl a whole number of packs.
__device__ __forceinline__ float ce_grad(float x, int64_t v, int64_t valid, int64_t tl, float m,
                                         float scale, float g) {
  if (v >= valid) return 0.f;
  const float out = expf(x - m) * scale;
  return v == tl ? out - g : out;
}

// d[0, Vl) = (softmax - onehot) * g of the row x[0, Vl) whose max is m and exp sum g / scale
// (columns from `valid` on are padding: gradient 0), tl its local target. x is the logits in
// global memory (ce_backward_kernel) or the row kept in shared memory (ce_fused_kernel): the
// same code, so the same bits.
template <typename T, bool kVector>
__device__ __forceinline__ void ce_gradient_row(T* d, const T* x, float m, float scale, float g,
                                                int64_t tl, int64_t Vl, int64_t valid) {
  if constexpr (kVector) {
    using P = detail::Pack<T>;
    const P* xp = reinterpret_cast<const P*>(x);
    P* dp = reinterpret_cast<P*>(d);
    for (int64_t p = threadIdx.x; p < Vl / P::kSize; p += blockDim.x) {
      const P in = xp[p];
      P out;
#pragma unroll
      for (int k = 0; k < P::kSize; k++)
        out.v[k] = detail::from_f32<T>(
            ce_grad(detail::to_f32(in.v[k]), p * P::kSize + k, valid, tl, m, scale, g));
      dp[p] = out;
    }
  } else {
    for (int64_t v = threadIdx.x; v < Vl; v += blockDim.x)
      d[v] = detail::from_f32<T>(ce_grad(detail::to_f32(x[v]), v, valid, tl, m, scale, g));
  }
}

template <typename T, bool kVector>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const int32_t* __restrict__ targets,
                                   const float* __restrict__ row_max,
                                   const float* __restrict__ sums,
                                   const float* __restrict__ dloss, int64_t Vl,
                                   int64_t vocab_begin, int64_t valid) {
  const int64_t n = blockIdx.x;
  const float g = dloss[n];
  ce_gradient_row<T, kVector>(dlogits + n * Vl, logits + n * Vl, row_max[n], g / sums[n], g,
                              local_target(targets[n], vocab_begin, valid), Vl, valid);
}

// The single-rank loss in one pass over each row (online softmax: one read of the logits), and
// with kGrad its gradient in the same launch: the block then keeps its row [0, Vl) in shared
// memory as it reads it (the padding columns from `valid` on as zeros: never read from the
// logits), and writes dlogits from there with ce_backward_kernel's code (the same gradient, bit
// for bit: one read of the logits and one write, where the loss and the
// backward kernels read them twice). Each thread takes the same columns in the same order
// either way (so the same statistics), loading kBatch packs at a time to keep bytes in flight at
// the occupancy the shared row leaves (two blocks of a GPT-2 vocabulary's bf16 row per SM).
// kVector: columns [0, valid) in 16-byte packs as far as whole packs reach, the rest one by one
// (every row 16-byte aligned and Vl a whole number of packs: the launchers check). dlogits may
// alias logits: every column is read before the barrier that precedes the first write.
template <typename T, bool kVector, bool kGrad>
__global__ void ce_fused_kernel(float* __restrict__ losses, float* __restrict__ row_max,
                                float* __restrict__ sums, T* dlogits, const T* logits,
                                const int32_t* __restrict__ targets,
                                const float* __restrict__ dloss, int64_t N, int64_t Vl,
                                int64_t valid) {
  extern __shared__ __align__(16) unsigned char ce_row_bytes[];
  T* row = reinterpret_cast<T*>(ce_row_bytes);
  __shared__ float shf[33];
  __shared__ double shd[33];
  __shared__ float stats[2];  // the row's max and exp sum
  const int64_t n = blockIdx.x;
  const T* l = logits + n * Vl;
  OnlineSoftmax part;
  int64_t scalar_begin = 0;
  if constexpr (kVector) {
    using P = detail::Pack<T>;
    constexpr int kBatch = 4;
    const int64_t packs = valid / P::kSize;
    const P* lp = reinterpret_cast<const P*>(l);
    P* rp = reinterpret_cast<P*>(row);
    for (int64_t p0 = threadIdx.x; p0 < packs; p0 += kBatch * int64_t(blockDim.x)) {
      P in[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; b++) {
        const int64_t p = p0 + b * int64_t(blockDim.x);
        if (p < packs) in[b] = lp[p];
      }
#pragma unroll
      for (int b = 0; b < kBatch; b++) {
        const int64_t p = p0 + b * int64_t(blockDim.x);
        if (p >= packs) break;
        if constexpr (kGrad) rp[p] = in[b];
#pragma unroll
        for (int k = 0; k < P::kSize; k++) part.add(detail::to_f32(in[b].v[k]));
      }
    }
    scalar_begin = packs * P::kSize;
  }
  for (int64_t v = scalar_begin + threadIdx.x; v < valid; v += blockDim.x) {
    const T x = l[v];
    if constexpr (kGrad) row[v] = x;
    part.add(detail::to_f32(x));
  }
  if constexpr (kGrad)
    for (int64_t v = valid + threadIdx.x; v < Vl; v += blockDim.x)
      row[v] = detail::from_f32<T>(0.f);
  const float m = part.m, s = part.s;
  const float M = detail::block_reduce(m, shf, detail::MaxOp{}, -INFINITY);
  const float scaled = (m == -INFINITY) ? 0.f : s * expf(m - M);
  const double total = detail::block_reduce(static_cast<double>(scaled), shd, detail::SumOp{}, 0.0);
  const int64_t tl = local_target(targets[n], 0, valid);
  if (threadIdx.x == 0) {
    const float sum = static_cast<float>(total);
    const float tlogit = tl >= 0 ? detail::to_f32(l[tl]) : 0.f;
    row_max[n] = M;
    sums[n] = sum;
    sums[N + n] = tlogit;
    losses[n] = logf(sum) + M - tlogit;
    stats[0] = M;
    stats[1] = sum;
  }
  if constexpr (kGrad) {
    __syncthreads();  // the row and the statistics
    const float g = dloss[n];
    ce_gradient_row<T, kVector>(dlogits + n * Vl, row, stats[0], g / stats[1], g, tl, Vl, valid);
  }
}

// The exps' pass over a split vocabulary (cross_entropy_local_sums with exps: kept for
// cross_entropy_backward_kept) is the CPU's; the GPU recomputes exp in its backward instead
// (CudaKernels::cross_entropy_keeps_exps is false), as its exps would be rounded to T.

// Bytes of shared memory ce_fused_kernel<T, kVector, true> may take beside its own, on the
// current device (the opt-in maximum), its limit raised to that once per kernel and device.
template <typename T, bool kVector>
int64_t fused_grad_smem_limit() {
  static std::atomic<int64_t> limit[64] = {};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return 0;
  if (limit[dev].load() == 0) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, ce_fused_kernel<T, kVector, true>));
    const int64_t dynamic =
        static_cast<int64_t>(optin) - static_cast<int64_t>(attr.sharedSizeBytes);
    CUDA_CHECK(cudaFuncSetAttribute(ce_fused_kernel<T, kVector, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(dynamic)));
    limit[dev].store(dynamic);
  }
  return limit[dev].load();
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
    ce_fused_kernel<T, true, false><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, row_max, sums, nullptr, logits, targets, nullptr, N, Vl, valid);
  } else {
    ce_fused_kernel<T, false, false><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, row_max, sums, nullptr, logits, targets, nullptr, N, Vl, valid);
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

template <typename T>
void cross_entropy_fused_grad(float* losses, float* row_max, float* sums, T* dlogits,
                              const T* logits, const int32_t* targets, const float* dloss,
                              int64_t N, int64_t Vl, int64_t vocab_size, cudaStream_t stream) {
  check_ce(N, Vl, "cross_entropy_fused_grad: bad sizes");
  if (N == 0) return;
  const int64_t valid = valid_columns(Vl, 0, vocab_size);
  const int64_t bytes = (Vl * static_cast<int64_t>(sizeof(T)) + 15) / 16 * 16;
  const bool vector = detail::rows_aligned16<T>(Vl, logits, dlogits);
  const int64_t limit =
      vector ? fused_grad_smem_limit<T, true>() : fused_grad_smem_limit<T, false>();
  // The loss's bits are cross_entropy_forward_fused's only where both read the logits the same
  // way (packs or scalars: the columns each thread sums differ), and that one looks at the
  // logits' alignment alone: a misaligned dlogits beside aligned logits takes the two kernels.
  const bool same_reads = vector == detail::rows_aligned16<T>(Vl, logits);
  if (Vl == 0 || bytes > limit || !same_reads) {  // (or the row does not fit shared memory)
    cross_entropy_forward_fused(losses, row_max, sums, logits, targets, N, Vl, vocab_size, stream);
    cross_entropy_backward(dlogits, logits, targets, row_max, sums, dloss, N, Vl, 0, vocab_size,
                           stream);
    return;
  }
  if (vector) {
    ce_fused_kernel<T, true, true><<<static_cast<unsigned>(N), kThreads, bytes, stream>>>(
        losses, row_max, sums, dlogits, logits, targets, dloss, N, Vl, valid);
  } else {
    ce_fused_kernel<T, false, true><<<static_cast<unsigned>(N), kThreads, bytes, stream>>>(
        losses, row_max, sums, dlogits, logits, targets, dloss, N, Vl, valid);
  }
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                                 \
  template void cross_entropy_fused_grad<T>(float*, float*, float*, T*, const T*,             \
                                            const int32_t*, const float*, int64_t, int64_t,    \
                                            int64_t, cudaStream_t);                            \
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

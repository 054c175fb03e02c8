// The decoding kernels (generation with a key/value cache): the GPU twins of
// kernels/cpu/decode.cpp, storage T float or bf16, arithmetic fp32 (angles in double).
//
// rope_forward_at: the rotation of llama.cu's RoPE (detail::rope_rotate_pair) with the position
// of row n read from positions[n]; rope_backward_at (context parallelism's backward: a rank's
// rows are two chunks of the sequence) the same with the transposed rotation.
// kv_cache_attention: one kernel writes each sequence's new k and v rows into the cache; a
// second runs one block per (sequence, query head): the scores of the cached positions into
// shared memory, a block max and sum (fixed tree order: deterministic), then each thread one
// output element as the probability-weighted sum over positions in order.
#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps per (sequence, head)

template <typename T>
__global__ void rope_at_kernel(T* __restrict__ qkv, const int32_t* __restrict__ positions,
                               int64_t N, int heads, int64_t C3, int HS, double theta,
                               float sign) {
  const int half = HS / 2;
  const int64_t total = N * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = idx / half;
    const int i = static_cast<int>(idx % half);
    detail::rope_rotate_pair(qkv + n * C3, heads, HS, i, static_cast<double>(positions[n]),
                             theta, sign);
  }
}

// One thread per element of the new k and v rows: B * KVH * HS threads.
template <typename T>
__global__ void cache_append_kernel(T* __restrict__ k_cache, T* __restrict__ v_cache,
                                    const T* __restrict__ qkv,
                                    const int32_t* __restrict__ positions, int64_t B, int64_t Tmax,
                                    int64_t NH, int64_t KVH, int64_t HS) {
  const int64_t total = B * KVH * HS;
  const int64_t CQ = (NH + 2 * KVH) * HS;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % HS, j = (idx / HS) % KVH, b = idx / (HS * KVH);
    const int64_t slot = ((b * KVH + j) * Tmax + positions[b]) * HS + i;
    k_cache[slot] = qkv[b * CQ + (NH + j) * HS + i];
    v_cache[slot] = qkv[b * CQ + (NH + KVH + j) * HS + i];
  }
}

// Block (b, h): p[s] (dynamic shared memory, Tmax floats) for s <= positions[b].
template <typename T>
__global__ void cache_attention_kernel(T* __restrict__ out, const T* __restrict__ k_cache,
                                       const T* __restrict__ v_cache, const T* __restrict__ qkv,
                                       const int32_t* __restrict__ positions, int64_t Tmax,
                                       int64_t NH, int64_t KVH, int64_t HS, float scale) {
  extern __shared__ float p[];
  __shared__ float scratch[33];
  const int64_t b = blockIdx.x / NH, h = blockIdx.x % NH, j = h / (NH / KVH);
  const int64_t len = positions[b] + 1;
  const T* q = qkv + b * (NH + 2 * KVH) * HS + h * HS;
  const T* keys = k_cache + (b * KVH + j) * Tmax * HS;
  const T* values = v_cache + (b * KVH + j) * Tmax * HS;
  float mx = -INFINITY;
  for (int64_t s = threadIdx.x; s < len; s += kThreads) {
    float dot = 0.f;
    for (int64_t i = 0; i < HS; i++)
      dot += detail::to_f32(q[i]) * detail::to_f32(keys[s * HS + i]);
    p[s] = dot * scale;
    mx = fmaxf(mx, p[s]);
  }
  mx = detail::block_reduce(mx, scratch, detail::MaxOp{}, -INFINITY);
  float sum = 0.f;
  for (int64_t s = threadIdx.x; s < len; s += kThreads) sum += (p[s] = expf(p[s] - mx));
  // The reduction's barriers also order the p[] writes before the reads below.
  sum = detail::block_reduce(sum, scratch, detail::SumOp{}, 0.f);
  const float inv = 1.f / sum;
  for (int64_t i = threadIdx.x; i < HS; i += kThreads) {
    float acc = 0.f;
    for (int64_t s = 0; s < len; s++) acc += p[s] * detail::to_f32(values[s * HS + i]);
    out[b * NH * HS + h * HS + i] = detail::from_f32<T>(acc * inv);
  }
}

}  // namespace

template <typename T>
void rope_forward_at(T* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                     int64_t HS, double theta, cudaStream_t stream) {
  detail::check_dims(N >= 0 && NH > 0 && KVH > 0 && NH % KVH == 0 && HS > 0 && HS % 2 == 0,
                     "rope_forward_at: N >= 0, KVH dividing NH and an even HS required");
  if (N == 0) return;
  rope_at_kernel<T><<<detail::grid_for(N * (HS / 2), kThreads), kThreads, 0, stream>>>(
      qkv, positions, N, static_cast<int>(NH + KVH), (NH + 2 * KVH) * HS, static_cast<int>(HS),
      theta, 1.0f);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void rope_backward_at(T* dqkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                      int64_t HS, double theta, cudaStream_t stream) {
  detail::check_dims(N >= 0 && NH > 0 && KVH > 0 && NH % KVH == 0 && HS > 0 && HS % 2 == 0,
                     "rope_backward_at: N >= 0, KVH dividing NH and an even HS required");
  if (N == 0) return;
  rope_at_kernel<T><<<detail::grid_for(N * (HS / 2), kThreads), kThreads, 0, stream>>>(
      dqkv, positions, N, static_cast<int>(NH + KVH), (NH + 2 * KVH) * HS, static_cast<int>(HS),
      theta, -1.0f);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void kv_cache_attention(T* out, T* k_cache, T* v_cache, const T* qkv, const int32_t* positions,
                        int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS,
                        cudaStream_t stream) {
  detail::check_dims(B >= 0 && Tmax > 0 && NH > 0 && KVH > 0 && NH % KVH == 0 && HS > 0,
                     "kv_cache_attention: B >= 0, Tmax > 0 and KVH dividing NH required");
  detail::check_dims(Tmax * sizeof(float) <= 48 * 1024,
                     "kv_cache_attention: the scores of Tmax positions must fit 48 KiB of "
                     "shared memory (Tmax <= 12288)");
  if (B == 0) return;
  cache_append_kernel<T><<<detail::grid_for(B * KVH * HS, kThreads), kThreads, 0, stream>>>(
      k_cache, v_cache, qkv, positions, B, Tmax, NH, KVH, HS);
  CUDA_CHECK_LAUNCH();
  const float scale = 1.f / sqrtf(static_cast<float>(HS));
  cache_attention_kernel<T><<<static_cast<unsigned>(B * NH), kThreads,
                              static_cast<size_t>(Tmax) * sizeof(float), stream>>>(
      out, k_cache, v_cache, qkv, positions, Tmax, NH, KVH, HS, scale);
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                                 \
  template void rope_forward_at<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t,    \
                                   double, cudaStream_t);                                      \
  template void rope_backward_at<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t,   \
                                    double, cudaStream_t);                                     \
  template void kv_cache_attention<T>(T*, T*, T*, const T*, const int32_t*, int64_t, int64_t, \
                                      int64_t, int64_t, int64_t, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

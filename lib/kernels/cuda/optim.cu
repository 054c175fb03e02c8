// AdamW update on fp32 master weights (optionally writing the bf16 working copy) and the
// deterministic gradient squared norm.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr int kGradNormBlocks = 512;  // fixed: the reduction tree depends on n only
constexpr int kGradNormThreads = 512;

// One step's constants, by value into the kernels.
struct AdamWConsts {
  float lr, beta1, beta2, bias1, bias2, eps, weight_decay, grad_scale;
};

// One element: the CPU formula (CpuDevice::adamw), the same code for both kernels below so
// that the packed and the scalar path give the same bits.
__device__ __forceinline__ void adamw_element(float& w, float grad, float& m, float& v,
                                              const AdamWConsts& c) {
  const float g = grad * c.grad_scale;
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  const float m_hat = m / c.bias1, v_hat = v / c.bias2;
  w = w - c.lr * (m_hat / (sqrtf(v_hat) + c.eps) + c.weight_decay * w);
}

// The same per element on four at once, and the bf16 copy of one or four weights.
__device__ __forceinline__ void adamw_element(float4& w, float4 g, float4& m, float4& v,
                                              const AdamWConsts& c) {
  adamw_element(w.x, g.x, m.x, v.x, c);
  adamw_element(w.y, g.y, m.y, v.y, c);
  adamw_element(w.z, g.z, m.z, v.z, c);
  adamw_element(w.w, g.w, m.w, v.w, c);
}
__device__ __forceinline__ void store_bf16(bf16* out, float w) { *out = __float2bfloat16_rn(w); }
__device__ __forceinline__ void store_bf16(uint2* out, float4 w) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(w.x, w.y);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(w.z, w.w);
  uint2 bits;
  memcpy(&bits.x, &lo, sizeof lo);
  memcpy(&bits.y, &hi, sizeof hi);
  *out = bits;
}

// V = float (one element per thread, any alignment; B = bf16) or float4 (16-byte loads and
// stores of four, B = uint2: their bf16 copy in one 8-byte store; n counts packs, and the
// caller runs the float kernel on the n % 4 left).
template <typename V, typename B>
__global__ void adamw_kernel(V* __restrict__ w, const V* __restrict__ grads, V* __restrict__ m,
                             V* __restrict__ v, int64_t n, AdamWConsts c,
                             B* __restrict__ w_bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    V wi = w[i], mi = m[i], vi = v[i];
    adamw_element(wi, grads[i], mi, vi, c);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if (w_bf16 != nullptr) store_bf16(w_bf16 + i, wi);
  }
}

__global__ void grad_sq_partial_kernel(double* __restrict__ partial, const float* __restrict__ g,
                                       int64_t n) {
  __shared__ double sh[33];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double x = static_cast<double>(g[i]);
    acc += x * x;
  }
  acc = detail::block_reduce(acc, sh, detail::SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void grad_sq_final_kernel(double* __restrict__ result,
                                     const double* __restrict__ partial, int blocks,
                                     bool accumulate) {
  __shared__ double sh[33];
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc += partial[i];
  acc = detail::block_reduce(acc, sh, detail::SumOp{}, 0.0);
  if (threadIdx.x == 0) *result = accumulate ? *result + acc : acc;
}

}  // namespace

void adamw_update(float* weights, const float* grads, float* exp_avg, float* exp_avg_sq,
                  int64_t n, const AdamWHyper& h, bf16* weights_bf16, cudaStream_t stream) {
  detail::check_dims(n >= 0, "adamw_update: n < 0");
  detail::check_dims(h.step >= 0 || (h.bias1 > 0.f && h.bias2 > 0.f), "adamw_update: step < 0");
  if (n == 0) return;
  const double b1 = h.beta1, b2 = h.beta2;
  const bool given = h.bias1 > 0.f && h.bias2 > 0.f;
  AdamWConsts c;
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.bias1 =
      given ? h.bias1 : static_cast<float>(1.0 - std::pow(b1, static_cast<double>(h.step + 1)));
  c.bias2 =
      given ? h.bias2 : static_cast<float>(1.0 - std::pow(b2, static_cast<double>(h.step + 1)));
  c.eps = h.eps;
  c.weight_decay = h.weight_decay;
  c.grad_scale = h.grad_scale;
  const bool packed = detail::aligned16(weights) && detail::aligned16(grads) &&
                      detail::aligned16(exp_avg) && detail::aligned16(exp_avg_sq) &&
                      reinterpret_cast<uintptr_t>(weights_bf16) % 8 == 0;  // (nullptr too)
  const int64_t n4 = packed ? n / 4 : 0, done = 4 * n4;
  if (n4 > 0) {
    adamw_kernel<<<detail::grid_for(n4, 256), 256, 0, stream>>>(
        reinterpret_cast<float4*>(weights), reinterpret_cast<const float4*>(grads),
        reinterpret_cast<float4*>(exp_avg), reinterpret_cast<float4*>(exp_avg_sq), n4, c,
        reinterpret_cast<uint2*>(weights_bf16));
    CUDA_CHECK_LAUNCH();
  }
  if (done < n) {
    adamw_kernel<<<detail::grid_for(n - done, 256), 256, 0, stream>>>(
        weights + done, grads + done, exp_avg + done, exp_avg_sq + done, n - done, c,
        weights_bf16 == nullptr ? nullptr : weights_bf16 + done);
    CUDA_CHECK_LAUNCH();
  }
}

size_t grad_square_sum_workspace_bytes() { return kGradNormBlocks * sizeof(double); }

void grad_square_sum(double* result, const float* g, int64_t n, bool accumulate,
                     cudaStream_t stream, void* workspace) {
  detail::check_dims(n >= 0, "grad_square_sum: n < 0");
  detail::Scratch scratch(workspace, grad_square_sum_workspace_bytes(), stream);
  double* partial = scratch.as<double>();
  grad_sq_partial_kernel<<<kGradNormBlocks, kGradNormThreads, 0, stream>>>(partial, g, n);
  CUDA_CHECK_LAUNCH();
  grad_sq_final_kernel<<<1, kGradNormThreads, 0, stream>>>(result, partial, kGradNormBlocks,
                                                           accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::cuda

// AdamW update on fp32 master weights (optionally writing the bf16 working copy) and the
// deterministic gradient squared norm.
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr int kGradNormBlocks = 512;  // fixed: the reduction tree depends on n only
constexpr int kGradNormThreads = 512;

__global__ void adamw_kernel(float* __restrict__ w, const float* __restrict__ grads,
                             float* __restrict__ m, float* __restrict__ v, int64_t n, float lr,
                             float beta1, float beta2, float bias1, float bias2, float eps,
                             float weight_decay, float grad_scale,
                             const uint8_t* __restrict__ decay_mask, bf16* __restrict__ w_bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / bias1, v_hat = vi / bias2;
    const float wd = (decay_mask == nullptr || decay_mask[i] != 0) ? weight_decay : 0.0f;
    const float wi = w[i];
    const float wn = wi - lr * (m_hat / (sqrtf(v_hat) + eps) + wd * wi);
    w[i] = wn;
    if (w_bf16 != nullptr) w_bf16[i] = __float2bfloat16_rn(wn);
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
                  int64_t n, const AdamWHyper& h, const uint8_t* decay_mask, bf16* weights_bf16,
                  cudaStream_t stream) {
  detail::check_dims(n >= 0, "adamw_update: n < 0");
  detail::check_dims(h.step >= 0 || (h.bias1 > 0.f && h.bias2 > 0.f), "adamw_update: step < 0");
  if (n == 0) return;
  const double b1 = h.beta1, b2 = h.beta2;
  const bool given = h.bias1 > 0.f && h.bias2 > 0.f;
  const float bias1 =
      given ? h.bias1 : static_cast<float>(1.0 - std::pow(b1, static_cast<double>(h.step + 1)));
  const float bias2 =
      given ? h.bias2 : static_cast<float>(1.0 - std::pow(b2, static_cast<double>(h.step + 1)));
  adamw_kernel<<<detail::grid_for(n, 256), 256, 0, stream>>>(
      weights, grads, exp_avg, exp_avg_sq, n, h.lr, h.beta1, h.beta2, bias1, bias2, h.eps,
      h.weight_decay, h.grad_scale, decay_mask, weights_bf16);
  CUDA_CHECK_LAUNCH();
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

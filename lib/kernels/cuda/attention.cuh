#pragma once
// Private declarations shared by the attention sources (nvcc only).
//
// Layouts (grouped-query attention; KVH = NH is multi-head attention): qkv[B,T,C3] with
// C3 = (NH + 2*KVH)*HS, per token [q heads (NH) | k heads (KVH) | v heads (KVH)]: q head h at
// column h*HS, k of kv head j at (NH + j)*HS, v of kv head j at (NH + KVH + j)*HS; query head h
// uses kv head h / (NH/KVH). dqkv has the layout of qkv. out, dout [B,T,NH*HS]; lse, delta
// [B,NH,T] (fp32, per query head). lse is the natural-log logsumexp of the scaled scores
// (scale = 1/sqrt(HS)), so P[t,s] = exp(scale * q_t.k_s - lse[t]) for s <= t.
// Backward: the dK/dV pass runs one block per (b, kv head, key tile) and loops over the kv
// head's query heads in head order inside the block (accumulating in registers), so a kv head's
// gradient is one write, summed in a fixed order: no atomics, and for KVH = NH the loop has one
// head and the arithmetic is exactly the multi-head kernel's.
#include "kernels/cuda/common.cuh"

namespace trident::cuda::detail {

// Sets the dynamic shared memory limit of `kernel` to `bytes` (needed above 48 KiB) and checks
// it against the device's opt-in maximum.
template <typename Kernel>
void prepare_smem(Kernel kernel, size_t bytes) {
  int dev = 0, max_optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  check_dims(bytes <= static_cast<size_t>(max_optin),
             "attention: kernel needs more shared memory than the device offers");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
}

inline void check_attention_dims(int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS) {
  check_dims(B > 0 && T > 0 && NH > 0 && KVH > 0, "attention: B, T, NH, KVH must be positive");
  check_dims(NH % KVH == 0, "attention: NH must be a multiple of KVH");
  check_dims(HS == 32 || HS == 64 || HS == 128, "attention: HS must be 32, 64 or 128");
  check_dims(B * NH <= INT32_MAX && T <= (int64_t(1) << 24),
             "attention: B*NH or T too large");
  check_dims(B * T * (NH + 2 * KVH) * HS < (int64_t(1) << 62), "attention: tensor too large");
}

// doc_start [B,T] (device; nullptr: none): packed documents, row t sees keys
// [doc_start[t], t] (kernels/cpu/ops.hpp).
// fp32 SIMT kernels (attention_f32.cu)
void attention_forward_impl(float* out, float* lse, const float* qkv, const int32_t* doc_start,
                            int B, int T, int NH, int KVH, int HS, cudaStream_t stream);
void attention_backward_impl(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* delta, const int32_t* doc_start, int B, int T, int NH,
                             int KVH, int HS, cudaStream_t stream);
// bf16 tensor-core kernels (attention_bf16.cu)
void attention_forward_impl(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                            const int32_t* doc_start, int B, int T, int NH, int KVH, int HS,
                            cudaStream_t stream);
// Hopper forward (attention_sm90.cu): sm_90a code, run on compute capability 9.0 for HS 64 and
// 128 only (attention_wgmma_supported).
bool attention_wgmma_supported(int HS);
void attention_forward_sm90(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                            const int32_t* doc_start, int B, int T, int NH, int KVH, int HS,
                            cudaStream_t stream);
// Hopper backward (attention_sm90_bwd.cu) on wgmma, HS 64 or 128; dq_accum as below.
void attention_backward_sm90(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                             const __nv_bfloat16* qkv, const float* lse, const float* delta,
                             const int32_t* doc_start, float* dq_accum, int B, int T, int NH,
                             int KVH, int HS, cudaStream_t stream);
// The atomic backward's last step: dqkv's q columns [rows][C] of row pitch C3 = scale * acc
// [rows][C] (fp32, the dQ accumulator), rounded to bf16.
void dq_from_accum(__nv_bfloat16* dqkv, const float* acc, int64_t rows, int64_t C, int64_t C3,
                   float scale, cudaStream_t stream);
// dq_accum (fp32 [B,T,NH,HS]; nullptr: the deterministic two-pass backward): dQ accumulated
// with atomics in the dK/dV pass (train.deterministic = false).
void attention_backward_impl(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                             const __nv_bfloat16* qkv, const float* lse, const float* delta,
                             const int32_t* doc_start, float* dq_accum, int B, int T, int NH,
                             int KVH, int HS, cudaStream_t stream);

}  // namespace trident::cuda::detail

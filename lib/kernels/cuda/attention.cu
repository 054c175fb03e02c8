// Causal (grouped-query) self-attention entry points: argument checks, the dO.O row sums
// (delta) of the backward, and dispatch to the fp32 SIMT or bf16 tensor-core kernels.
// out, dout and delta are per query head ([B,T,NH*HS], [B,NH,T]) whatever KVH is, so the delta
// kernel does not see KVH.
#include "kernels/cuda/attention.cuh"

namespace trident::cuda {

namespace {

// delta[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d]: one warp per (b, t, h), fp32.
template <typename T>
__global__ void attention_delta_kernel(float* __restrict__ delta, const T* __restrict__ dout,
                                       const T* __restrict__ out, int B, int T_, int NH, int HS) {
  const int64_t rows = int64_t(B) * T_ * NH;
  const int lane = threadIdx.x & 31;
  const int64_t warp = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (warp >= rows) return;
  const int64_t bt = warp / NH;  // b * T + t
  const int h = static_cast<int>(warp % NH);
  const int64_t C = int64_t(NH) * HS;
  const T* g = dout + bt * C + int64_t(h) * HS;
  const T* o = out + bt * C + int64_t(h) * HS;
  float acc = 0.f;
  for (int d = lane; d < HS; d += 32) acc += detail::to_f32(g[d]) * detail::to_f32(o[d]);
  acc = detail::warp_sum(acc);
  if (lane == 0) {
    const int64_t b = bt / T_, t = bt % T_;
    delta[(b * NH + h) * T_ + t] = acc;
  }
}

template <typename T>
void check_alignment(const void* p, const char* name) {
  if constexpr (sizeof(T) == 2) {
    if (!detail::aligned16(p))
      throw Error(std::string("attention (bf16): ") + name + " must be 16-byte aligned");
  } else {
    (void)p;
    (void)name;
  }
}

}  // namespace

size_t attention_backward_workspace_bytes(int64_t B, int64_t T_, int64_t NH, int64_t HS,
                                          bool deterministic) {
  const int64_t delta = B * NH * T_, dq_accum = deterministic ? 0 : B * T_ * NH * HS;
  return static_cast<size_t>(delta + dq_accum) * sizeof(float);
}

bool attention_wgmma_available(int64_t HS) {
  return (HS == 64 || HS == 128) && detail::attention_wgmma_supported(static_cast<int>(HS));
}

namespace {

// Whether `kernel` runs the wgmma kernels for T and HS; wgmma asked for where it cannot run
// is an error.
template <typename T>
bool use_wgmma(AttentionKernel kernel, int64_t HS) {
  if (sizeof(T) != 2) {
    if (kernel == AttentionKernel::wgmma) throw Error("attention: the wgmma kernel is bf16 only");
    return false;
  }
  const bool available = kernel != AttentionKernel::mma_sync && attention_wgmma_available(HS);
  if (kernel == AttentionKernel::wgmma && !available)
    throw Error("attention: the wgmma kernel runs on compute capability 9.0 (H100, H200) with "
                "head size 64 or 128 (here HS " + std::to_string(HS) + ")");
  return available;
}

}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t NH,
                       int64_t KVH, int64_t HS, cudaStream_t stream, const int32_t* doc_start,
                       AttentionKernel kernel) {
  detail::check_attention_dims(B, T_, NH, KVH, HS);
  check_alignment<T>(qkv, "qkv");
  check_alignment<T>(out, "out");
  if (use_wgmma<T>(kernel, HS)) {
    if constexpr (sizeof(T) == 2) {
      detail::attention_forward_sm90(out, lse, qkv, doc_start, static_cast<int>(B),
                                     static_cast<int>(T_), static_cast<int>(NH),
                                     static_cast<int>(KVH), static_cast<int>(HS), stream);
      return;
    }
  }
  detail::attention_forward_impl(out, lse, qkv, doc_start, static_cast<int>(B),
                                 static_cast<int>(T_),
                                 static_cast<int>(NH), static_cast<int>(KVH),
                                 static_cast<int>(HS), stream);
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                        int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS,
                        cudaStream_t stream, void* workspace, const int32_t* doc_start,
                        bool deterministic, AttentionKernel kernel) {
  detail::check_attention_dims(B, T_, NH, KVH, HS);
  check_alignment<T>(qkv, "qkv");
  check_alignment<T>(dqkv, "dqkv");
  check_alignment<T>(dout, "dout");
  // fp32 is always deterministic (the parity path): only bf16 takes the atomic dQ.
  const bool wgmma = use_wgmma<T>(kernel, HS);
  const bool atomic_dq = !deterministic && sizeof(T) == 2;
  detail::Scratch scratch(workspace,
                          attention_backward_workspace_bytes(B, T_, NH, HS, !atomic_dq), stream);
  float* delta = scratch.as<float>();
  float* dq_accum = atomic_dq ? delta + B * NH * T_ : nullptr;
  const int64_t rows = B * T_ * NH;
  attention_delta_kernel<T><<<detail::grid_for(rows, 8, INT32_MAX), 256, 0, stream>>>(
      delta, dout, out, static_cast<int>(B), static_cast<int>(T_), static_cast<int>(NH),
      static_cast<int>(HS));
  CUDA_CHECK_LAUNCH();
  const int b = static_cast<int>(B), t = static_cast<int>(T_), nh = static_cast<int>(NH);
  const int kvh = static_cast<int>(KVH), hs = static_cast<int>(HS);
  if constexpr (sizeof(T) == 2) {
    if (wgmma)
      detail::attention_backward_sm90(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, b, t, nh,
                                      kvh, hs, stream);
    else
      detail::attention_backward_impl(dqkv, dout, qkv, lse, delta, doc_start, dq_accum, b, t, nh,
                                      kvh, hs, stream);
  } else {
    detail::attention_backward_impl(dqkv, dout, qkv, lse, delta, doc_start, b, t, nh, kvh, hs,
                                    stream);
  }
}

#define TRIDENT_INSTANTIATE(T)                                                                 \
  template void attention_forward<T>(T*, float*, const T*, int64_t, int64_t, int64_t, int64_t, \
                                     int64_t, cudaStream_t, const int32_t*, AttentionKernel);  \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const float*, int64_t, \
                                      int64_t, int64_t, int64_t, int64_t, cudaStream_t, void*,  \
                                      const int32_t*, bool, AttentionKernel);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

#pragma once
// The CUDA kernel set of the transformer graph (model/transformer.hpp): kernels/cuda behind the
// member functions of CpuKernels (model/cpu_kernels.hpp), on one GPU's compute stream.
//
// Precision (T = float or bf16):
//  * float: activations and weights fp32; GEMMs in true fp32 (no TF32): the parity reference
//    against the CPU.
//  * bf16: activations, the residual stream, pipeline messages and tensor-parallel collectives
//    in bf16; GEMMs bf16 x bf16 with fp32 accumulation; norms, softmax, attention and
//    cross-entropy statistics in fp32. Master weights and gradients are fp32 (G = float): the
//    model keeps a bf16 compute copy (convert).
// Mixture of experts (has_moe): fp32 only (kernels/cuda/moe.cu).
// FP8 linear layers (has_fp8, train.precision = "fp8"): bf16 only, on GPUs with FP8 tensor cores
// (compute capability 8.9 or later; cuBLASLt's FP8 GEMMs, kernels/cuda/gemm.cu).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "comm/comm.hpp"
#include "cuda/cuda_device.hpp"
#include "kernels/cpu/moe.hpp"  // the host-side integer bookkeeping, shared with the CPU
#include "kernels/cuda/ops.hpp"
#include "util/error.hpp"

namespace trident {

// The mixture of experts (model/moe.hpp) keeps its activations and statistics in one type, so
// only the fp32 kernel set has it (kernels_have_moe tests for the member).
template <typename Tx>
struct CudaMoeSupport {};
template <>
struct CudaMoeSupport<float> {
  static constexpr bool has_moe = true;
};

template <typename Tx>
class CudaKernels : public CudaMoeSupport<Tx> {
 public:
  using T = Tx;
  using G = float;
  using S = float;
  using Saved = float;  // attention keeps the logsumexp of each row [B,NH,T]
  static constexpr DType act_dtype = std::is_same_v<Tx, float> ? DType::F32 : DType::BF16;
  static constexpr DType stat_dtype = DType::F32;

  // `deterministic` false: the attention backward accumulates dQ with atomics (bf16 only;
  // train.deterministic, kernels/cuda/ops.hpp). `attention`: the bf16 attention kernels
  // (train.attention_kernel).
  explicit CudaKernels(CudaDevice& device, bool deterministic = true,
                       cuda::AttentionKernel attention = cuda::AttentionKernel::automatic)
      : dev_(device), deterministic_(deterministic), attention_kernel_(attention) {}
  Device& device() { return dev_; }
  static int64_t attention_saved_size(int64_t B, int64_t Tn, int64_t NH) { return B * NH * Tn; }

  // Host ids to the device without waiting for the stream: copied into a pinned buffer (a ring
  // of them, each reused once its previous copy has finished), from which the copy runs
  // asynchronously, so the caller may reuse `host` at once.
  void upload_ids(int32_t* dst, const int32_t* host, int64_t n) {
    PinnedStaging& st = *staging_[next_staging_++ % staging_.size()];
    dev_.wait_event(st.copied, "token upload");  // its previous copy (bounded: NCCL may be queued)
    int32_t* pinned = st.reserve(n);
    std::memcpy(pinned, host, static_cast<size_t>(n) * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(dst, pinned, static_cast<size_t>(n) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, s()));
    CUDA_CHECK(cudaEventRecord(st.copied, s()));
  }
  // `acc` in device memory (the step's loss sum: stream-ordered, nothing waits), or in host
  // memory (the MoE block's statistics): then the mean is taken on the device and added here,
  // which waits for the stream.
  void accumulate_mean(double* acc, const S* x, int64_t n) {
    if (is_device_memory(acc)) {
      cuda::accumulate_mean(acc, x, n, s());
      return;
    }
    if (mean_scratch_.size() == 0) mean_scratch_ = DeviceArray<double>(dev_, 1);
    CUDA_CHECK(cudaMemsetAsync(mean_scratch_.data(), 0, sizeof(double), s()));
    cuda::accumulate_mean(mean_scratch_.data(), x, n, s());
    double mean = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&mean, mean_scratch_.data(), sizeof(double),
                               cudaMemcpyDeviceToHost, s()));
    CUDA_CHECK(cudaStreamSynchronize(s()));
    *acc += mean;
  }
  void fill(S* x, int64_t n, S value) { cuda::fill(x, n, value, s()); }
  void copy(T* dst, const T* src, int64_t n) {
    dev_.copy(dst, src, n * static_cast<int64_t>(sizeof(T)));
  }
  void convert(T* dst, const G* src, int64_t n) { cuda::convert(dst, src, n, s()); }
  void add_inplace(T* acc, const T* x, int64_t n) { cuda::add_inplace(acc, x, n, s()); }

  void linear_forward(T* out, const T* inp, const T* w, const T* b, int64_t N, int64_t C,
                      int64_t OC) {
    cuda::linear_forward(dev_.blas(), out, inp, w, b, N, C, OC, s());
  }

  // FP8 linear layers (model/fp8_linear.hpp), the CPU reference's twins on FP8 codes (Q). The host
  // does not wait for the stream per quantised tensor: the current recipe's amaxes, scales and GEMM
  // output factors are formed on the device (fp8_scales_on_device; a staged MPI communicator's
  // reduction still goes through the host), and the delayed recipe's quantise passes take the
  // amaxes into the states' device slots (its first step alone brings them to the host, through
  // abs_max). The backward's GEMMs contract along the forward's rows, and the FP8 tensor cores take
  // both operands contiguous along the contraction, so the backward's operands are quantised
  // straight into that layout, each in one pass (Transformer Engine's cast-transpose): w for dX and
  // x for dW transposed, dy row-major for dX and transposed for dW.
  static constexpr bool has_fp8 = std::is_same_v<Tx, cuda::bf16>;
  using Q = uint8_t;  // an FP8 code
  float abs_max(const T* x, int64_t n) {
    if (amax_.size() == 0) amax_ = DeviceArray<float>(dev_, 1);
    cuda::abs_max(amax_.data(), x, n, s());
    float host = 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(&host, amax_.data(), sizeof(float), cudaMemcpyDeviceToHost, s()));
    CUDA_CHECK(cudaStreamSynchronize(s()));
    return host;
  }
  void fp8_quantize(Q* q, const T* x, int64_t n, Fp8Scale scale, Fp8Format format,
                    float* amax = nullptr) {
    cuda::fp8_quantize(q, x, n, scale.value, format, s(), amax, scale.device);
  }
  // The current recipe's scales kept on the device (kernels_fp8_device_scales).
  static constexpr bool fp8_scales_on_device = true;
  void abs_max_into(float* amax, const T* x, int64_t n) { cuda::abs_max(amax, x, n, s()); }
  void fp8_scales(float* scale, const float* amax, int64_t n, Fp8Format format, int margin) {
    cuda::fp8_scales(scale, amax, n, format, margin, s());
  }
  void fp8_linear_forward(T* out, const Q* xq, const Q* wq, const T* b, int64_t N, int64_t C,
                          int64_t OC, Fp8Dequant inv_scale)
    requires std::is_same_v<Tx, cuda::bf16>
  {
    const GemmScale g = gemm_scale(0, inv_scale);
    cuda::fp8_gemm(dev_.blas(), Fp8Format::E4M3, Fp8Format::E4M3, cuda::DType::BF16, N, OC, C,
                   g.alpha, xq, wq, 0.0f, out, b, s(), g.factor);
  }
  // The backward's operands quantised straight into the layout its GEMMs take (out_t [cols,
  // rows]; rowmajor, or nullptr, [rows, cols] in the same pass; kernels_fp8_transposed_backward).
  static constexpr bool fp8_backward_transposed = true;
  void fp8_quantize_transposed(Q* out_t, Q* rowmajor, const T* x, int64_t rows, int64_t cols,
                               Fp8Scale scale, Fp8Format format, float* amax) {
    cuda::fp8_quantize_transposed(out_t, rowmajor, x, rows, cols, scale.value, format, s(), amax,
                                  scale.device);
  }
  // dyq [N,OC] row-major (for dX), dyt [OC,N], xt [C,N] and wt [C,OC] transposed.
  void fp8_linear_backward_transposed(T* dinp, G* dw, G* db, const T* dout, const Q* dyq,
                                      const Q* dyt, const Q* xt, const Q* wt, int64_t N,
                                      int64_t C, int64_t OC, Fp8Dequant inv_dinp,
                                      Fp8Dequant inv_dw, Fp8Format dy_format)
    requires std::is_same_v<Tx, cuda::bf16>
  {
    if (db) cuda::bias_grad_accumulate<T>(db, dout, N, OC, s(),
                                          workspace(cuda::bias_grad_workspace_bytes(N, OC)));
    if (dinp) {  // dX[N,C] = dy[N,OC] w[OC,C]: w^T [C,OC]
      const GemmScale g = gemm_scale(0, inv_dinp);
      cuda::fp8_gemm(dev_.blas(), dy_format, Fp8Format::E4M3, cuda::DType::BF16, N, C, OC,
                     g.alpha, dyq, wt, 0.0f, dinp, nullptr, s(), g.factor);
    }
    if (dw) {  // dW[OC,C] += dy^T x: dy^T [OC,N], x^T [C,N]
      const GemmScale g = gemm_scale(1, inv_dw);
      cuda::fp8_gemm(dev_.blas(), dy_format, Fp8Format::E4M3, cuda::DType::F32, OC, C, N,
                     g.alpha, dyt, xt, 1.0f, dw, nullptr, s(), g.factor);
    }
  }
  void linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w, int64_t N,
                       int64_t C, int64_t OC) {
    cuda::linear_backward(dev_.blas(), dinp, dw, db, dout, inp, w, N, C, OC, s(),
                          workspace(cuda::bias_grad_workspace_bytes(N, OC)));
  }

  // A GPT-2 MLP's up projection with its GELU, and the GELU's gradient in the down projection's
  // input gradient (train.fused_bias_gelu): in bf16 cuBLASLt's GELU_AUX_BIAS and DGELU epilogues
  // (kernels/cuda/gemm.cu), in fp32 the separate kernels; the CPU sets' twins
  // (model/cpu_kernels.hpp).
  static constexpr bool has_fused_linear_gelu = true;
  void linear_gelu_forward(T* act, T* pre, const T* inp, const T* w, const T* b, int64_t N,
                           int64_t C, int64_t OC) {
    cuda::linear_gelu_forward(dev_.blas(), act, pre, inp, w, b, N, C, OC, s());
  }
  void linear_backward_dgelu(T* dpre, G* dw, G* db, const T* dout, const T* inp, const T* w,
                             const T* pre, int64_t N, int64_t C, int64_t OC) {
    cuda::linear_backward_dgelu(dev_.blas(), dpre, dw, db, dout, inp, w, pre, N, C, OC, s(),
                                workspace(cuda::bias_grad_workspace_bytes(N, OC)));
  }

  void layernorm_forward(T* out, S* mean, S* rstd, const T* inp, const T* w, const T* b,
                         int64_t N, int64_t C) {
    cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, s());
  }
  void layernorm_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                          const S* mean, const S* rstd, int64_t N, int64_t C) {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, s(),
                             workspace(cuda::layernorm_backward_workspace_bytes(N, C)));
  }
  void rmsnorm_forward(T* out, S* rstd, const T* inp, const T* w, int64_t N, int64_t C,
                       double eps) {
    cuda::rmsnorm_forward(out, rstd, inp, w, N, C, static_cast<float>(eps), s());
  }
  void rmsnorm_backward(T* dinp, G* dw, const T* dout, const T* inp, const T* w, const S* rstd,
                        int64_t N, int64_t C) {
    cuda::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, s(),
                           workspace(cuda::rmsnorm_backward_workspace_bytes(N, C)));
  }
  // The residual add fused with the norm after it (one pass over the stream instead of two),
  // and the norms' input gradients added to the stream's in the norm backward (fp32, one
  // rounding): kernels/cuda/ops.hpp, the CPU set's twins.
  static constexpr bool has_fused_residual_norm = true;
  void add_layernorm_forward(T* out, S* mean, S* rstd, T* residual, const T* x, const T* w,
                             const T* b, int64_t N, int64_t C) {
    cuda::add_layernorm_forward(out, mean, rstd, residual, x, w, b, N, C, s());
  }
  void add_rmsnorm_forward(T* out, S* rstd, T* residual, const T* x, const T* w, int64_t N,
                           int64_t C, double eps) {
    cuda::add_rmsnorm_forward(out, rstd, residual, x, w, N, C, static_cast<float>(eps), s());
  }
  void layernorm_backward_add(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                              const S* mean, const S* rstd, int64_t N, int64_t C) {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, s(),
                             workspace(cuda::layernorm_backward_workspace_bytes(N, C)), true);
  }
  void rmsnorm_backward_add(T* dinp, G* dw, const T* dout, const T* inp, const T* w,
                            const S* rstd, int64_t N, int64_t C) {
    cuda::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, s(),
                           workspace(cuda::rmsnorm_backward_workspace_bytes(N, C)), true);
  }

  void attention_forward(T* out, Saved* lse, const T* qkv, int64_t B, int64_t Tn, int64_t NH,
                         int64_t KVH, int64_t HS, const int32_t* doc_start) {
    cuda::attention_forward(out, lse, qkv, B, Tn, NH, KVH, HS, s(), doc_start,
                            attention_kernel_);
  }
  void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const Saved* lse,
                          int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                          const int32_t* doc_start) {
    cuda::attention_backward(
        dqkv, dout, qkv, out, lse, B, Tn, NH, KVH, HS, s(),
        workspace(cuda::attention_backward_workspace_bytes(B, Tn, NH, HS, deterministic_)),
        doc_start, deterministic_, attention_kernel_);
  }
  void rope_forward(T* qkv, int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                    double theta) {
    cuda::rope_forward(qkv, B, Tn, NH, KVH, HS, theta, s());
  }
  void rope_backward(T* dqkv, int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                     double theta) {
    cuda::rope_backward(dqkv, B, Tn, NH, KVH, HS, theta, s());
  }

  // Decoding (Transformer::forward_decode): positions [N] in device memory (upload_ids).
  void rope_forward_at(T* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                       int64_t HS, double theta) {
    cuda::rope_forward_at(qkv, positions, N, NH, KVH, HS, theta, s());
  }
  void kv_cache_attention(T* out, T* k_cache, T* v_cache, const T* qkv, const int32_t* positions,
                          int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS) {
    cuda::kv_cache_attention(out, k_cache, v_cache, qkv, positions, B, Tmax, NH, KVH, HS, s());
  }
  // Context parallelism's ring attention (model/context_parallel.hpp;
  // kernels/cuda/context_attention.cu), float and bf16: key/value blocks [N, 2 KVH HS] packed
  // from qkv rows and the gradient's unpacked into them, one block merged into the running
  // output and the attention's saved log-sum-exp (Saved, [B,NH,Tl]), and its backward; rotary
  // embeddings and learned positions at the rows' positions (device memory, upload_ids).
  void kv_pack(T* kv, const T* qkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS) {
    cuda::kv_pack(kv, qkv, N, NH, KVH, HS, s());
  }
  void kv_unpack(T* dqkv, const T* dkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS) {
    cuda::kv_unpack(dqkv, dkv, N, NH, KVH, HS, s());
  }
  // The ring's kernels do not mask documents on the GPU (the configuration refuses context
  // parallelism there): packed documents are refused here too, never silently unmasked.
  void attention_merge_forward(T* out, Saved* lse, const T* qkv, const T* kv, int64_t B,
                               int64_t Tl, int64_t q0, int64_t Tq, int64_t k0, int64_t Tk,
                               int64_t NH, int64_t KVH, int64_t HS, const int32_t* doc_start,
                               const int32_t*) {
    refuse_ring_documents(doc_start);
    cuda::attention_merge_forward(out, lse, qkv, kv, B, Tl, q0, Tq, k0, Tk, NH, KVH, HS, s());
  }
  void attention_merge_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv,
                                const T* out, const Saved* lse, int64_t B, int64_t Tl,
                                int64_t q0, int64_t Tq, int64_t k0, int64_t Tk, int64_t NH,
                                int64_t KVH, int64_t HS, const int32_t* doc_start,
                                const int32_t*) {
    refuse_ring_documents(doc_start);
    cuda::attention_merge_backward(
        dqkv, dkv, dout, qkv, kv, out, lse, B, Tl, q0, Tq, k0, Tk, NH, KVH, HS, s(),
        workspace(cuda::attention_merge_backward_workspace_bytes(B, Tq, NH)));
  }
  void rope_backward_at(T* dqkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                        int64_t HS, double theta) {
    cuda::rope_backward_at(dqkv, positions, N, NH, KVH, HS, theta, s());
  }
  void position_embedding_forward_at(T* out, const T* wpe, const int32_t* positions, int64_t N,
                                     int64_t C) {
    cuda::position_embedding_forward_at(out, wpe, positions, N, C, s());
  }
  void position_embedding_backward_at(G* dwpe, const T* dout, const int32_t* positions,
                                      int64_t N, int64_t C) {
    cuda::position_embedding_backward_at(
        dwpe, dout, positions, N, C, s(),
        workspace(cuda::position_embedding_backward_at_workspace_bytes(N)));
  }

  // host[n] = x[n] as float (the decoded logits for the sampler); waits for the stream.
  void to_host_float(float* host, const T* x, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      dev_.to_host(host, x, n * static_cast<int64_t>(sizeof(float)));
    } else {
      // bf16 is the upper half of a float's bits.
      std::vector<uint16_t> bits(static_cast<size_t>(n));
      dev_.to_host(bits.data(), x, n * static_cast<int64_t>(sizeof(uint16_t)));
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
        std::memcpy(host + i, &word, sizeof(float));
      }
    }
  }

  void gelu_forward(T* out, const T* inp, int64_t n) { cuda::gelu_forward(out, inp, n, s()); }
  void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
    cuda::gelu_backward(dinp, inp, dout, n, s());
  }
  void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t Fh) {
    cuda::swiglu_forward(out, gate_up, N, Fh, s());
  }
  void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t Fh) {
    cuda::swiglu_backward(dgate_up, dout, gate_up, N, Fh, s());
  }

  void token_embedding_forward(T* out, const int32_t* ids, const T* wte, int64_t N, int64_t C,
                               int64_t vocab_begin, int64_t rows) {
    cuda::token_embedding_forward(out, ids, wte, N, C, vocab_begin, rows, s());
  }
  void token_embedding_backward(G* dwte, const T* dout, const int32_t* ids, int64_t N, int64_t C,
                                int64_t vocab_begin, int64_t rows) {
    cuda::token_embedding_backward(
        dwte, dout, ids, N, C, vocab_begin, rows, s(),
        workspace(cuda::token_embedding_backward_workspace_bytes(N, rows)));
  }
  void position_embedding_forward(T* out, const T* wpe, int64_t first_row, int64_t rows,
                                  int64_t Tn, int64_t C) {
    if (first_row == 0 && rows % Tn == 0)
      cuda::position_embedding_forward(out, wpe, rows / Tn, Tn, C, s());
    else
      cuda::position_embedding_forward_rows(out, wpe, first_row, rows, Tn, C, s());
  }
  void position_embedding_backward(G* dwpe, const T* dout, int64_t B, int64_t Tn, int64_t C) {
    cuda::position_embedding_backward(dwpe, dout, B, Tn, C, s());
  }

  // One read of the logits (online softmax) when the vocabulary is not split, and with the
  // gradient one read and one write (the row held in shared memory). A split vocabulary's
  // backward recomputes the exps rather than keeping them (they would be rounded to T).
  static constexpr bool has_fused_cross_entropy = true;
  static constexpr bool has_fused_cross_entropy_grad = true;
  static constexpr bool cross_entropy_keeps_exps = false;
  void cross_entropy_forward_fused(S* losses, S* row_max, S* sums, const T* logits,
                                   const int32_t* targets, int64_t N, int64_t Vl, int64_t V) {
    cuda::cross_entropy_forward_fused(losses, row_max, sums, logits, targets, N, Vl, V, s());
  }
  void cross_entropy_fused_grad(S* losses, S* row_max, S* sums, T* dlogits, const T* logits,
                                const int32_t* targets, const S* dloss, int64_t N, int64_t Vl,
                                int64_t V) {
    cuda::cross_entropy_fused_grad(losses, row_max, sums, dlogits, logits, targets, dloss, N, Vl,
                                   V, s());
  }
  void cross_entropy_local_max(S* row_max, const T* logits, int64_t N, int64_t Vl,
                               int64_t vocab_begin, int64_t V) {
    cuda::cross_entropy_local_max(row_max, logits, N, Vl, vocab_begin, V, s());
  }
  void cross_entropy_local_sums(S* sums, const T* logits, const int32_t* targets,
                                const S* row_max, int64_t N, int64_t Vl, int64_t vocab_begin,
                                int64_t V) {
    cuda::cross_entropy_local_sums(sums, logits, targets, row_max, N, Vl, vocab_begin, V, s());
  }
  void cross_entropy_loss(S* losses, const S* row_max, const S* sums, int64_t N) {
    cuda::cross_entropy_loss(losses, row_max, sums, N, s());
  }
  void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets,
                              const S* row_max, const S* sums, const S* dloss, int64_t N,
                              int64_t Vl, int64_t vocab_begin, int64_t V) {
    cuda::cross_entropy_backward(dlogits, logits, targets, row_max, sums, dloss, N, Vl,
                                 vocab_begin, V, s());
  }

  // Mixture of experts (kernels/cuda/moe.cu; model/moe.hpp), T = float only. The graph hands
  // the expert GEMMs and the row moves index arrays that are either device memory (the
  // dispatch plan's) or host memory (expert parallelism's receive plan): those are read where
  // they are needed (offsets on the host, row indices on the device), copied when they are not.
  static int64_t moe_capacity(double factor, int64_t Tn, int64_t E, int64_t K) {
    return cpu::moe_capacity(factor, Tn, E, K);
  }
  void moe_router_forward(T* probs, int32_t* expert, T* weight, const T* logits, int64_t N,
                          int64_t E, int64_t K)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_router_forward(probs, expert, weight, logits, N, E, K, s());
  }
  void moe_router_backward(T* dlogits, const T* dweight, const T* dprobs_extra, const T* probs,
                           const int32_t* expert, const T* weight, int64_t N, int64_t E,
                           int64_t K)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_router_backward(dlogits, dweight, dprobs_extra, probs, expert, weight, N, E, K,
                              s());
  }
  void moe_aux_loss_forward(S* aux, const T* probs, const int32_t* expert, int64_t B,
                            int64_t Tn, int64_t E, int64_t K)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_aux_loss_forward(aux, probs, expert, B, Tn, E, K, s());
  }
  void moe_aux_loss_backward(T* dprobs, const S* daux, const int32_t* expert, int64_t B,
                             int64_t Tn, int64_t E, int64_t K)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_aux_loss_backward(dprobs, daux, expert, B, Tn, E, K, s());
  }
  void moe_z_loss_forward(S* z, const T* logits, int64_t B, int64_t Tn, int64_t E)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_z_loss_forward(z, logits, B, Tn, E, s());
  }
  void moe_z_loss_backward(T* dlogits, const S* dz, const T* logits, int64_t B, int64_t Tn,
                           int64_t E)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_z_loss_backward(dlogits, dz, logits, B, Tn, E, s());
  }
  // slot, slot_token, offsets: device; load: host. Waits for the stream (returns M).
  int64_t moe_dispatch_plan(int64_t* slot, int64_t* slot_token, int64_t* offsets,
                            int64_t* load, const int32_t* expert, int64_t B, int64_t Tn,
                            int64_t E, int64_t K, int64_t capacity)
    requires std::is_same_v<Tx, float>
  {
    return cuda::moe_dispatch_plan(slot, slot_token, offsets, load, expert, B, Tn, E, K,
                                   capacity, s(),
                                   workspace(cuda::moe_dispatch_plan_workspace_bytes(B, E)));
  }
  void moe_permute(T* xp, const T* x, const int64_t* slot_token, int64_t M, int64_t C)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_permute(xp, x, device_indices(slot_token, M), M, C, s());
  }
  void moe_permute_backward(T* dx, const T* dxp, const int64_t* slot, int64_t N, int64_t K,
                            int64_t C)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_permute_backward(dx, dxp, slot, N, K, C, s());
  }
  void moe_unpermute(T* out, const T* y, const int64_t* slot, const T* weight, int64_t N,
                     int64_t K, int64_t C)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_unpermute(out, y, slot, weight, N, K, C, s());
  }
  void moe_unpermute_backward(T* dy, T* dweight, const T* dout, const T* y, const int64_t* slot,
                              const T* weight, int64_t N, int64_t K, int64_t C)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_unpermute_backward(dy, dweight, dout, y, slot, weight, N, K, C, s());
  }
  // Expert parallelism's bookkeeping: host integers (offsets may be the dispatch plan's device
  // array, complete since the plan waited for the stream).
  static void moe_ep_send_counts(int64_t* send_rows, int64_t* expert_rows, const int64_t* offsets,
                                 int64_t E, int64_t EP) {
    std::vector<int64_t> host(static_cast<size_t>(E + 1));
    if (is_device_memory(offsets)) {
      CUDA_CHECK(cudaMemcpy(host.data(), offsets, host.size() * sizeof(int64_t),
                            cudaMemcpyDeviceToHost));
      offsets = host.data();
    }
    cpu::moe_ep_send_counts(send_rows, expert_rows, offsets, E, EP);
  }
  static int64_t moe_ep_receive_plan(int64_t* offsets, int64_t* src_row, const int64_t* counts,
                                     int64_t EP, int64_t El) {
    return cpu::moe_ep_receive_plan(offsets, src_row, counts, EP, El);
  }
  void moe_scatter_rows(T* out, const T* in, const int64_t* row, int64_t M, int64_t C)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_scatter_rows(out, in, device_indices(row, M), M, C, s());
  }
  void moe_expert_linear_forward(T* out, const T* inp, const T* w, const T* b,
                                 const int64_t* offsets, int64_t E, int64_t C, int64_t OC)
    requires std::is_same_v<Tx, float>
  {
    cuda::moe_expert_linear_forward(dev_.blas(), out, inp, w, b, host_offsets(offsets, E), E, C,
                                    OC, s());
  }
  void moe_expert_linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp,
                                  const T* w, const int64_t* offsets, int64_t E, int64_t C,
                                  int64_t OC)
    requires std::is_same_v<Tx, float>
  {
    const int64_t* host = host_offsets(offsets, E);
    int64_t most_rows = 0;
    for (int64_t e = 0; e < E; ++e) most_rows = std::max(most_rows, host[e + 1] - host[e]);
    void* ws = db != nullptr ? workspace(cuda::bias_grad_workspace_bytes(most_rows, OC)) : nullptr;
    cuda::moe_expert_linear_backward(dev_.blas(), dinp, dw, db, dout, inp, w, host, E, C, OC,
                                     s(), ws);
  }

 private:
  cudaStream_t s() const { return dev_.stream(); }
  // Scratch shared by the kernels that need it, grown to the largest request (the old buffer is
  // freed with cudaFree, which waits for the work queued on it).
  static void refuse_ring_documents(const int32_t* doc_start) {
    if (doc_start)
      throw Error("packed documents under context parallelism: the GPU's ring attention kernels "
                  "do not mask documents yet");
  }
  void* workspace(size_t bytes) {
    if (static_cast<int64_t>(bytes) > workspace_.size())
      workspace_ = DeviceArray<unsigned char>(dev_, static_cast<int64_t>(bytes));
    return workspace_.data();
  }
  // An FP8 GEMM's output factor as fp8_gemm takes it: alpha where the host knows it
  // (Fp8Dequant::get), else alpha 1 and the factor formed on the device from its operands'
  // scales there (slot 0: the forward's and dX's, 1: dW's).
  struct GemmScale {
    float alpha;
    const float* factor;
  };
  GemmScale gemm_scale(int slot, const Fp8Dequant& d) {
    if (!d.on_device()) return {d.get(), nullptr};
    if (fp8_factors_.size() == 0) fp8_factors_ = DeviceArray<float>(dev_, 2);
    float* out = fp8_factors_.data() + slot;
    cuda::fp8_dequant(out, d.a.device, d.b.device, s());
    return {1.0f, out};
  }

  // Whether p points into device (or managed) memory rather than host memory.
  static bool is_device_memory(const void* p) {
    cudaPointerAttributes attr{};
    CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  }
  // offsets[E+1] readable on the host: copied down (waiting for the stream) when on the device.
  const int64_t* host_offsets(const int64_t* offsets, int64_t E) {
    if (!is_device_memory(offsets)) return offsets;
    host_offsets_.resize(static_cast<size_t>(E + 1));
    CUDA_CHECK(cudaMemcpyAsync(host_offsets_.data(), offsets,
                               host_offsets_.size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                               s()));
    CUDA_CHECK(cudaStreamSynchronize(s()));
    return host_offsets_.data();
  }
  // index[n] readable on the device: uploaded (stream-ordered) when in host memory.
  const int64_t* device_indices(const int64_t* index, int64_t n) {
    if (n == 0 || is_device_memory(index)) return index;
    if (n > uploaded_indices_.size()) uploaded_indices_ = DeviceArray<int64_t>(dev_, n);
    CUDA_CHECK(cudaMemcpyAsync(uploaded_indices_.data(), index,
                               static_cast<size_t>(n) * sizeof(int64_t), cudaMemcpyHostToDevice,
                               s()));
    return uploaded_indices_.data();
  }

  // Page-locked host memory for one id upload, and the event of its last copy.
  struct PinnedStaging {
    int32_t* data = nullptr;
    int64_t capacity = 0;
    cudaEvent_t copied = nullptr;
    PinnedStaging() { CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming)); }
    ~PinnedStaging() {
      if (data != nullptr) cudaFreeHost(data);
      cudaEventDestroy(copied);
    }
    PinnedStaging(const PinnedStaging&) = delete;
    PinnedStaging& operator=(const PinnedStaging&) = delete;
    // At least n ids; the previous copy out of this buffer must have finished (`copied`).
    int32_t* reserve(int64_t n) {
      if (n > capacity) {
        if (data != nullptr) CUDA_CHECK(cudaFreeHost(data));
        data = nullptr;
        CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data),
                                  static_cast<size_t>(n) * sizeof(int32_t)));
        capacity = n;
      }
      return data;
    }
  };
  static std::array<std::unique_ptr<PinnedStaging>, 4> make_staging() {
    std::array<std::unique_ptr<PinnedStaging>, 4> ring;
    for (auto& s : ring) s = std::make_unique<PinnedStaging>();
    return ring;
  }

  CudaDevice& dev_;
  bool deterministic_ = true;
  cuda::AttentionKernel attention_kernel_ = cuda::AttentionKernel::automatic;
  DeviceArray<unsigned char> workspace_;
  std::vector<int64_t> host_offsets_;        // host_offsets' copy
  DeviceArray<int64_t> uploaded_indices_;    // device_indices' copy
  DeviceArray<double> mean_scratch_;         // accumulate_mean into a host accumulator
  DeviceArray<float> amax_;                  // abs_max's device result
  DeviceArray<float> fp8_factors_;           // gemm_scale's two
  // Tokens and targets of two micro-batches in flight.
  std::array<std::unique_ptr<PinnedStaging>, 4> staging_ = make_staging();
  size_t next_staging_ = 0;
};

}  // namespace trident

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
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "comm/comm.hpp"
#include "cuda/cuda_device.hpp"
#include "kernels/cuda/ops.hpp"
#include "util/error.hpp"

namespace trident {

template <typename Tx>
class CudaKernels {
 public:
  using T = Tx;
  using G = float;
  using S = float;
  using Saved = float;  // attention keeps the logsumexp of each row [B,NH,T]
  static constexpr DType act_dtype = std::is_same_v<Tx, float> ? DType::F32 : DType::BF16;
  static constexpr DType stat_dtype = DType::F32;

  explicit CudaKernels(CudaDevice& device) : dev_(device) {}
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
  void accumulate_mean(double* acc, const S* x, int64_t n) {
    cuda::accumulate_mean(acc, x, n, s());
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
  void linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w, int64_t N,
                       int64_t C, int64_t OC) {
    cuda::linear_backward(dev_.blas(), dinp, dw, db, dout, inp, w, N, C, OC, s(),
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

  void attention_forward(T* out, Saved* lse, const T* qkv, int64_t B, int64_t Tn, int64_t NH,
                         int64_t KVH, int64_t HS) {
    cuda::attention_forward(out, lse, qkv, B, Tn, NH, KVH, HS, s());
  }
  void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const Saved* lse,
                          int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS) {
    cuda::attention_backward(dqkv, dout, qkv, out, lse, B, Tn, NH, KVH, HS, s(),
                             workspace(cuda::attention_backward_workspace_bytes(B, Tn, NH)));
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

  // One read of the logits (online softmax) when the vocabulary is not split.
  static constexpr bool has_fused_cross_entropy = true;
  void cross_entropy_forward_fused(S* losses, S* row_max, S* sums, const T* logits,
                                   const int32_t* targets, int64_t N, int64_t Vl, int64_t V) {
    cuda::cross_entropy_forward_fused(losses, row_max, sums, logits, targets, N, Vl, V, s());
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

 private:
  cudaStream_t s() const { return dev_.stream(); }
  // Scratch shared by the kernels that need it, grown to the largest request (the old buffer is
  // freed with cudaFree, which waits for the work queued on it).
  void* workspace(size_t bytes) {
    if (static_cast<int64_t>(bytes) > workspace_.size())
      workspace_ = DeviceArray<unsigned char>(dev_, static_cast<int64_t>(bytes));
    return workspace_.data();
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
  DeviceArray<unsigned char> workspace_;
  // Tokens and targets of two micro-batches in flight.
  std::array<std::unique_ptr<PinnedStaging>, 4> staging_ = make_staging();
  size_t next_staging_ = 0;
};

}  // namespace trident

#pragma once
// CUDA kernels of the GPT forward and backward pass: the GPU twins of kernels/cpu/ops.hpp.
// A plain C++ header (usable from .cpp files compiled by the host compiler): it only includes
// the C runtime API and the bf16 type, both host-compiler clean.
//
// Conventions (the same as the CPU kernels unless stated)
//  * All pointers are DEVICE pointers; every function is asynchronous on `stream` and checks its
//    launches (CUDA_CHECK(cudaGetLastError()) after each), throwing trident::Error on failure.
//  * Row-major shapes. N = B*T rows of the residual stream, C = width.
//  * Parameter gradients ACCUMULATE (+=); activation gradients are OVERWRITTEN.
//  * Storage type T is float or bf16 (__nv_bfloat16) for activations and weights. Arithmetic is
//    fp32 everywhere: GEMM accumulation (cuBLAS compute type 32F), LayerNorm statistics (mean,
//    rstd are float), softmax, attention logsumexp, cross-entropy (row_max, sums, losses are
//    float), and PARAMETER GRADIENTS ARE ALWAYS float (dweight, dbias, dwte, dwpe), also when T is
//    bf16: micro-batches accumulate into fp32 gradient buffers that AdamW reads directly (fp32
//    master weights; convert() makes the bf16 copy, or adamw_update writes it).
//  * Deterministic: no float atomics anywhere; reductions use a fixed partition and order (they
//    depend on the shapes only, not on the device's SM count). Two runs on the same GPU model and
//    library versions give bitwise-identical results (cuBLAS: same algorithm, see docs/gpu.md).
//  * Scratch: kernels that need temporary memory take an optional `workspace` pointer; when it is
//    nullptr they allocate it stream-ordered (cudaMallocAsync / cudaFreeAsync on `stream`).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/fp8.hpp"

namespace trident::cuda {

using bf16 = __nv_bfloat16;

// Throws trident::Error("CUDA error at file:line: <expr>: <name>: <description>").
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace trident::cuda

// Checks a CUDA runtime call; throws trident::Error with file:line and cudaGetErrorString.
#define CUDA_CHECK(call)                                                          \
  do {                                                                            \
    const cudaError_t trident_cuda_err_ = (call);                                 \
    if (trident_cuda_err_ != cudaSuccess)                                         \
      ::trident::cuda::throw_cuda_error(trident_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

namespace trident::cuda {

// ---------------------------------------------------------------- device
// True when the runtime loads and reports at least one device (never throws).
bool device_available();
// "NVIDIA H200 (sm_90, 132 SMs, 139 GiB)" for the current device; "" when none.
std::string device_summary();

// dst[n] = src[n] with conversion (round to nearest even into bf16).
// Instantiated for <bf16, float>, <float, bf16>, <float, float>, <bf16, bf16>.
template <typename Dst, typename Src>
void convert(Dst* dst, const Src* src, int64_t n, cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- cuBLAS(Lt)
// One cuBLAS and one cuBLASLt handle plus a 32 MiB GEMM workspace, created once per device
// (construct it with the device current). The workspace is shared by all calls: use one context
// per stream when streams run GEMMs concurrently.
class CublasContext {
 public:
  explicit CublasContext(size_t workspace_bytes = size_t(32) << 20);
  ~CublasContext();
  CublasContext(const CublasContext&) = delete;
  CublasContext& operator=(const CublasContext&) = delete;

  // fp32 GEMMs may use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32). Off by default: fp32
  // GEMMs are then true fp32 (the parity reference). bf16 GEMMs always use tensor cores.
  void set_allow_tf32(bool allow);
  bool allow_tf32() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

enum class DType : int { F32 = 0, BF16 = 1 };
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::BF16;
};

// Row-major C[M,N] = alpha * op(A) op(B) + beta * C (+ bias[N] on every row, when bias is not
// nullptr), like cpu::gemm. op(A) is [M,K] (A stored [K,M] when trans_a), op(B) is [K,N].
// A and B have type ab, C and bias type c: (F32,F32), (BF16,BF16) and (BF16,F32) are supported.
// fp32 accumulation always. cuBLASLt with a heuristic-chosen algorithm (fused bias epilogue);
// falls back to cublasGemmEx plus a bias kernel when Lt finds no algorithm.
void gemm_ex(CublasContext& ctx, DType ab, DType c, bool trans_a, bool trans_b, int64_t M,
             int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
             int64_t ldb, float beta, void* C, int64_t ldc, const void* bias,
             cudaStream_t stream);

template <typename TAB, typename TC>
inline void gemm(CublasContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 float alpha, const TAB* A, int64_t lda, const TAB* B, int64_t ldb, float beta,
                 TC* C, int64_t ldc, cudaStream_t stream = nullptr, const TC* bias = nullptr) {
  gemm_ex(ctx, dtype_of<TAB>::value, dtype_of<TC>::value, trans_a, trans_b, M, N, K, alpha, A,
          lda, B, ldb, beta, C, ldc, bias, stream);
}

// What a GEMM's epilogue does with the GELU (gemm_gelu).
enum class Gelu { None, Forward, Backward };
// Row-major C[M,N] = gelu(op(A) op(B) + bias) with the GELU's input written to aux [M,N]
// (Gelu::Forward: cuBLASLt's GELU_AUX_BIAS), or C = (op(A) op(B)) * gelu'(aux) (Gelu::Backward:
// DGELU, no bias); A, B, C, bias and aux of type t, the GELU taken in fp32 before C is rounded,
// aux with C's leading dimension. false, doing nothing, where cuBLASLt cannot (ldc not a multiple
// of 8, K = 0, or no algorithm for the shapes): the caller runs the GEMM and the GELU kernel.
bool gemm_gelu(CublasContext& ctx, DType t, bool trans_a, bool trans_b, int64_t M, int64_t N,
               int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb, void* C,
               int64_t ldc, const void* bias, Gelu gelu, const void* aux, cudaStream_t stream);

// ---------------------------------------------------------------- linear (torch layout)
// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC]   (bias may be nullptr; fused epilogue)
template <typename T>
void linear_forward(CublasContext& ctx, T* out, const T* inp, const T* weight, const T* bias,
                    int64_t N, int64_t C, int64_t OC, cudaStream_t stream = nullptr);
// dinp[N,C] = dout @ weight (overwrite; skipped when nullptr);
// dweight[OC,C] += dout^T @ inp (fp32, accumulated by the GEMM with beta = 1; skipped when
// nullptr);
// dbias[OC] += sum_n dout (fp32; skipped when nullptr): with dweight, in the same GEMM where
// cuBLASLt has an algorithm for its BGRADB epilogue (deterministic as the GEMM is: its sums'
// order is the algorithm's), else the deterministic two-pass column reduction.
template <typename T>
void linear_backward(CublasContext& ctx, T* dinp, float* dweight, float* dbias, const T* dout,
                     const T* inp, const T* weight, int64_t N, int64_t C, int64_t OC,
                     cudaStream_t stream = nullptr, void* workspace = nullptr);
// linear_backward's fused half: dweight += dout^T @ inp and dbias += sum_n dout in one GEMM
// (cuBLASLt's BGRADB epilogue, the sums into workspace scratch then added); false, doing
// nothing, where cuBLASLt has no algorithm for it (linear_backward then runs the two).
template <typename T>
bool linear_weight_bias_grad(CublasContext& ctx, float* dweight, float* dbias, const T* dout,
                             const T* inp, int64_t N, int64_t C, int64_t OC,
                             cudaStream_t stream = nullptr, void* workspace = nullptr);
// A GPT-2 MLP's up projection and GELU (train.fused_bias_gelu): pre[N,OC] = inp weight^T + bias
// (kept for backward), act[N,OC] = gelu(pre), the GELU in the GEMM's epilogue where cuBLASLt
// has one (gemm_gelu).
template <typename T>
void linear_gelu_forward(CublasContext& ctx, T* act, T* pre, const T* inp, const T* weight,
                         const T* bias, int64_t N, int64_t C, int64_t OC,
                         cudaStream_t stream = nullptr);
// linear_backward of a layer whose input was gelu(pre[N,C]), with the input gradient through
// the GELU: dpre[N,C] = (dout weight) * gelu'(pre) (overwrite; skipped when nullptr); dweight,
// dbias as linear_backward, computed first.
template <typename T>
void linear_backward_dgelu(CublasContext& ctx, T* dpre, float* dweight, float* dbias,
                           const T* dout, const T* inp, const T* weight, const T* pre, int64_t N,
                           int64_t C, int64_t OC, cudaStream_t stream = nullptr,
                           void* workspace = nullptr);
// dbias[OC] += sum over N rows of dout[N,OC]; workspace: bias_grad_workspace_bytes(N, OC).
template <typename T>
void bias_grad_accumulate(float* dbias, const T* dout, int64_t N, int64_t OC,
                          cudaStream_t stream = nullptr, void* workspace = nullptr);
size_t bias_grad_workspace_bytes(int64_t N, int64_t OC);

// ---------------------------------------------------------------- embeddings
// out[N,C] = wte[ids[n] - vocab_begin] if the id is in [vocab_begin, vocab_begin + rows), else 0.
template <typename T>
void token_embedding_forward(T* out, const int32_t* ids, const T* wte, int64_t N, int64_t C,
                             int64_t vocab_begin, int64_t rows, cudaStream_t stream = nullptr);
// dwte[rows,C] += dout[n] for every n whose id is in range. Deterministic: the (row, n) pairs are
// stably radix-sorted by row (cub), then each row's tokens are summed in token order n.
// workspace: token_embedding_backward_workspace_bytes(N).
template <typename T>
void token_embedding_backward(float* dwte, const T* dout, const int32_t* ids, int64_t N,
                              int64_t C, int64_t vocab_begin, int64_t rows,
                              cudaStream_t stream = nullptr, void* workspace = nullptr);
size_t token_embedding_backward_workspace_bytes(int64_t N, int64_t rows);
// out[B,T,C] += wpe[t]
template <typename T>
void position_embedding_forward(T* out, const T* wpe, int64_t B, int64_t T_, int64_t C,
                                cudaStream_t stream = nullptr);
// dwpe[t,C] += sum_b dout[b,t]   (batch summed in order)
template <typename T>
void position_embedding_backward(float* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C,
                                 cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- layernorm (eps = 1e-5)
// out[N,C] = (inp - mean) * rstd * weight + bias; mean[N], rstd[N] fp32 (two-pass statistics).
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int64_t N, int64_t C, cudaStream_t stream = nullptr);
// The residual add fused with the norm after it: residual[N,C] += x (rounded to T, as
// add_inplace), then layernorm_forward of the sum: bitwise add_inplace + layernorm_forward.
template <typename T>
void add_layernorm_forward(T* out, float* mean, float* rstd, T* residual, const T* x,
                           const T* weight, const T* bias, int64_t N, int64_t C,
                           cudaStream_t stream = nullptr);
// dinp (overwrite; `accumulate`: dinp += dx in fp32, one rounding, and dinp != dout);
// dweight[C] +=, dbias[C] += (fp32; per-block partials over a fixed row chunking, then a second
// pass in chunk order). workspace: layernorm_backward_workspace_bytes.
template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, cudaStream_t stream = nullptr, void* workspace = nullptr,
                        bool accumulate = false);
size_t layernorm_backward_workspace_bytes(int64_t N, int64_t C);

// ---------------------------------------------------------------- GELU (tanh) and residual
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t N, cudaStream_t stream = nullptr);
// dinp = dout * gelu'(inp) (overwrite; dinp may alias dout)
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t N, cudaStream_t stream = nullptr);
// out = a + b
template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t N, cudaStream_t stream = nullptr);
// acc += x
template <typename T>
void add_inplace(T* acc, const T* x, int64_t N, cudaStream_t stream = nullptr);
// x *= s (fp32)
void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream = nullptr);
// x[i] = value (fp32)
void fill(float* x, int64_t n, float value, cudaStream_t stream = nullptr);
// *acc += mean of x[0, n) (double accumulation in a fixed order: bitwise reproducible). The
// losses of a step stay on the device until the step reads their sum once.
void accumulate_mean(double* acc, const float* x, int64_t n, cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- softmax cross-entropy
// The CPU's vocab-parallel three-pass protocol (the caller all-reduces MAX after pass 1 and SUM
// after pass 2 over the tensor group; identity on one rank). logits[N,Vl] are this rank's
// columns [vocab_begin, vocab_begin + Vl); columns >= vocab_size are padding. Statistics fp32.
// One block per row.
template <typename T>
void cross_entropy_local_max(float* row_max, const T* logits, int64_t N, int64_t Vl,
                             int64_t vocab_begin, int64_t vocab_size,
                             cudaStream_t stream = nullptr);
// sums[0,N) = sum exp(logit - row_max) over valid local columns; sums[N,2N) = target logit or 0.
template <typename T>
void cross_entropy_local_sums(float* sums, const T* logits, const int32_t* targets,
                              const float* row_max, int64_t N, int64_t Vl, int64_t vocab_begin,
                              int64_t vocab_size, cudaStream_t stream = nullptr);
// losses[n] = log(sum_exp) + row_max - target_logit
void cross_entropy_loss(float* losses, const float* row_max, const float* sums, int64_t N,
                        cudaStream_t stream = nullptr);
// Single tensor rank (vocab not split): passes 1-3 fused into one read of the logits (online
// softmax). Writes row_max, sums (same layout as above, so cross_entropy_backward applies
// unchanged) and losses.
template <typename T>
void cross_entropy_forward_fused(float* losses, float* row_max, float* sums, const T* logits,
                                 const int32_t* targets, int64_t N, int64_t Vl,
                                 int64_t vocab_size, cudaStream_t stream = nullptr);
// cross_entropy_forward_fused and cross_entropy_backward (vocab_begin 0) in one launch, the
// same bits: each row read once into shared memory and the gradient written from there (the
// two kernels where a row does not fit the block's shared memory). dlogits may alias logits.
template <typename T>
void cross_entropy_fused_grad(float* losses, float* row_max, float* sums, T* dlogits,
                              const T* logits, const int32_t* targets, const float* dloss,
                              int64_t N, int64_t Vl, int64_t vocab_size,
                              cudaStream_t stream = nullptr);
// dlogits = (softmax - onehot(target)) * dloss[n]; padding columns 0; may alias logits.
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets,
                            const float* row_max, const float* sums, const float* dloss,
                            int64_t N, int64_t Vl, int64_t vocab_begin, int64_t vocab_size,
                            cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- causal self-attention
// Grouped-query attention (KVH = NH is multi-head attention), the CPU layout:
// qkv[B,T,(NH+2*KVH)*HS] = [q heads (NH) | k heads (KVH) | v heads (KVH)] per token; query head
// h uses kv head h / (NH/KVH). out[B,T,NH*HS]; scale 1/sqrt(HS).
// Flash-attention style: never materialises T x T in global memory. lse[B,NH,T] (fp32) is the
// per-row logsumexp of the scaled scores, saved for the backward. HS in {32, 64, 128}.
//  * T = float: exact-fp32 SIMT kernels (no tensor cores).
//  * T = bf16:  tensor-core kernels (mma.sync m16n8k16 bf16, fp32 accumulate; P and dS are
//               rounded to bf16 as the A operand of the second GEMM, like FlashAttention-2).
//               Requires 16-byte aligned qkv/out/dout/dqkv (cudaMalloc'd buffers are).
// Packed documents: doc_start[B,T] (device memory; nullptr: none), as the CPU's: row t attends
// to keys [doc_start[t], t], doc_start non-decreasing along a sequence.
// `kernel` (train.attention_kernel) picks the bf16 kernels: mma_sync (the kernels above, any
// sm_80+ GPU), wgmma (Hopper: wgmma, TMA and a producer warp; compute capability 9.0, HS 64 or
// 128), automatic (wgmma where it runs, else mma_sync). fp32 takes the SIMT kernels and refuses
// wgmma. Both kernel sets have the deterministic backward and the atomic-dQ one.
enum class AttentionKernel { automatic, mma_sync, wgmma };
// Whether the wgmma forward runs here for head size HS (the current device is 9.0).
bool attention_wgmma_available(int64_t HS);
template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t NH,
                       int64_t KVH, int64_t HS, cudaStream_t stream = nullptr,
                       const int32_t* doc_start = nullptr,
                       AttentionKernel kernel = AttentionKernel::automatic);
// dqkv (overwrite). Deterministic (no atomics): a dK/dV pass over key blocks (summing the query
// heads of a kv head in head order) and a dQ pass over query blocks, both recomputing P
// blockwise from lse. `deterministic = false` (train.deterministic; bf16 only, fp32 stays
// deterministic): the dK/dV pass also accumulates dQ in fp32 with atomics and the dQ pass
// becomes a conversion: less work, dQ's rounding varies between runs. workspace (fp32 dO.O row
// sums, and the dQ accumulator [B,T,NH,HS] when not deterministic):
// attention_backward_workspace_bytes(B, T_, NH, HS, deterministic).
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                        int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS,
                        cudaStream_t stream = nullptr, void* workspace = nullptr,
                        const int32_t* doc_start = nullptr, bool deterministic = true,
                        AttentionKernel kernel = AttentionKernel::automatic);
size_t attention_backward_workspace_bytes(int64_t B, int64_t T_, int64_t NH, int64_t HS = 0,
                                          bool deterministic = true);

// ---------------------------------------------------------------- Llama ops (CPU twins in
// kernels/cpu/ops.hpp, same conventions)
// RoPE in place on the q and k heads of qkv[B,T,(NH+2*KVH)*HS], rotate-half pairs (i, i+HS/2),
// angle t * theta^(-2i/HS) with t = row mod T; angle, cos and sin computed in double; the
// rotation itself in fp32, stored as T.
template <typename T>
void rope_forward(T* qkv, int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS,
                  double theta, cudaStream_t stream = nullptr);
// dqkv in place: the q and k gradients rotated back.
template <typename T>
void rope_backward(T* dqkv, int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS,
                   double theta, cudaStream_t stream = nullptr);
// Decoding (key/value cache; kernels/cpu/ops.hpp has the contracts): rope_forward on N rows,
// row n at position positions[n] (device memory); one new token per sequence appended to
// k_cache / v_cache [B,KVH,Tmax,HS] and attended over its cached positions.
template <typename T>
void rope_forward_at(T* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                     int64_t HS, double theta, cudaStream_t stream = nullptr);
template <typename T>
void kv_cache_attention(T* out, T* k_cache, T* v_cache, const T* qkv, const int32_t* positions,
                        int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS,
                        cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- context parallelism
// Ring attention (model/context_parallel.hpp; kernels/cpu/ops.hpp has the contracts and
// kernels/cuda/context_attention.cu the design). The saved state is attention_forward's lse
// [B,NH,Tl] (fp32), which the merges update and read. Storage T float or bf16, arithmetic fp32;
// deterministic (no atomics). HS in {32, 64, 128} as attention_forward.
// kv[N,2*KVH*HS] = the k and v columns of qkv[N,(NH+2*KVH)*HS] (a strided copy).
template <typename T>
void kv_pack(T* kv, const T* qkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS,
             cudaStream_t stream = nullptr);
// The k and v columns of dqkv = dkv (q columns untouched).
template <typename T>
void kv_unpack(T* dqkv, const T* dkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS,
               cudaStream_t stream = nullptr);
// Query rows [q0, q0+Tq) of out[B,Tl,NH*HS] and lse merged with the keys [k0, k0+Tk) of
// kv[B,Tl,2*KVH*HS], all visible (lse = -inf: no keys yet).
template <typename T>
void attention_merge_forward(T* out, float* lse, const T* qkv, const T* kv, int64_t B,
                             int64_t Tl, int64_t q0, int64_t Tq, int64_t k0, int64_t Tk,
                             int64_t NH, int64_t KVH, int64_t HS, cudaStream_t stream = nullptr);
// The block's backward from the final out and lse: ACCUMULATES dq into the q columns of dqkv
// rows [q0, q0+Tq) and dk, dv into dkv rows [k0, k0+Tk). workspace (fp32 dO.O row sums):
// attention_merge_backward_workspace_bytes(B, Tq, NH).
template <typename T>
void attention_merge_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv,
                              const T* out, const float* lse, int64_t B, int64_t Tl, int64_t q0,
                              int64_t Tq, int64_t k0, int64_t Tk, int64_t NH, int64_t KVH,
                              int64_t HS, cudaStream_t stream = nullptr,
                              void* workspace = nullptr);
size_t attention_merge_backward_workspace_bytes(int64_t B, int64_t Tq, int64_t NH);
// rope_backward on N rows of dqkv, row n at position positions[n] (device memory): the
// transpose of rope_forward_at, in place.
template <typename T>
void rope_backward_at(T* dqkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                      int64_t HS, double theta, cudaStream_t stream = nullptr);
// out[N,C] += wpe[positions[n]]   (positions: device memory)
template <typename T>
void position_embedding_forward_at(T* out, const T* wpe, const int32_t* positions, int64_t N,
                                   int64_t C, cudaStream_t stream = nullptr);
// dwpe[positions[n],C] += dout[n] (fp32; repeated positions allowed, each position's rows summed
// in row order, then added: token_embedding_backward's deterministic sort). Positions must be
// below kMaxPositionRows (attention's limit on a sequence). workspace:
// position_embedding_backward_at_workspace_bytes(N).
constexpr int64_t kMaxPositionRows = int64_t(1) << 24;
template <typename T>
void position_embedding_backward_at(float* dwpe, const T* dout, const int32_t* positions,
                                    int64_t N, int64_t C, cudaStream_t stream = nullptr,
                                    void* workspace = nullptr);
size_t position_embedding_backward_at_workspace_bytes(int64_t N);
// out[N,C] = inp * rstd * weight, rstd[N] fp32 = 1/sqrt(mean(inp^2) + eps) (fp32 statistics).
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     float eps, cudaStream_t stream = nullptr);
// residual[N,C] += x (rounded to T), then rmsnorm_forward of the sum (as add_layernorm_forward).
template <typename T>
void add_rmsnorm_forward(T* out, float* rstd, T* residual, const T* x, const T* weight,
                         int64_t N, int64_t C, float eps, cudaStream_t stream = nullptr);
// dinp (overwrite; `accumulate`: dinp += dx, as layernorm_backward); dweight[C] += (fp32,
// deterministic: fixed row chunking, chunk order). workspace:
// rmsnorm_backward_workspace_bytes(N, C).
template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t N, int64_t C, cudaStream_t stream = nullptr,
                      void* workspace = nullptr, bool accumulate = false);
size_t rmsnorm_backward_workspace_bytes(int64_t N, int64_t C);
// gate_up[N, 2*Fh] rows [gate | up]; out[N,Fh] = silu(gate) * up (fp32 arithmetic).
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t Fh,
                    cudaStream_t stream = nullptr);
// dgate_up[N, 2*Fh] (overwrite) from dout[N,Fh].
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t Fh,
                     cudaStream_t stream = nullptr);
// Sequence-parallel shard of the position table: out[i,C] += wpe[(first_row + i) % T_] for
// i < rows.
template <typename T>
void position_embedding_forward_rows(T* out, const T* wpe, int64_t first_row, int64_t rows,
                                     int64_t T_, int64_t C, cudaStream_t stream = nullptr);

// ---------------------------------------------------------------- mixture of experts
// The GPU twins of kernels/cpu/moe.hpp (same symbols, shapes and accumulate/overwrite rules;
// docs/moe.md), fp32 only (the MoE graph keeps its activations and statistics in one type).
// Router, losses and row sums in double like the CPU's; deterministic (no atomics).
void moe_router_forward(float* probs, int32_t* expert, float* weight, const float* logits,
                        int64_t N, int64_t E, int64_t K, cudaStream_t stream = nullptr);
void moe_router_backward(float* dlogits, const float* dweight, const float* dprobs_extra,
                         const float* probs, const int32_t* expert, const float* weight,
                         int64_t N, int64_t E, int64_t K, cudaStream_t stream = nullptr);
void moe_aux_loss_forward(float* aux, const float* probs, const int32_t* expert, int64_t B,
                          int64_t Tn, int64_t E, int64_t K, cudaStream_t stream = nullptr);
void moe_aux_loss_backward(float* dprobs, const float* daux, const int32_t* expert, int64_t B,
                           int64_t Tn, int64_t E, int64_t K, cudaStream_t stream = nullptr);
void moe_z_loss_forward(float* z, const float* logits, int64_t B, int64_t Tn, int64_t E,
                        cudaStream_t stream = nullptr);
void moe_z_loss_backward(float* dlogits, const float* dz, const float* logits, int64_t B,
                         int64_t Tn, int64_t E, cudaStream_t stream = nullptr);
// slot, slot_token, offsets on the device; load_host[E] in HOST memory. Returns M, so it waits
// for the stream (two small device-to-host copies). workspace:
// moe_dispatch_plan_workspace_bytes(B, E) (nullptr: stream-ordered allocation).
int64_t moe_dispatch_plan(int64_t* slot, int64_t* slot_token, int64_t* offsets,
                          int64_t* load_host, const int32_t* expert, int64_t B, int64_t Tn,
                          int64_t E, int64_t K, int64_t capacity, cudaStream_t stream = nullptr,
                          void* workspace = nullptr);
size_t moe_dispatch_plan_workspace_bytes(int64_t B, int64_t E);
void moe_permute(float* xp, const float* x, const int64_t* slot_token, int64_t M, int64_t C,
                 cudaStream_t stream = nullptr);
void moe_permute_backward(float* dx, const float* dxp, const int64_t* slot, int64_t N,
                          int64_t K, int64_t C, cudaStream_t stream = nullptr);
void moe_unpermute(float* out, const float* y, const int64_t* slot, const float* weight,
                   int64_t N, int64_t K, int64_t C, cudaStream_t stream = nullptr);
void moe_unpermute_backward(float* dy, float* dweight, const float* dout, const float* y,
                            const int64_t* slot, const float* weight, int64_t N, int64_t K,
                            int64_t C, cudaStream_t stream = nullptr);
void moe_scatter_rows(float* out, const float* in, const int64_t* row, int64_t M, int64_t C,
                      cudaStream_t stream = nullptr);
// The grouped expert GEMMs: one cuBLAS linear per expert over its rows, empty experts skipped.
// offsets_host[E+1] is in HOST memory (it sizes the GEMMs).
void moe_expert_linear_forward(CublasContext& ctx, float* out, const float* inp, const float* w,
                               const float* b, const int64_t* offsets_host, int64_t E, int64_t C,
                               int64_t OC, cudaStream_t stream = nullptr);
// workspace: bias_grad_workspace_bytes(the largest expert's rows, OC), or nullptr.
void moe_expert_linear_backward(CublasContext& ctx, float* dinp, float* dw, float* db,
                                const float* dout, const float* inp, const float* w,
                                const int64_t* offsets_host, int64_t E, int64_t C, int64_t OC,
                                cudaStream_t stream = nullptr, void* workspace = nullptr);

// ---------------------------------------------------------------- optimizer
struct AdamWHyper {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  float grad_scale = 1.f;  // gradients are multiplied by it first (clipping)
  int64_t step = 0;        // 0-based; bias corrections use step + 1 (computed in double)
  // When both are > 0 they are the bias corrections 1 - beta^t, used as given (the trainer
  // passes the CPU optimizer's values, computed from the double betas) and `step` is ignored.
  float bias1 = 0.f, bias2 = 0.f;
};
// Elementwise AdamW on fp32 master weights, exactly the CPU AdamW::update formula:
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)
// (one weight decay for the n elements: the optimizer calls it per segment). When weights_bf16
// is not nullptr it receives the updated weights rounded to bf16 (to nearest even), so that a
// bf16 model needs no second pass over the weights. Memory-bound (28 bytes per element, 30
// with the copy): 16-byte packs where all four fp32 arrays start 16-byte aligned (and the copy
// 8-byte aligned), else one element per thread; either gives the same bits.
void adamw_update(float* weights, const float* grads, float* exp_avg, float* exp_avg_sq,
                  int64_t n, const AdamWHyper& hyper, bf16* weights_bf16 = nullptr,
                  cudaStream_t stream = nullptr);

// *result (device double) = sum g[i]^2 (or += when accumulate), in fp64 with a fixed two-pass
// reduction (kGradNormBlocks partials, then one block in order): bitwise reproducible.
// workspace: grad_square_sum_workspace_bytes().
void grad_square_sum(double* result, const float* g, int64_t n, bool accumulate = false,
                     cudaStream_t stream = nullptr, void* workspace = nullptr);
size_t grad_square_sum_workspace_bytes();

// ---------------------------------------------------------------- FP8
// train.precision = "fp8"'s operands and GEMMs on the GPU (sm_89 and later; the bf16 kernel
// set's FP8 linear layers, cuda/cuda_kernels.hpp). *amax (a device float) = max |in[i]| over n
// values: 0 for n = 0, NaN if any value is NaN, as cpu::abs_max (an integer max over the bits:
// order-independent, deterministic).
template <typename T>
void abs_max(float* amax, const T* in, int64_t n, cudaStream_t stream = nullptr);
// out[i] = the FP8 code (util/fp8.hpp) of in[i] * scale in `format`: round to nearest even,
// saturating at the largest finite value (the hardware's __NV_SATFINITE conversion), NaN to the
// canonical NaN; float_to_fp8 on the host gives the same bits (CudaFp8 tests). amax (a device
// float, or nullptr) becomes the larger of itself and max |in[i]| in the same pass, as abs_max
// takes it (not reset first: the uses of a tensor in a step accumulate into one). scale_ptr (a
// device float, or nullptr: `scale`): the scale where fp8_scales formed it.
template <typename T>
void fp8_quantize(uint8_t* out, const T* in, int64_t n, float scale, Fp8Format format,
                  cudaStream_t stream = nullptr, float* amax = nullptr,
                  const float* scale_ptr = nullptr);
// out_t[cols, rows] = the codes of (in[rows, cols] * scale)^T, as fp8_quantize's, and (out, or
// nullptr) the row-major codes out[rows, cols] in the same pass: the backward's operands, whose
// contraction runs along the rows of the forward's (the FP8 tensor cores take both operands
// contiguous along the contraction, the "TN" form); amax as fp8_quantize's. rows <= 65535 * 32.
template <typename T>
void fp8_quantize_transposed(uint8_t* out_t, uint8_t* out, const T* in, int64_t rows,
                             int64_t cols, float scale, Fp8Format format,
                             cudaStream_t stream = nullptr, float* amax = nullptr,
                             const float* scale_ptr = nullptr);
// The current recipe's scales on the device (device floats): scale[i] = fp8_scale(amax[i], 1,
// format, margin) of util/fp8.hpp, to the bit (correctly rounded divisions).
void fp8_scales(float* scale, const float* amax, int64_t n, Fp8Format format, int margin,
                cudaStream_t stream = nullptr);
// *out = 1 / (*a * *b) (device floats): an FP8 GEMM's output factor from its operands' scales.
void fp8_dequant(float* out, const float* a, const float* b, cudaStream_t stream = nullptr);
// C[M,N] = alpha * A[M,K] B[N,K]^T + beta * C (+ bias[N]) through cuBLASLt's FP8 GEMM, fp32
// accumulation: A and B FP8 codes of formats fa and fb (not both E5M2), row-major and
// contiguous along K (the TN form the FP8 tensor cores take), K a multiple of 16 (their 16-byte
// alignment); C row-major [M,N], bf16 (bias bf16, or nullptr) or f32 (no bias), its rows a
// multiple of 16 bytes, every pointer 16-byte aligned. Throws a trident::Error naming what is
// missing, or the shape and the heuristic's status when cuBLASLt has no kernel for it.
// factor (a device float, or nullptr): multiplies the product too (alpha * *factor * A B^T;
// cuBLASLt's scale pointer of its first operand), an output factor formed on the device.
void fp8_gemm(CublasContext& ctx, Fp8Format fa, Fp8Format fb, DType c, int64_t M, int64_t N,
              int64_t K, float alpha, const uint8_t* A, const uint8_t* B, float beta, void* C,
              const void* bias, cudaStream_t stream = nullptr, const float* factor = nullptr);

}  // namespace trident::cuda

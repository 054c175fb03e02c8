#pragma once
// The CPU kernel set of the transformer graph (model/transformer.hpp): kernels/cpu behind the
// interface the graph calls. Everything lives in host memory and is computed in F (float for
// training, double for the finite-difference gradient tests). The CUDA kernel set
// (cuda/cuda_kernels.hpp) implements the same member functions with the same shapes and the
// same accumulate/overwrite rules; kernels/cpu/ops.hpp documents each one.
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "comm/comm.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cpu/ops.hpp"
#include "tensor/buffer.hpp"
#include "tensor/device.hpp"

namespace trident {

template <typename F>
class CpuKernels {
 public:
  using T = F;      // activations and compute weights
  using G = F;      // master weights and parameter gradients
  using S = F;      // statistics: norm mean / rstd, cross-entropy max, sums and losses
  using Saved = F;  // what attention keeps for its backward: the row log-sum-exp [B,NH,T]
  static constexpr DType act_dtype = std::is_same_v<F, float> ? DType::F32 : DType::F64;
  static constexpr DType stat_dtype = act_dtype;

  // On a host device of its own (tests, tools), or on the trainer's.
  CpuKernels() : dev_(make_cpu_device()) {}
  explicit CpuKernels(Device& host) : dev_(&host, [](Device*) {}) {}
  Device& device() { return *dev_; }
  static int64_t attention_saved_size(int64_t B, int64_t T, int64_t NH) { return B * NH * T; }

  void upload_ids(int32_t* dst, const int32_t* host, int64_t n) {
    std::memcpy(dst, host, sizeof(int32_t) * n);
  }
  // *acc += mean of x[0, n), summed in double in index order.
  void accumulate_mean(double* acc, const S* x, int64_t n) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i]);
    *acc += total / static_cast<double>(n);
  }
  void fill(S* x, int64_t n, S value) {
    for (int64_t i = 0; i < n; ++i) x[i] = value;
  }
  void copy(T* dst, const T* src, int64_t n) { std::memcpy(dst, src, sizeof(T) * n); }
  void add_inplace(T* acc, const T* x, int64_t n) { cpu::add_inplace(acc, x, n); }

  void linear_forward(T* out, const T* inp, const T* w, const T* b, int64_t N, int64_t C,
                      int64_t OC) {
    cpu::linear_forward(out, inp, w, b, N, C, OC);
  }
  void linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w, int64_t N,
                       int64_t C, int64_t OC) {
    cpu::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  // A GPT-2 MLP's up projection with its GELU (train.fused_bias_gelu; the GPU's cuBLASLt
  // epilogue): pre = inp w^T + b, act = gelu(pre). And the input gradient through the GELU:
  // dpre = (dout w) * gelu'(pre), dW and db accumulated as linear_backward does (dpre null: those
  // alone). In fp32 the two steps of the separate calls, so the same bits; the bf16 set and the
  // GPU take the GELU of the product before it is rounded (model/cpu_bf16_kernels.hpp).
  static constexpr bool has_fused_linear_gelu = true;
  void linear_gelu_forward(T* act, T* pre, const T* inp, const T* w, const T* b, int64_t N,
                           int64_t C, int64_t OC) {
    cpu::linear_forward(pre, inp, w, b, N, C, OC);
    cpu::gelu_forward(act, pre, N * OC);
  }
  void linear_backward_dgelu(T* dpre, G* dw, G* db, const T* dout, const T* inp, const T* w,
                             const T* pre, int64_t N, int64_t C, int64_t OC) {
    cpu::linear_backward(dpre, dw, db, dout, inp, w, N, C, OC);
    if (dpre) cpu::gelu_backward(dpre, pre, dpre, N * C);  // elementwise: in place
  }

  void layernorm_forward(T* out, S* mean, S* rstd, const T* inp, const T* w, const T* b,
                         int64_t N, int64_t C) {
    cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                          const S* mean, const S* rstd, int64_t N, int64_t C) {
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(T* out, S* rstd, const T* inp, const T* w, int64_t N, int64_t C,
                       double eps) {
    cpu::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(T* dinp, G* dw, const T* dout, const T* inp, const T* w, const S* rstd,
                        int64_t N, int64_t C) {
    cpu::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  // The residual add fused with the norm after it, and the norms' input gradients added to the
  // residual stream's in the backward (kernels/cpu/ops.hpp).
  static constexpr bool has_fused_residual_norm = true;
  void add_layernorm_forward(T* out, S* mean, S* rstd, T* residual, const T* x, const T* w,
                             const T* b, int64_t N, int64_t C) {
    cpu::add_layernorm_forward(out, mean, rstd, residual, x, w, b, N, C);
  }
  void add_rmsnorm_forward(T* out, S* rstd, T* residual, const T* x, const T* w, int64_t N,
                           int64_t C, double eps) {
    cpu::add_rmsnorm_forward(out, rstd, residual, x, w, N, C, eps);
  }
  void layernorm_backward_add(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                              const S* mean, const S* rstd, int64_t N, int64_t C) {
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, true);
  }
  void rmsnorm_backward_add(T* dinp, G* dw, const T* dout, const T* inp, const T* w,
                            const S* rstd, int64_t N, int64_t C) {
    cpu::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, true);
  }

  // The FP8 reference (train.precision = "fp8"; model/fp8_linear.hpp): quantisation and the
  // linear layer's GEMMs on quantised operands.
  static constexpr bool has_fp8 = true;
  using Q = T;  // a quantised value: the FP8 code's value, held in T (the GPU's holds codes)
  float abs_max(const T* x, int64_t n) { return static_cast<float>(cpu::abs_max(x, n)); }
  // amax: nullptr, or a float of K's memory that becomes the larger of itself and max |x|,
  // as the GPU's quantise pass takes it (Fp8DelayedScaling::amax_slot): by bit pattern, the
  // float order of non-negative values with a NaN above infinity.
  void fp8_quantize(T* q, const T* x, int64_t n, Fp8Scale scale, Fp8Format format,
                    float* amax = nullptr) {
    cpu::fp8_quantize(q, x, n, scale.get(), format);
    if (!amax) return;
    const float a = abs_max(x, n);
    if (std::bit_cast<uint32_t>(a) > std::bit_cast<uint32_t>(*amax)) *amax = a;
  }
  // The linear layer on quantised operands (xq[N,C], wq[OC,C], dyq[N,OC] in `dy_format`, which
  // the values need not be told), each product's sum times its inverse scales, as an FP8 tensor
  // core's output; the bias gradient from the unquantised dout.
  void fp8_linear_forward(T* out, const T* xq, const T* wq, const T* b, int64_t N, int64_t C,
                          int64_t OC, Fp8Dequant inv_scale) {
    cpu::linear_forward(out, xq, wq, b, N, C, OC, static_cast<T>(inv_scale.get()));
  }
  void fp8_linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* dyq, const T* xq,
                           const T* wq, int64_t N, int64_t C, int64_t OC, Fp8Dequant inv_dinp,
                           Fp8Dequant inv_dw, Fp8Format /*dy_format*/) {
    if (db) cpu::linear_backward<T>(nullptr, nullptr, db, dout, nullptr, nullptr, N, C, OC);
    cpu::linear_backward<T>(dinp, dw, nullptr, dyq, xq, wq, N, C, OC,
                            static_cast<T>(dinp ? inv_dinp.get() : 1.0f),
                            static_cast<T>(dw ? inv_dw.get() : 1.0f));
  }

  // doc_start [B,Tn] (K's memory, through upload_ids; nullptr: no documents).
  void attention_forward(T* out, Saved* saved, const T* qkv, int64_t B, int64_t Tn, int64_t NH,
                         int64_t KVH, int64_t HS, const int32_t* doc_start) {
    cpu::attention_forward(out, saved, qkv, B, Tn, NH, KVH, HS, doc_start);
  }
  // `out` (the forward's output) and the saved log-sum-exp: the probabilities are recomputed.
  void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const Saved* saved,
                          int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                          const int32_t* doc_start) {
    cpu::attention_backward(dqkv, dout, qkv, out, saved, B, Tn, NH, KVH, HS, doc_start);
  }
  void rope_forward(T* qkv, int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                    double theta) {
    cpu::rope_forward(qkv, B, Tn, NH, KVH, HS, theta);
  }
  void rope_backward(T* dqkv, int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                     double theta) {
    cpu::rope_backward(dqkv, B, Tn, NH, KVH, HS, theta);
  }

  // Decoding (Transformer::forward_decode): positions [N] come through upload_ids.
  void rope_forward_at(T* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                       int64_t HS, double theta) {
    cpu::rope_forward_at(qkv, positions, N, NH, KVH, HS, theta);
  }
  void kv_cache_attention(T* out, T* k_cache, T* v_cache, const T* qkv, const int32_t* positions,
                          int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS) {
    cpu::kv_cache_attention(out, k_cache, v_cache, qkv, positions, B, Tmax, NH, KVH, HS);
  }

  // Context parallelism's ring attention (model/context_parallel.hpp; kernels/cpu/ops.hpp):
  // key/value blocks [N, 2 KVH HS] packed from qkv rows and the gradient's unpacked into them,
  // one block merged into the running output and log-sum-exp, and its backward; rotary
  // embeddings and learned positions at the rows' positions in their sequences.
  void kv_pack(T* kv, const T* qkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS) {
    cpu::kv_pack(kv, qkv, N, NH, KVH, HS);
  }
  void kv_unpack(T* dqkv, const T* dkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS) {
    cpu::kv_unpack(dqkv, dkv, N, NH, KVH, HS);
  }
  // doc_start [B,Tl] and key_positions [Tl] (packed documents; nullptr: none): kernels/cpu/ops.hpp.
  void attention_merge_forward(T* out, Saved* lse, const T* qkv, const T* kv, int64_t B,
                               int64_t Tl, int64_t q0, int64_t Tq, int64_t k0, int64_t Tk,
                               int64_t NH, int64_t KVH, int64_t HS, const int32_t* doc_start,
                               const int32_t* key_positions) {
    cpu::attention_merge_forward(out, lse, qkv, kv, B, Tl, q0, Tq, k0, Tk, NH, KVH, HS, doc_start,
                                 key_positions);
  }
  void attention_merge_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv,
                                const T* out, const Saved* lse, int64_t B, int64_t Tl,
                                int64_t q0, int64_t Tq, int64_t k0, int64_t Tk, int64_t NH,
                                int64_t KVH, int64_t HS, const int32_t* doc_start,
                                const int32_t* key_positions) {
    cpu::attention_merge_backward(dqkv, dkv, dout, qkv, kv, out, lse, B, Tl, q0, Tq, k0, Tk, NH,
                                  KVH, HS, doc_start, key_positions);
  }
  void rope_backward_at(T* dqkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                        int64_t HS, double theta) {
    cpu::rope_backward_at(dqkv, positions, N, NH, KVH, HS, theta);
  }
  void position_embedding_forward_at(T* out, const T* wpe, const int32_t* positions, int64_t N,
                                     int64_t C) {
    cpu::position_embedding_forward_at(out, wpe, positions, N, C);
  }
  void position_embedding_backward_at(G* dwpe, const T* dout, const int32_t* positions,
                                      int64_t N, int64_t C) {
    cpu::position_embedding_backward_at(dwpe, dout, positions, N, C);
  }

  // host[n] = x[n] as float (the decoded logits for the sampler).
  void to_host_float(float* host, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(x[i]);
  }

  void gelu_forward(T* out, const T* inp, int64_t n) { cpu::gelu_forward(out, inp, n); }
  void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t Fh) {
    cpu::swiglu_forward(out, gate_up, N, Fh);
  }
  void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t Fh) {
    cpu::swiglu_backward(dgate_up, dout, gate_up, N, Fh);
  }

  void token_embedding_forward(T* out, const int32_t* ids, const T* wte, int64_t N, int64_t C,
                               int64_t vocab_begin, int64_t rows) {
    cpu::token_embedding_forward(out, ids, wte, N, C, vocab_begin, rows);
  }
  void token_embedding_backward(G* dwte, const T* dout, const int32_t* ids, int64_t N, int64_t C,
                                int64_t vocab_begin, int64_t rows) {
    cpu::token_embedding_backward(dwte, dout, ids, N, C, vocab_begin, rows);
  }
  // out[i] += wpe[(first_row + i) % Tn] for the rank's rows.
  void position_embedding_forward(T* out, const T* wpe, int64_t first_row, int64_t rows,
                                  int64_t Tn, int64_t C) {
    if (first_row == 0 && rows % Tn == 0)
      cpu::position_embedding_forward(out, wpe, rows / Tn, Tn, C);
    else
      cpu::position_embedding_forward_rows(out, wpe, first_row, rows, Tn, C);
  }
  void position_embedding_backward(G* dwpe, const T* dout, int64_t B, int64_t Tn, int64_t C) {
    cpu::position_embedding_backward(dwpe, dout, B, Tn, C);
  }

  // The vocab-parallel cross-entropy's local passes (kernels/cpu/ops.hpp); the graph reduces
  // between them. On one rank the fused forward, and the forward with the backward, go over
  // each row once while it is in cache; over a tensor group the forward with the backward
  // keeps the exponentials of its second pass for the gradient (one exp per column).
  static constexpr bool has_fused_cross_entropy = true;
  static constexpr bool has_fused_cross_entropy_grad = true;
  static constexpr bool cross_entropy_keeps_exps = true;
  void cross_entropy_forward_fused(S* losses, S* row_max, S* sums, const T* logits,
                                   const int32_t* targets, int64_t N, int64_t Vl, int64_t V) {
    cpu::cross_entropy_fused<T>(losses, row_max, sums, nullptr, logits, targets, nullptr, N, Vl,
                                V);
  }
  void cross_entropy_fused_grad(S* losses, S* row_max, S* sums, T* dlogits, const T* logits,
                                const int32_t* targets, const S* dloss, int64_t N, int64_t Vl,
                                int64_t V) {
    cpu::cross_entropy_fused(losses, row_max, sums, dlogits, logits, targets, dloss, N, Vl, V);
  }
  void cross_entropy_local_max(S* row_max, const T* logits, int64_t N, int64_t Vl,
                               int64_t vocab_begin, int64_t V) {
    cpu::cross_entropy_local_max(row_max, logits, N, Vl, vocab_begin, V);
  }
  // `exps` (this kernel set only): the exponentials kept for cross_entropy_backward_kept.
  void cross_entropy_local_sums(S* sums, const T* logits, const int32_t* targets,
                                const S* row_max, int64_t N, int64_t Vl, int64_t vocab_begin,
                                int64_t V, T* exps = nullptr) {
    cpu::cross_entropy_local_sums(sums, logits, targets, row_max, N, Vl, vocab_begin, V, exps);
  }
  void cross_entropy_backward_kept(T* dlogits, const T* exps, const int32_t* targets,
                                   const S* sums, const S* dloss, int64_t N, int64_t Vl,
                                   int64_t vocab_begin, int64_t V) {
    cpu::cross_entropy_backward_kept(dlogits, exps, targets, sums, dloss, N, Vl, vocab_begin, V);
  }
  void cross_entropy_loss(S* losses, const S* row_max, const S* sums, int64_t N) {
    cpu::cross_entropy_loss(losses, row_max, sums, N);
  }
  void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets,
                              const S* row_max, const S* sums, const S* dloss, int64_t N,
                              int64_t Vl, int64_t vocab_begin, int64_t V) {
    cpu::cross_entropy_backward(dlogits, logits, targets, row_max, sums, dloss, N, Vl,
                                vocab_begin, V);
  }

  // Mixture of experts (kernels/cpu/moe.hpp; model/moe.hpp). The dispatch plan and the
  // statistics are computed in host memory, which is the CPU's device memory.
  static constexpr bool has_moe = true;
  static int64_t moe_capacity(double factor, int64_t Tn, int64_t E, int64_t K) {
    return cpu::moe_capacity(factor, Tn, E, K);
  }
  void moe_router_forward(T* probs, int32_t* expert, T* weight, const T* logits, int64_t N,
                          int64_t E, int64_t K) {
    cpu::moe_router_forward(probs, expert, weight, logits, N, E, K);
  }
  void moe_router_backward(T* dlogits, const T* dweight, const T* dprobs_extra, const T* probs,
                           const int32_t* expert, const T* weight, int64_t N, int64_t E,
                           int64_t K) {
    cpu::moe_router_backward(dlogits, dweight, dprobs_extra, probs, expert, weight, N, E, K);
  }
  void moe_aux_loss_forward(S* aux, const T* probs, const int32_t* expert, int64_t B,
                            int64_t Tn, int64_t E, int64_t K) {
    cpu::moe_aux_loss_forward(aux, probs, expert, B, Tn, E, K);
  }
  void moe_aux_loss_backward(T* dprobs, const S* daux, const int32_t* expert, int64_t B,
                             int64_t Tn, int64_t E, int64_t K) {
    cpu::moe_aux_loss_backward(dprobs, daux, expert, B, Tn, E, K);
  }
  // Context parallelism: the load-balancing loss of sequences split over ranks.
  static constexpr bool has_moe_context = true;
  void moe_aux_loss_partials(double* partials, const T* probs, const int32_t* expert, int64_t B,
                             int64_t Tn, int64_t E, int64_t K) {
    cpu::moe_aux_loss_partials(partials, probs, expert, B, Tn, E, K);
  }
  void moe_aux_loss_from_partials(S* aux, const double* partials, int64_t B, int64_t T_seq,
                                  int64_t E, int64_t K) {
    cpu::moe_aux_loss_from_partials(aux, partials, B, T_seq, E, K);
  }
  void moe_aux_loss_backward_from_partials(T* dprobs, const S* daux, const double* partials,
                                           int64_t B, int64_t Tn, int64_t T_seq, int64_t E,
                                           int64_t K, double scale) {
    cpu::moe_aux_loss_backward_from_partials(dprobs, daux, partials, B, Tn, T_seq, E, K, scale);
  }
  void moe_z_loss_forward(S* z, const T* logits, int64_t B, int64_t Tn, int64_t E) {
    cpu::moe_z_loss_forward(z, logits, B, Tn, E);
  }
  void moe_z_loss_backward(T* dlogits, const S* dz, const T* logits, int64_t B, int64_t Tn,
                           int64_t E) {
    cpu::moe_z_loss_backward(dlogits, dz, logits, B, Tn, E);
  }
  int64_t moe_dispatch_plan(int64_t* slot, int64_t* slot_token, int64_t* offsets,
                            int64_t* load, const int32_t* expert, int64_t B, int64_t Tn,
                            int64_t E, int64_t K, int64_t capacity) {
    return cpu::moe_dispatch_plan(slot, slot_token, offsets, load, expert, B, Tn, E, K,
                                  capacity);
  }
  void moe_permute(T* xp, const T* x, const int64_t* slot_token, int64_t M, int64_t C) {
    cpu::moe_permute(xp, x, slot_token, M, C);
  }
  void moe_permute_backward(T* dx, const T* dxp, const int64_t* slot, int64_t N, int64_t K,
                            int64_t C) {
    cpu::moe_permute_backward(dx, dxp, slot, N, K, C);
  }
  void moe_unpermute(T* out, const T* y, const int64_t* slot, const T* weight, int64_t N,
                     int64_t K, int64_t C) {
    cpu::moe_unpermute(out, y, slot, weight, N, K, C);
  }
  void moe_unpermute_backward(T* dy, T* dweight, const T* dout, const T* y, const int64_t* slot,
                              const T* weight, int64_t N, int64_t K, int64_t C) {
    cpu::moe_unpermute_backward(dy, dweight, dout, y, slot, weight, N, K, C);
  }
  // Expert parallelism's bookkeeping (host integers) and the rows' scatter back.
  static void moe_ep_send_counts(int64_t* send_rows, int64_t* expert_rows, const int64_t* offsets,
                                 int64_t E, int64_t EP) {
    cpu::moe_ep_send_counts(send_rows, expert_rows, offsets, E, EP);
  }
  static int64_t moe_ep_receive_plan(int64_t* offsets, int64_t* src_row, const int64_t* counts,
                                     int64_t EP, int64_t El) {
    return cpu::moe_ep_receive_plan(offsets, src_row, counts, EP, El);
  }
  void moe_scatter_rows(T* out, const T* in, const int64_t* row, int64_t M, int64_t C) {
    cpu::moe_scatter_rows(out, in, row, M, C);
  }
  void moe_expert_linear_forward(T* out, const T* inp, const T* w, const T* b,
                                 const int64_t* offsets, int64_t E, int64_t C, int64_t OC) {
    cpu::moe_expert_linear_forward(out, inp, w, b, offsets, E, C, OC);
  }
  void moe_expert_linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp,
                                  const T* w, const int64_t* offsets, int64_t E, int64_t C,
                                  int64_t OC) {
    cpu::moe_expert_linear_backward(dinp, dw, db, dout, inp, w, offsets, E, C, OC);
  }

 private:
  std::shared_ptr<Device> dev_;
};

}  // namespace trident

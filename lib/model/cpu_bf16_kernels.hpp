#pragma once
// The CPU kernel set of train.precision = "bf16": the CPU reference of the GPU's bf16 path
// (cuda/cuda_kernels.hpp with T = bf16), run by the CPU trainer.
//
// What is bf16 is what the GPU keeps in bf16: every activation and activation gradient the graph
// stores (the residual stream, the norms' outputs, qkv, the attention's output, the MLP's
// tensors, the logits and their gradient), the compute copy of the weights, and the operands of
// every product (the linear layers', the LM head's and the attention's: P and dS are rounded as
// the GPU's tensor-core kernels round them). Sums, norms' statistics, softmax, the loss, the
// parameter gradients, the master weights and AdamW's moments are fp32, as there.
//
// The storage is fp32 holding bf16 values: each kernel computes in fp32 from its bf16 inputs and
// rounds what it writes (nearest even, util/bf16.hpp's rounding) before anything reads it, and a
// tensor-group sum is rounded once after the fp32 reduction (TensorParallel::round_sum). So the
// numbers are bf16's while the CPU kernels stay the fp32 ones; the memory is fp32's (a bf16 run
// on the CPU holds what an fp32 one holds, plus the weights' rounded copy).
//
// The products: a bf16 x bf16 product is exact in fp32, so an fp32 GEMM on bf16 values with
// fp32 sums computes what a bf16 GEMM with fp32 accumulation computes (up to the order of the
// sums). Bf16Gemm::Fma runs them so, at the core's fp32 rate; Bf16Gemm::OneDnn runs the dense
// linear layers and the LM head through oneDNN's bf16 matmul (kernels/cpu/bf16_gemm.hpp: AMX
// tiles, or AVX512-BF16 dot products), which is faster where the core has AMX or dot products
// that outrun its FMAs (Zen 5; not Intel's without AMX: bf16_gemm_outpaces_fp32, docs/gemm.md,
// "The trainer's bf16"), and the attention's products there too, a query block against up to
// 1024 keys per call (kernels/cpu/attention_bf16.cpp: oneDNN's matmul on attention.cpp's
// 128 x 128 x 64 blocks made the 124M step 20 % slower on an AMX core, its cost per call
// outweighing the tiles' speed at that size); the experts' grouped products stay on FMAs.
#include <cstdint>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/scratch.hpp"
#include "model/cpu_kernels.hpp"

namespace trident {

// How the linear layers' bf16 products run (train.cpu_bf16_gemm).
enum class Bf16Gemm { Fma, OneDnn };

class CpuBf16Kernels : public CpuKernels<float> {
 public:
  using Base = CpuKernels<float>;
  // T holds bf16 values: the model keeps a rounded compute copy of the weights (Transformer's
  // compute_weights) and the tensor group rounds its sums (model/tensor_parallel.hpp).
  static constexpr bool bf16_values = true;
  // Not fused: the residual sum is rounded before the norm reads it, as the backward's
  // recomputation of the norm reads the stored (rounded) residual.
  static constexpr bool has_fused_residual_norm = false;
  // The FP8 reference is another precision (train.precision = "fp8").
  static constexpr bool has_fp8 = false;

  CpuBf16Kernels(Device& host, Bf16Gemm gemm) : Base(host), gemm_(gemm) {}

  static void round(T* x, int64_t n) { cpu::round_to_bf16_values(x, n); }
  // The compute copy of the master weights: dst = bf16(src), in one pass.
  void convert(T* dst, const G* src, int64_t n) { cpu::round_to_bf16_values(dst, src, n); }
  // The oneDNN engine's weights in bf16: its products take bf16 operands, and a weight read as
  // fp32 values would be converted at every call (the LM head's 50304 x 768 twice per chunk of
  // rows, forward and dX: 4 times a step of the 124M benchmark shape; every layer's weights
  // twice). The model keeps a packed bf16 copy of
  // its compute weights (kernels_pack_bf16_weights) and re-packs it whenever it re-rounds them
  // (weights_changed); a weight inside that range is read from the copy, any other (ZeRO-3's
  // gathered units) is converted at the call, as before.
  bool packs_weights() const { return gemm_ == Bf16Gemm::OneDnn; }
  void pack_weights(uint16_t* packed, const T* values, int64_t n) {
    cpu::round_to_bf16(values, n, packed);  // values are bf16 already: the bits, exactly
    packed_ = {values, n, packed};
  }
  // The other way, after the optimizer wrote the packed copy itself (AdamW::update's bf16_copy,
  // rounded as each weight is stored): the compute values from the bits, 2 bytes a weight read
  // rather than the 4 of rounding the master weights again and the 6 of packing them.
  void unpack_weights(T* values, const uint16_t* packed, int64_t n) {
    cpu::bf16_bits_to_values(packed, n, values);
    packed_ = {values, n, packed};
  }

  // A tensor-group sum of bf16 values, summed in fp32: rounded once (TensorParallel).
  void round_sum(T* x, int64_t n) { round(x, n); }

  void add_inplace(T* acc, const T* x, int64_t n) {
    Base::add_inplace(acc, x, n);
    round(acc, n);
  }

  void linear_forward(T* out, const T* inp, const T* w, const T* b, int64_t N, int64_t C,
                      int64_t OC) {
    product(out, inp, w, b, N, C, OC);
    round(out, N * OC);
  }
  // The LM head's chunk of logits [N, OC], left unrounded: the loss kernels below round each
  // row as they first read it (kernels_round_logits_in_loss). The logits are the largest tensor
  // of a step (rows x vocabulary): rounding 1024 x 50304 of them in a pass of their own takes
  // 34 ms on one thread here (memory-bound, 12 GB/s), row by row in cache 10 ms; with their
  // gradient's, 48 ms of a ~900 ms step of the small benchmark shape.
  static constexpr bool loss_rounds_logits = true;
  void head_logits_forward(T* out, const T* inp, const T* w, int64_t N, int64_t C, int64_t OC) {
    head_grad_bits_ = {};  // the chunk's buffer is being overwritten
    product(out, inp, w, nullptr, N, C, OC);
  }
  void linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w, int64_t N,
                       int64_t C, int64_t OC) {
    unrounded_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    if (dinp) round(dinp, N * C);
  }
  // The fused GELU as the GPU's cuBLASLt epilogues compute it: from the product in fp32, before
  // the rounding the separate calls store (one rounding of act and of dpre, not two), pre
  // rounded as linear_forward rounds it. The backward's recomputation of act (Transformer's
  // recomputed_act) takes the GELU of the rounded pre, as the GPU's does.
  void linear_gelu_forward(T* act, T* pre, const T* inp, const T* w, const T* b, int64_t N,
                           int64_t C, int64_t OC) {
    product(pre, inp, w, b, N, C, OC);
    cpu::gelu_forward(act, pre, N * OC, true);
    round(pre, N * OC);
  }
  void linear_backward_dgelu(T* dpre, G* dw, G* db, const T* dout, const T* inp, const T* w,
                             const T* pre, int64_t N, int64_t C, int64_t OC) {
    unrounded_backward(dpre, dw, db, dout, inp, w, N, C, OC);
    if (dpre) cpu::gelu_backward(dpre, pre, dpre, N * C, true);  // elementwise: in place
  }

  void layernorm_forward(T* out, S* mean, S* rstd, const T* inp, const T* w, const T* b,
                         int64_t N, int64_t C) {
    Base::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    round(out, N * C);
  }
  void layernorm_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                          const S* mean, const S* rstd, int64_t N, int64_t C) {
    Base::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    round(dinp, N * C);
  }
  void rmsnorm_forward(T* out, S* rstd, const T* inp, const T* w, int64_t N, int64_t C,
                       double eps) {
    Base::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    round(out, N * C);
  }
  void rmsnorm_backward(T* dinp, G* dw, const T* dout, const T* inp, const T* w, const S* rstd,
                        int64_t N, int64_t C) {
    Base::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    round(dinp, N * C);
  }

  void attention_forward(T* out, Saved* saved, const T* qkv, int64_t B, int64_t Tn, int64_t NH,
                         int64_t KVH, int64_t HS, const int32_t* doc_start) {
    if (gemm_ == Bf16Gemm::OneDnn)  // stores its output rounded
      return cpu::attention_forward_bf16(out, saved, qkv, B, Tn, NH, KVH, HS, doc_start);
    cpu::attention_forward(out, saved, qkv, B, Tn, NH, KVH, HS, doc_start, true);
    round(out, B * Tn * NH * HS);
  }
  void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const Saved* saved,
                          int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                          const int32_t* doc_start) {
    if (gemm_ == Bf16Gemm::OneDnn)  // stores its outputs rounded
      return cpu::attention_backward_bf16(dqkv, dout, qkv, out, saved, B, Tn, NH, KVH, HS,
                                          doc_start);
    cpu::attention_backward(dqkv, dout, qkv, out, saved, B, Tn, NH, KVH, HS, doc_start, true);
    round(dqkv, B * Tn * (NH + 2 * KVH) * HS);
  }
  void rope_forward(T* qkv, int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                    double theta) {
    Base::rope_forward(qkv, B, Tn, NH, KVH, HS, theta);
    round(qkv, B * Tn * (NH + 2 * KVH) * HS);
  }
  void rope_backward(T* dqkv, int64_t B, int64_t Tn, int64_t NH, int64_t KVH, int64_t HS,
                     double theta) {
    Base::rope_backward(dqkv, B, Tn, NH, KVH, HS, theta);
    round(dqkv, B * Tn * (NH + 2 * KVH) * HS);
  }
  void rope_forward_at(T* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                       int64_t HS, double theta) {
    Base::rope_forward_at(qkv, positions, N, NH, KVH, HS, theta);
    round(qkv, N * (NH + 2 * KVH) * HS);
  }
  void rope_backward_at(T* dqkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                        int64_t HS, double theta) {
    Base::rope_backward_at(dqkv, positions, N, NH, KVH, HS, theta);
    round(dqkv, N * (NH + 2 * KVH) * HS);
  }
  void kv_cache_attention(T* out, T* k_cache, T* v_cache, const T* qkv, const int32_t* positions,
                          int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS) {
    Base::kv_cache_attention(out, k_cache, v_cache, qkv, positions, B, Tmax, NH, KVH, HS);
    round(out, B * NH * HS);
  }
  // The ring's merges: the running output and the accumulated gradients are bf16 tensors
  // between merges (kv_pack and kv_unpack copy bf16 values).
  void attention_merge_forward(T* out, Saved* lse, const T* qkv, const T* kv, int64_t B,
                               int64_t Tl, int64_t q0, int64_t Tq, int64_t k0, int64_t Tk,
                               int64_t NH, int64_t KVH, int64_t HS, const int32_t* doc_start,
                               const int32_t* key_positions) {
    Base::attention_merge_forward(out, lse, qkv, kv, B, Tl, q0, Tq, k0, Tk, NH, KVH, HS,
                                  doc_start, key_positions);
    round(out, B * Tl * NH * HS);
  }
  void attention_merge_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv,
                                const T* out, const Saved* lse, int64_t B, int64_t Tl,
                                int64_t q0, int64_t Tq, int64_t k0, int64_t Tk, int64_t NH,
                                int64_t KVH, int64_t HS, const int32_t* doc_start,
                                const int32_t* key_positions) {
    Base::attention_merge_backward(dqkv, dkv, dout, qkv, kv, out, lse, B, Tl, q0, Tq, k0, Tk, NH,
                                   KVH, HS, doc_start, key_positions);
    round(dqkv, B * Tl * (NH + 2 * KVH) * HS);
    round(dkv, B * Tl * 2 * KVH * HS);
  }
  void position_embedding_forward_at(T* out, const T* wpe, const int32_t* positions, int64_t N,
                                     int64_t C) {
    Base::position_embedding_forward_at(out, wpe, positions, N, C);
    round(out, N * C);
  }
  void position_embedding_forward(T* out, const T* wpe, int64_t first_row, int64_t rows,
                                  int64_t Tn, int64_t C) {
    Base::position_embedding_forward(out, wpe, first_row, rows, Tn, C);
    round(out, rows * C);
  }

  // Rounded as they are stored (one pass over the MLP's widest tensors rather than two).
  void gelu_forward(T* out, const T* inp, int64_t n) { cpu::gelu_forward(out, inp, n, true); }
  void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
    cpu::gelu_backward(dinp, inp, dout, n, true);
  }
  void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t Fh) {
    Base::swiglu_forward(out, gate_up, N, Fh);
    round(out, N * Fh);
  }
  void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t Fh) {
    Base::swiglu_backward(dgate_up, dout, gate_up, N, Fh);
    round(dgate_up, N * 2 * Fh);
  }

  // The loss: statistics and the loss in fp32 from the bf16 logits; the logits' gradient is
  // bf16. (The one-pass kernels keep their exponentials in fp32 scratch, as the GPU's loss
  // keeps them in registers.)
  // The logits arrive unrounded from head_logits_forward: the kernels that read them first
  // round them (in place; the buffer is the head's scratch, the loss's to overwrite).
  void cross_entropy_forward_fused(S* losses, S* row_max, S* sums, const T* logits,
                                   const int32_t* targets, int64_t N, int64_t Vl, int64_t V) {
    round(const_cast<T*>(logits), N * Vl);
    Base::cross_entropy_forward_fused(losses, row_max, sums, logits, targets, N, Vl, V);
  }
  void cross_entropy_fused_grad(S* losses, S* row_max, S* sums, T* dlogits, const T* logits,
                                const int32_t* targets, const S* dloss, int64_t N, int64_t Vl,
                                int64_t V) {
    if (dlogits == logits) {  // the head's case: each row rounded while in cache
      // The oneDNN engine's two products of the head's backward (dX, dW) read the gradient's
      // bf16 bits: the loss writes them from each row while it is in cache, and the products
      // take them for this buffer (linear_backward) until the next chunk's logits overwrite it
      // (head_logits_forward), instead of each converting the chunk (R x V) from memory.
      uint16_t* bits = nullptr;
      if (gemm_ == Bf16Gemm::OneDnn) {
        bits = cpu::thread_scratch<HeadGradBitsTag, uint16_t>(static_cast<size_t>(N * Vl));
        head_grad_bits_ = {dlogits, N * Vl, bits};
      }
      cpu::cross_entropy_fused(losses, row_max, sums, dlogits, logits, targets, dloss, N, Vl, V,
                               true, bits);
      return;
    }
    round(const_cast<T*>(logits), N * Vl);
    Base::cross_entropy_fused_grad(losses, row_max, sums, dlogits, logits, targets, dloss, N, Vl,
                                   V);
    round(dlogits, N * Vl);
  }
  void cross_entropy_local_max(S* row_max, const T* logits, int64_t N, int64_t Vl,
                               int64_t vocab_begin, int64_t V) {
    round(const_cast<T*>(logits), N * Vl);
    Base::cross_entropy_local_max(row_max, logits, N, Vl, vocab_begin, V);
  }
  void cross_entropy_backward_kept(T* dlogits, const T* exps, const int32_t* targets,
                                   const S* sums, const S* dloss, int64_t N, int64_t Vl,
                                   int64_t vocab_begin, int64_t V) {
    Base::cross_entropy_backward_kept(dlogits, exps, targets, sums, dloss, N, Vl, vocab_begin, V);
    round(dlogits, N * Vl);
  }
  void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets,
                              const S* row_max, const S* sums, const S* dloss, int64_t N,
                              int64_t Vl, int64_t vocab_begin, int64_t V) {
    Base::cross_entropy_backward(dlogits, logits, targets, row_max, sums, dloss, N, Vl,
                                 vocab_begin, V);
    round(dlogits, N * Vl);
  }

  // Mixture of experts: the router's probabilities and weights and every row the experts read
  // or write are bf16; the auxiliary losses are fp32 statistics.
  void moe_router_forward(T* probs, int32_t* expert, T* weight, const T* logits, int64_t N,
                          int64_t E, int64_t K) {
    Base::moe_router_forward(probs, expert, weight, logits, N, E, K);
    round(probs, N * E);
    round(weight, N * K);
  }
  void moe_router_backward(T* dlogits, const T* dweight, const T* dprobs_extra, const T* probs,
                           const int32_t* expert, const T* weight, int64_t N, int64_t E,
                           int64_t K) {
    Base::moe_router_backward(dlogits, dweight, dprobs_extra, probs, expert, weight, N, E, K);
    round(dlogits, N * E);
  }
  void moe_aux_loss_backward(T* dprobs, const S* daux, const int32_t* expert, int64_t B,
                             int64_t Tn, int64_t E, int64_t K) {
    Base::moe_aux_loss_backward(dprobs, daux, expert, B, Tn, E, K);
    round(dprobs, B * Tn * E);
  }
  void moe_aux_loss_backward_from_partials(T* dprobs, const S* daux, const double* partials,
                                           int64_t B, int64_t Tn, int64_t T_seq, int64_t E,
                                           int64_t K, double scale) {
    Base::moe_aux_loss_backward_from_partials(dprobs, daux, partials, B, Tn, T_seq, E, K, scale);
    round(dprobs, B * Tn * E);
  }
  void moe_z_loss_backward(T* dlogits, const S* dz, const T* logits, int64_t B, int64_t Tn,
                           int64_t E) {
    Base::moe_z_loss_backward(dlogits, dz, logits, B, Tn, E);
    round(dlogits, B * Tn * E);
  }
  void moe_permute_backward(T* dx, const T* dxp, const int64_t* slot, int64_t N, int64_t K,
                            int64_t C) {
    Base::moe_permute_backward(dx, dxp, slot, N, K, C);
    round(dx, N * C);
  }
  void moe_unpermute(T* out, const T* y, const int64_t* slot, const T* weight, int64_t N,
                     int64_t K, int64_t C) {
    Base::moe_unpermute(out, y, slot, weight, N, K, C);
    round(out, N * C);
  }
  // dy's rows are the slots of the kept assignments: rounding the buffer's [M,C] rows is done by
  // the caller's size, which this kernel does not know, so the rows it writes are rounded here.
  void moe_unpermute_backward(T* dy, T* dweight, const T* dout, const T* y, const int64_t* slot,
                              const T* weight, int64_t N, int64_t K, int64_t C) {
    Base::moe_unpermute_backward(dy, dweight, dout, y, slot, weight, N, K, C);
    for (int64_t i = 0; i < N * K; ++i)
      if (slot[i] >= 0) round(dy + slot[i] * C, C);
    round(dweight, N * K);
  }
  void moe_expert_linear_forward(T* out, const T* inp, const T* w, const T* b,
                                 const int64_t* offsets, int64_t E, int64_t C, int64_t OC) {
    Base::moe_expert_linear_forward(out, inp, w, b, offsets, E, C, OC);
    round(out, offsets[E] * OC);
  }
  void moe_expert_linear_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp,
                                  const T* w, const int64_t* offsets, int64_t E, int64_t C,
                                  int64_t OC) {
    Base::moe_expert_linear_backward(dinp, dw, db, dout, inp, w, offsets, E, C, OC);
    if (dinp) round(dinp, offsets[E] * C);
  }

 private:
  // linear_backward with dinp left in fp32 (the callers round it, or take the GELU's gradient
  // of it first).
  void unrounded_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const T* w,
                          int64_t N, int64_t C, int64_t OC) {
    if (gemm_ == Bf16Gemm::OneDnn) {
      if (db) cpu::linear_backward<T>(nullptr, nullptr, db, dout, nullptr, nullptr, N, C, OC);
      cpu::linear_backward_bf16(dinp, dw, dout, head_grad_bits(dout, N * OC), inp, w,
                                dinp ? packed(w) : nullptr, N, C, OC);
    } else {
      Base::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    }
  }
  // out[N, OC] = inp W^T (+ b) in fp32 from the bf16 operands, by the engine.
  void product(T* out, const T* inp, const T* w, const T* b, int64_t N, int64_t C, int64_t OC) {
    if (gemm_ == Bf16Gemm::Fma) return Base::linear_forward(out, inp, w, b, N, C, OC);
    // The bias is added in the product's epilogue (not copied into every row first).
    if (const uint16_t* wp = packed(w))
      cpu::gemm_bf16_b_rounded(false, true, N, OC, C, 1.0f, inp, C, wp, C, 0.0f, out, OC, b);
    else
      cpu::gemm_bf16(false, true, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC, b);
  }

  struct HeadGradBitsTag;  // the scratch of the head's gradient bits (kernels/cpu/scratch.hpp)
  // bf16 bits kept for n values held in fp32 storage.
  struct Bits {
    const T* values = nullptr;
    int64_t n = 0;
    const uint16_t* bits = nullptr;
  };

  // The packed bf16 copy of w (pack_weights), or nullptr when w is outside the packed range.
  const uint16_t* packed(const T* w) const {
    const Bits& p = packed_;
    if (p.bits == nullptr || w < p.values || w >= p.values + p.n) return nullptr;
    return p.bits + (w - p.values);
  }
  // The LM head's gradient bits the loss wrote for dout [n] (cross_entropy_fused_grad), or
  // nullptr.
  const uint16_t* head_grad_bits(const T* dout, int64_t n) const {
    const Bits& h = head_grad_bits_;
    return h.bits != nullptr && dout == h.values && n == h.n ? h.bits : nullptr;
  }

  Bf16Gemm gemm_;
  Bits packed_;          // the compute weights' bits, owned by the model
  Bits head_grad_bits_;  // the head chunk's gradient bits, in this thread's scratch
};

}  // namespace trident

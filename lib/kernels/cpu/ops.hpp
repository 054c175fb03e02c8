#pragma once
// CPU kernels of the GPT forward and backward pass, llm.c style: explicit functions on raw
// pointers with the shapes in comments. Every kernel is a template instantiated for float (the
// trainer) and double (the finite-difference gradient tests).
//
// Conventions
//  * Shapes are row-major. N = B*T rows of the residual stream, C = width.
//  * Parameter gradients ACCUMULATE (+=): micro-batches add into the same gradient buffer.
//  * Activation gradients (dinp, dqkv, ...) are OVERWRITTEN.
//  * Multithreaded loops are deterministic for a given thread count (static partitioning,
//    fixed reduction order), so two runs of one configuration are bitwise identical.
//  * Where a kernel takes the sequence length T, the element type is spelled F (a template
//    parameter may not share its name with a function parameter).
//  * Vocab-parallel kernels see only this rank's rows [vocab_begin, vocab_begin + rows) of the
//    (padded) vocabulary; ids and columns >= vocab_size (padding) never contribute.
#include <cstdint>

#include "util/fp8.hpp"

namespace trident::cpu {

// ---------------------------------------------------------------- embeddings
// out[N,C] = wte[ids[n] - vocab_begin] if vocab_begin <= ids[n] < vocab_begin + rows, else 0.
// wte: [rows, C], ids: [N]
template <typename T>
void token_embedding_forward(T* out, const int32_t* ids, const T* wte, int64_t N, int64_t C,
                             int64_t vocab_begin, int64_t rows);
// dwte[rows,C] += dout[n] for every n whose id is in this rank's range.
template <typename T>
void token_embedding_backward(T* dwte, const T* dout, const int32_t* ids, int64_t N, int64_t C,
                              int64_t vocab_begin, int64_t rows);
// out[B,T,C] += wpe[t]   (wpe: [T_max >= T, C])
template <typename F>
void position_embedding_forward(F* out, const F* wpe, int64_t B, int64_t T, int64_t C);
// Rows [first_row, first_row + rows) of the flattened [B,T] grid only (a sequence-parallel
// shard): out[i,C] += wpe[(first_row + i) % T]
template <typename F>
void position_embedding_forward_rows(F* out, const F* wpe, int64_t first_row, int64_t rows,
                                     int64_t T, int64_t C);
// dwpe[t,C] += sum_b dout[b,t]
template <typename F>
void position_embedding_backward(F* dwpe, const F* dout, int64_t B, int64_t T, int64_t C);

// ---------------------------------------------------------------- layernorm (eps = 1e-5)
// out[N,C] = (inp - mean) * rstd * weight + bias; saves mean[N], rstd[N] for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C);
// residual[N,C] += x, then out = layernorm(residual) as above: the residual add fused with the
// norm that reads its result (one pass over the rows, each row in L1 for both).
template <typename T>
void add_layernorm_forward(T* out, T* mean, T* rstd, T* residual, const T* x, const T* weight,
                           const T* bias, int64_t N, int64_t C);
// dinp[N,C] (overwrite; with add_to_dinp, accumulate: the residual stream's gradient takes the
// norm's input gradient without a separate add); dweight[C] += ; dbias[C] +=
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t N, int64_t C,
                        bool add_to_dinp = false);

// ---------------------------------------------------------------- linear (torch layout)
// out[N,OC] = scale * (inp[N,C] @ weight[OC,C]^T) + bias[OC]     (bias may be nullptr)
// `scale` multiplies each product's sum, as an FP8 tensor core's output scaling does (1 but for
// the FP8 reference's quantised operands).
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC, T scale = T(1));
// dinp[N,C] = dinp_scale * (dout[N,OC] @ weight) (overwrite; skipped when dinp == nullptr)
// dweight[OC,C] += dweight_scale * (dout^T @ inp);  dbias[OC] += sum_n dout (each skipped when
// nullptr)
template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC, T dinp_scale = T(1),
                     T dweight_scale = T(1));

// ---------------------------------------------------------------- causal self-attention
// Grouped-query attention (KVH = NH is multi-head attention).
// qkv[B,T,(NH+2*KVH)*HS]: per token [q of heads 0..NH-1 | k of kv heads 0..KVH-1 | v of kv
// heads], head h of q at columns [h*HS, (h+1)*HS), kv head j of k at (NH+j)*HS, of v at
// (NH+KVH+j)*HS. Query head h uses kv head h / (NH/KVH) (NH % KVH == 0).
// out[B,T,NH*HS] (heads concatenated). lse[B,NH,T] saves each row's log-sum-exp of its scaled
// scores, log sum_{s<=t} exp(scale q_t.k_s) (row t attends to s <= t): all the backward needs
// besides qkv and out. Scale 1/sqrt(HS). Blocked with an online softmax: no [T,T] matrix exists;
// the scratch is two 128 x 128 blocks per thread, allocated per call.
// Packed documents: doc_start[B,T] (nullptr: none) gives each row the first row of its document
// (model/documents.hpp: doc_start[t] <= t, non-decreasing in t); row t then attends to
// s in [doc_start[t], t] only, and the key blocks wholly before a row block's documents are
// skipped.
// bf16_operands (train.precision = "bf16" on the CPU, model/cpu_bf16_kernels.hpp): P is
// rounded to bf16 before it multiplies V, as the GPU's bf16 kernels round it for their second
// tensor-core product (the row sums are taken before the rounding, in fp32, as there); q, k and
// v are then bf16 values already, so every product of the attention has bf16 inputs and fp32
// sums.
template <typename F>
void attention_forward(F* out, F* lse, const F* qkv, int64_t B, int64_t T, int64_t NH,
                       int64_t KVH, int64_t HS, const int32_t* doc_start = nullptr,
                       bool bf16_operands = false);
// dqkv[B,T,(NH+2*KVH)*HS] (overwrite; the k and v gradients of a kv head sum over its query
// heads in head order). out and lse: the forward's, doc_start the forward's. P is recomputed
// block by block. bf16_operands: P and dS are rounded to bf16 before the products that read
// them (dV, and dK, dQ), as in the forward.
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                        int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS,
                        const int32_t* doc_start = nullptr, bool bf16_operands = false);
// The same attention with bf16 operands (as bf16_operands = true) but its products on oneDNN's
// bf16 matmul (kernels/cpu/bf16_gemm.hpp: AMX tiles where the core has them), a query block
// against up to 1024 keys per call rather than 128 x 128 blocks: the attention of the CPU's bf16
// oneDNN engine (model/cpu_bf16_kernels.hpp). q, k, v and dout must hold bf16 values; out and
// dqkv are stored rounded to bf16 (lse in fp32). Same arguments and results, rounded, up to the
// order of the fp32 sums (attention_bf16.cpp).
void attention_forward_bf16(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                            int64_t NH, int64_t KVH, int64_t HS, const int32_t* doc_start);
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                             int64_t HS, const int32_t* doc_start);

// ---------------------------------------------------------------- rotary embeddings (RoPE)
// In place on the q heads (NH) and k heads (KVH) of qkv[B,T,(NH+2*KVH)*HS] (layout of
// attention_forward; v untouched), "rotate half" convention (Hugging Face Llama): within a
// head the pairs are (i, i + HS/2), i < HS/2, rotated by angle t * theta^(-2i/HS), t the
// position of the row in its sequence (row index mod T):
//   x'[i] = x[i] cos - x[i+HS/2] sin;   x'[i+HS/2] = x[i+HS/2] cos + x[i] sin.
// Angles, cos and sin are computed in double. HS must be even.
template <typename F>
void rope_forward(F* qkv, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS,
                  double theta);
// dqkv in place: the q and k gradients rotated back (the transpose of the forward rotation).
template <typename F>
void rope_backward(F* dqkv, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS,
                   double theta);

// ---------------------------------------------------------------- decoding (key/value cache)
// rope_forward on N rows of qkv[N,(NH+2*KVH)*HS] where row n is at position positions[n].
template <typename F>
void rope_forward_at(F* qkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                     int64_t HS, double theta);
// One new token per sequence b < B at position positions[b] < Tmax: its k and v (rows of
// qkv[B,(NH+2*KVH)*HS], layout of attention_forward, k rotated) are written into
// k_cache / v_cache [B,KVH,Tmax,HS] at that position, then out[B,NH*HS] = softmax(scale q K^T) V
// over the cached positions 0..positions[b] (what attention_forward gives that row).
template <typename F>
void kv_cache_attention(F* out, F* k_cache, F* v_cache, const F* qkv, const int32_t* positions,
                        int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS);

// ---------------------------------------------------------------- context parallelism
// Ring attention: a sequence of length T is cut into 2N chunks of Tc rows; context rank i holds
// chunks i and 2N-1-i, its local sequence of Tl = 2*Tc rows (chunk i first), and the causal
// attention of its rows is attention_forward on the local qkv merged with the key/value blocks
// of the other ranks. The block that travels is kv[B,Tl,2*KVH*HS]: per row [k of kv heads
// 0..KVH-1 | v of kv heads] (qkv's k and v columns, same order).
//
// kv[N,2*KVH*HS] = the k and v columns of qkv[N,(NH+2*KVH)*HS] (overwrite).
template <typename F>
void kv_pack(F* kv, const F* qkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS);
// The k and v columns of dqkv[N,(NH+2*KVH)*HS] = dkv[N,2*KVH*HS] (overwrite; q columns
// untouched).
template <typename F>
void kv_unpack(F* dqkv, const F* dkv, int64_t N, int64_t NH, int64_t KVH, int64_t HS);
// Merges one key/value block into a partial attention result, per sequence b < B and head h:
// for the query rows t in [q0, q0+Tq) of qkv[B,Tl,(NH+2*KVH)*HS], out[B,Tl,NH*HS] and
// lse[B,NH,Tl] hold the normalised attention over the keys seen so far and the log-sum-exp of
// their scaled scores (lse = -inf: no keys yet, out is then ignored); afterwards they hold the
// attention over those keys and the keys s in [k0, k0+Tk) of kv[B,Tl,2*KVH*HS] (same b, all
// visible: no mask), as if attention_forward had seen them all. Rows outside [q0, q0+Tq) are
// untouched. The block's own result is computed with the online softmax and merged as
//   lse' = log(exp(lse) + exp(lse_blk)),  out' = out exp(lse - lse') + out_blk exp(lse_blk - lse').
// Packed documents: doc_start[B,Tl] (nullptr: none) holds each local query row's document
// start as a position in the whole sequence, key_positions[Tl] each block row's position there
// (non-decreasing); query row t then sees only the keys at positions >= doc_start[t] (a row
// that sees none of the block keeps its out and lse).
template <typename F>
void attention_merge_forward(F* out, F* lse, const F* qkv, const F* kv, int64_t B, int64_t Tl,
                             int64_t q0, int64_t Tq, int64_t k0, int64_t Tk, int64_t NH,
                             int64_t KVH, int64_t HS, const int32_t* doc_start = nullptr,
                             const int32_t* key_positions = nullptr);
// The backward of one merged block, from the FINAL out and lse (after every merge) and dout
// [B,Tl,NH*HS]: with P = exp(scale q k^T - lse) over the block and D = rowsum(dout * out),
//   dv += P^T dout,  dS = P * (dout v^T - D),  dk += scale dS^T q,  dq += scale dS k.
// ACCUMULATES: dq into the q columns of dqkv[B,Tl,(NH+2*KVH)*HS] rows [q0, q0+Tq), dk and dv
// into dkv[B,Tl,2*KVH*HS] rows [k0, k0+Tk); nothing else is written. The sum of the blocks'
// dq over all the keys a row sees, plus attention_backward's, is the row's dq.
// doc_start, key_positions: the forward's.
template <typename F>
void attention_merge_backward(F* dqkv, F* dkv, const F* dout, const F* qkv, const F* kv,
                              const F* out, const F* lse, int64_t B, int64_t Tl, int64_t q0,
                              int64_t Tq, int64_t k0, int64_t Tk, int64_t NH, int64_t KVH,
                              int64_t HS, const int32_t* doc_start = nullptr,
                              const int32_t* key_positions = nullptr);
// rope_backward on N rows of dqkv[N,(NH+2*KVH)*HS] where row n is at position positions[n]:
// the transpose of rope_forward_at (in place).
template <typename F>
void rope_backward_at(F* dqkv, const int32_t* positions, int64_t N, int64_t NH, int64_t KVH,
                      int64_t HS, double theta);
// out[N,C] += wpe[positions[n]]   (wpe: [T_max > every position, C])
template <typename F>
void position_embedding_forward_at(F* out, const F* wpe, const int32_t* positions, int64_t N,
                                   int64_t C);
// dwpe[positions[n],C] += dout[n], summed in row order n = 0..N-1 (repeated positions allowed).
template <typename F>
void position_embedding_backward_at(F* dwpe, const F* dout, const int32_t* positions, int64_t N,
                                    int64_t C);

// ---------------------------------------------------------------- RMSNorm
// out[N,C] = inp * rstd * weight, rstd[n] = 1 / sqrt(mean_c(inp^2) + eps) (saved for backward;
// statistics accumulated in double for float).
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     double eps);
// residual[N,C] += x, then out = rmsnorm(residual) as above, fused (see add_layernorm_forward).
template <typename T>
void add_rmsnorm_forward(T* out, T* rstd, T* residual, const T* x, const T* weight, int64_t N,
                         int64_t C, double eps);
// dinp[N,C] (overwrite; with add_to_dinp, accumulate); dweight[C] +=
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C, bool add_to_dinp = false);

// ---------------------------------------------------------------- SwiGLU
// gate_up[N, 2*Fh]: each row [gate (Fh) | up (Fh)]. out[N,Fh] = silu(gate) * up,
// silu(x) = x / (1 + exp(-x)).
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t Fh);
// dgate_up[N, 2*Fh] (overwrite) from dout[N,Fh].
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t Fh);

// ---------------------------------------------------------------- GELU, tanh approximation
// out[N] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// round_bf16 (float only; the CPU's bf16 precision): each result stored rounded to bf16 (nearest
// even, bf16_gemm.hpp's rounding), in the same pass.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t N, bool round_bf16 = false);
// dinp[N] = dout * gelu'(inp)   (overwrite; round_bf16 as above)
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t N, bool round_bf16 = false);

// ---------------------------------------------------------------- FP8 quantisation
// max |x[i]| over n values (0 for n = 0; NaN if any value is NaN, so that a bad tensor cannot
// hide in a scale).
template <typename F>
F abs_max(const F* x, int64_t n);
// q[i] = fp8(x[i] * scale) in `format` (util/fp8.hpp: round to nearest even, saturating), as the
// float of that FP8 value (not divided by the scale): a GEMM of two such tensors in fp32 is what
// an FP8 tensor core computes before its output is multiplied by 1 / (scale_a * scale_b).
template <typename F>
void fp8_quantize(F* q, const F* x, int64_t n, float scale, Fp8Format format);

// ---------------------------------------------------------------- residual
// out[N] = a + b
template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t N);
// acc[N] += x
template <typename T>
void add_inplace(T* acc, const T* x, int64_t N);

// ---------------------------------------------------------------- softmax cross-entropy
// Vocab-parallel in three local passes with the reductions between them done by the caller
// (identity on one rank; MAX then SUM all-reduce over the tensor group otherwise).
// logits[N,Vl]: this rank's columns [vocab_begin, vocab_begin+Vl); targets[N] global ids.
//
// 1. row_max[N] = max over valid local columns (-inf when this rank has none).
template <typename T>
void cross_entropy_local_max(T* row_max, const T* logits, int64_t N, int64_t Vl,
                             int64_t vocab_begin, int64_t vocab_size);
// 2. with the global row_max: sums[0..N) = sum_v exp(logit - row_max) over valid local columns,
//    sums[N..2N) = logits[n, target - vocab_begin] if the target is local, else 0.
//    (One buffer so that the caller needs one SUM all-reduce of 2N values.) With `exps`, also
//    exps[N, Vl] = exp(logit - row_max) over the valid columns (the padding is left as it is)
//    for cross_entropy_backward_kept; exps may alias logits (each row's target logit is read
//    first): the backward then makes no second exp of each column.
template <typename T>
void cross_entropy_local_sums(T* sums, const T* logits, const int32_t* targets, const T* row_max,
                              int64_t N, int64_t Vl, int64_t vocab_begin, int64_t vocab_size,
                              T* exps = nullptr);
// 3. losses[n] = log(sum_exp[n]) + row_max[n] - target_logit[n]   (sums = [sum_exp | target])
template <typename T>
void cross_entropy_loss(T* losses, const T* row_max, const T* sums, int64_t N);
// dlogits[N,Vl] = (softmax - onehot(target)) * dloss[n]; padding columns get 0.
// dlogits may alias logits (in place).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const T* row_max,
                            const T* sums, const T* dloss, int64_t N, int64_t Vl,
                            int64_t vocab_begin, int64_t vocab_size);
// cross_entropy_backward from the kept exponentials (cross_entropy_local_sums's exps): the same
// outputs bit for bit. dlogits may alias exps.
template <typename T>
void cross_entropy_backward_kept(T* dlogits, const T* exps, const int32_t* targets, const T* sums,
                                 const T* dloss, int64_t N, int64_t Vl, int64_t vocab_begin,
                                 int64_t vocab_size);
// The whole vocabulary on this rank (vocab_begin = 0, no reduction between the passes): 1-3
// for each row in turn, and with dlogits and dloss (both or neither) the backward, while the row
// (Vl values: 200 KB at a 50k vocabulary) is in cache; the passes above stream the whole chunk
// of logits from memory three times. Same arithmetic as 1-3 and the backward, so the outputs
// are theirs bit for bit. dlogits may alias logits.
// bf16_rows (float, with dlogits aliasing logits: the CPU's bf16, model/cpu_bf16_kernels.hpp):
// each row is rounded to bf16 in place before it is read and its gradient after it is written,
// while the row is in cache: what rounding the whole chunk before and after computes, without
// the two passes over it from memory. dlogits_bits (with bf16_rows and dlogits; nullptr: none)
// [N, Vl] receives the gradient's bf16 bits too, written from the row while it is in cache:
// the operand the oneDNN engine's products read, without a conversion pass of their own.
template <typename T>
void cross_entropy_fused(T* losses, T* row_max, T* sums, T* dlogits, const T* logits,
                         const int32_t* targets, const T* dloss, int64_t N, int64_t Vl,
                         int64_t vocab_size, bool bf16_rows = false,
                         uint16_t* dlogits_bits = nullptr);

}  // namespace trident::cpu

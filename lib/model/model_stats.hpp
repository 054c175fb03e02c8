#pragma once
// Derived figures printed at start (and by `trident model`) and used for GFLOP/s, for both
// architectures (model.arch). The formulas are documented in docs/model.md. Symbols: V vocab
// (unpadded), Vp padded vocabulary, T seq_len, C width, L layers, NH heads, KVH kv_head_count(),
// HS = C / NH head size, F = ffn_size().
#include <cstdint>

#include "config/config.hpp"
#include "model/architecture.hpp"

namespace trident {

// Unique trainable parameters of the global model (vocabulary unpadded; a tied LM head counted
// once, as the token embedding):
//   V*C  (+ T*C position table, gpt2)
//   + L * ( C*(NH + 2*KVH)*HS + NH*HS*C                 attention: qkv, output projection
//           (+ (NH + 2*KVH)*HS + C                      their biases, gpt2)
//           + 2*C*F + F + C  (gpt2: fc1, fc2, biases)  |  3*C*F  (llama: gate, up, down)
//           + 4*C (gpt2: two LayerNorms)               |  2*C    (llama: two RMSNorms) )
//   + 2*C (gpt2 final LayerNorm)  |  C (llama final RMSNorm)
//   + V*C when model.tie_embeddings is false (separate LM head)
// gpt2 with F = 4C, KVH = NH: V*C + T*C + L*(12*C^2 + 13*C) + 2*C.
// A mixture of experts (model.moe_experts = E > 0): each of the Lm = ceil(L / interval) MoE
// layers counts E MLPs and the router E*C in place of its MLP.
// Exact; throws trident::Error naming model.width when the count does not fit in int64.
int64_t parameter_count(const ModelConfig& m);
// The parameters one token uses: parameter_count with model.moe_top_k MLPs per MoE layer in
// place of E (the router counted whole). = parameter_count for a dense model.
int64_t active_parameter_count(const ModelConfig& m);
// Layers with a MoE MLP (ModelConfig::is_moe_layer): ceil(L / interval), 0 when dense.
int64_t moe_layer_count(const ModelConfig& m);

// Training FLOPs (forward + backward = 3 x forward) per token, counting matmuls only
// (Megatron-LM's convention: attention over the full T x T, embedding lookups and elementwise
// work not counted), with Vp the padded vocabulary the LM head multiplies:
//   3 * ( 2*L*( C*(NH + 2*KVH)*HS + NH*HS*C + M*C*F )  +  L*4*T*NH*HS  +  2*C*Vp ),
// M = 2 MLP matrices (gpt2) or 3 (llama); a MoE layer counts M*C*F once per routed expert
// (top_k of them) plus the router's C*E. gpt2 with F = 4C, KVH = NH reduces to
// 3 * ( L*(24*C^2 + 4*T*C) + 2*C*Vp ). Computed exactly in integers (a double holds it
// exactly below 2^53); throws trident::Error naming model.width if that overflows.
double training_flops_per_token(const ModelConfig& m, int64_t padded_vocab);

// The same training FLOPs per token in the parts a cost model places on different pipeline
// stages and recomputes differently (lib/plan):
//   layer_linear    = 3 * 2*( C*(NH + 2*KVH)*HS + NH*HS*C + M*C*F )   one layer's matmuls
//   layer_attention = 3 * 4*T*NH*HS                                   one layer's scores and
//                                                                     weighted sum
//   head            = 3 * 2*C*Vp                                      the LM head
// training_flops_per_token = L*(layer_linear + layer_attention) + head, exactly for a dense
// model; with MoE layers layer_linear is the mean over the layers.
struct TrainingFlopsParts {
  double layer_linear = 0.0;
  double layer_attention = 0.0;
  double head = 0.0;
};
TrainingFlopsParts training_flops_parts(const ModelConfig& m, int64_t padded_vocab);

// How one rank holds a micro-batch's activations: the trainer's make_activations
// (model/transformer.hpp) and the planner (lib/plan) count them with the functions below, one
// source of truth that tests/test_model_recompute.cpp checks against the bytes the model
// allocates.
struct ActivationShape {
  int64_t micro_batch = 1;
  int64_t tp = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  bool split_backward = false;  // zb-h1/h2: backward_input keeps tensors for backward_weight
  int64_t element_bytes = 4;    // an activation (fp32 4, bf16 2)
  int64_t stat_bytes = 4;       // a norm statistic
  // What attention keeps for its backward per row and local head, and the bytes of one
  // element: the row logsumexp (1, fp32) on both backends; seq_len for a materialised softmax
  // (trident plan --attention materialized).
  int64_t attention_saved_per_row = 1;
  int64_t attention_saved_bytes = 4;
  // train.precision = "fp8": the linear layers quantise their operands into scratch
  // (model/fp8_linear.hpp), counted in backward_scratch_bytes (fp8_scratch_bytes): values at
  // element_bytes (the CPU reference's), or (fp8_codes, the GPU's) one-byte codes, the output
  // gradient's in two layouts (the backward's transposed operands).
  bool fp8 = false;
  bool fp8_codes = false;
  // parallel.expert: a MoE layer's expert-side rows are sized for the most its rank's experts
  // may receive, N K EP (model/moe.hpp).
  int64_t expert_parallel = 1;
};

// Bytes one layer keeps per micro-batch from its forward to its backward. With N = B*T rows,
// Ns = N/TP under sequence parallelism (else N), local widths QKVl = (NH + 2*KVH)*HS/TP,
// Hl = NH*HS/TP, Fl = F/TP, Ul = 2*Fl (llama) or Fl, e = element_bytes, s = stat_bytes, norm
// statistics per row k = 2 (LayerNorm: mean, rstd) or 1 (RMSNorm), A = attention_saved_bytes *
// N * NH/TP * attention_saved_per_row:
//   none       e*(2*Ns*C + N*(QKVl + Hl + Ul)) + s*2*k*Ns + A
//              (input, residual; qkv, attention output, MLP pre-activation; norm statistics;
//              attention's saved state). The two norms' outputs and the MLP activation are not
//              kept: recomputed in backward (recomputed_activation_bytes), in the backward's
//              gradient scratch (held once, not counted here).
//   selective  none - A
//   full       e*Ns*C                                   (the input)
// split_backward adds the linear layers' output gradients, e*N*(QKVl + C + Ul + C), and under
// full recomputation also their inputs, e*N*(C + Hl + C + Fl), recomputed from the rerun
// layer into the stash for backward_weight.
int64_t layer_activation_bytes(const ModelConfig& m, const ActivationShape& s);

// Bytes of one layer's forward tensors that every mode recomputes in backward instead of
// keeping: the two norms' outputs (gathered) and the MLP activation, e*N*(2*C + Fl). Written
// in forward and again in backward (the planner's memory-bound time counts them).
int64_t recomputed_activation_bytes(const ModelConfig& m, const ActivationShape& s);

// Bytes a MoE layer (model/moe.hpp) keeps per micro-batch beyond a dense layer's
// layer_activation_bytes (0 under full recomputation, which keeps the input only), with
// E experts, K = top_k, NK = N*K (the rows the router assigns), R = NK*EP (the most rows the
// rank's experts may receive, EP = s.expert_parallel):
//   e*(2*N*E + NK + 2*NK*C + R*(Ul + Fl) + [EP > 1] R*C) + 4*NK + 8*(2*NK + E + 1) + s*2*B
//   (router logits and probabilities, gate weights, the routed input and output rows, the
//   experts' pre-activation and activation rows, under EP the rows they received; the chosen
//   experts int32; the dispatch plan int64; the per-sequence aux and z losses). 0 for a dense
//   model.
int64_t moe_layer_extra_bytes(const ModelConfig& m, const ActivationShape& s);

// Bytes of the MoE block's buffers, held once by a rank with MoE layers (model/moe.hpp, shared
// by its MoE layers): the backward's output-gradient and input-gradient rows [NK, C], the
// expert-side gradients [R, Fl] and [R, Ul], the gate weights' [NK], the router's
// probabilities' and logits' [N, E], the router's and the norm's input gradients [N, C], the
// aux losses' [B] (statistics); under EP the arrivals, expert outputs and both gradients
// [R, C], and the row counts sent and received (2 E int64). 0 for a dense model.
int64_t moe_buffer_bytes(const ModelConfig& m, const ActivationShape& s);

// What packed documents (data.document_mask) add to a micro-batch of N rows on a rank: each
// row's document start, its position with model.position_reset, and under context parallelism
// the start as a position too (Transformer::Activations), int32 each.
inline int64_t document_bytes(int64_t N, bool position_reset, int cp_size) {
  return 4 * N * (1 + (position_reset ? 1 : 0) + (cp_size > 1 ? 1 : 0));
}

// Bytes a rank holds once (not per micro-batch) to recompute in: selective, one layer's A plus
// the recomputed attention output e*N*Hl; full, one layer's stash under none plus its discarded
// output e*Ns*C (plus a MoE layer's extra under none when the model has MoE layers); none, 0.
// (The norms' outputs and the MLP activation are recomputed in the backward's scratch.)
int64_t recompute_workspace_bytes(const ModelConfig& m, const ActivationShape& s);

// Bytes of the backward's scratch a rank holds once (not per micro-batch), for micro-batches of
// s.micro_batch: the Transformer's gradients of the residual stream, a norm's output and input,
// the attention's qkv and output, and the MLP's up and activation,
//   e*N*(3*C + QKVl + Hl + Ul + Fl)
// (the norms' outputs and the MLP activation are computed in two of them, see
// recompute_workspace_bytes); under sequence parallelism also the tensor group's
// (TensorParallel): a row-parallel layer's partial products and a gathered output gradient
// [N, C], and a reduce-scattered input gradient [N/tp, C], e*(2*N*C + Ns*C).
int64_t backward_scratch_bytes(const ModelConfig& m, const ActivationShape& s);

// Elements of FP8's quantised copies (model/fp8_linear.hpp's scratch, held once, grown to the
// largest call): the largest input, weight and output gradient of the dense GEMMs,
// N*(max(C, Hl, Fl) + max(QKVl, C, Ul)) + max(QKVl*C, C*Hl, Ul*C, C*Fl), and with MoE layers
// the experts' where larger: R = N*K*EP rows at most (what MoeActs is sized for) of inputs
// max(C, Fl) and gradients max(Ul, C), and the E/EP local experts' stacked weights
// E/EP * max(Ul*C, C*Fl). 0 unless s.fp8.
int64_t fp8_scratch_elements(const ModelConfig& m, const ActivationShape& s);
// Their bytes (backward_scratch_bytes counts them): each element at s.element_bytes (the CPU
// reference's fp32 values), or under s.fp8_codes (the GPU's) one byte, the output gradient's
// term twice (its row-major codes for dX and its transposed ones for dW, the input's and the
// weight's transposed only).
int64_t fp8_scratch_bytes(const ModelConfig& m, const ActivationShape& s);

// The LM head and its cross-entropy run over chunks of rows of the micro-batch (the
// Transformer's head_forward/head_backward), so the logits [N, Vl] are never whole in memory:
// only one chunk [rows, Vl], held once per rank, not per micro-batch. The N rows are cut into
// the fewest chunks of at most `chunk_bytes` of logits, as even as a multiple of 32 rows allows
// (so the head's GEMMs keep their shape; fewer than 32 rows when not even 32 fit), at least 1
// and at most N rows each; `requested` > 0 (train.lm_head_chunk_rows) instead min(requested, N).
// The same on every tensor rank (Vl is the same), so the per-chunk collectives of the
// vocab-parallel loss match up.
int64_t lm_head_chunk_rows(int64_t N, int64_t local_vocab, int64_t element_bytes,
                           int64_t requested, int64_t chunk_bytes);
// The default `chunk_bytes` by device. A CPU: 128 MiB (GPT-2's vocabulary: 2 chunks of 512 of
// 1,024 rows; the small benchmark shape's step 2-6 % faster than in 32 MiB's 160-row chunks
// with AVX-512 GEMM kernels and 6 % with AVX2 ones, for 71 MB more; docs/model.md). A GPU:
// 512 MiB, so that the head's GEMMs fill the device: at 32 MiB the GPT-2 124M bf16 head of
// 16,384 rows ran as 52 chunks of 320 rows, the input gradient's GEMM as 320 x 768 output
// tiles over K = 50,304, and the fp32 weight gradient [50,304 x 768] was read and written once
// per chunk (16 GB a step).
constexpr int64_t kLmHeadChunkBytesCpu = int64_t{128} << 20;
constexpr int64_t kLmHeadChunkBytesGpu = int64_t{512} << 20;
inline int64_t lm_head_chunk_bytes(bool gpu) {
  return gpu ? kLmHeadChunkBytesGpu : kLmHeadChunkBytesCpu;
}
// Bytes of that one chunk of logits, lm_head_chunk_rows(...) * local_vocab * element_bytes,
// and of its rows' dL/d(loss) (a training forward's, in the statistics type).
int64_t lm_head_scratch_bytes(int64_t N, int64_t local_vocab, int64_t element_bytes,
                              int64_t requested, int64_t chunk_bytes);

}  // namespace trident

#pragma once
// The model's parameters as a pure function of (config, shard): names, global shapes, shard
// maps, initialisation and flat offsets, for both architectures. Checkpoints, the optimizer,
// parity tests and both kernel sets read the layout from here; no model is built to learn it.
//
//   gpt2  (GPT-2): learned position table, pre-LN blocks with LayerNorm (weight and bias),
//         biased linears, GELU (tanh) MLP fc1 -> fc2, multi-head attention.
//   llama (Llama family, as Hugging Face LlamaForCausalLM): RMSNorm (weight only), rotary
//         embeddings on q and k, SwiGLU MLP down(silu(gate(x)) * up(x)), grouped-query
//         attention with model.kv_heads, no biases, no position table.
// Both: vocab-parallel token embedding and LM head (tied to the embedding when
// model.tie_embeddings), a final norm; Megatron's tensor-parallel split of every block.
//
// Tensor names (global shapes; C width, H = heads * head_size = C, K = kv_heads * head_size,
// F = ffn_size(), V vocab):
//   embedding.token.weight [V,C]           embedding.position.weight [T,C] (gpt2)
//   layers.L.ln1.{weight,bias} [C]          layers.L.attn_norm.weight [C]       (gpt2 / llama)
//   layers.L.attn.qkv.{weight [H+2K,C], bias [H+2K] (gpt2)}    rows [q | k | v]
//   layers.L.attn.proj.{weight [C,H], bias [C] (gpt2)}
//   layers.L.ln2.{weight,bias} [C]          layers.L.mlp_norm.weight [C]
//   layers.L.mlp.fc1.{weight [F,C], bias}   layers.L.mlp.gate_up.weight [2F,C]  rows [gate | up]
//   layers.L.mlp.fc2.{weight [C,F], bias}   layers.L.mlp.down.weight [C,F]
//   A MoE layer (ModelConfig::is_moe_layer; E = model.moe_experts) has, in place of its MLP:
//   layers.L.mlp.router.weight [E,C]        replicated on every tensor rank
//   layers.L.mlp.experts.fc1.{weight [E*F,C], bias [E*F]}   layers.L.mlp.experts.gate_up.weight [E*2F,C]
//   layers.L.mlp.experts.fc2.{weight [E*C,F], bias [E*C]}   layers.L.mlp.experts.down.weight [E*C,F]
//   the experts stacked along the rows: expert e's tensor is rows [e*R, (e+1)*R) of the dense
//   one's R rows, split over the tensor ranks exactly like the dense tensor.
//   final_ln.{weight,bias} [C]              final_norm.weight [C]
//   lm_head.weight [V,C] (untied only)
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "model/params.hpp"
#include "util/fp8.hpp"

namespace trident {

// Activation recomputation (train.recompute; Korthikanti et al., arXiv 2205.05198): what a
// layer keeps from its forward to its backward. None: everything its backward reads. Selective:
// all but attention's saved state (the CPU's probabilities, the GPU's row logsumexp), which the
// backward recomputes from the kept q, k, v. Full: only the layer's input; the backward reruns
// the layer's forward first.
enum class Recompute { None, Selective, Full };
// "none" | "selective" | "full"; trident::Error naming train.recompute otherwise.
Recompute parse_recompute(const std::string& name);
std::string to_string(Recompute r);

// What part of the model this rank holds.
// train.precision = "fp8" (model/fp8_linear.hpp): the linear layers of the blocks between the
// first `skip_first` and the last `skip_last` layers of the model compute on FP8 operands
// (activations and weights E4M3, gradients `grad_format`), scaled per tensor with `margin`,
// from each tensor's current amax or, `delayed`, from the last `history` steps' amaxes.
struct Fp8Settings {
  bool enabled = false;
  Fp8Format grad_format = Fp8Format::E5M2;
  int margin = 0;
  bool delayed = false;  // train.fp8_recipe = "delayed"
  int history = 1024;    // train.fp8_amax_history
  int64_t skip_first = 1, skip_last = 1;
  // Whether layer `layer` (of `layers`) runs its linear layers in FP8.
  bool covers(int64_t layer, int64_t layers) const {
    return enabled && layer >= skip_first && layer < layers - skip_last;
  }
};
// The FP8 settings of train.precision and the train.fp8_* keys (disabled unless fp8).
Fp8Settings fp8_settings(const TrainConfig& train);

struct ModelShard {
  int tp_rank = 0;
  int tp_size = 1;
  int64_t layer_begin = 0;  // [layer_begin, layer_end) of model.layers
  int64_t layer_end = 0;
  bool has_embedding = true;  // first pipeline stage
  bool has_head = true;       // last pipeline stage (final norm, LM head, loss)
  // Sequence parallelism (tp_size > 1): outside the tensor-parallel matmuls (norms, residual
  // adds, the stream between stages) each tensor rank holds rows
  // [tp_rank * N/tp, (tp_rank + 1) * N/tp) of the N = B*T rows; the all-reduce after a
  // row-parallel matmul becomes a reduce-scatter and the input of a column-parallel one is
  // all-gathered (the same bytes, activations 1/tp).
  bool sequence_parallel = false;
  // The interleaved schedule's model chunks (virtual stages): the [begin, end) layer ranges the
  // rank holds, in model order; layer_begin/layer_end are then unused. Empty: one chunk,
  // [layer_begin, layer_end). The embedding belongs to chunk 0 (has_embedding), the final norm,
  // head and loss to the last chunk (has_head).
  std::vector<std::pair<int64_t, int64_t>> chunks;
  // How the rank keeps its activations for backward (train.recompute).
  Recompute recompute = Recompute::None;
  // Rows per chunk of the LM head and its loss (train.lm_head_chunk_rows); 0: model_stats.hpp's
  // lm_head_chunk_rows (what fits in the device's lm_head_chunk_bytes).
  int64_t lm_head_chunk_rows = 0;
  // Overlap a column-parallel layer's input-gradient all-reduce with its weight gradient, and
  // under sequence parallelism its input's all-gather with its input gradient
  // (parallel.tp_overlap; model/tensor_parallel.hpp).
  bool tp_overlap = false;
  // Expert parallelism (parallel.expert; grid/grid.hpp expert_group): this rank holds experts
  // [ep_rank * E/ep_size, (ep_rank + 1) * E/ep_size) of every MoE layer.
  int ep_rank = 0;
  int ep_size = 1;
  // Context parallelism (parallel.context; model/context_parallel.hpp): every sequence cut into
  // 2 * cp_size chunks, this rank holding chunks cp_rank and 2 * cp_size - 1 - cp_rank, so
  // seq_len / cp_size rows of each sequence (seq_rows()).
  int cp_rank = 0;
  int cp_size = 1;
  int64_t seq_rows(int64_t seq_len) const { return seq_len / cp_size; }
  // Packed documents (data.document_mask): the end-of-document token; attention stays inside
  // each document of a sequence (data/documents.hpp) and, with ModelConfig::position_reset,
  // positions restart after each. -1: a sequence is one stream. Every stage then needs the
  // micro-batch's tokens.
  int32_t document_eod = -1;
  bool masks_documents() const { return document_eod >= 0; }
  // train.deterministic: false lets a kernel set trade bitwise reproducibility for speed (the
  // GPU's bf16 attention backward: atomic dQ); the CPU's kernels ignore it.
  bool deterministic = true;
  // train.attention_kernel: which bf16 attention kernels the GPU's kernel set runs ("auto",
  // "mma_sync", "wgmma"); the CPU's ignore it.
  std::string attention_kernel = "auto";
  // train.fused_bias_gelu: a GPT-2 MLP's GELU in its GEMMs' epilogues where the kernel set
  // has them (kernels_fuse_linear_gelu).
  bool fused_bias_gelu = true;
  Fp8Settings fp8;  // train.precision = "fp8"
  // ZeRO stage (optim.zero_stage; model/zero_shards.hpp): from 2 the model never allocates the
  // whole gradient buffer, from 3 nor the whole weights (its shards hold slices; set_zero).
  int zero_stage = 0;

  std::vector<std::pair<int64_t, int64_t>> layer_chunks() const {
    if (chunks.empty()) return {{layer_begin, layer_end}};
    return chunks;
  }
  // layer_chunks()[chunk] without the copy (0 <= chunk < chunk_count()).
  std::pair<int64_t, int64_t> layer_chunk(int chunk) const {
    return chunks.empty() ? std::make_pair(layer_begin, layer_end)
                          : chunks[static_cast<size_t>(chunk)];
  }
  int chunk_count() const { return chunks.empty() ? 1 : static_cast<int>(chunks.size()); }
  int64_t layer_count() const {
    int64_t n = 0;
    for (const auto& [begin, end] : layer_chunks()) n += end - begin;
    return n;
  }
  static ModelShard whole(const ModelConfig& m) {
    ModelShard s;
    s.layer_end = m.layers;
    return s;
  }
};

int64_t padded_vocab_size(const ModelConfig& m, int tp_size);

// Indices into ParamLayout::params of one block's tensors; -1 where the architecture has none.
struct BlockParams {
  int norm1_w = -1, norm1_b = -1;  // before attention: LayerNorm (gpt2) / RMSNorm (llama)
  int qkv_w = -1, qkv_b = -1;      // column-parallel, fused [q | k | v]
  int proj_w = -1, proj_b = -1;    // row-parallel attention output
  int norm2_w = -1, norm2_b = -1;  // before the MLP
  int up_w = -1, up_b = -1;        // column-parallel: fc1 (gpt2) / fused [gate | up] (llama)
  int down_w = -1, down_b = -1;    // row-parallel: fc2 (gpt2) / down (llama)
  // A MoE layer: the router [E,C]; up_* and down_* are then the experts' stacked tensors.
  int router_w = -1;
  bool moe() const { return router_w >= 0; }
};

struct ParamLayout {
  std::vector<ParamInfo> params;  // in flat-buffer order, offsets set
  int64_t flat_size = 0;          // elements of the flat weight / gradient buffer
  int token_embedding = -1, position_embedding = -1;
  std::vector<BlockParams> blocks;  // the shard's layers, chunk after chunk (layer_chunks())
  int final_norm_w = -1, final_norm_b = -1;
  int lm_head = -1;  // the token embedding when tied
};

// The parameters `shard` holds. Throws trident::Error (naming the keys) when the model does
// not split over shard.tp_size tensor ranks.
ParamLayout parameter_layout(const ModelConfig& config, const ModelShard& shard);
// Every parameter of the global model (names, global shapes): what a checkpoint holds,
// whatever the layout that writes or reads it.
std::vector<ParamInfo> global_parameters(const ModelConfig& config);

// Initial values of this rank's part of `p` (Normal: N(0, 0.02); NormalResidual:
// N(0, 0.02/sqrt(2 layers)), gpt2's output projections; Zeros; Ones), drawn from the
// counter-based RNG keyed by (seed, name, global index), so any layout gets the same global
// tensor. Padding elements are 0.
template <typename F>
void init_parameter(const ParamInfo& p, uint64_t seed, int64_t layers, F* out);

}  // namespace trident

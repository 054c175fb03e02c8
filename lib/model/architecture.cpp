#include "model/architecture.hpp"

#include <cmath>

#include "grid/grid.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace trident {

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw Error("train.recompute = \"" + name + "\" must be none, selective or full");
}

std::string to_string(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

void require_divisible(int64_t value, const std::string& what, int tp) {
  if (value % tp != 0)
    throw Error(what + " (" + std::to_string(value) + ") must be divisible by parallel.tensor (" +
                std::to_string(tp) + ")");
}

// Builds the list in flat-buffer order: the order in which backward finishes the gradients is
// the reverse, so data parallelism can reduce the buffer from its end while backward runs.
class LayoutBuilder {
 public:
  LayoutBuilder(const ModelConfig& m, const ModelShard& s) : m_(m), s_(s) {}

  // A tensor split along `split_dim` into `blocks`, or replicated (split_dim = -1).
  int add(const std::string& name, std::vector<int64_t> global_shape, int split_dim,
          std::vector<ShardBlock> blocks, Init init, bool decay) {
    ParamInfo p;
    p.name = name;
    p.local_shape = global_shape;
    if (split_dim >= 0) {
      int64_t local = 0;
      for (const ShardBlock& b : blocks) local += b.length;
      p.local_shape[split_dim] = local;
    }
    p.global_shape = std::move(global_shape);
    p.split_dim = split_dim;
    p.blocks = std::move(blocks);
    p.init = init;
    p.weight_decay = decay;
    layout_.params.push_back(std::move(p));
    return static_cast<int>(layout_.params.size()) - 1;
  }
  // Replicated on every tensor rank: counted in the gradient norm by tensor rank 0 only.
  // Norm parameters see only the rank's rows under sequence parallelism (partial gradients).
  int replicated(const std::string& name, int64_t n, Init init, bool norm) {
    const int i = add(name, {n}, -1, {}, init, false);
    layout_.params[i].counted_in_norm = s_.tp_rank == 0;
    layout_.params[i].tensor_partial_grad = norm && s_.sequence_parallel && s_.tp_size > 1;
    return i;
  }
  // A vocab-parallel [V,C] table (token embedding or LM head).
  int vocab_table(const std::string& name) {
    const int64_t padded = padded_vocab_size(m_, s_.tp_size);
    const int i = add(name, {m_.vocab_size, m_.width}, 0,
                      vocab_blocks(m_.vocab_size, padded, s_.tp_rank, s_.tp_size), Init::Normal,
                      true);
    layout_.params[i].local_shape = {padded / s_.tp_size, m_.width};
    return i;
  }
  ParamLayout finish() {
    int64_t total = 0;
    for (ParamInfo& p : layout_.params) {
      p.offset = total;
      total += round_up(p.numel(), 16);  // every tensor starts on a 64-byte boundary
    }
    layout_.flat_size = total;
    return std::move(layout_);
  }
  ParamLayout& layout() { return layout_; }

 private:
  const ModelConfig& m_;
  const ModelShard& s_;
  ParamLayout layout_;
};

// A MoE layer's router and stacked experts (see architecture.hpp): each expert is the dense
// MLP's tensors, its rows split over the tensor ranks as the dense ones are (fused_blocks
// with one part per expert, or per expert and gate/up), so expert e lies at local rows
// [e*Rl, (e+1)*Rl) on every rank. Under expert parallelism a rank holds the El = E/ep experts
// of its expert rank: global rows from row_begin = ep_rank * El * (rows per expert) on.
void add_experts(LayoutBuilder& b, const ModelConfig& m, const ModelShard& s,
                 const std::string& p, BlockParams& bp) {
  const int r = s.tp_rank, tp = s.tp_size;
  const int64_t C = m.width, F = m.ffn_size(), E = m.moe_experts;
  if (E % s.ep_size != 0)
    throw Error("model.moe_experts (" + std::to_string(E) +
                ") must be divisible by parallel.expert (" + std::to_string(s.ep_size) + ")");
  const int64_t El = E / s.ep_size, first = s.ep_rank * El;
  const bool gpt2 = !m.is_llama();
  const Init residual = gpt2 ? Init::NormalResidual : Init::Normal;
  bp.router_w = b.add(p + "mlp.router.weight", {E, C}, -1, {}, Init::Normal, true);
  b.layout().params[bp.router_w].counted_in_norm = r == 0;
  // The stacked tensor [E*rows_per_expert, ...] of which this rank holds El experts.
  auto experts = [&](int i, int64_t rows_per_expert) {
    ParamInfo& t = b.layout().params[i];
    if (t.split_dim != 0) t.local_shape[0] = El * rows_per_expert;  // (split 0: the blocks')
    t.expert = s.ep_size > 1;
    t.row_begin = first * rows_per_expert;
    return i;
  };
  const auto cols = contiguous_blocks(F, r, tp);
  if (gpt2) {
    const auto rows = fused_blocks(std::vector<int64_t>(El, F), r, tp);
    bp.up_w = experts(
        b.add(p + "mlp.experts.fc1.weight", {E * F, C}, 0, rows, Init::Normal, true), F);
    bp.up_b = experts(b.add(p + "mlp.experts.fc1.bias", {E * F}, 0, rows, Init::Zeros, false), F);
    bp.down_w = experts(
        b.add(p + "mlp.experts.fc2.weight", {E * C, F}, 1, cols, residual, true), C);
    bp.down_b = experts(b.replicated(p + "mlp.experts.fc2.bias", E * C, Init::Zeros, false), C);
  } else {
    const auto rows = fused_blocks(std::vector<int64_t>(2 * El, F), r, tp);
    bp.up_w = experts(b.add(p + "mlp.experts.gate_up.weight", {2 * E * F, C}, 0, rows,
                            Init::Normal, true),
                      2 * F);
    bp.down_w = experts(
        b.add(p + "mlp.experts.down.weight", {E * C, F}, 1, cols, residual, true), C);
  }
}

BlockParams add_block(LayoutBuilder& b, const ModelConfig& m, const ModelShard& s, int64_t l) {
  const std::string p = "layers." + std::to_string(l) + ".";
  const int r = s.tp_rank, tp = s.tp_size;
  const int64_t C = m.width, H = m.heads * m.head_size(), K = m.kv_head_count() * m.head_size();
  const int64_t F = m.ffn_size();
  const bool gpt2 = !m.is_llama();
  // gpt2 scales the init of the projections that write into the residual stream.
  const Init residual = gpt2 ? Init::NormalResidual : Init::Normal;
  const auto qkv = fused_blocks({H, K, K}, r, tp);
  BlockParams bp;
  bp.norm1_w = b.replicated(p + (gpt2 ? "ln1.weight" : "attn_norm.weight"), C, Init::Ones, true);
  if (gpt2) bp.norm1_b = b.replicated(p + "ln1.bias", C, Init::Zeros, true);
  bp.qkv_w = b.add(p + "attn.qkv.weight", {H + 2 * K, C}, 0, qkv, Init::Normal, true);
  if (gpt2) bp.qkv_b = b.add(p + "attn.qkv.bias", {H + 2 * K}, 0, qkv, Init::Zeros, false);
  bp.proj_w = b.add(p + "attn.proj.weight", {C, H}, 1, contiguous_blocks(H, r, tp), residual,
                    true);
  if (gpt2) bp.proj_b = b.replicated(p + "attn.proj.bias", C, Init::Zeros, false);
  bp.norm2_w = b.replicated(p + (gpt2 ? "ln2.weight" : "mlp_norm.weight"), C, Init::Ones, true);
  if (gpt2) bp.norm2_b = b.replicated(p + "ln2.bias", C, Init::Zeros, true);
  if (m.is_moe_layer(l)) {
    add_experts(b, m, s, p, bp);
  } else if (gpt2) {
    const auto cols = contiguous_blocks(F, r, tp);
    bp.up_w = b.add(p + "mlp.fc1.weight", {F, C}, 0, cols, Init::Normal, true);
    bp.up_b = b.add(p + "mlp.fc1.bias", {F}, 0, cols, Init::Zeros, false);
    bp.down_w = b.add(p + "mlp.fc2.weight", {C, F}, 1, cols, residual, true);
    bp.down_b = b.replicated(p + "mlp.fc2.bias", C, Init::Zeros, false);
  } else {
    bp.up_w = b.add(p + "mlp.gate_up.weight", {2 * F, C}, 0, fused_blocks({F, F}, r, tp),
                    Init::Normal, true);
    bp.down_w = b.add(p + "mlp.down.weight", {C, F}, 1, contiguous_blocks(F, r, tp), residual,
                      true);
  }
  return bp;
}

}  // namespace

int64_t padded_vocab_size(const ModelConfig& m, int tp_size) {
  return padded_vocab(m.vocab_size, m.vocab_multiple, tp_size);
}

ParamLayout parameter_layout(const ModelConfig& m, const ModelShard& s) {
  const int tp = s.tp_size;
  require_divisible(m.heads, "model.heads", tp);
  require_divisible(m.kv_head_count(), "model.kv_heads", tp);
  require_divisible(m.width, "model.width", tp);
  require_divisible(m.ffn_size(), "the MLP width (model.ffn_width)", tp);
  if (m.heads % m.kv_head_count() != 0)
    throw Error("model.kv_heads (" + std::to_string(m.kv_head_count()) +
                ") must divide model.heads (" + std::to_string(m.heads) + ")");
  const bool gpt2 = !m.is_llama();
  LayoutBuilder b(m, s);
  ParamLayout& layout = b.layout();
  // The token embedding lives on the first stage; tied, the last stage holds a copy as its LM
  // head, and the first stage's copy is the one counted in the gradient norm.
  if (s.has_embedding || (s.has_head && m.tie_embeddings)) {
    layout.token_embedding = b.vocab_table("embedding.token.weight");
    layout.params[layout.token_embedding].counted_in_norm = s.has_embedding;
  }
  if (s.has_embedding && gpt2) {
    layout.position_embedding =
        b.add("embedding.position.weight", {m.seq_len, m.width}, -1, {}, Init::Normal, false);
    layout.params[layout.position_embedding].counted_in_norm = s.tp_rank == 0;
  }
  // Chunk after chunk: the later chunks' gradients, final first in a step's backward, lie
  // further up the flat buffer (see the order note on LayoutBuilder).
  for (const auto& [begin, end] : s.layer_chunks())
    for (int64_t l = begin; l < end; ++l) layout.blocks.push_back(add_block(b, m, s, l));
  if (s.has_head) {
    layout.final_norm_w =
        b.replicated(gpt2 ? "final_ln.weight" : "final_norm.weight", m.width, Init::Ones, true);
    if (gpt2) layout.final_norm_b = b.replicated("final_ln.bias", m.width, Init::Zeros, true);
    layout.lm_head = m.tie_embeddings ? layout.token_embedding : b.vocab_table("lm_head.weight");
  }
  return b.finish();
}

std::vector<ParamInfo> global_parameters(const ModelConfig& config) {
  return parameter_layout(config, ModelShard::whole(config)).params;
}

template <typename F>
void init_parameter(const ParamInfo& p, uint64_t seed, int64_t layers, F* out) {
  const double std_normal = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  const uint64_t key = stream_key(seed, p.name);
  const int64_t n = p.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const auto gi = p.global_index(i);
    double v = 0.0;
    if (gi) {
      switch (p.init) {
        case Init::Normal: v = std_normal * normal01(key, *gi); break;
        case Init::NormalResidual: v = std_residual * normal01(key, *gi); break;
        case Init::Zeros: v = 0.0; break;
        case Init::Ones: v = 1.0; break;
      }
    }
    out[i] = static_cast<F>(v);
  }
}
template void init_parameter<float>(const ParamInfo&, uint64_t, int64_t, float*);
template void init_parameter<double>(const ParamInfo&, uint64_t, int64_t, double*);

Fp8Settings fp8_settings(const TrainConfig& train) {
  Fp8Settings fp8;
  if (train.precision != "fp8") return fp8;
  fp8.enabled = true;
  fp8.grad_format = train.fp8_grad_format == "e4m3" ? Fp8Format::E4M3 : Fp8Format::E5M2;
  fp8.margin = static_cast<int>(train.fp8_margin);
  fp8.delayed = train.fp8_recipe == "delayed";
  fp8.history = static_cast<int>(train.fp8_amax_history);
  fp8.skip_first = train.fp8_skip_first_layers;
  fp8.skip_last = train.fp8_skip_last_layers;
  return fp8;
}

}  // namespace trident

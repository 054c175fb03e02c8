// Parameter count and training FLOPs per token for gpt2 and llama (formulas in the header and
// in docs/model.md). Integer arithmetic in __int128 with overflow checks, so a huge width is an
// error that names it rather than a silently wrapped figure.
#include "model/model_stats.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "util/error.hpp"

namespace trident {
namespace {

// A non-negative __int128 whose every operation is overflow-checked.
class Exact {
 public:
  Exact(__int128 v, const ModelConfig* m) : v_(v), m_(m) {}
  Exact operator+(const Exact& o) const {
    __int128 r;
    if (__builtin_add_overflow(v_, o.v_, &r)) overflow();
    return {r, m_};
  }
  Exact operator*(const Exact& o) const {
    __int128 r;
    if (__builtin_mul_overflow(v_, o.v_, &r)) overflow();
    return {r, m_};
  }
  __int128 value() const { return v_; }
  [[noreturn]] void overflow() const {
    // Every key the counts multiply, so that the one set too large is among them.
    std::string keys = "model.width = " + std::to_string(m_->width) +
                       ", model.layers = " + std::to_string(m_->layers) +
                       ", model.vocab_size = " + std::to_string(m_->vocab_size) +
                       ", model.seq_len = " + std::to_string(m_->seq_len) +
                       (m_->ffn_width > 0 ? ", model.ffn_width = " + std::to_string(m_->ffn_width)
                                          : ", MLP size " + std::to_string(m_->ffn_size()));
    if (m_->moe_experts > 0) keys += ", model.moe_experts = " + std::to_string(m_->moe_experts);
    throw Error("the parameter or FLOP count overflows: one of " + keys +
                " is too large");
  }

 private:
  __int128 v_;
  const ModelConfig* m_;
};

void check_shape(const ModelConfig& m) {
  if (m.width < 1 || m.heads < 1 || m.layers < 1 || m.vocab_size < 1 || m.seq_len < 1 ||
      m.kv_heads < 0 || m.ffn_width < 0 || m.width % m.heads != 0)
    throw Error("cannot count the model: model.width (" + std::to_string(m.width) +
                "), model.heads (" + std::to_string(m.heads) +
                "), model.layers, model.vocab_size and model.seq_len must be >= 1, "
                "model.kv_heads and model.ffn_width >= 0, model.width divisible by model.heads");
  // ffn_size() computes 4 * width (gpt2) or 8 * width + 255 (llama) when model.ffn_width is 0.
  if (m.ffn_width == 0 && m.width > (INT64_MAX - 255) / 8)
    throw Error("the model's size overflows: model.width = " + std::to_string(m.width) +
                " is too large for the default MLP size");
}

}  // namespace

int64_t moe_layer_count(const ModelConfig& m) {
  if (m.moe_experts <= 0) return 0;
  return (m.layers + m.moe_layer_interval - 1) / m.moe_layer_interval;
}

namespace {

int64_t count_parameters(const ModelConfig& m, bool active) {
  check_shape(m);
  const Exact V(m.vocab_size, &m), T(m.seq_len, &m), C(m.width, &m), L(m.layers, &m);
  const Exact NH(m.heads, &m), KVH(m.kv_head_count(), &m), HS(m.head_size(), &m);
  const Exact F(m.ffn_size(), &m);
  auto k = [&](__int128 v) { return Exact(v, &m); };
  const bool llama = m.is_llama();

  const Exact qkv_rows = (NH + k(2) * KVH) * HS;
  Exact attention = C * qkv_rows + NH * HS * C;
  if (!llama) attention = attention + qkv_rows + C;  // qkv and proj biases
  const Exact mlp = llama ? k(3) * C * F : k(2) * C * F + F + C;
  const Exact norms = llama ? k(2) * C : k(4) * C;
  // A MoE layer: `experts` copies of the MLP and the router [E,C].
  const Exact Lm(moe_layer_count(m), &m), Ld(m.layers - moe_layer_count(m), &m);
  const Exact E(m.moe_experts, &m);
  const Exact experts = active ? Exact(m.moe_top_k, &m) : E;
  const Exact moe_mlp = experts * mlp + E * C;

  Exact total = V * C + Ld * (attention + mlp + norms) +
                Lm * (attention + moe_mlp + norms) + (llama ? C : k(2) * C);
  if (!llama) total = total + T * C;  // learned position table
  if (!m.tie_embeddings) total = total + V * C;
  if (total.value() > INT64_MAX) total.overflow();
  return static_cast<int64_t>(total.value());
}

}  // namespace

int64_t parameter_count(const ModelConfig& m) { return count_parameters(m, false); }
int64_t active_parameter_count(const ModelConfig& m) { return count_parameters(m, true); }

namespace {

// One token's forward matmul FLOPs, in the parts training_flops_parts names (before the x3):
// the dense and the MoE layers' linear parts (the latter with top_k experts and the router).
struct ForwardFlops {
  Exact layer_linear, moe_layer_linear, layer_attention, head;
};

ForwardFlops forward_flops(const ModelConfig& m, int64_t padded_vocab) {
  check_shape(m);
  if (padded_vocab < m.vocab_size)
    throw Error("training FLOPs: the padded vocabulary (" + std::to_string(padded_vocab) +
                ") is smaller than model.vocab_size (" + std::to_string(m.vocab_size) + ")");
  const Exact T(m.seq_len, &m), C(m.width, &m), Vp(padded_vocab, &m);
  const Exact NH(m.heads, &m), KVH(m.kv_head_count(), &m), HS(m.head_size(), &m);
  const Exact F(m.ffn_size(), &m);
  auto k = [&](__int128 v) { return Exact(v, &m); };
  const Exact mlp_mats = k(m.is_llama() ? 3 : 2);
  const Exact attention = C * (NH + k(2) * KVH) * HS + NH * HS * C;
  const Exact linear = attention + mlp_mats * C * F;
  const Exact moe_linear =
      attention + k(m.moe_top_k) * mlp_mats * C * F + k(m.moe_experts) * C;
  return {k(2) * linear, k(2) * moe_linear, k(4) * T * NH * HS, k(2) * C * Vp};
}

}  // namespace

double training_flops_per_token(const ModelConfig& m, int64_t padded_vocab) {
  const ForwardFlops f = forward_flops(m, padded_vocab);
  const Exact L(m.layers, &m), Lm(moe_layer_count(m), &m), three(3, &m);
  const Exact Ld(m.layers - moe_layer_count(m), &m);
  const Exact forward = Ld * f.layer_linear + Lm * f.moe_layer_linear +
                        L * f.layer_attention + f.head;
  return static_cast<double>((three * forward).value());
}

TrainingFlopsParts training_flops_parts(const ModelConfig& m, int64_t padded_vocab) {
  const ForwardFlops f = forward_flops(m, padded_vocab);
  const Exact three(3, &m);
  // A MoE model's layers differ: layer_linear is their mean.
  const Exact Lm(moe_layer_count(m), &m), Ld(m.layers - moe_layer_count(m), &m);
  const Exact linear_sum = Ld * f.layer_linear + Lm * f.moe_layer_linear;
  return {static_cast<double>((three * linear_sum).value()) / static_cast<double>(m.layers),
          static_cast<double>((three * f.layer_attention).value()),
          static_cast<double>((three * f.head).value())};
}

namespace {

// The local widths of one layer and the rows of a micro-batch (ActivationShape's symbols).
struct LayerWidths {
  int64_t N, Ns, C, QKVl, Hl, Fl, Ul, norm_stats, saved_core;
};

LayerWidths layer_widths(const ModelConfig& m, const ActivationShape& s) {
  check_shape(m);
  if (s.micro_batch < 1 || s.tp < 1)
    throw Error("activation bytes: the micro-batch (" + std::to_string(s.micro_batch) +
                ") and parallel.tensor (" + std::to_string(s.tp) + ") must be >= 1");
  LayerWidths w{};
  w.N = s.micro_batch * m.seq_len;
  w.Ns = s.sequence_parallel ? w.N / s.tp : w.N;
  w.C = m.width;
  w.QKVl = (m.heads + 2 * m.kv_head_count()) * m.head_size() / s.tp;
  w.Hl = m.heads * m.head_size() / s.tp;
  w.Fl = m.ffn_size() / s.tp;
  w.Ul = m.is_llama() ? 2 * w.Fl : w.Fl;
  w.norm_stats = m.is_llama() ? 1 : 2;
  w.saved_core = s.attention_saved_bytes * w.N * (m.heads / s.tp) * s.attention_saved_per_row;
  return w;
}

int64_t stash_without_core(const LayerWidths& w, const ActivationShape& s) {
  return s.element_bytes * (2 * w.Ns * w.C + w.N * (w.QKVl + w.Hl + w.Ul)) +
         s.stat_bytes * 2 * w.norm_stats * w.Ns;
}

}  // namespace

int64_t layer_activation_bytes(const ModelConfig& m, const ActivationShape& s) {
  const LayerWidths w = layer_widths(m, s);
  const int64_t e = s.element_bytes;
  int64_t bytes = 0;
  switch (s.recompute) {
    case Recompute::None: bytes = stash_without_core(w, s) + w.saved_core; break;
    case Recompute::Selective: bytes = stash_without_core(w, s); break;
    case Recompute::Full: bytes = e * w.Ns * w.C; break;
  }
  if (s.split_backward) {
    bytes += e * w.N * (w.QKVl + w.C + w.Ul + w.C);  // output gradients
    if (s.recompute == Recompute::Full) bytes += e * w.N * (w.C + w.Hl + w.C + w.Fl);  // inputs
  }
  return bytes;
}

int64_t recomputed_activation_bytes(const ModelConfig& m, const ActivationShape& s) {
  const LayerWidths w = layer_widths(m, s);
  return s.element_bytes * w.N * (2 * w.C + w.Fl);
}

int64_t moe_layer_extra_bytes(const ModelConfig& m, const ActivationShape& s) {
  if (m.moe_experts == 0 || s.recompute == Recompute::Full) return 0;
  const LayerWidths w = layer_widths(m, s);
  const int64_t E = m.moe_experts, NK = w.N * m.moe_top_k, R = NK * s.expert_parallel;
  const int64_t received = s.expert_parallel > 1 ? R * w.C : 0;
  return s.element_bytes * (2 * w.N * E + NK + 2 * NK * w.C + R * (w.Ul + w.Fl) + received) +
         4 * NK + 8 * (2 * NK + E + 1) + s.stat_bytes * 2 * s.micro_batch;
}

int64_t moe_buffer_bytes(const ModelConfig& m, const ActivationShape& s) {
  if (m.moe_experts == 0) return 0;
  const LayerWidths w = layer_widths(m, s);
  const int64_t E = m.moe_experts, NK = w.N * m.moe_top_k, R = NK * s.expert_parallel;
  const int64_t exchange = s.expert_parallel > 1 ? s.element_bytes * 4 * R * w.C + 16 * E : 0;
  return s.element_bytes * (2 * NK * w.C + R * (w.Fl + w.Ul) + NK + 2 * w.N * E + 2 * w.N * w.C) +
         exchange + s.stat_bytes * s.micro_batch;
}

int64_t backward_scratch_bytes(const ModelConfig& m, const ActivationShape& s) {
  const LayerWidths w = layer_widths(m, s);
  int64_t bytes = s.element_bytes * w.N * (3 * w.C + w.QKVl + w.Hl + w.Ul + w.Fl);
  if (s.sequence_parallel && s.tp > 1) bytes += s.element_bytes * (2 * w.N + w.Ns) * w.C;
  return bytes + fp8_scratch_bytes(m, s);
}

namespace {

// fp8_scratch_elements' three terms: the largest input, output gradient and weight.
struct Fp8ScratchTerms {
  int64_t input = 0, output = 0, weight = 0;
};

Fp8ScratchTerms fp8_scratch_terms(const ModelConfig& m, const ActivationShape& s) {
  if (!s.fp8) return {};
  const LayerWidths w = layer_widths(m, s);
  Fp8ScratchTerms t;
  t.input = w.N * std::max({w.C, w.Hl, w.Fl});
  t.output = w.N * std::max({w.QKVl, w.C, w.Ul});
  t.weight = std::max({w.QKVl * w.C, w.C * w.Hl, w.Ul * w.C, w.C * w.Fl});
  if (m.moe_experts > 0) {
    const int64_t ep = s.expert_parallel;
    const int64_t R = w.N * m.moe_top_k * ep, experts = m.moe_experts / ep;
    t.input = std::max(t.input, R * std::max(w.C, w.Fl));
    t.output = std::max(t.output, R * std::max(w.Ul, w.C));
    t.weight = std::max(t.weight, experts * std::max(w.Ul * w.C, w.C * w.Fl));
  }
  return t;
}

}  // namespace

int64_t fp8_scratch_elements(const ModelConfig& m, const ActivationShape& s) {
  const Fp8ScratchTerms t = fp8_scratch_terms(m, s);
  return t.input + t.output + t.weight;
}

int64_t fp8_scratch_bytes(const ModelConfig& m, const ActivationShape& s) {
  const Fp8ScratchTerms t = fp8_scratch_terms(m, s);
  return s.fp8_codes ? t.input + 2 * t.output + t.weight
                     : s.element_bytes * (t.input + t.output + t.weight);
}

int64_t recompute_workspace_bytes(const ModelConfig& m, const ActivationShape& s) {
  const LayerWidths w = layer_widths(m, s);
  switch (s.recompute) {
    case Recompute::None: return 0;
    case Recompute::Selective: return w.saved_core + s.element_bytes * w.N * w.Hl;
    case Recompute::Full: {
      ActivationShape kept = s;
      kept.recompute = Recompute::None;
      return stash_without_core(w, s) + w.saved_core + s.element_bytes * w.Ns * w.C +
             moe_layer_extra_bytes(m, kept);
    }
  }
  return 0;
}

int64_t lm_head_chunk_rows(int64_t N, int64_t local_vocab, int64_t element_bytes,
                           int64_t requested, int64_t chunk_bytes) {
  if (N < 1 || local_vocab < 1 || element_bytes < 1 || chunk_bytes < 1)
    throw Error("lm_head_chunk_rows: rows (" + std::to_string(N) + "), local vocabulary (" +
                std::to_string(local_vocab) + "), element bytes (" +
                std::to_string(element_bytes) + ") and chunk bytes (" +
                std::to_string(chunk_bytes) + ") must be >= 1");
  if (requested > 0) return std::min(requested, N);
  int64_t most = chunk_bytes / (local_vocab * element_bytes);  // rows that fit
  if (most >= 32) most -= most % 32;
  most = std::clamp<int64_t>(most, 1, N);
  // The fewest chunks of at most `most` rows, evened out: a multiple of 32 rows is at most
  // `most` (itself one, or under 32), so rounding up keeps the chunk within its bytes.
  const int64_t chunks = (N + most - 1) / most;
  int64_t rows = (N + chunks - 1) / chunks;
  if (most >= 32) rows = std::min(most, (rows + 31) / 32 * 32);
  return std::min(rows, N);
}

int64_t lm_head_scratch_bytes(int64_t N, int64_t local_vocab, int64_t element_bytes,
                              int64_t requested, int64_t chunk_bytes) {
  // The statistics type S: fp32 (fp64 for a double model), as the kernel sets' S.
  const int64_t stat_bytes = std::max<int64_t>(element_bytes, 4);
  const int64_t rows = lm_head_chunk_rows(N, local_vocab, element_bytes, requested, chunk_bytes);
  return rows * local_vocab * element_bytes + rows * stat_bytes;
}

}  // namespace trident

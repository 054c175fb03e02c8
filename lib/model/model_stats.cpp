// Parameter count and training FLOPs per token for gpt2 and llama (formulas in the header and
// in docs/model.md). Integer arithmetic in __int128 with overflow checks, so a huge width is an
// error that names it rather than a silently wrapped figure.
#include "model/model_stats.hpp"

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
    throw Error("the parameter or FLOP count overflows: model.width = " +
                std::to_string(m_->width) + " (model.layers = " + std::to_string(m_->layers) +
                ", model.vocab_size = " + std::to_string(m_->vocab_size) + ", MLP size " +
                std::to_string(m_->ffn_size()) + ") is too large");
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

int64_t parameter_count(const ModelConfig& m) {
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

  Exact total = V * C + L * (attention + mlp + norms) + (llama ? C : k(2) * C);
  if (!llama) total = total + T * C;  // learned position table
  if (!m.tie_embeddings) total = total + V * C;
  if (total.value() > INT64_MAX) total.overflow();
  return static_cast<int64_t>(total.value());
}

namespace {

// One token's forward matmul FLOPs, in the parts training_flops_parts names (before the x3).
struct ForwardFlops {
  Exact layer_linear, layer_attention, head;
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
  const Exact linear = C * (NH + k(2) * KVH) * HS + NH * HS * C + mlp_mats * C * F;
  return {k(2) * linear, k(4) * T * NH * HS, k(2) * C * Vp};
}

}  // namespace

double training_flops_per_token(const ModelConfig& m, int64_t padded_vocab) {
  const ForwardFlops f = forward_flops(m, padded_vocab);
  const Exact L(m.layers, &m), three(3, &m);
  const Exact forward = L * f.layer_linear + L * f.layer_attention + f.head;
  return static_cast<double>((three * forward).value());
}

TrainingFlopsParts training_flops_parts(const ModelConfig& m, int64_t padded_vocab) {
  const ForwardFlops f = forward_flops(m, padded_vocab);
  const Exact three(3, &m);
  return {static_cast<double>((three * f.layer_linear).value()),
          static_cast<double>((three * f.layer_attention).value()),
          static_cast<double>((three * f.head).value())};
}

}  // namespace trident

#include "interop/hf_model.hpp"

#include <cmath>
#include <map>

#include "config/schema.hpp"
#include "model/architecture.hpp"
#include "train/checkpoint_tensors.hpp"
#include "util/error.hpp"

namespace trident {

std::vector<Run> HfTensor::dataset_runs(int64_t begin, int64_t end) const {
  if (!transposed) return {Run{0, (row_begin + begin) * cols(), (end - begin) * cols()}};
  // Hugging Face rows are dataset columns: one run per dataset row.
  const int64_t dataset_rows = dataset_shape[0], dataset_cols = dataset_shape[1];
  const int64_t width = end - begin;
  std::vector<Run> runs;
  runs.reserve(static_cast<size_t>(dataset_rows));
  for (int64_t i = 0; i < dataset_rows; ++i) runs.push_back({i * width, i * dataset_cols + begin, width});
  return runs;
}

namespace {

// out [cols, rows] = the transpose of in [rows, cols] (both row-major).
void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

}  // namespace

void HfTensor::to_hf_order(const float* dataset_order, int64_t begin, int64_t end,
                           float* hf_order) const {
  const int64_t width = end - begin;
  if (!transposed) {
    std::copy_n(dataset_order, width * cols(), hf_order);
    return;
  }
  transpose(dataset_order, dataset_shape[0], width, hf_order);
}

void HfTensor::to_dataset_order(const float* hf_order, int64_t begin, int64_t end,
                                float* dataset_order) const {
  const int64_t width = end - begin;
  if (!transposed) {
    std::copy_n(hf_order, width * cols(), dataset_order);
    return;
  }
  transpose(hf_order, width, dataset_shape[0], dataset_order);
}

namespace {

// A mixture of experts exports as MixtralForCausalLM, which is a llama whose every MLP is a
// dropless set of SwiGLU experts behind a softmax top-k router renormalised over the k: the
// keys that would make Trident's model differ from that are refused, naming the key.
void require_mixtral(const ModelConfig& m) {
  const std::string what = "model.moe_experts = " + std::to_string(m.moe_experts) +
                           " exports as Mixtral, which ";
  if (!m.is_llama())
    throw Error("model.arch = \"" + m.arch + "\" with " + what + "is a llama (SwiGLU experts): "
                "transformers has no GPT-2 mixture of experts");
  if (m.moe_layer_interval != 1)
    throw Error("model.moe_layer_interval = " + std::to_string(m.moe_layer_interval) +
                " cannot be a Mixtral: every Mixtral layer is a mixture of experts (interval 1)");
  if (m.moe_capacity_factor != 0)
    throw Error("model.moe_capacity_factor = " + config::toml_float(m.moe_capacity_factor) +
                " cannot be a Mixtral: Mixtral is dropless (capacity factor 0)");
  // The z-loss is a training objective, not the model's forward; Mixtral's config has no
  // place for it, so an export would silently lose it (an import would read 0).
  if (m.moe_z_loss_coeff != 0)
    throw Error("model.moe_z_loss_coeff = " + config::toml_float(m.moe_z_loss_coeff) +
                " has no Mixtral equivalent (transformers' Mixtral has no router z-loss); "
                "only a model trained without it exports");
}

}  // namespace

std::vector<HfTensor> hf_tensors(const ModelConfig& m) {
  if (m.moe_experts > 0) require_mixtral(m);
  if (!m.is_llama() && m.kv_head_count() != m.heads)
    throw Error("model.kv_heads = " + std::to_string(m.kv_heads) + " (grouped-query attention) "
                "has no GPT2LMHeadModel equivalent: gpt2 exports need kv_heads = heads");
  std::map<std::string, std::vector<int64_t>> shapes;  // the checkpoint's, by parameter name
  for_each_checkpoint_tensor(m, {}, [&](const CheckpointTensor& t) {
    shapes[t.global.name] = t.global.global_shape;
  });
  std::vector<HfTensor> out;
  // A whole dataset, or its transpose.
  auto whole = [&](const std::string& hf, const std::string& param, bool transposed = false) {
    const std::vector<int64_t>& shape = shapes.at(param);
    std::vector<int64_t> hf_shape = shape;
    if (transposed) hf_shape = {shape[1], shape[0]};
    out.push_back({hf, hf_shape, dataset_path(kWeightsRoot, param), shape, 0, transposed});
  };
  // Rows [begin, begin + rows) of a dataset.
  auto rows = [&](const std::string& hf, const std::string& param, int64_t begin, int64_t count) {
    const std::vector<int64_t>& shape = shapes.at(param);
    out.push_back({hf, {count, shape[1]}, dataset_path(kWeightsRoot, param), shape, begin, false});
  };
  if (!m.is_llama()) {
    // GPT2LMHeadModel: Conv1D weights hold [in, out], the transpose of Trident's [out, in].
    whole("transformer.wte.weight", "embedding.token.weight");
    whole("transformer.wpe.weight", "embedding.position.weight");
    for (int64_t l = 0; l < m.layers; ++l) {
      const std::string hf = "transformer.h." + std::to_string(l) + ".";
      const std::string tr = "layers." + std::to_string(l) + ".";
      whole(hf + "ln_1.weight", tr + "ln1.weight");
      whole(hf + "ln_1.bias", tr + "ln1.bias");
      whole(hf + "attn.c_attn.weight", tr + "attn.qkv.weight", true);
      whole(hf + "attn.c_attn.bias", tr + "attn.qkv.bias");
      whole(hf + "attn.c_proj.weight", tr + "attn.proj.weight", true);
      whole(hf + "attn.c_proj.bias", tr + "attn.proj.bias");
      whole(hf + "ln_2.weight", tr + "ln2.weight");
      whole(hf + "ln_2.bias", tr + "ln2.bias");
      whole(hf + "mlp.c_fc.weight", tr + "mlp.fc1.weight", true);
      whole(hf + "mlp.c_fc.bias", tr + "mlp.fc1.bias");
      whole(hf + "mlp.c_proj.weight", tr + "mlp.fc2.weight", true);
      whole(hf + "mlp.c_proj.bias", tr + "mlp.fc2.bias");
    }
    whole("transformer.ln_f.weight", "final_ln.weight");
    whole("transformer.ln_f.bias", "final_ln.bias");
  } else {
    const int64_t H = m.width, K = m.kv_head_count() * m.head_size(), F = m.ffn_size();
    whole("model.embed_tokens.weight", "embedding.token.weight");
    for (int64_t l = 0; l < m.layers; ++l) {
      const std::string hf = "model.layers." + std::to_string(l) + ".";
      const std::string tr = "layers." + std::to_string(l) + ".";
      // The fused qkv is [q | k | v] and gate_up [gate | up], in Hugging Face's row order
      // (rotate-half rotary: no permutation, docs/checkpoint-format.md).
      rows(hf + "self_attn.q_proj.weight", tr + "attn.qkv.weight", 0, H);
      rows(hf + "self_attn.k_proj.weight", tr + "attn.qkv.weight", H, K);
      rows(hf + "self_attn.v_proj.weight", tr + "attn.qkv.weight", H + K, K);
      whole(hf + "self_attn.o_proj.weight", tr + "attn.proj.weight");
      if (m.moe_experts > 0) {
        // Mixtral: expert e's w1 (gate) and w3 (up) are the rows [gate | up] of its block in
        // the stacked gate_up [E*2F, C]; its w2 (down) the rows [e*C, (e+1)*C) of down
        // [E*C, F]. The router is the gate.
        const std::string moe = hf + "block_sparse_moe.";
        whole(moe + "gate.weight", tr + "mlp.router.weight");
        for (int64_t e = 0; e < m.moe_experts; ++e) {
          const std::string ex = moe + "experts." + std::to_string(e) + ".";
          rows(ex + "w1.weight", tr + "mlp.experts.gate_up.weight", e * 2 * F, F);
          rows(ex + "w2.weight", tr + "mlp.experts.down.weight", e * m.width, m.width);
          rows(ex + "w3.weight", tr + "mlp.experts.gate_up.weight", e * 2 * F + F, F);
        }
      } else {
        rows(hf + "mlp.gate_proj.weight", tr + "mlp.gate_up.weight", 0, F);
        rows(hf + "mlp.up_proj.weight", tr + "mlp.gate_up.weight", F, F);
        whole(hf + "mlp.down_proj.weight", tr + "mlp.down.weight");
      }
      whole(hf + "input_layernorm.weight", tr + "attn_norm.weight");
      whole(hf + "post_attention_layernorm.weight", tr + "mlp_norm.weight");
    }
    whole("model.norm.weight", "final_norm.weight");
  }
  if (!m.tie_embeddings) whole("lm_head.weight", "lm_head.weight");
  return out;
}
namespace {
// The shape fields llama and Mixtral configs share. rope_parameters: transformers 5 reads
// rope_theta from there (and moves a top-level one there itself).
void add_llama_shape(nlohmann::ordered_json& c, const ModelConfig& m) {
  c["vocab_size"] = m.vocab_size;
  c["hidden_size"] = m.width;
  c["intermediate_size"] = m.ffn_size();
  c["num_hidden_layers"] = m.layers;
  c["num_attention_heads"] = m.heads;
  c["num_key_value_heads"] = m.kv_head_count();
  c["head_dim"] = m.head_size();
  c["max_position_embeddings"] = m.seq_len;
  c["rms_norm_eps"] = m.norm_eps;
  c["rope_theta"] = m.rope_theta;
  c["rope_parameters"] = {{"rope_theta", m.rope_theta}, {"rope_type", "default"}};
}
}  // namespace

nlohmann::ordered_json hf_config(const ModelConfig& m, const std::string& torch_dtype) {
  nlohmann::ordered_json c;
  if (!m.is_llama()) {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["vocab_size"] = m.vocab_size;
    c["n_positions"] = m.seq_len;
    c["n_embd"] = m.width;
    c["n_layer"] = m.layers;
    c["n_head"] = m.heads;
    c["n_inner"] = m.ffn_size();
    c["activation_function"] = "gelu_new";  // tanh GELU, what Trident computes
    c["layer_norm_epsilon"] = 1e-5;         // Trident's gpt2 LayerNorm
    // No dropout in Trident; the token ids are the data's, not GPT-2's tokenizer's.
    c["resid_pdrop"] = 0.0;
    c["embd_pdrop"] = 0.0;
    c["attn_pdrop"] = 0.0;
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
    c["reorder_and_upcast_attn"] = false;
    c["initializer_range"] = 0.02;
    c["bos_token_id"] = nullptr;
    c["eos_token_id"] = nullptr;
    c["tie_word_embeddings"] = m.tie_embeddings;
    c["use_cache"] = true;
  } else if (m.moe_experts > 0) {
    // MixtralForCausalLM (require_mixtral has checked the model is one). router_aux_loss_coef
    // is not written: transformers' load-balancing loss is not Trident's (docs/interop.md).
    require_mixtral(m);
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    add_llama_shape(c, m);  // intermediate_size: one expert's
    c["hidden_act"] = "silu";
    c["attention_dropout"] = 0.0;
    c["sliding_window"] = nullptr;
    c["num_local_experts"] = m.moe_experts;
    c["num_experts_per_tok"] = m.moe_top_k;
    c["router_jitter_noise"] = 0.0;
    c["output_router_logits"] = false;
    c["initializer_range"] = 0.02;
    c["tie_word_embeddings"] = m.tie_embeddings;
    c["use_cache"] = true;
  } else {
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    add_llama_shape(c, m);
    c["rope_scaling"] = nullptr;
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["attention_dropout"] = 0.0;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
    c["initializer_range"] = 0.02;
    c["tie_word_embeddings"] = m.tie_embeddings;
    c["use_cache"] = true;
  }
  c["torch_dtype"] = torch_dtype;  // transformers 4's name
  c["dtype"] = torch_dtype;        // transformers 5's
  return c;
}

namespace {

// Typed access to config.json with transformers' defaults for absent (or null) keys; every
// failure one line naming the file and the key.
class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& json, const std::string& file) : json_(json), file_(file) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error("'" + file_ + "': " + key + " " + what);
  }
  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }
  int64_t integer(const std::string& key, std::optional<int64_t> fallback) const {
    if (!has(key)) {
      if (!fallback) fail(key, "is missing");
      return *fallback;
    }
    const auto& v = json_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      fail(key, "= " + v.dump() + " must be a positive integer");
    return v.get<int64_t>();
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const auto& v = json_[key];
    if (!v.is_number() || !(v.get<double>() > 0)) fail(key, "= " + v.dump() + " must be a positive number");
    return v.get<double>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_boolean()) fail(key, "= " + json_[key].dump() + " must be true or false");
    return json_[key].get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_string()) fail(key, "= " + json_[key].dump() + " must be a string");
    return json_[key].get<std::string>();
  }
  // A key whose only value Trident computes.
  void require_flag(const std::string& key, bool fallback, bool wanted, const std::string& why) const {
    if (flag(key, fallback) != wanted)
      fail(key, "= " + std::string(wanted ? "false" : "true") + " is not supported (" + why + ")");
  }
  const nlohmann::json& json() const { return json_; }

 private:
  const nlohmann::json& json_;
  std::string file_;
};

ModelConfig gpt2_from_hf(const HfConfigReader& r, std::optional<int64_t> seq_len) {
  ModelConfig m;
  m.arch = "gpt2";
  m.vocab_size = r.integer("vocab_size", 50257);
  m.seq_len = r.integer("n_positions", 1024);
  m.width = r.integer("n_embd", 768);
  m.layers = r.integer("n_layer", 12);
  m.heads = r.integer("n_head", 12);
  m.ffn_width = r.has("n_inner") ? r.integer("n_inner", {}) : 0;
  if (m.ffn_width == 4 * m.width) m.ffn_width = 0;  // the default, as a Trident config says it
  m.tie_embeddings = r.flag("tie_word_embeddings", true);
  const std::string act = r.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    r.fail("activation_function", "= \"" + act + "\" is not supported (Trident's gpt2 uses the "
           "tanh GELU: gelu_new or gelu_pytorch_tanh)");
  if (r.number("layer_norm_epsilon", 1e-5) != 1e-5)
    r.fail("layer_norm_epsilon", "= " + r.json()["layer_norm_epsilon"].dump() +
           " is not supported (Trident's gpt2 LayerNorm uses 1e-5)");
  r.require_flag("scale_attn_weights", true, true, "Trident scales attention by 1/sqrt(head size)");
  r.require_flag("scale_attn_by_inverse_layer_idx", false, false, "no such scaling in Trident");
  r.require_flag("add_cross_attention", false, false, "Trident is decoder-only");
  if (seq_len && *seq_len != m.seq_len)
    r.fail("n_positions", "= " + std::to_string(m.seq_len) + " is the position table's length; "
           "--seq-len " + std::to_string(*seq_len) + " cannot change it for gpt2");
  if (m.width % m.heads != 0)
    r.fail("n_embd", "= " + std::to_string(m.width) + " is not divisible by n_head = " +
           std::to_string(m.heads));
  return m;
}

// transformers' defaults for the config.json keys llama and Mixtral share.
struct LlamaDefaults {
  int64_t intermediate_size, max_position_embeddings;
  std::optional<int64_t> num_key_value_heads;  // none: num_attention_heads
  double rms_norm_eps, rope_theta;
};
constexpr LlamaDefaults kLlamaDefaults{11008, 2048, std::nullopt, 1e-6, 10000.0};
constexpr LlamaDefaults kMixtralDefaults{14336, 4096 * 32, 8, 1e-5, 1e6};

ModelConfig llama_from_hf(const HfConfigReader& r, std::optional<int64_t> seq_len,
                          const LlamaDefaults& d = kLlamaDefaults) {
  ModelConfig m;
  m.arch = "llama";
  m.vocab_size = r.integer("vocab_size", 32000);
  m.width = r.integer("hidden_size", 4096);
  m.ffn_width = r.integer("intermediate_size", d.intermediate_size);
  m.layers = r.integer("num_hidden_layers", 32);
  m.heads = r.integer("num_attention_heads", 32);
  m.kv_heads = r.integer("num_key_value_heads", d.num_key_value_heads.value_or(m.heads));
  if (m.kv_heads == m.heads) m.kv_heads = 0;
  m.seq_len = seq_len ? *seq_len : r.integer("max_position_embeddings", d.max_position_embeddings);
  m.norm_eps = r.number("rms_norm_eps", d.rms_norm_eps);
  m.rope_theta = r.number("rope_theta", d.rope_theta);
  m.tie_embeddings = r.flag("tie_word_embeddings", false);
  if (r.has("rope_scaling"))
    r.fail("rope_scaling", "= " + r.json()["rope_scaling"].dump() +
           " is not supported (Trident's rotary embedding has no scaling)");
  if (r.has("rope_parameters")) {  // transformers 5's form of rope_theta / rope_scaling
    const auto& p = r.json()["rope_parameters"];
    if (!p.is_object() || (p.contains("rope_type") && p["rope_type"] != "default"))
      r.fail("rope_parameters", "= " + p.dump() + " is not supported (only rope_type \"default\")");
    if (p.contains("rope_theta")) {
      if (!p["rope_theta"].is_number()) r.fail("rope_parameters", "rope_theta must be a number");
      m.rope_theta = p["rope_theta"].get<double>();
    }
  }
  if (const std::string act = r.text("hidden_act", "silu"); act != "silu")
    r.fail("hidden_act", "= \"" + act + "\" is not supported (Trident's llama MLP is SwiGLU: silu)");
  r.require_flag("attention_bias", false, false, "Trident's llama has no biases");
  r.require_flag("mlp_bias", false, false, "Trident's llama has no biases");
  if (m.width % m.heads != 0)
    r.fail("hidden_size", "= " + std::to_string(m.width) + " is not divisible by "
           "num_attention_heads = " + std::to_string(m.heads));
  if (r.has("head_dim") && r.integer("head_dim", {}) != m.width / m.heads)
    r.fail("head_dim", "= " + std::to_string(r.integer("head_dim", {})) + " is not supported "
           "(Trident's head size is hidden_size / num_attention_heads = " +
           std::to_string(m.width / m.heads) + ")");
  if (m.ffn_width == ModelConfig{.arch = "llama", .width = m.width}.ffn_size()) m.ffn_width = 0;
  return m;
}

// MixtralForCausalLM: a llama whose every MLP is num_local_experts SwiGLU experts (w1 gate,
// w3 up, w2 down) behind a softmax top-k router renormalised over the k, dropless, exactly
// Trident's llama MoE with moe_layer_interval 1 and moe_capacity_factor 0 (docs/interop.md).
ModelConfig mixtral_from_hf(const HfConfigReader& r, std::optional<int64_t> seq_len) {
  ModelConfig m = llama_from_hf(r, seq_len, kMixtralDefaults);
  m.moe_experts = r.integer("num_local_experts", 8);
  m.moe_top_k = r.integer("num_experts_per_tok", 2);
  if (m.moe_top_k > m.moe_experts)
    r.fail("num_experts_per_tok", "= " + std::to_string(m.moe_top_k) +
           " must be <= num_local_experts = " + std::to_string(m.moe_experts));
  m.moe_layer_interval = 1;
  m.moe_capacity_factor = 0.0;
  // Mixtral has no router z-loss; its router_aux_loss_coef weighs another load-balancing
  // loss than Trident's (docs/interop.md), so it is not read: Trident's default stays.
  m.moe_z_loss_coeff = 0.0;
  if (r.has("sliding_window"))
    r.fail("sliding_window", "= " + r.json()["sliding_window"].dump() +
           " is not supported (Trident's attention is full causal: sliding_window must be null)");
  if (r.has("router_jitter_noise")) {
    const auto& v = r.json()["router_jitter_noise"];
    if (!v.is_number() || v.get<double>() != 0.0)
      r.fail("router_jitter_noise", "= " + v.dump() + " is not supported (Trident's router has "
             "no jitter: it must be 0)");
  }
  return m;
}

}  // namespace

ModelConfig model_from_hf_config(const nlohmann::json& config, const std::string& file,
                                 std::optional<int64_t> seq_len) {
  if (!config.is_object()) throw Error("'" + file + "': not a JSON object");
  const HfConfigReader r(config, file);
  const std::string type = r.text("model_type", "");
  if (type == "gpt2") return gpt2_from_hf(r, seq_len);
  if (type == "llama") return llama_from_hf(r, seq_len);
  if (type == "mixtral") return mixtral_from_hf(r, seq_len);
  if (type.empty()) r.fail("model_type", "is missing (gpt2, llama or mixtral)");
  r.fail("model_type", "= \"" + type + "\" is not supported (gpt2, llama or mixtral)");
}

}  // namespace trident

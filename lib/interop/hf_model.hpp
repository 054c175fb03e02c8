#pragma once
// How a Trident model maps onto Hugging Face transformers' GPT2LMHeadModel (model.arch gpt2),
// LlamaForCausalLM (llama) and MixtralForCausalLM (a llama mixture of experts with every layer
// MoE, dropless, no z-loss): the config.json fields, and which rows of which Trident
// dataset each Hugging Face tensor is (docs/interop.md; data_tools/hf_reference.py is the
// by-hand reference it was checked against).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/ckpt_runs.hpp"
#include "config/config.hpp"

namespace trident {

// One Hugging Face tensor: rows [row_begin, row_begin + rows) of a Trident dataset (the q, k,
// v blocks of the fused qkv, the gate and up blocks of gate_up; otherwise the whole dataset),
// or the transpose of a whole dataset (GPT-2's Conv1D weights are [in, out]).
struct HfTensor {
  std::string hf_name;
  std::vector<int64_t> hf_shape;
  std::string dataset;                 // "/model/layers/000/attn/qkv/weight"
  std::vector<int64_t> dataset_shape;  // its global shape
  int64_t row_begin = 0;
  bool transposed = false;

  // The Hugging Face tensor as a matrix [rows, cols] (a vector is [n, 1]): the unit of work
  // is a block of its rows.
  int64_t rows() const { return hf_shape[0]; }
  int64_t cols() const { return hf_shape.size() == 2 ? hf_shape[1] : 1; }
  int64_t numel() const { return rows() * cols(); }
  // The elements of the dataset that Hugging Face rows [begin, end) hold, as runs whose local
  // offsets index a buffer in the dataset's order (row-major [end - begin, cols], or for a
  // transposed tensor [dataset rows, end - begin]).
  std::vector<Run> dataset_runs(int64_t begin, int64_t end) const;
  // Rows [begin, end) between the dataset-ordered buffer of dataset_runs and Hugging Face's
  // row-major order (a copy unless transposed).
  void to_hf_order(const float* dataset_order, int64_t begin, int64_t end, float* hf_order) const;
  void to_dataset_order(const float* hf_order, int64_t begin, int64_t end,
                        float* dataset_order) const;
};

// Every tensor of the Hugging Face model in its module order (the order of its state_dict),
// without the LM head when the embeddings are tied (transformers does not save it then).
// Throws naming the key for a model transformers cannot hold (gpt2 with kv_heads != heads; a
// mixture of experts that is no Mixtral: gpt2, moe_layer_interval != 1, a capacity factor, a
// z-loss).
std::vector<HfTensor> hf_tensors(const ModelConfig& model);

// config.json for the model (every field transformers needs; vocab_size unpadded;
// torch_dtype "float32" or "bfloat16").
nlohmann::ordered_json hf_config(const ModelConfig& model, const std::string& torch_dtype);

// The Trident model keys that config.json (`file`, for errors) describes; throws one line
// naming the file and the key for anything Trident cannot represent (an unknown model_type,
// rope_scaling, biases in llama, head_dim != hidden_size / num_attention_heads, a Mixtral's
// sliding_window or router_jitter_noise, ...).
// `seq_len`: llama's model.seq_len when given (default: max_position_embeddings); gpt2's is
// n_positions (the position table's rows) and must not differ.
ModelConfig model_from_hf_config(const nlohmann::json& config, const std::string& file,
                                 std::optional<int64_t> seq_len);

}  // namespace trident

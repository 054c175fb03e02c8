// trident generate --ckpt FILE [--tokenizer FILE] (--prompt TEXT | --prompt-file FILE)
//     [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--prompt-loss]
// Text from a checkpoint's model, one rank: the prompt runs through the model one token at a
// time with a key/value cache (each new token attends to the cached keys and values of the
// ones before it), then tokens are sampled and streamed to standard output as they come.
// The layers are the trainer's CPU kernels applied to one row at a time; attention over the
// cache is written here. --prompt-loss also prints the mean cross-entropy of the prompt's
// tokens given those before them (the number the trainer's evaluation computes for the same
// window: tests/test_app_generate.cpp compares them).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <span>
#include <sstream>

#include "checkpoint/h5_file.hpp"
#include "commands.hpp"
#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/architecture.hpp"
#include "tokenizer/bpe_tokenizer.hpp"
#include "train/checkpointing.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace trident {

void add_generate_command(CLI::App& app, GenerateOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "generate", "Sample text from a checkpoint's model (one rank, key/value cache)");
  cmd->add_option("--ckpt", options.checkpoint, "checkpoint file")->required();
  cmd->add_option("--tokenizer", options.tokenizer,
                  "Hugging Face tokenizer.json; default: byte-level (ids 0..255)");
  auto* prompt = cmd->add_option("--prompt", options.prompt, "prompt text");
  auto* file = cmd->add_option("--prompt-file", options.prompt_file, "prompt text from a file");
  prompt->excludes(file);
  file->excludes(prompt);
  cmd->add_option("--max-new-tokens", options.max_new_tokens, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", options.temperature, "0: greedy (the most likely token)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", options.top_k, "sample among the k most likely tokens; 0: all")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", options.top_p,
                  "sample among the most likely tokens whose probabilities sum to p (nucleus)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", options.seed, "sampling seed");
  cmd->add_flag("--prompt-loss", options.prompt_loss,
                "also print the mean cross-entropy of the prompt (each token given those before)");
}

namespace {

// The model's weights, whole (one rank), by parameter name.
class Weights {
 public:
  Weights(const std::string& path, ModelConfig& model) {
    CheckpointReader reader(path, MPI_COMM_SELF, checkpoint_reader_options());
    model = check_checkpoint(reader).config.model;
    if (model.moe_experts > 0)
      throw Error("generate: checkpoint '" + path + "' has model.moe_experts = " +
                  std::to_string(model.moe_experts) +
                  ": the key/value-cache decoder has no mixture of experts yet (docs/moe.md)");
    for (const ParamInfo& p : global_parameters(model)) {
      std::vector<float>& data = tensors_[p.name];
      data.resize(p.global_numel());
      reader.read_tensor(dataset_path("/model", p.name), p.global_shape,
                         {Run{0, 0, p.global_numel()}}, std::span<float>(data));
    }
    reader.close();  // checksums checked here
  }
  const float* operator()(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : it->second.data();
  }

 private:
  std::map<std::string, std::vector<float>> tensors_;
};

// One sequence through the model, a token at a time, keys and values cached per layer.
class CachedModel {
 public:
  CachedModel(const ModelConfig& m, const Weights& w) : m_(m), w_(w) {
    const int64_t kv = 2 * m.kv_head_count() * m.head_size();
    cache_.assign(m.layers, std::vector<float>(m.seq_len * kv));
  }
  int64_t position() const { return pos_; }

  // Logits [vocab_size] of the token after `token`, which sits at position position().
  std::vector<float> step(int32_t token) {
    if (pos_ >= m_.seq_len)
      throw Error("generate: the prompt is longer than model.seq_len (" +
                  std::to_string(m_.seq_len) + " tokens; with --max-new-tokens 0, seq_len + 1)");
    const int64_t C = m_.width;
    std::vector<float> x(C), h(C), tmp(C);
    const float* wte = w_("embedding.token.weight");
    std::copy(wte + static_cast<int64_t>(token) * C, wte + (token + 1) * C, x.begin());
    if (const float* wpe = w_("embedding.position.weight"))
      for (int64_t c = 0; c < C; ++c) x[c] += wpe[pos_ * C + c];
    for (int64_t l = 0; l < m_.layers; ++l) layer(l, x);
    norm(h.data(), x.data(), m_.is_llama() ? "final_norm" : "final_ln");
    const float* head = w_("lm_head.weight") ? w_("lm_head.weight") : wte;
    std::vector<float> logits(m_.vocab_size);
    cpu::linear_forward(logits.data(), h.data(), head, static_cast<const float*>(nullptr), 1, C,
                        m_.vocab_size);
    ++pos_;
    return logits;
  }

 private:
  std::string p(int64_t l, const char* name) const {
    return "layers." + std::to_string(l) + "." + name;
  }
  void norm(float* out, const float* in, const std::string& name) const {
    float mean = 0, rstd = 0;
    if (m_.is_llama())
      cpu::rmsnorm_forward(out, &rstd, in, w_(name + ".weight"), 1, m_.width, m_.norm_eps);
    else
      cpu::layernorm_forward(out, &mean, &rstd, in, w_(name + ".weight"), w_(name + ".bias"), 1,
                             m_.width);
  }
  void layer(int64_t l, std::vector<float>& x) {
    const int64_t C = m_.width, NH = m_.heads, KVH = m_.kv_head_count(), HS = m_.head_size();
    const bool llama = m_.is_llama();
    std::vector<float> h(C), qkv((NH + 2 * KVH) * HS), att(NH * HS), out(C);
    norm(h.data(), x.data(), p(l, llama ? "attn_norm" : "ln1"));
    cpu::linear_forward(qkv.data(), h.data(), w_(p(l, "attn.qkv.weight")),
                        w_(p(l, "attn.qkv.bias")), 1, C, (NH + 2 * KVH) * HS);
    if (llama) rotate(qkv);
    // Cache row pos_: [k of kv heads | v of kv heads].
    float* row = cache_[l].data() + pos_ * 2 * KVH * HS;
    std::copy(qkv.begin() + NH * HS, qkv.end(), row);
    attend(l, qkv.data(), att.data());
    cpu::linear_forward(out.data(), att.data(), w_(p(l, "attn.proj.weight")),
                        w_(p(l, "attn.proj.bias")), 1, NH * HS, C);
    for (int64_t c = 0; c < C; ++c) x[c] += out[c];
    norm(h.data(), x.data(), p(l, llama ? "mlp_norm" : "ln2"));
    const int64_t F = m_.ffn_size();
    if (llama) {
      std::vector<float> gate_up(2 * F), act(F);
      cpu::linear_forward(gate_up.data(), h.data(), w_(p(l, "mlp.gate_up.weight")),
                          static_cast<const float*>(nullptr), 1, C, 2 * F);
      cpu::swiglu_forward(act.data(), gate_up.data(), 1, F);
      cpu::linear_forward(out.data(), act.data(), w_(p(l, "mlp.down.weight")),
                          static_cast<const float*>(nullptr), 1, F, C);
    } else {
      std::vector<float> up(F), act(F);
      cpu::linear_forward(up.data(), h.data(), w_(p(l, "mlp.fc1.weight")),
                          w_(p(l, "mlp.fc1.bias")), 1, C, F);
      cpu::gelu_forward(act.data(), up.data(), F);
      cpu::linear_forward(out.data(), act.data(), w_(p(l, "mlp.fc2.weight")),
                          w_(p(l, "mlp.fc2.bias")), 1, F, C);
    }
    for (int64_t c = 0; c < C; ++c) x[c] += out[c];
  }
  // RoPE at position pos_: the kernel rotates row t of a [1, T] batch by position t, so the
  // row goes last in a batch of pos_ + 1 rows.
  void rotate(std::vector<float>& qkv) {
    const int64_t width = static_cast<int64_t>(qkv.size());
    rope_rows_.assign((pos_ + 1) * width, 0.0f);
    std::copy(qkv.begin(), qkv.end(), rope_rows_.end() - width);
    cpu::rope_forward(rope_rows_.data(), 1, pos_ + 1, m_.heads, m_.kv_head_count(),
                      m_.head_size(), m_.rope_theta);
    std::copy(rope_rows_.end() - width, rope_rows_.end(), qkv.begin());
  }
  // Causal attention of the new token's queries over the cached keys and values 0..pos_.
  void attend(int64_t l, const float* qkv, float* out) const {
    const int64_t NH = m_.heads, KVH = m_.kv_head_count(), HS = m_.head_size();
    const int64_t stride = 2 * KVH * HS;
    const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
    std::vector<float> score(pos_ + 1);
    for (int64_t hd = 0; hd < NH; ++hd) {
      const int64_t kvh = hd / (NH / KVH);
      const float* q = qkv + hd * HS;
      float max = -INFINITY;
      for (int64_t s = 0; s <= pos_; ++s) {
        const float* k = cache_[l].data() + s * stride + kvh * HS;
        float dot = 0;
        for (int64_t i = 0; i < HS; ++i) dot += q[i] * k[i];
        score[s] = dot * scale;
        max = std::max(max, score[s]);
      }
      float sum = 0;
      for (int64_t s = 0; s <= pos_; ++s) sum += (score[s] = std::exp(score[s] - max));
      float* o = out + hd * HS;
      std::fill(o, o + HS, 0.0f);
      for (int64_t s = 0; s <= pos_; ++s) {
        const float* v = cache_[l].data() + s * stride + (KVH + kvh) * HS;
        for (int64_t i = 0; i < HS; ++i) o[i] += score[s] / sum * v[i];
      }
    }
  }

  const ModelConfig& m_;
  const Weights& w_;
  std::vector<std::vector<float>> cache_;  // per layer [seq_len, 2 * KVH * HS]
  std::vector<float> rope_rows_;
  int64_t pos_ = 0;
};

// -log softmax(logits)[target], in double.
double cross_entropy(const std::vector<float>& logits, int32_t target) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float z : logits) sum += std::exp(static_cast<double>(z) - max);
  return std::log(sum) - (static_cast<double>(logits[target]) - max);
}

// The next token: greedy at temperature 0, else sampled from softmax(logits / temperature)
// restricted to the top k and then to the smallest set whose probability reaches top_p.
int32_t sample(const std::vector<float>& logits, const GenerateOptions& o, uint64_t key,
               uint64_t draw) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (o.temperature == 0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; ties by id, so the order is the same everywhere.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t k = o.top_k > 0 ? std::min<int64_t>(o.top_k, V) : V;
  std::vector<double> prob(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i)
    sum += prob[i] = std::exp((logits[order[i]] - logits[order[0]]) / o.temperature);
  int64_t kept = 0;
  double mass = 0;
  while (kept < k && (kept == 0 || mass < o.top_p * sum)) mass += prob[kept++];
  double u = uniform01(key, draw) * mass;
  for (int64_t i = 0; i < kept; ++i)
    if ((u -= prob[i]) <= 0) return order[i];
  return order[kept - 1];
}

void write_bytes(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void run_generate(const GenerateOptions& options) {
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size != 1)
    throw Error("generate runs on one rank (this job has " + std::to_string(world_size) + ")");
  if (options.prompt.empty() && options.prompt_file.empty())
    throw Error("generate: give --prompt TEXT or --prompt-file FILE");
  std::string prompt = options.prompt;
  if (!options.prompt_file.empty()) {
    std::ifstream in(options.prompt_file, std::ios::binary);
    if (!in) throw Error("--prompt-file '" + options.prompt_file + "': cannot read it");
    std::ostringstream text;
    text << in.rdbuf();
    prompt = text.str();
  }
  const BpeTokenizer tokenizer = options.tokenizer.empty()
                                     ? BpeTokenizer::bytes()
                                     : BpeTokenizer::from_file(options.tokenizer);
  const std::vector<int32_t> ids = tokenizer.encode(prompt);
  ModelConfig model;
  const Weights weights(options.checkpoint, model);
  if (tokenizer.vocab_size() > model.vocab_size)
    throw Error("generate: the tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                " ids but the model's vocabulary " + std::to_string(model.vocab_size));
  if (ids.empty()) throw Error("generate: the prompt has no tokens");
  cpu::set_num_threads(1);

  CachedModel cached(model, weights);
  std::vector<float> logits;
  double loss_sum = 0;
  // The last prompt token runs only to predict the first new one: a prompt of seq_len + 1
  // tokens is one window of the trainer's evaluation (--prompt-loss, --max-new-tokens 0).
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) loss_sum += cross_entropy(logits, ids[i]);
    if (i + 1 < ids.size() || options.max_new_tokens > 0) logits = cached.step(ids[i]);
  }
  if (options.prompt_loss) {
    if (ids.size() < 2) throw Error("--prompt-loss needs a prompt of at least 2 tokens");
    std::printf("prompt loss %.17g over %zu tokens\n", loss_sum / (ids.size() - 1),
                ids.size() - 1);
  }
  write_bytes(prompt);
  const uint64_t key = stream_key(options.seed, "generate");
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    const int32_t next = sample(logits, options, key, static_cast<uint64_t>(n));
    // An id the model has but the tokenizer lacks (padding of the vocabulary) ends the text.
    if (next >= tokenizer.vocab_size()) {
      std::fprintf(stderr, "generate: stopped at id %d, which the tokenizer does not have\n",
                   static_cast<int>(next));
      break;
    }
    write_bytes(tokenizer.decode({next}));
    if (n + 1 == options.max_new_tokens) break;
    if (cached.position() >= model.seq_len) {
      std::fprintf(stderr, "generate: stopped after %lld new tokens: model.seq_len (%lld) "
                   "reached\n", static_cast<long long>(n + 1),
                   static_cast<long long>(model.seq_len));
      break;
    }
    logits = cached.step(next);
  }
  write_bytes("\n");
}

}  // namespace trident

#include "train/generation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "tokenizer/bpe_tokenizer.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace trident {

int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& o, uint64_t key,
                     uint64_t draw) {
  if (o.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; ties by id, so the order is the same everywhere.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t k = o.top_k > 0 ? std::min<int64_t>(o.top_k, V) : V;
  std::vector<double> prob(static_cast<size_t>(k));
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

namespace {

// Positions [0, end) a prompt of `length` tokens feeds (prompt, then all new tokens but the
// last), cut at the context.
int64_t decode_end(int64_t length, int64_t max_new_tokens, int64_t context) {
  return std::min(context, length + max_new_tokens - 1);
}

}  // namespace

std::vector<std::vector<int32_t>> generate_tokens(StageModel& model,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerateRequest& request,
                                                  const GenerateCallbacks& callbacks) {
  const int64_t max_new_tokens = request.max_new_tokens;
  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t context = model.config().seq_len, V = model.config().vocab_size;
  std::vector<int64_t> end(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t length = static_cast<int64_t>(prompts[b].size());
    const std::string which = B == 1 ? "the prompt" : "prompt " + std::to_string(b);
    if (length == 0) throw Error("generate: " + which + " has no tokens");
    const int64_t fed = max_new_tokens > 0 ? length : length - 1;
    if (fed > context)
      throw Error("generate: " + which + " (" + std::to_string(length) +
                  " tokens) is longer than model.seq_len (" + std::to_string(context) +
                  " tokens; with --max-new-tokens 0, seq_len + 1)");
    for (const int32_t id : prompts[b])
      if (id < 0 || id >= V)
        throw Error("generate: " + which + " has token id " + std::to_string(id) +
                    ", outside the model's vocabulary of " + std::to_string(V));
    end[b] = decode_end(length, max_new_tokens, context);
  }
  std::vector<std::vector<int32_t>> generated(static_cast<size_t>(B));
  const int64_t steps = B == 0 ? 0 : *std::max_element(end.begin(), end.end());
  if (steps == 0) return generated;
  const auto cache = model.make_decode_cache(B);
  std::vector<int32_t> tokens(static_cast<size_t>(B)), positions(static_cast<size_t>(B));
  std::vector<float> logits(static_cast<size_t>(B * V));
  const uint64_t key = stream_key(request.sampling.seed, "generate");
  const int64_t sample_vocab = std::min(request.sample_vocab, V);
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t length = static_cast<int64_t>(prompts[b].size());
      // Finished rows repeat their last step (a row that feeds nothing, position 0).
      const int64_t at = std::max<int64_t>(0, std::min(s, end[b] - 1));
      tokens[b] = at < length ? prompts[b][at] : generated[b][at - length];
      positions[b] = static_cast<int32_t>(at);
    }
    model.forward_decode(*cache, tokens.data(), positions.data(), logits.data());
    for (int64_t b = 0; b < B; ++b) {
      if (s >= end[b]) continue;
      const float* row = logits.data() + b * V;
      if (callbacks.on_logits) callbacks.on_logits(b, s, row);
      const int64_t length = static_cast<int64_t>(prompts[b].size());
      auto& out = generated[b];
      if (s + 1 < length || static_cast<int64_t>(out.size()) >= max_new_tokens) continue;
      const uint64_t draw = (static_cast<uint64_t>(b) << 32) + out.size();
      const int32_t next = sample_token(row, sample_vocab, request.sampling, key, draw);
      if (next == request.stop_token) {
        end[b] = s + 1;  // finished: repeats this step from now on
        continue;
      }
      out.push_back(next);
      if (callbacks.on_token) callbacks.on_token(b, next);
    }
  }
  return generated;
}

std::string sample_continuation(StageModel& model, const Config& config,
                                const BpeTokenizer& tokenizer) {
  const EvalConfig& e = config.eval;
  std::vector<int32_t> prompt = tokenizer.encode(e.sample_prompt);
  // The context holds the prompt's last tokens and the new ones.
  const int64_t keep = std::max<int64_t>(1, config.model.seq_len - e.sample_tokens + 1);
  if (static_cast<int64_t>(prompt.size()) > keep) prompt.erase(prompt.begin(), prompt.end() - keep);
  GenerateRequest request;
  request.max_new_tokens = e.sample_tokens;
  request.sampling = {e.sample_temperature, 0, 1.0, static_cast<uint64_t>(config.train.seed)};
  request.sample_vocab = tokenizer.vocab_size();
  const auto generated = generate_tokens(model, {prompt}, request);
  return e.sample_prompt + tokenizer.decode(generated[0]);
}

}  // namespace trident

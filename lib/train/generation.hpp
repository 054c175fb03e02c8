#pragma once
// Text generation through the model graph (StageModel::forward_decode, one token per sequence
// per step against a key/value cache): the sampler and the batched decoding loop that
// `trident generate` and the trainer's periodic samples (eval.sample_interval) share.
//
// Batched prompts run in lockstep: at step s every unfinished sequence feeds its token at
// position s (its prompt's, then what it generated), so sequences of different lengths share
// the steps; a finished one repeats its last step (its cache row is never read again).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "model/stage_model.hpp"

namespace trident {

class BpeTokenizer;

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the most likely token; ties: the lowest id)
  int64_t top_k = 0;         // sample among the k most likely tokens; 0: all
  double top_p = 1.0;        // then among the most likely ones whose probabilities reach p
  uint64_t seed = 0;
};

// The next token from logits[V]: the arg max at temperature 0, else a draw from
// softmax(logits / temperature) restricted to the top k and then to the smallest set of most
// likely tokens whose probability reaches top_p. A pure function of (logits, options, key,
// draw): every rank of a tensor group samples the same token from the same logits.
int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& options,
                     uint64_t key, uint64_t draw);

// What to generate for every prompt of a batch.
struct GenerateRequest {
  int64_t max_new_tokens = 0;  // fewer when a sequence reaches model.seq_len or stop_token
  SamplingOptions sampling;
  int64_t sample_vocab = 0;    // ids >= this (the tokenizer's size) are never drawn
  int32_t stop_token = -1;     // a sequence that samples it ends there (not kept); -1: none
};

struct GenerateCallbacks {
  // Each new token of sequence `row` as it is sampled.
  std::function<void(int64_t row, int32_t token)> on_token;
  // The logits [vocab_size] that follow sequence `row`'s token at `position`.
  std::function<void(int64_t row, int64_t position, const float* logits)> on_logits;
};

// Collective over the model's tensor group (the whole model on each rank: pipeline 1).
// The new tokens of each prompt, sampled among ids < sample_vocab (the tokenizer's: padding
// ids of the model's vocabulary are never produced). Prompt b is fed whole when
// max_new_tokens > 0, else all but its last token (a prompt of seq_len + 1 tokens is then one
// training window). Sequence b draws from stream_key(seed, "generate") with counters
// b * 2^32 + n. Throws one line for an empty prompt, an id outside the vocabulary or a prompt
// longer than the context.
std::vector<std::vector<int32_t>> generate_tokens(StageModel& model,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerateRequest& request,
                                                  const GenerateCallbacks& callbacks = {});

// The trainer's periodic sample (eval.sample_interval): eval.sample_prompt and its continuation
// of eval.sample_tokens tokens from the model's current weights (eval.sample_temperature, seed
// train.seed), the prompt cut to its last tokens so that it and the new ones fit model.seq_len.
// Collective over the tensor group, as generate_tokens.
std::string sample_continuation(StageModel& model, const Config& config,
                                const BpeTokenizer& tokenizer);

}  // namespace trident

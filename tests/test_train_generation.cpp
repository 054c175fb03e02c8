// Generation through the model graph (Transformer::forward_decode, train/generation.hpp) on the
// CPU kernel set, both architectures: greedy decoding with the key/value cache gives the tokens
// of greedy decoding that recomputes the whole prefix with the training forward each token,
// and the logits of every generated position equal the training forward's at that position;
// batched prompts of different lengths give what each gives alone; bad prompts and a sampling
// config on a pipeline are one clear error. (TP 2 == TP 1: tests/test_app_generate.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "model/cpu_model.hpp"
#include "model/stage_model.hpp"
#include "train/generation.hpp"
#include "train/run_reports.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

ModelConfig tiny_model(const std::string& arch) {
  ModelConfig m;
  m.arch = arch;
  m.layers = 2;
  m.heads = 4;
  m.width = 32;
  m.vocab_size = 50;  // padded to 56: the padding ids are never produced
  m.vocab_multiple = 8;
  m.seq_len = 16;
  if (arch == "llama") {  // grouped-query attention, an untied head, larger RoPE angles
    m.kv_heads = 2;
    m.tie_embeddings = false;
    m.rope_theta = 100.0;
  }
  return m;
}

constexpr uint64_t kSeed = 11;
// Larger-than-init weights: peaked next-token distributions (greedy ties are not at stake).
constexpr float kWeightScale = 4.0f;

template <class Model>
void init_scaled(Model& model) {
  model.init_weights(kSeed);
  for (int64_t i = 0; i < model.flat_size(); ++i) model.weights()[i] *= kWeightScale;
  model.weights_changed();
}

// Greedy decoding by the training forward over the whole prefix (padded to seq_len; causal, so
// the padding does not reach the rows read): the tokens, and each generated position's logits.
struct Recomputed {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};
Recomputed recompute_greedy(const ModelConfig& m, const std::vector<int32_t>& prompt,
                            int64_t new_tokens) {
  auto comm = make_self_communicator("tensor");
  CpuModel<float> model(m, ModelShard::whole(m), *comm);
  init_scaled(model);
  auto acts = model.make_activations(1);
  const int64_t Vl = padded_vocab_size(m, 1);
  std::vector<float> logits(static_cast<size_t>(m.seq_len * Vl));
  Recomputed out;
  std::vector<int32_t> seq = prompt;
  const std::vector<int32_t> targets(m.seq_len, 0);
  while (static_cast<int64_t>(out.tokens.size()) < new_tokens) {
    std::vector<int32_t> window = seq;
    window.resize(m.seq_len, 0);
    model.forward(acts, window.data(), targets.data(), nullptr, 0.0f);
    model.take_loss_sum();
    model.logits(acts, logits.data());  // from the kept final norm: the head the trainer runs
    const float* row = logits.data() + (seq.size() - 1) * Vl;
    out.logits.emplace_back(row, row + m.vocab_size);
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + m.vocab_size) - row);
    out.tokens.push_back(next);
    seq.push_back(next);
  }
  return out;
}

struct Decoded {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<std::vector<float>>> logits;  // [row][generated position][vocab]
};
Decoded decode_greedy(const ModelConfig& m, const std::vector<std::vector<int32_t>>& prompts,
                      int64_t new_tokens, int32_t stop_token = -1) {
  auto comm = make_self_communicator("tensor");
  auto host = make_cpu_device();
  auto model = make_cpu_stage_model(m, ModelShard::whole(m), *comm, *host);
  init_scaled(*model);
  Decoded out;
  out.logits.resize(prompts.size());
  GenerateCallbacks callbacks;
  callbacks.on_logits = [&](int64_t row, int64_t position, const float* logits) {
    if (position + 1 >= static_cast<int64_t>(prompts[row].size()))  // predicts a new token
      out.logits[row].emplace_back(logits, logits + m.vocab_size);
  };
  GenerateRequest greedy;
  greedy.max_new_tokens = new_tokens;
  greedy.sampling.temperature = 0;
  greedy.sample_vocab = m.vocab_size;
  greedy.stop_token = stop_token;
  out.tokens = generate_tokens(*model, prompts, greedy, callbacks);
  return out;
}

std::vector<int32_t> prompt_of(int64_t length, int64_t salt, int64_t vocab) {
  std::vector<int32_t> p(length);
  for (int64_t i = 0; i < length; ++i) p[i] = static_cast<int32_t>((i * 7 + salt * 5 + 3) % vocab);
  return p;
}

class Generation : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { omp_set_num_threads(1); }
};

}  // namespace

TEST_P(Generation, CachedGreedyEqualsFullPrefixRecompute) {
  const ModelConfig m = tiny_model(GetParam());
  const std::vector<int32_t> prompt = prompt_of(4, 1, m.vocab_size);
  const int64_t new_tokens = m.seq_len - 4;  // to the end of the context
  const Recomputed ref = recompute_greedy(m, prompt, new_tokens);
  const Decoded dec = decode_greedy(m, {prompt}, new_tokens);
  ASSERT_EQ(dec.tokens.size(), 1u);
  EXPECT_EQ(dec.tokens[0], ref.tokens);
  ASSERT_EQ(dec.logits[0].size(), ref.logits.size());
  ASSERT_EQ(static_cast<int64_t>(ref.logits.size()), new_tokens);
  // The first generated position: the training forward's logits at the last prompt position.
  double first = 0, worst = 0, scale = 0;
  int64_t compared = 0;
  for (size_t n = 0; n < ref.logits.size(); ++n)
    for (int64_t v = 0; v < m.vocab_size; ++v, ++compared) {
      const double d = std::fabs(dec.logits[0][n][v] - ref.logits[n][v]);
      worst = std::max(worst, d);
      if (n == 0) first = std::max(first, d);
      scale = std::max(scale, static_cast<double>(std::fabs(ref.logits[n][v])));
    }
  std::printf("%s: %lld tokens equal; logits max |diff| %.3g at the first generated position, "
              "%.3g over all %lld compared (max |logit| %.3g)\n",
              GetParam().c_str(), static_cast<long long>(ref.tokens.size()), first, worst,
              static_cast<long long>(compared), scale);
  EXPECT_EQ(compared, new_tokens * m.vocab_size);
  // float kernels, different summation orders (GEMM vs. the cache's dot products): 1e-5
  // relative to the largest logit.
  EXPECT_LE(first, 1e-5 * scale);
  EXPECT_LE(worst, 1e-5 * scale);
}

TEST_P(Generation, BatchedPromptsEqualEachAlone) {
  const ModelConfig m = tiny_model(GetParam());
  const std::vector<std::vector<int32_t>> prompts = {
      prompt_of(3, 1, m.vocab_size), prompt_of(7, 2, m.vocab_size),
      prompt_of(1, 3, m.vocab_size), prompt_of(5, 4, m.vocab_size)};
  const int64_t new_tokens = 8;
  const Decoded batched = decode_greedy(m, prompts, new_tokens);
  int64_t compared = 0;
  double worst = 0, scale = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const Decoded alone = decode_greedy(m, {prompts[b]}, new_tokens);
    EXPECT_EQ(batched.tokens[b], alone.tokens[0]) << "prompt " << b;
    compared += static_cast<int64_t>(alone.tokens[0].size());
    ASSERT_EQ(batched.logits[b].size(), alone.logits[0].size());
    for (size_t n = 0; n < alone.logits[0].size(); ++n)
      for (int64_t v = 0; v < m.vocab_size; ++v) {
        const float x = batched.logits[b][n][v], y = alone.logits[0][n][v];
        worst = std::max(worst, static_cast<double>(std::fabs(x - y)));
        scale = std::max(scale, static_cast<double>(std::fabs(y)));
      }
  }
  std::printf("%s: %lld tokens of 4 prompts equal batched and alone; logits max |diff| %.3g "
              "(max |logit| %.3g)\n",
              GetParam().c_str(), static_cast<long long>(compared), worst, scale);
  EXPECT_EQ(compared, 4 * new_tokens);
  // The GEMMs run on B rows or one: other blockings, so float rounding differs a little.
  EXPECT_LE(worst, 1e-5 * scale);
}

TEST_P(Generation, ContextEndStopsAndBadPromptsAreOneLine) {
  const ModelConfig m = tiny_model(GetParam());
  // 14 prompt tokens + 8 new ones would pass seq_len 16: 3 new tokens (positions 13..15).
  const Decoded near_end = decode_greedy(m, {prompt_of(14, 1, m.vocab_size)}, 8);
  EXPECT_EQ(near_end.tokens[0].size(), 3u);
  auto comm = make_self_communicator("tensor");
  auto host = make_cpu_device();
  auto model = make_cpu_stage_model(m, ModelShard::whole(m), *comm, *host);
  const auto message = [&](const std::vector<std::vector<int32_t>>& prompts, int64_t n) {
    try {
      generate_tokens(*model, prompts, {n, {}, m.vocab_size, -1});
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      return what;
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  EXPECT_NE(message({prompt_of(17, 1, m.vocab_size)}, 1).find("longer than model.seq_len (16"),
            std::string::npos);
  // With no new tokens a prompt may be one longer (a training window: inputs and targets).
  EXPECT_NO_THROW(generate_tokens(*model, {prompt_of(17, 1, m.vocab_size)}, {0, {}, 50, -1}));
  EXPECT_NE(message({{1, 2}, {}}, 1).find("prompt 1 has no tokens"), std::string::npos);
  EXPECT_NE(message({{1, 50}}, 1).find("token id 50, outside the model's vocabulary of 50"),
            std::string::npos);
}

TEST_P(Generation, StopTokenEndsItsSequenceOnly) {
  const ModelConfig m = tiny_model(GetParam());
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(3, 1, m.vocab_size),
                                                     prompt_of(5, 4, m.vocab_size)};
  const Decoded free = decode_greedy(m, prompts, 8);
  // Row 0's third new token as the stop token: row 0 ends after two (unless the token came
  // earlier), row 1 goes on as before up to its first sample of it.
  const int32_t stop = free.tokens[0][2];
  const Decoded stopped = decode_greedy(m, prompts, 8, stop);
  int64_t compared = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& all = free.tokens[b];
    const std::vector<int32_t> expected(all.begin(), std::find(all.begin(), all.end(), stop));
    EXPECT_EQ(stopped.tokens[b], expected) << "prompt " << b;
    compared += static_cast<int64_t>(expected.size());
  }
  std::printf("%s: stop token %d: rows end after %zu and %zu of 8 tokens\n", GetParam().c_str(),
              stop, stopped.tokens[0].size(), stopped.tokens[1].size());
  EXPECT_LE(stopped.tokens[0].size(), 2u);
  EXPECT_GT(compared, 0);
}

INSTANTIATE_TEST_SUITE_P(Architectures, Generation, ::testing::Values("gpt2", "llama"));

TEST(GenerationConfig, SamplesNeedPipelineOneAndBytesNeedTheirVocabulary) {
  const std::string base = "[data]\ntrain = \"data/train_*.bin\"\n";
  const auto error_of = [&](const std::vector<std::string>& overrides) {
    try {
      parse_config(base, "x.toml", overrides);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_of({"eval.sample_interval=5", "parallel.pipeline=2"})
                .find("eval.sample_interval (5) samples through the decoding path, which needs "
                      "the whole model on a rank: parallel.pipeline = 1 (it is 2)"),
            std::string::npos);
  EXPECT_NE(error_of({"eval.sample_interval=5", "model.moe_experts=4"})
                .find("which has no mixture of experts yet (model.moe_experts = 4)"),
            std::string::npos);
  EXPECT_NE(error_of({"eval.sample_interval=5", "model.vocab_size=100"})
                .find("needs model.vocab_size >= 256 (it is 100)"),
            std::string::npos);
  const Config c = parse_config(base, "x.toml",
                                {"eval.sample_interval=5", "eval.sample_prompt=\"Q: \"",
                                 "eval.sample_tokens=7", "eval.sample_temperature=0.5"});
  EXPECT_EQ(c.eval.sample_interval, 5);
  EXPECT_EQ(c.eval.sample_prompt, "Q: ");
  EXPECT_EQ(c.eval.sample_tokens, 7);
  EXPECT_EQ(c.eval.sample_temperature, 0.5);
}

// eval.sample_interval's line: a sample that is no UTF-8 (bytes the model chose) is shown with
// U+FFFD; the JSON dump threw "invalid UTF-8 byte" before and ended the run as an internal error.
TEST(SampleLine, BytesThatAreNoUtf8AreShownAsReplacementCharacters) {
  EXPECT_EQ(trident::sample_line(4, "ab\"c"), "sample at step 4: \"ab\\\"c\"\n");
  EXPECT_EQ(trident::sample_line(2, "a\xC7(b"), "sample at step 2: \"a\xEF\xBF\xBD(b\"\n");
}

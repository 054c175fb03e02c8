// Parameter count and training FLOPs per token (model/model_stats.hpp) for both architectures:
// the published parameter counts of GPT-2 124M, Llama 3.2 1B and Llama 3.1 8B are the
// independent reference; the FLOPs reduce to the GPT-2 formula and follow their definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "model/model_stats.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

ModelConfig gpt2_124m() {
  ModelConfig m;
  m.layers = 12;
  m.heads = 12;
  m.width = 768;
  m.vocab_size = 50257;
  m.seq_len = 1024;
  return m;
}

// meta-llama/Llama-3.2-1B: tied embeddings.
ModelConfig llama_3_2_1b() {
  ModelConfig m;
  m.arch = "llama";
  m.layers = 16;
  m.width = 2048;
  m.heads = 32;
  m.kv_heads = 8;
  m.ffn_width = 8192;
  m.vocab_size = 128256;
  m.seq_len = 2048;
  m.tie_embeddings = true;
  return m;
}

// meta-llama/Llama-3.1-8B: separate LM head.
ModelConfig llama_3_1_8b() {
  ModelConfig m;
  m.arch = "llama";
  m.layers = 32;
  m.width = 4096;
  m.heads = 32;
  m.kv_heads = 8;
  m.ffn_width = 14336;
  m.vocab_size = 128256;
  m.seq_len = 2048;
  m.tie_embeddings = false;
  return m;
}

TEST(ModelStats, Gpt2_124MParameters) {
  EXPECT_EQ(parameter_count(gpt2_124m()), 124439808);
}

TEST(ModelStats, Gpt2MatchesTheClosedForm) {
  for (int64_t C : {64, 96, 768, 1600}) {
    for (int64_t L : {1, 2, 12, 48}) {
      ModelConfig m = gpt2_124m();
      m.width = C;
      m.heads = C / 32;
      m.layers = L;
      SCOPED_TRACE(std::to_string(C) + " x " + std::to_string(L));
      EXPECT_EQ(parameter_count(m), m.vocab_size * C + m.seq_len * C +
                                        L * (12 * C * C + 13 * C) + 2 * C);
      // The same with an explicit ffn_width = 4C and kv_heads = heads.
      m.ffn_width = 4 * C;
      m.kv_heads = m.heads;
      EXPECT_EQ(parameter_count(m), m.vocab_size * C + m.seq_len * C +
                                        L * (12 * C * C + 13 * C) + 2 * C);
    }
  }
}

TEST(ModelStats, Llama3_2_1BParameters) {
  EXPECT_EQ(parameter_count(llama_3_2_1b()), 1235814400);
}

TEST(ModelStats, Llama3_1_8BParameters) {
  EXPECT_EQ(parameter_count(llama_3_1_8b()), 8030261248);
}

TEST(ModelStats, UntiedHeadAddsOneVocabularyMatrix) {
  ModelConfig m = llama_3_2_1b();
  const int64_t tied = parameter_count(m);
  m.tie_embeddings = false;
  EXPECT_EQ(parameter_count(m) - tied, m.vocab_size * m.width);
  ModelConfig g = gpt2_124m();
  const int64_t gtied = parameter_count(g);
  g.tie_embeddings = false;
  EXPECT_EQ(parameter_count(g) - gtied, g.vocab_size * g.width);
}

TEST(ModelStats, LlamaTermByTerm) {
  // A small shape, every term written out: no position table, no biases, three MLP matrices,
  // two RMSNorm weights per block and one final one.
  ModelConfig m;
  m.arch = "llama";
  m.layers = 3;
  m.width = 48;
  m.heads = 6;     // HS = 8
  m.kv_heads = 2;  // k and v: 2 * 8 rows each
  m.ffn_width = 100;
  m.vocab_size = 77;
  m.seq_len = 1000;  // has no parameters in llama
  m.tie_embeddings = true;
  const int64_t per_layer = 48 * (48 + 2 * 16) + 48 * 48 + 3 * 48 * 100 + 2 * 48;
  EXPECT_EQ(parameter_count(m), 77 * 48 + 3 * per_layer + 48);
  // The default MLP: 8/3 * 48 = 128 -> 256.
  m.ffn_width = 0;
  EXPECT_EQ(parameter_count(m), 77 * 48 + 3 * (48 * 80 + 48 * 48 + 3 * 48 * 256 + 96) + 48);
}

TEST(ModelStats, Gpt2WithGroupedQueryAttention) {
  ModelConfig m = gpt2_124m();
  m.kv_heads = 4;  // k, v: 4 * 64 rows each instead of 768
  const int64_t C = 768, kv = 4 * 64;
  const int64_t attention = C * (C + 2 * kv) + (C + 2 * kv) + C * C + C;
  const int64_t mlp = 2 * C * 4 * C + 4 * C + C;
  EXPECT_EQ(parameter_count(m),
            50257 * C + 1024 * C + 12 * (attention + mlp + 4 * C) + 2 * C);
}

// FLOPs per token: the GPT-2 identity 3*(L*(24C^2 + 4TC) + 2CVp) when F = 4C and KVH = NH.
TEST(ModelStats, Gpt2FlopsIdentity) {
  for (int64_t C : {64, 768, 1600}) {
    for (int64_t Vp : {256, 50304, 128256}) {
      ModelConfig m = gpt2_124m();
      m.width = C;
      m.heads = C / 64;
      SCOPED_TRACE(std::to_string(C) + ", Vp " + std::to_string(Vp));
      m.vocab_size = Vp;
      const int64_t L = m.layers, T = m.seq_len;
      const double expected = 3.0 * static_cast<double>(L * (24 * C * C + 4 * T * C) + 2 * C * Vp);
      EXPECT_EQ(training_flops_per_token(m, Vp), expected);
      m.ffn_width = 4 * C;
      m.kv_heads = m.heads;
      EXPECT_EQ(training_flops_per_token(m, Vp), expected);
    }
  }
  // GPT-2 124M with the padded vocabulary 50304: 3 * (12*(24*768^2 + 4*1024*768) + 2*768*50304)
  // = 3 * (12 * 17301504 + 77266944), worked out by hand.
  EXPECT_EQ(training_flops_per_token(gpt2_124m(), 50304), 854654976.0);
}

TEST(ModelStats, LlamaFlopsByDefinition) {
  const ModelConfig m = llama_3_1_8b();
  const int64_t C = 4096, L = 32, T = 2048, HS = 128, F = 14336, Vp = 128256;
  const int64_t linear = C * (32 + 2 * 8) * HS + 32 * HS * C + 3 * C * F;
  const int64_t forward = 2 * L * linear + L * 4 * T * 32 * HS + 2 * C * Vp;
  EXPECT_EQ(training_flops_per_token(m, Vp), 3.0 * static_cast<double>(forward));
  // Close to 6 * parameters (the matmul weights, less the embedding) plus attention.
  const double six_n = 6.0 * static_cast<double>(parameter_count(m) - Vp * C);
  EXPECT_NEAR(training_flops_per_token(m, Vp) - 3.0 * L * 4 * T * 32 * HS, six_n, 1e-3 * six_n);
  // The untied head multiplies the same 2*C*Vp per token as the tied one.
  ModelConfig tied = m;
  tied.tie_embeddings = true;
  EXPECT_EQ(training_flops_per_token(tied, Vp), training_flops_per_token(m, Vp));
  // Padding counts: the head multiplies Vp columns.
  EXPECT_EQ(training_flops_per_token(m, Vp + 128) - training_flops_per_token(m, Vp),
            3.0 * 2 * C * 128);
}

TEST(ModelStats, OverflowIsAnErrorNamingTheWidth) {
  ModelConfig m = gpt2_124m();
  m.width = int64_t{1} << 31;
  m.heads = 1;
  // ~12 * 2^62 * L: more than int64 holds; it must not wrap.
  try {
    parameter_count(m);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.width = 2147483648"), std::string::npos)
        << e.what();
  }
  // 2^31 fits the FLOPs' integer range (about 2^69) and a double.
  EXPECT_GT(training_flops_per_token(m, m.vocab_size), 1e21);
  // A width whose square overflows even 128 bits.
  m.width = int64_t{1} << 62;
  m.ffn_width = 1;
  EXPECT_THROW(parameter_count(m), Error);
  EXPECT_THROW(training_flops_per_token(m, m.vocab_size), Error);
  // The default MLP size itself would overflow.
  m.ffn_width = 0;
  EXPECT_THROW(parameter_count(m), Error);
  // Large but representable: 1 layer of width 2^20 (~1.3e13 parameters).
  ModelConfig big = gpt2_124m();
  big.width = int64_t{1} << 20;
  big.heads = 1024;
  big.layers = 1;
  EXPECT_EQ(parameter_count(big), big.vocab_size * big.width + big.seq_len * big.width +
                                      (12 * big.width * big.width + 13 * big.width) +
                                      2 * big.width);
}

TEST(ModelStats, InvalidShapeIsAnError) {
  ModelConfig m = gpt2_124m();
  m.heads = 7;  // 768 % 7 != 0
  EXPECT_THROW(parameter_count(m), Error);
  EXPECT_THROW(training_flops_per_token(gpt2_124m(), 100), Error);  // Vp < V
}

// The LM head's chunks: the fewest that fit the budget, as even as multiples of 32 rows allow.
TEST(ModelStats, LmHeadChunksAreTheFewestEvenOnesWithinTheBudget) {
  constexpr int64_t V = 50304;
  // CPU, fp32, 1,024 rows: 667 rows fit in 128 MiB -> 640; 2 chunks of 512.
  EXPECT_EQ(lm_head_chunk_rows(1024, V, 4, 0, kLmHeadChunkBytesCpu), 512);
  // At 64 MiB: 333 fit -> 320; 4 chunks -> 256 each, not 3 x 320 + 64. At 32 MiB: 166 fit ->
  // 160; 7 chunks of 147 -> 160.
  EXPECT_EQ(lm_head_chunk_rows(1024, V, 4, 0, int64_t{64} << 20), 256);
  EXPECT_EQ(lm_head_chunk_rows(1024, V, 4, 0, int64_t{32} << 20), 160);
  // Half the vocabulary (TP 2): all 1,024 rows fit, one chunk; at 8,192 rows 1,334 fit ->
  // 1,312; 7 chunks of 1,171 -> 1,184.
  EXPECT_EQ(lm_head_chunk_rows(1024, V / 2, 4, 0, kLmHeadChunkBytesCpu), 1024);
  EXPECT_EQ(lm_head_chunk_rows(8192, V / 2, 4, 0, kLmHeadChunkBytesCpu), 1184);
  // GPU, bf16, 16,384 rows (GPT-2 124M at micro-batch 16): 5,336 fit in 512 MiB -> 5,312;
  // 4 chunks of 4,096 (at 32 MiB: 52 chunks of 320 rows).
  EXPECT_EQ(lm_head_chunk_rows(16384, V, 2, 0, kLmHeadChunkBytesGpu), 4096);
  EXPECT_EQ(lm_head_chunk_rows(16384, V, 2, 0, int64_t{32} << 20), 320);
  // Everything fits: one chunk; fewer than 32 rows fit: no rounding to 32.
  EXPECT_EQ(lm_head_chunk_rows(100, V, 2, 0, kLmHeadChunkBytesGpu), 100);
  EXPECT_EQ(lm_head_chunk_rows(100, V, 4, 0, 10 * V * 4), 10);
  EXPECT_EQ(lm_head_chunk_rows(95, V, 4, 0, 10 * V * 4), 10);  // 10 chunks of 9.5 -> 10
  // train.lm_head_chunk_rows wins, capped at the rows there are.
  EXPECT_EQ(lm_head_chunk_rows(1024, V, 4, 96, kLmHeadChunkBytesCpu), 96);
  EXPECT_EQ(lm_head_chunk_rows(64, V, 4, 96, kLmHeadChunkBytesCpu), 64);
  // Every chunk stays within the budget, and the chunk count is the fewest possible.
  for (const int64_t N : {1, 31, 32, 33, 1000, 1024, 4097, 16384})
    for (const int64_t budget : {V * 4, 32 * V * 4, kLmHeadChunkBytesCpu, kLmHeadChunkBytesGpu}) {
      const int64_t rows = lm_head_chunk_rows(N, V, 4, 0, budget);
      SCOPED_TRACE("N " + std::to_string(N) + ", budget " + std::to_string(budget));
      EXPECT_GE(rows, 1);
      EXPECT_LE(rows, N);
      EXPECT_LE(rows * V * 4, std::max<int64_t>(budget, V * 4));
      int64_t fit = std::min<int64_t>(N, std::max<int64_t>(1, budget / (V * 4)));
      if (fit >= 32 && fit < N) fit -= fit % 32;
      EXPECT_EQ((N + rows - 1) / rows, (N + fit - 1) / fit);
    }
  EXPECT_EQ(lm_head_chunk_bytes(true), kLmHeadChunkBytesGpu);
  EXPECT_EQ(lm_head_chunk_bytes(false), kLmHeadChunkBytesCpu);
  EXPECT_THROW(lm_head_chunk_rows(1024, V, 4, 0, 0), Error);
}

}  // namespace
}  // namespace trident

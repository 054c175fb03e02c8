// Packed documents (data.document_mask, model.position_reset): the document starts and
// positions of a micro-batch (model/documents.hpp), and whole models in double on a packed
// sequence against the same documents run one by one, each as a sequence of its own.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "model/cpu_model.hpp"
#include "model/documents.hpp"

using namespace trident;

namespace {

constexpr int32_t kEod = 0;

std::vector<int32_t> starts_of(const std::vector<int32_t>& tokens, int64_t B) {
  const int64_t T = static_cast<int64_t>(tokens.size()) / B;
  std::vector<int32_t> start(tokens.size(), -1);
  document_starts(start.data(), tokens.data(), B, T, kEod);
  return start;
}

TEST(DocumentStarts, TheEndOfDocumentTokenBelongsToTheDocumentItEnds) {
  // Documents [5 6 0] [7 0] [0] [8 9]: the row after each 0 starts a new one; a 0 alone is a
  // one-token document; the sequence ends inside the last one.
  EXPECT_EQ(starts_of({5, 6, 0, 7, 0, 0, 8, 9}, 1),
            (std::vector<int32_t>{0, 0, 0, 3, 3, 5, 6, 6}));
  // No end-of-document token: one document; one at the last row changes nothing inside.
  EXPECT_EQ(starts_of({1, 2, 3, 4}, 1), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(starts_of({1, 2, 3, 0}, 1), (std::vector<int32_t>{0, 0, 0, 0}));
  // At row 0: row 1 starts the next.
  EXPECT_EQ(starts_of({0, 2, 3, 4}, 1), (std::vector<int32_t>{0, 1, 1, 1}));
}

TEST(DocumentStarts, SequencesAreIndependentAndPositionsRestart) {
  // Two sequences of 4: the second starts its own count at its row 0 whatever the first ended
  // with.
  const std::vector<int32_t> tokens{1, 0, 2, 3, 4, 5, 0, 6};
  const std::vector<int32_t> start = starts_of(tokens, 2);
  EXPECT_EQ(start, (std::vector<int32_t>{0, 0, 2, 2, 0, 0, 0, 3}));
  std::vector<int32_t> position(tokens.size(), -1);
  document_positions(position.data(), start.data(), 2, 4);
  EXPECT_EQ(position, (std::vector<int32_t>{0, 1, 0, 1, 0, 1, 2, 0}));
}

// ----------------------------------------------------------------- whole models in double

ModelConfig tiny(const std::string& arch, int64_t seq_len) {
  ModelConfig m;
  m.arch = arch;
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.width = 16;
  m.vocab_size = 11;
  m.seq_len = seq_len;
  m.tie_embeddings = arch == "gpt2";
  m.rope_theta = 100.0;  // larger angles at these short positions
  return m;
}

struct Pass {
  double loss = 0;             // the mean over the sequence's rows
  std::vector<double> grads;   // of that mean
};

// One forward and backward of B = 1 sequence on a model whose weights are `weights` (the
// packed model's, parameter by parameter; the position table's first seq_len rows).
Pass run(const ModelConfig& m, bool documents, CpuModel<double>& from,
        const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  auto comm = make_self_communicator("tensor");
  ModelShard shard = ModelShard::whole(m);
  if (documents) shard.document_eod = kEod;
  CpuModel<double> model(m, shard, *comm);
  for (const ParamInfo& p : model.params()) {
    const ParamInfo& q = from.param(p.name);
    const double* src = from.weights() + q.offset;
    std::copy(src, src + p.numel(), model.weights() + p.offset);  // a prefix of q's rows
  }
  auto acts = model.make_activations(1);
  model.zero_grads();
  model.forward(acts, tokens.data(), targets.data(), nullptr, 1.0);
  model.backward(acts, 1.0, nullptr, nullptr);
  Pass r;
  r.loss = model.take_loss_sum();
  r.grads.assign(model.grads(), model.grads() + model.flat_size());
  return r;
}

// A packed sequence of documents against each document alone (a sequence of its length,
// positions from 0): the packed mean loss is the length-weighted mean of theirs, and every
// gradient the length-weighted sum of theirs. `position_reset`: positions restart per document
// (needed for gpt2's learned table; llama's RoPE is relative, so its attention matches either
// way).
void expect_packed_equals_alone(const std::string& arch, bool position_reset) {
  omp_set_num_threads(1);
  // Documents of 3, 1, 5 and 3 tokens (each ending with kEod but the last, cut by the
  // sequence's end), and targets that cross document boundaries as a stream's do.
  const std::vector<std::vector<int32_t>> docs{{4, 7, kEod}, {kEod}, {9, 2, 2, 5, kEod}, {3, 8, 1}};
  std::vector<int32_t> tokens, targets;
  for (const auto& d : docs) tokens.insert(tokens.end(), d.begin(), d.end());
  for (size_t i = 0; i < tokens.size(); ++i) targets.push_back((tokens[i] * 3 + 1 + i) % 11);
  const int64_t T = static_cast<int64_t>(tokens.size());
  ModelConfig packed_config = tiny(arch, T);
  packed_config.position_reset = position_reset;
  auto comm = make_self_communicator("tensor");
  CpuModel<double> init(packed_config, ModelShard::whole(packed_config), *comm);
  init.init_weights(3);
  for (int64_t i = 0; i < init.flat_size(); ++i) init.weights()[i] *= 4.0;  // visible gradients

  const Pass packed = run(packed_config, true, init, tokens, targets);
  // The reference: each document alone, weighted by its share of the rows.
  std::vector<double> loss_terms, grads(packed.grads.size(), 0.0);
  double loss = 0;
  int64_t t0 = 0;
  for (const auto& d : docs) {
    const int64_t len = static_cast<int64_t>(d.size());
    const ModelConfig alone_config = tiny(arch, len);
    const std::vector<int32_t> t(targets.begin() + t0, targets.begin() + t0 + len);
    const Pass alone = run(alone_config, false, init, d, t);
    const double share = static_cast<double>(len) / static_cast<double>(T);
    loss += share * alone.loss;
    // Map the alone model's parameters onto the packed model's (same names, a prefix of rows).
    auto scomm = make_self_communicator("tensor");
    const CpuModel<double> shape(alone_config, ModelShard::whole(alone_config), *scomm);
    for (const ParamInfo& p : shape.params()) {
      const ParamInfo& q = init.param(p.name);
      for (int64_t i = 0; i < p.numel(); ++i)
        grads[static_cast<size_t>(q.offset + i)] +=
            share * alone.grads[static_cast<size_t>(p.offset + i)];
    }
    t0 += len;
  }
  EXPECT_NEAR(packed.loss, loss, 1e-12 * std::fabs(loss)) << arch;
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    diff2 += (packed.grads[i] - grads[i]) * (packed.grads[i] - grads[i]);
    ref2 += grads[i] * grads[i];
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(diff2 / ref2), 1e-11) << arch << ": " << grads.size() << " gradients";
  std::printf("[documents] %s position_reset=%d: loss %.15f vs %.15f, %zu gradients, "
              "rel diff %.2e\n",
              arch.c_str(), position_reset ? 1 : 0, packed.loss, loss, grads.size(),
              std::sqrt(diff2 / ref2));
}

TEST(PackedDocuments, Gpt2WithPositionResetEqualsEachDocumentAlone) {
  expect_packed_equals_alone("gpt2", true);
}
TEST(PackedDocuments, LlamaWithPositionResetEqualsEachDocumentAlone) {
  expect_packed_equals_alone("llama", true);
}
TEST(PackedDocuments, LlamaWithoutPositionResetEqualsEachDocumentAloneToo) {
  expect_packed_equals_alone("llama", false);  // RoPE scores depend on relative positions only
}

// Without the mask a packed sequence is one stream: the check above must fail there, so it
// can tell the two apart.
TEST(PackedDocuments, WithoutTheMaskTheDocumentsSeeEachOther) {
  omp_set_num_threads(1);
  const std::vector<int32_t> tokens{4, 7, kEod, 9, 2, 5}, targets{1, 2, 3, 4, 5, 6};
  ModelConfig m = tiny("llama", 6);
  auto comm = make_self_communicator("tensor");
  CpuModel<double> init(m, ModelShard::whole(m), *comm);
  init.init_weights(3);
  const Pass masked = run(m, true, init, tokens, targets);
  const Pass stream = run(m, false, init, tokens, targets);
  EXPECT_GT(std::fabs(masked.loss - stream.loss), 1e-6);
}

TEST(PackedDocuments, AStageWithoutTokensIsRefused) {
  ModelConfig m = tiny("gpt2", 4);
  auto comm = make_self_communicator("tensor");
  ModelShard shard = ModelShard::whole(m);
  shard.document_eod = kEod;
  CpuModel<double> model(m, shard, *comm);
  auto acts = model.make_activations(1);
  const std::vector<int32_t> targets{1, 2, 3, 4};
  try {
    model.forward(acts, nullptr, targets.data(), nullptr, 0.0);
    FAIL() << "a forward without tokens was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("every pipeline stage"), std::string::npos) << e.what();
  }
}

}  // namespace

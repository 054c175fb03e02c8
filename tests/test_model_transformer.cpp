// Whole-model tests, both architectures: gradient check of every parameter of a tiny model in
// double, float-vs-double agreement, initialisation, layout-independent initialisation of
// tensor shards, and the split backward of ZB-H1 against the whole backward.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>

#include "comm/comm.hpp"
#include "host_device.hpp"
#include "kernel_vectors.hpp"
#include "model/cpu_model.hpp"
#include "model/model_stats.hpp"
#include "model/stage_model.hpp"

using namespace trident;
using trident::test::token_sequence;

namespace {

// "gpt2", "llama", or "gpt2-gqa" (gpt2 with one kv head: biases on grouped-query attention);
// "gpt2-moe" (every layer a mixture of 4 experts, top-2, token dropping, z-loss) and
// "llama-moe" (layer 0 of 3 SwiGLU experts, top-2, dropless; layer 1 dense).
ModelConfig tiny_model(const std::string& variant = "gpt2") {
  const std::string arch = variant.rfind("llama", 0) == 0 ? "llama" : "gpt2";
  ModelConfig m;
  m.arch = arch;
  m.layers = 2;
  m.heads = 2;
  m.width = 8;
  m.vocab_size = 11;      // padded to 12 with vocab_multiple 4: exercises padding rows
  m.vocab_multiple = 4;
  m.seq_len = 5;
  if (arch == "llama") {  // grouped-query attention, an untied head, a non-default FFN
    m.heads = 4;
    m.kv_heads = 2;
    m.width = 16;
    m.ffn_width = 12;
    m.tie_embeddings = false;
    m.rope_theta = 100.0;  // larger angles at these short positions
  }
  if (variant == "gpt2-gqa") m.kv_heads = 1;
  if (variant == "gpt2-moe") {
    m.moe_experts = 4;
    m.moe_top_k = 2;
    m.moe_capacity_factor = 1.0;  // 3 of a sequence's 10 assignments per expert
    m.moe_aux_loss_coeff = 0.1;
    m.moe_z_loss_coeff = 0.01;
  }
  if (variant == "llama-moe") {
    m.moe_experts = 3;
    m.moe_top_k = 2;
    m.moe_layer_interval = 2;
    m.moe_aux_loss_coeff = 0.1;
  }
  return m;
}

class WholeModel : public ::testing::TestWithParam<std::string> {};

// What backward differentiates: the summed mean LM losses plus the MoE layers' auxiliary
// losses with their coefficients (0 for a dense model). Resets the sums.
template <class Model>
double objective(Model& model, const ModelConfig& m) {
  const MoeStats moe = model.take_moe_stats();
  return model.take_loss_sum() + m.moe_aux_loss_coeff * moe.aux_loss_sum +
         m.moe_z_loss_coeff * moe.z_loss_sum;
}


// The whole model with the LM head and its loss over chunks of `rows` rows (0: the automatic
// size, one chunk at these sizes).
ModelShard whole_with_head_chunks(const ModelConfig& m, int64_t rows) {
  ModelShard s = ModelShard::whole(m);
  s.lm_head_chunk_rows = rows;
  return s;
}

// Every parameter's gradient against central differences of the loss, in double.
void check_every_gradient(const std::string& variant, int64_t head_chunk_rows) {
  // Thousands of tiny forwards: one thread, so that an OpenMP barrier never waits for a thread
  // that the busy-polling MPI tests running beside it (ctest -j 2) have descheduled.
  omp_set_num_threads(1);
  const ModelConfig m = tiny_model(variant);
  auto comm = make_self_communicator("tensor");
  CpuModel<double> model(m, whole_with_head_chunks(m, head_chunk_rows), *comm);
  model.init_weights(7);
  // Larger-than-init weights so that every path carries a visible gradient.
  for (int64_t i = 0; i < model.flat_size(); ++i) model.weights()[i] *= 5.0;
  const int64_t B = 2, N = B * m.seq_len;
  auto acts = model.make_activations(B);
  const auto tokens = token_sequence(N, m.vocab_size, 1), targets = token_sequence(N, m.vocab_size, 2);

  model.zero_grads();
  model.forward(acts, tokens.data(), targets.data(), nullptr, 1.0);
  objective(model, m);  // the finite differences below start from zero sums
  model.backward(acts, 1.0, nullptr, nullptr);
  const std::vector<double> analytic(model.grads(), model.grads() + model.flat_size());

  const double h = 1e-5;
  int64_t compared = 0;
  double worst = 0.0;
  std::string worst_name;
  for (const ParamInfo& p : model.params()) {
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const auto gi = p.global_index(i);
      double& w = model.weights()[p.offset + i];
      const double saved = w;
      w = saved + h;
      model.forward(acts, tokens.data(), targets.data(), nullptr, 0.0);
      const double up = objective(model, m);
      w = saved - h;
      model.forward(acts, tokens.data(), targets.data(), nullptr, 0.0);
      const double down = objective(model, m);
      w = saved;
      const double numeric = (up - down) / (2 * h);
      if (!gi) {  // a padding row of the vocabulary: never used, gradient exactly 0
        EXPECT_EQ(analytic[p.offset + i], 0.0) << p.name;
        continue;
      }
      ++compared;
      diff2 += (numeric - analytic[p.offset + i]) * (numeric - analytic[p.offset + i]);
      ref2 += numeric * numeric;
    }
    ASSERT_GT(ref2, 0.0) << p.name << " has no gradient at all";
    const double rel = std::sqrt(diff2 / ref2);
    EXPECT_LE(rel, 1e-6) << p.name;
    if (rel > worst) worst = rel, worst_name = p.name;
  }
  ASSERT_GT(compared, 0);
  std::printf("[ measured ] %s whole-model gradient check (LM head chunk rows %lld of %lld): "
              "%lld parameters, %lld elements, worst relative error %.3e (%s)\n",
              variant.c_str(), static_cast<long long>(head_chunk_rows),
              static_cast<long long>(N), static_cast<long long>(model.params().size()),
              static_cast<long long>(compared), worst, worst_name.c_str());
}

}  // namespace

TEST_P(WholeModel, EveryParameterMatchesCentralDifferencesInDouble) {
  check_every_gradient(GetParam(), 0);
}

// The LM head and loss in chunks of 3 of the 10 rows (3 + 3 + 3 + 1): the gradient the training
// forward forms chunk by chunk is the loss's exact gradient.
TEST_P(WholeModel, EveryParameterMatchesCentralDifferencesWithTheHeadInChunks) {
  check_every_gradient(GetParam(), 3);
}

// Chunks of rows change only the GEMM shapes of the head: the loss and every gradient agree with
// the one-chunk run to float rounding; the chunked model holds one chunk of logits, not N rows.
TEST_P(WholeModel, HeadChunksAgreeWithOneChunk) {
  const ModelConfig m = tiny_model(GetParam());
  auto comm = make_self_communicator("tensor");
  CpuModel<float> one(m, whole_with_head_chunks(m, 0), *comm);
  CpuModel<float> chunked(m, whole_with_head_chunks(m, 4), *comm);
  one.init_weights(9);
  chunked.init_weights(9);
  const int64_t B = 2, N = B * m.seq_len;
  const int64_t Vp = padded_vocab_size(m, 1);
  // One chunk of logits and its rows' dL/d(loss), fp32.
  EXPECT_EQ(one.head_scratch_bytes(B), N * Vp * 4 + N * 4);
  EXPECT_EQ(chunked.head_scratch_bytes(B), 4 * Vp * 4 + 4 * 4);
  EXPECT_EQ(one.activation_bytes(B), chunked.activation_bytes(B));  // no logits per micro-batch
  one.zero_grads();
  chunked.zero_grads();
  for (int64_t micro = 0; micro < 2; ++micro) {
    const auto tokens = token_sequence(N, m.vocab_size, micro), targets = token_sequence(N, m.vocab_size, 4);
    auto a1 = one.make_activations(B);
    auto ac = chunked.make_activations(B);
    one.forward(a1, tokens.data(), targets.data(), nullptr, 0.5f);
    chunked.forward(ac, tokens.data(), targets.data(), nullptr, 0.5f);
    one.backward(a1, 0.5f, nullptr, nullptr);
    chunked.backward(ac, 0.5f, nullptr, nullptr);
  }
  const double l1 = one.take_loss_sum(), lc = chunked.take_loss_sum();
  EXPECT_NEAR(lc, l1, 1e-6 * std::abs(l1));
  double diff2 = 0, ref2 = 0;
  int64_t compared = 0;
  for (int64_t i = 0; i < one.flat_size(); ++i, ++compared) {
    diff2 += std::pow(static_cast<double>(one.grads()[i]) - chunked.grads()[i], 2);
    ref2 += std::pow(static_cast<double>(one.grads()[i]), 2);
  }
  ASSERT_GT(compared, 0);
  ASSERT_GT(ref2, 0.0);
  const double rel = std::sqrt(diff2 / ref2);
  EXPECT_LE(rel, 1e-6);
  std::printf("[ measured ] %s LM head in chunks of 4 of %lld rows vs one chunk: loss %.3e, %lld "
              "gradients, relative L2 difference %.3e\n",
              GetParam().c_str(), static_cast<long long>(N), std::abs(lc - l1) / std::abs(l1),
              static_cast<long long>(compared), rel);
}

TEST_P(WholeModel, FloatModelAgreesWithDouble) {
  const ModelConfig m = tiny_model(GetParam());
  auto comm = make_self_communicator("tensor");
  CpuModel<double> md(m, ModelShard::whole(m), *comm);
  CpuModel<float> mf(m, ModelShard::whole(m), *comm);
  md.init_weights(3);
  mf.init_weights(3);
  const int64_t B = 2, N = B * m.seq_len;
  auto ad = md.make_activations(B);
  auto af = mf.make_activations(B);
  const auto tokens = token_sequence(N, m.vocab_size, 5), targets = token_sequence(N, m.vocab_size, 6);
  md.zero_grads();
  mf.zero_grads();
  md.forward(ad, tokens.data(), targets.data(), nullptr, 1.0);
  mf.forward(af, tokens.data(), targets.data(), nullptr, 1.0f);
  const double ld = md.take_loss_sum(), lf = mf.take_loss_sum();
  EXPECT_NEAR(lf, ld, 1e-6 * std::abs(ld));
  md.backward(ad, 1.0, nullptr, nullptr);
  mf.backward(af, 1.0f, nullptr, nullptr);
  double diff2 = 0, ref2 = 0;
  ASSERT_EQ(md.flat_size(), mf.flat_size());
  for (int64_t i = 0; i < md.flat_size(); ++i) {
    diff2 += std::pow(md.grads()[i] - mf.grads()[i], 2);
    ref2 += std::pow(md.grads()[i], 2);
  }
  EXPECT_LE(std::sqrt(diff2 / ref2), 1e-5);
}

namespace {

void check_split_backward(const std::string& variant, int64_t head_chunk_rows) {
  SCOPED_TRACE("LM head chunk rows " + std::to_string(head_chunk_rows));
  const ModelConfig m = tiny_model(variant);
  auto comm = make_self_communicator("tensor");
  const ModelShard shard = whole_with_head_chunks(m, head_chunk_rows);
  CpuModel<float> whole(m, shard, *comm), split(m, shard, *comm);
  whole.init_weights(5);
  split.init_weights(5);
  std::vector<int64_t> whole_marks, split_marks;
  whole.set_grads_final_hook([&](int64_t w) { whole_marks.push_back(w); });
  split.set_grads_final_hook([&](int64_t w) { split_marks.push_back(w); });
  const int64_t B = 2, N = B * m.seq_len, M = 3;
  const float loss_scale = 1.0f / M;
  whole.zero_grads();
  split.zero_grads();
  std::vector<CpuModel<float>::Activations> kept;  // from backward_input to backward_weight
  for (int64_t micro = 0; micro < M; ++micro) {
    const auto tokens = token_sequence(N, m.vocab_size, micro), targets = token_sequence(N, m.vocab_size, 7);
    auto a = whole.make_activations(B);
    whole.forward(a, tokens.data(), targets.data(), nullptr, loss_scale);
    whole.backward(a, loss_scale, nullptr, nullptr);
    kept.push_back(split.make_activations(B, true));
    split.forward(kept.back(), tokens.data(), targets.data(), nullptr, loss_scale);
    split.backward_input(kept.back(), loss_scale, nullptr, nullptr);
  }
  EXPECT_TRUE(split_marks.empty()) << "watermarks reported before the weight gradients";
  for (auto& a : kept) split.backward_weight(a);
  EXPECT_EQ(whole.take_loss_sum(), split.take_loss_sum());
  ASSERT_EQ(whole.flat_size(), split.flat_size());
  int64_t compared = 0, differing = 0, nonzero = 0;
  for (int64_t i = 0; i < whole.flat_size(); ++i, ++compared) {
    if (std::memcmp(&whole.grads()[i], &split.grads()[i], sizeof(float)) != 0) ++differing;
    if (whole.grads()[i] != 0.0f) ++nonzero;
  }
  EXPECT_EQ(differing, 0) << "of " << compared << " gradients";
  EXPECT_GT(nonzero, compared / 2) << "most gradients carry a contribution";
  ASSERT_FALSE(whole_marks.empty());
  EXPECT_EQ(split_marks, whole_marks);
  // The split activations hold the deferred output gradients on top of the whole backward's.
  EXPECT_EQ(split.activation_bytes(B, true) - split.activation_bytes(B),
            split.deferred_weight_grad_bytes(B));
  EXPECT_GT(split.deferred_weight_grad_bytes(B), 0);
}

// A MoE model's parameters: the router and the stacked experts per MoE layer, counted by
// parameter_count (and active_parameter_count with top_k experts), initialised per expert
// like the dense MLP it replaces.
TEST(ModelMoe, ParameterCountsAndStackedExperts) {
  for (const std::string variant : {"gpt2-moe", "llama-moe"}) {
    SCOPED_TRACE(variant);
    const ModelConfig m = tiny_model(variant);
    auto comm = make_self_communicator("tensor");
    CpuModel<float> model(m, ModelShard::whole(m), *comm);
    int64_t global = 0;
    for (const ParamInfo& p : model.params()) global += p.global_numel();
    EXPECT_EQ(global, parameter_count(m));
    ModelConfig dense = m;
    dense.moe_experts = 0;
    const int64_t C = m.width, F = m.ffn_size(), E = m.moe_experts;
    const int64_t mlp = m.is_llama() ? 3 * C * F : 2 * C * F + F + C;
    const int64_t moe_layers = m.moe_layer_interval == 1 ? 2 : 1;
    EXPECT_EQ(moe_layer_count(m), moe_layers);
    EXPECT_EQ(parameter_count(m), parameter_count(dense) + moe_layers * ((E - 1) * mlp + E * C));
    EXPECT_EQ(active_parameter_count(m),
              parameter_count(dense) + moe_layers * ((m.moe_top_k - 1) * mlp + E * C));
    EXPECT_GT(training_flops_per_token(m, 12), training_flops_per_token(dense, 12));
    const ParamInfo& router = model.param("layers.0.mlp.router.weight");
    EXPECT_EQ(router.global_shape, (std::vector<int64_t>{E, C}));
    const ParamInfo& up =
        model.param(m.is_llama() ? "layers.0.mlp.experts.gate_up.weight"
                                 : "layers.0.mlp.experts.fc1.weight");
    EXPECT_EQ(up.global_shape[0], (m.is_llama() ? 2 : 1) * E * F);
    if (m.moe_layer_interval == 2) EXPECT_NO_THROW(model.param("layers.1.mlp.down.weight"));
  }
}

// The classic MoE bug is a load-balancing loss computed over whatever rows a micro-batch
// holds. Here it is per sequence, averaged like the LM loss: one micro-batch of 2 sequences
// and two of 1 (loss scale 1/2 each) give the same objective, the same per-expert loads and
// the same gradients of every parameter, routers included (double: to rounding).
TEST(ModelMoe, AuxLossAndGradientsDoNotDependOnTheMicroBatchSize) {
  for (const std::string variant : {"gpt2-moe", "llama-moe"}) {
    SCOPED_TRACE(variant);
    const ModelConfig m = tiny_model(variant);
    auto comm = make_self_communicator("tensor");
    CpuModel<double> one(m, ModelShard::whole(m), *comm), two(m, ModelShard::whole(m), *comm);
    one.init_weights(9);
    two.init_weights(9);
    for (int64_t i = 0; i < one.flat_size(); ++i) one.weights()[i] *= 5.0, two.weights()[i] *= 5.0;
    const int64_t T = m.seq_len;
    const auto tokens = token_sequence(2 * T, m.vocab_size, 3), targets = token_sequence(2 * T, m.vocab_size, 4);
    one.zero_grads();
    two.zero_grads();
    auto a = one.make_activations(2);
    one.forward(a, tokens.data(), targets.data(), nullptr, 1.0);
    one.backward(a, 1.0, nullptr, nullptr);
    const MoeStats s1 = one.take_moe_stats();
    const double lm1 = one.take_loss_sum();
    for (int64_t b = 0; b < 2; ++b) {
      auto half = two.make_activations(1);
      two.forward(half, tokens.data() + b * T, targets.data() + b * T, nullptr, 0.5);
      two.backward(half, 0.5, nullptr, nullptr);
    }
    const MoeStats s2 = two.take_moe_stats();
    const double lm2 = two.take_loss_sum() / 2;  // two micro-batches' means
    EXPECT_NEAR(lm1, lm2, 1e-12);
    EXPECT_GT(s1.aux_loss_sum, 0.0);
    EXPECT_NEAR(s1.aux_loss_sum, s2.aux_loss_sum / 2, 1e-12);
    EXPECT_NEAR(s1.z_loss_sum, s2.z_loss_sum / 2, 1e-12);
    EXPECT_EQ(s1.load, s2.load);
    EXPECT_EQ(s1.dropped, s2.dropped);
    int64_t routed = 0;
    for (int64_t l : s1.load) routed += l;
    EXPECT_EQ(routed, moe_layer_count(m) * 2 * T * m.moe_top_k);
    if (m.moe_capacity_factor > 0) EXPECT_GT(s1.dropped, 0) << "the capacity drops nothing";
    double diff2 = 0, ref2 = 0;
    int64_t compared = 0;
    for (int64_t i = 0; i < one.flat_size(); ++i, ++compared) {
      diff2 += std::pow(one.grads()[i] - two.grads()[i], 2);
      ref2 += std::pow(one.grads()[i], 2);
    }
    ASSERT_GT(compared, 0);
    ASSERT_GT(ref2, 0.0);
    EXPECT_LE(std::sqrt(diff2 / ref2), 1e-12);
    const ParamInfo& router = one.param("layers.0.mlp.router.weight");
    double router2 = 0;
    for (int64_t i = 0; i < router.numel(); ++i) router2 += std::pow(one.grads()[router.offset + i], 2);
    EXPECT_GT(router2, 0.0) << "the router has a gradient";
  }
}

}  // namespace

// The split backward of the zero-bubble schedule (ZB-H1): backward_input of every micro-batch,
// then backward_weight in micro-batch order (the most deferral a schedule can have), gives every
// gradient of backward() to the bit, and reports the grads-final watermarks from
// backward_weight only: the same ones, in the same order. gpt2 here has a tied head, llama an
// untied one; both heads' weight gradients are formed in the training forward (while each
// chunk's logits are there), the linear layers' in backward_weight.
TEST_P(WholeModel, SplitBackwardGivesTheWholeBackwardsGradientsToTheBit) {
  for (const int64_t head_chunk_rows : {0, 4})  // one chunk of the LM head, several
    check_split_backward(GetParam(), head_chunk_rows);
}

INSTANTIATE_TEST_SUITE_P(Arch, WholeModel, ::testing::Values("gpt2", "llama"));
INSTANTIATE_TEST_SUITE_P(GroupedQuery, WholeModel, ::testing::Values("gpt2-gqa"));
INSTANTIATE_TEST_SUITE_P(MixtureOfExperts, WholeModel,
                         ::testing::Values("gpt2-moe", "llama-moe"));

TEST(ModelInit, Gpt2Initialisation) {
  ModelConfig m;
  m.layers = 4;
  m.heads = 4;
  m.width = 64;
  m.vocab_size = 256;
  m.seq_len = 32;
  auto comm = make_self_communicator("tensor");
  CpuModel<float> model(m, ModelShard::whole(m), *comm);
  model.init_weights(1);
  auto stats = [&](const std::string& name) {
    const ParamInfo& p = model.param(name);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double w = model.weights()[p.offset + i];
      s += w;
      s2 += w * w;
    }
    const double mean = s / p.numel();
    return std::pair{mean, std::sqrt(s2 / p.numel() - mean * mean)};
  };
  EXPECT_NEAR(stats("layers.0.mlp.fc1.weight").second, 0.02, 0.001);
  EXPECT_NEAR(stats("embedding.token.weight").second, 0.02, 0.001);
  EXPECT_NEAR(stats("layers.3.attn.proj.weight").second, 0.02 / std::sqrt(8.0), 0.001);
  EXPECT_NEAR(stats("layers.3.mlp.fc2.weight").second, 0.02 / std::sqrt(8.0), 0.001);
  EXPECT_EQ(stats("layers.1.ln1.weight").first, 1.0);
  EXPECT_EQ(stats("layers.1.ln1.weight").second, 0.0);
  EXPECT_EQ(stats("layers.1.attn.qkv.bias").second, 0.0);
  EXPECT_EQ(stats("final_ln.bias").first, 0.0);
  EXPECT_EQ(parameter_count(m), 256 * 64 + 32 * 64 + 4 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
  // Every global parameter exists once in the single-rank model.
  int64_t global = 0;
  for (const ParamInfo& p : model.params()) global += p.global_numel();
  EXPECT_EQ(global, parameter_count(m));
  CpuModel<float> other_seed(m, ModelShard::whole(m), *comm);
  other_seed.init_weights(2);
  EXPECT_FALSE(std::equal(model.weights(), model.weights() + model.flat_size(),
                          other_seed.weights()));
}

TEST_P(WholeModel, TensorShardsHoldExactlyTheSingleRankValues) {
  ModelConfig m;
  m.arch = GetParam().rfind("llama", 0) == 0 ? "llama" : "gpt2";
  m.kv_heads = GetParam() == "gpt2" ? 0 : 4;  // 8 query heads in 4 groups
  if (GetParam().find("moe") != std::string::npos) m.moe_experts = 3;  // stacked experts
  m.tie_embeddings = !m.is_llama();
  m.layers = 2;
  m.heads = GetParam() == "gpt2" ? 4 : 8;
  m.width = 32;
  m.vocab_size = 50;
  m.vocab_multiple = 8;
  m.seq_len = 8;
  auto comm = make_self_communicator("tensor");
  CpuModel<float> whole(m, ModelShard::whole(m), *comm);
  whole.init_weights(11);
  // (tp, ep): tensor shards, and with experts also expert shards (ModelShard::ep_size: each
  // rank holds E/ep of every stacked expert tensor, from global row ParamInfo::row_begin on).
  std::vector<std::pair<int, int>> layouts = {{2, 1}, {4, 1}};
  if (m.moe_experts > 0) layouts.insert(layouts.end(), {{1, 3}, {2, 3}});
  for (const auto& [tp, ep] : layouts) {
    std::map<std::string, std::vector<int>> seen;  // global element -> times held across ranks
    for (int r = 0; r < tp * ep; ++r) {
      ModelShard shard = ModelShard::whole(m);
      shard.tp_rank = r % tp;
      shard.tp_size = tp;
      shard.ep_rank = r / tp;
      shard.ep_size = ep;
      CpuModel<float> part(m, shard, *comm);
      part.init_weights(11);
      for (const ParamInfo& p : part.params()) {
        const ParamInfo& q = whole.param(p.name);
        EXPECT_EQ(p.expert, ep > 1 && p.name.find(".experts.") != std::string::npos) << p.name;
        auto& count = seen[p.name];
        count.resize(q.global_numel(), 0);
        for (int64_t i = 0; i < p.numel(); ++i) {
          const auto gi = p.global_index(i);
          if (!gi) {
            EXPECT_EQ(part.weights()[p.offset + i], 0.0f) << "padding of " << p.name;
            continue;
          }
          ASSERT_LT(*gi, q.global_numel());
          EXPECT_EQ(part.weights()[p.offset + i], whole.weights()[q.offset + *gi]) << p.name;
          ++count[*gi];
        }
      }
    }
    for (const auto& [name, count] : seen) {
      const ParamInfo& q = whole.param(name);
      // Replicated over the tensor ranks, or held once; an expert by one expert rank, the
      // rest by every one.
      const bool expert = name.find(".experts.") != std::string::npos;
      const int expected = (q.split_dim < 0 ? tp : 1) * (expert ? 1 : ep);
      for (size_t i = 0; i < count.size(); ++i)
        ASSERT_EQ(count[i], expected) << name << " element " << i << " tp=" << tp << " ep=" << ep;
    }
  }
}

TEST(ModelInit, LlamaInitialisationAndParameterCount) {
  for (const bool tied : {false, true}) {
    ModelConfig m;
    m.arch = "llama";
    m.layers = 3;
    m.heads = 8;
    m.kv_heads = 2;
    m.width = 128;
    m.ffn_width = 320;
    m.vocab_size = 300;
    m.seq_len = 16;
    m.tie_embeddings = tied;
    auto comm = make_self_communicator("tensor");
    CpuModel<float> model(m, ModelShard::whole(m), *comm);
    model.init_weights(5);
    auto stddev = [&](const std::string& name) {
      const ParamInfo& p = model.param(name);
      double s2 = 0;
      for (int64_t i = 0; i < p.numel(); ++i) s2 += std::pow(model.weights()[p.offset + i], 2);
      return std::sqrt(s2 / p.numel());
    };
    // Hugging Face's Llama init: every matrix N(0, 0.02), norms 1; no biases, no position table.
    EXPECT_NEAR(stddev("layers.2.attn.proj.weight"), 0.02, 0.001);
    EXPECT_NEAR(stddev("layers.2.mlp.down.weight"), 0.02, 0.001);
    EXPECT_NEAR(stddev("layers.0.mlp.gate_up.weight"), 0.02, 0.001);
    EXPECT_EQ(stddev("layers.1.attn_norm.weight"), 1.0);
    EXPECT_EQ(stddev("final_norm.weight"), 1.0);
    EXPECT_EQ(model.param("layers.0.attn.qkv.weight").global_shape,
              (std::vector<int64_t>{128 + 2 * 2 * 16, 128}));
    EXPECT_EQ(model.param("layers.0.mlp.gate_up.weight").global_shape,
              (std::vector<int64_t>{2 * 320, 128}));
    for (const ParamInfo& p : model.params()) {
      EXPECT_EQ(p.name.find("bias"), std::string::npos) << p.name;
      EXPECT_NE(p.name, "embedding.position.weight");
    }
    EXPECT_EQ(tied, model.layout().lm_head == model.layout().token_embedding);
    // The parameter list and the closed-form count agree.
    int64_t global = 0;
    for (const ParamInfo& p : model.params()) global += p.global_numel();
    EXPECT_EQ(global, parameter_count(m)) << "tied " << tied;
  }
}

TEST(ModelLayout, BadSplitsAreRefusedNamingTheKey) {
  ModelConfig m = tiny_model("llama");
  ModelShard s = ModelShard::whole(m);
  s.tp_size = 4;  // kv_heads 2 over 4 tensor ranks
  try {
    parameter_layout(m, s);
    FAIL() << "kv_heads 2 over 4 tensor ranks was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model.kv_heads"), std::string::npos) << e.what();
  }
  m.kv_heads = 3;  // does not divide 4 heads
  EXPECT_THROW(parameter_layout(m, ModelShard::whole(m)), std::exception);
}

namespace {

// The host device, counting the copies to host memory (a GPU's synchronising reads).
class CountingDevice final : public testing_support::HostForwardingDevice {
 public:
  std::string describe() const override { return "counting cpu"; }
  void to_host(void* h, const void* src, int64_t bytes) override {
    ++reads;
    host().to_host(h, src, bytes);
  }
  int reads = 0;
};

}  // namespace

// The micro-batches' losses stay in device memory: forwards read nothing back, and one read
// per step returns their sum (the GPU waits once per step for its losses).
TEST(StageModelLoss, ForwardsReadNothingBackAndTheStepReadsTheSumOnce) {
  const ModelConfig m = tiny_model("llama");
  auto comm = make_self_communicator("tensor");
  CountingDevice device;
  auto model = make_cpu_stage_model(m, ModelShard::whole(m), *comm, device);
  model->init_weights(3);
  CpuModel<double> reference(m, ModelShard::whole(m), *comm);
  reference.init_weights(3);
  const int64_t B = 2, N = B * m.seq_len;
  auto acts = model->make_activations(B, false);
  auto ref_acts = reference.make_activations(B);
  double expected = 0.0;
  for (int64_t micro = 0; micro < 4; ++micro) {
    const auto tokens = token_sequence(N, m.vocab_size, micro), targets = token_sequence(N, m.vocab_size, 9);
    model->forward(*acts, tokens.data(), targets.data(), nullptr, 0.0f);
    reference.forward(ref_acts, tokens.data(), targets.data(), nullptr, 0.0);
    expected += reference.take_loss_sum();
  }
  EXPECT_EQ(device.reads, 0);
  const double sum = model->take_loss_sum();
  EXPECT_EQ(device.reads, 1);
  EXPECT_NEAR(sum, expected, 1e-5 * expected);
  EXPECT_EQ(model->take_loss_sum(), 0.0);  // the read resets the sum
}

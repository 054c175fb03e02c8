// Activation recomputation (train.recompute, model/architecture.hpp Recompute) on one rank:
// selective and full give the losses and gradients of `none` to the bit, with the whole and
// the split (zb-h1) backward, for gpt2, llama and grouped-query gpt2; and the bytes the model
// allocates per layer per micro-batch, measured on a counting device, are what model_stats.hpp's
// layer_activation_bytes (the planner's count as well) says.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "host_device.hpp"
#include "model/cpu_bf16_kernels.hpp"
#include "model/cpu_model.hpp"
#include "model/model_stats.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

// Host memory that counts the bytes of its live allocations: what a model really holds.
class CountingDevice final : public testing_support::HostForwardingDevice {
 public:
  int64_t live_bytes() const { return *live_; }

  std::string describe() const override { return "counting cpu"; }
  std::shared_ptr<void> allocate(int64_t bytes) override {
    std::shared_ptr<void> memory = host().allocate(bytes);
    *live_ += bytes;
    void* p = memory.get();
    return std::shared_ptr<void>(p, [memory, live = live_, bytes](void*) mutable {
      *live -= bytes;
      memory.reset();
    });
  }

 private:
  std::shared_ptr<int64_t> live_ = std::make_shared<int64_t>(0);
};

using Model = Transformer<CpuKernels<float>>;

// "gpt2", "llama" (grouped-query, untied head) or "gpt2-gqa"; three layers.
ModelConfig small_model(const std::string& variant) {
  ModelConfig m;
  m.arch = variant.rfind("llama", 0) == 0 ? "llama" : "gpt2";
  m.layers = 3;
  m.heads = 4;
  m.width = 32;
  m.vocab_size = 61;
  m.vocab_multiple = 4;
  m.seq_len = 12;
  if (m.arch == "llama") {
    m.kv_heads = 2;
    m.tie_embeddings = false;
  }
  if (variant == "gpt2-gqa") m.kv_heads = 1;
  if (variant.find("moe") != std::string::npos) {  // docs/moe.md: 4 experts, top-2
    m.moe_experts = 4;
    m.moe_top_k = 2;
    m.moe_capacity_factor = variant == "gpt2-moe" ? 1.0 : 0.0;
    m.moe_z_loss_coeff = 0.01;
  }
  return m;
}

ModelShard shard_with(const ModelConfig& m, Recompute r) {
  ModelShard s = ModelShard::whole(m);
  s.recompute = r;
  return s;
}

std::vector<int32_t> sequence(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7 + salt * 5 + i * i) % vocab);
  return v;
}

// One step of M micro-batches, every forward before any backward (as GPipe runs them: each
// micro-batch's stash is live while the others use the shared workspace), backwards in reverse
// order; split: backward_input of each, then backward_weight of each in micro-batch order.
// Returns the loss sum.
template <class TransformerModel>
double run_step(TransformerModel& model, int64_t B, int64_t M, bool split, int64_t step) {
  const ModelConfig& m = model.config();
  const int64_t N = B * m.seq_len;
  model.zero_grads();
  const float scale = 1.0f / static_cast<float>(M);
  std::vector<typename TransformerModel::Activations> acts;
  for (int64_t micro = 0; micro < M; ++micro) {
    const auto tokens = sequence(N, m.vocab_size, step * M + micro);
    const auto targets = sequence(N, m.vocab_size, step * M + micro + 17);
    acts.push_back(model.make_activations(B, split));
    model.forward(acts.back(), tokens.data(), targets.data(), nullptr, scale);
  }
  for (int64_t micro = M; micro-- > 0;) {
    if (split)
      model.backward_input(acts[micro], scale, nullptr, nullptr);
    else
      model.backward(acts[micro], scale, nullptr, nullptr);
  }
  if (split)
    for (auto& a : acts) model.backward_weight(a);
  return model.take_loss_sum();
}

// Plain SGD on the flat buffer, the same on both models.
template <class TransformerModel>
void sgd(TransformerModel& model) {
  for (int64_t i = 0; i < model.flat_size(); ++i) model.weights()[i] -= 0.05f * model.grads()[i];
  model.weights_changed();
}

// Two models trained side by side from the same weights: their losses and gradients compared
// bit for bit after each step (before the SGD update).
struct SideBySide {
  int64_t compared = 0, differing = 0, nonzero = 0, losses_equal = 0;
  double worst_loss = 0, worst_grad = 0;  // relative: |b - a| / |a|, gradients in L2
};

// `steps` steps of 3 micro-batches of 2 on `a` (the reference) and `b`; `each_step(step)`
// runs after each step's backward, before the update.
template <class A, class B, class EachStep>
SideBySide train_side_by_side(A& a, B& b, int64_t steps, bool split, EachStep each_step) {
  SideBySide r;
  const int64_t Bsz = 2, M = 3;
  for (int64_t step = 0; step < steps; ++step) {
    const double loss_a = run_step(a, Bsz, M, split, step);
    const double loss_b = run_step(b, Bsz, M, split, step);
    if (std::memcmp(&loss_a, &loss_b, sizeof loss_a) == 0) ++r.losses_equal;
    r.worst_loss = std::max(r.worst_loss, std::fabs(loss_b - loss_a) / std::fabs(loss_a));
    each_step(step);
    EXPECT_EQ(a.flat_size(), b.flat_size());
    double d2 = 0, a2 = 0;
    for (int64_t i = 0; i < a.flat_size(); ++i, ++r.compared) {
      const float ga = a.grads()[i], gb = b.grads()[i];
      if (std::memcmp(&ga, &gb, sizeof ga) != 0) ++r.differing;
      if (ga != 0.0f) ++r.nonzero;
      d2 += (static_cast<double>(gb) - ga) * (static_cast<double>(gb) - ga);
      a2 += static_cast<double>(ga) * ga;
    }
    r.worst_grad = std::max(r.worst_grad, std::sqrt(d2 / a2));
    sgd(a);
    sgd(b);
  }
  return r;
}

struct Case {
  std::string arch;
  Recompute mode;
  bool split;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string arch = info.param.arch;
  for (char& c : arch)
    if (c == '-') c = '_';
  return arch + "_" + to_string(info.param.mode) + (info.param.split ? "_split" : "");
}

class RecomputeParity : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(RecomputeParity, LossesAndGradientsBitwiseLikeNone) {
  // Tiny kernels: one thread, so that an OpenMP barrier never waits for a thread that the
  // busy-polling MPI tests running beside it have descheduled.
  omp_set_num_threads(1);
  const Case c = GetParam();
  const ModelConfig m = small_model(c.arch);
  auto comm = make_self_communicator("tensor");
  Model none(m, shard_with(m, Recompute::None), *comm, CpuKernels<float>());
  Model recomputed(m, shard_with(m, c.mode), *comm, CpuKernels<float>());
  none.init_weights(11);
  recomputed.init_weights(11);
  const int64_t steps = 5;
  const SideBySide r = train_side_by_side(none, recomputed, steps, c.split, [&](int64_t step) {
    // A MoE layer's forward rerun for the recomputation is not counted a second time.
    const MoeStats moe_none = none.take_moe_stats(), moe = recomputed.take_moe_stats();
    EXPECT_EQ(moe.load, moe_none.load) << "step " << step + 1;
    EXPECT_EQ(moe.aux_loss_sum, moe_none.aux_loss_sum) << "step " << step + 1;
  });
  const int64_t compared = r.compared, differing = r.differing, losses_equal = r.losses_equal;
  EXPECT_EQ(compared, steps * none.flat_size());
  EXPECT_EQ(differing, 0) << "of " << compared << " gradients";
  EXPECT_GT(r.nonzero, compared / 2) << "most gradients carry a contribution";
  EXPECT_EQ(losses_equal, steps) << "worst loss difference " << r.worst_loss;
  std::printf("[ measured ] %s recompute=%s%s: %lld gradients over %lld steps bitwise equal to "
              "none (%lld differing), %lld of %lld losses equal\n",
              c.arch.c_str(), to_string(c.mode).c_str(), c.split ? " (split backward)" : "",
              static_cast<long long>(compared), static_cast<long long>(steps),
              static_cast<long long>(differing), static_cast<long long>(losses_equal),
              static_cast<long long>(steps));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RecomputeParity,
    ::testing::Values(Case{"gpt2", Recompute::Selective, false},
                      Case{"gpt2", Recompute::Full, false},
                      Case{"gpt2", Recompute::Selective, true},
                      Case{"gpt2", Recompute::Full, true},
                      Case{"llama", Recompute::Selective, false},
                      Case{"llama", Recompute::Full, false},
                      Case{"llama", Recompute::Selective, true},
                      Case{"llama", Recompute::Full, true},
                      Case{"gpt2-gqa", Recompute::Full, false},
                      Case{"gpt2-moe", Recompute::Selective, true},
                      Case{"gpt2-moe", Recompute::Full, false},
                      Case{"gpt2-moe", Recompute::Full, true},
                      Case{"llama-moe", Recompute::Full, true}),
    case_name);

namespace {

ModelShard with_fused_gelu(const ModelConfig& m, Recompute r, bool fused) {
  ModelShard s = shard_with(m, r);
  s.fused_bias_gelu = fused;
  return s;
}

class FusedBiasGelu : public ::testing::TestWithParam<Case> {};

}  // namespace

// train.fused_bias_gelu on the fp32 CPU kernels: the up projection with its GELU in one call and
// the GELU's gradient in the down projection's input gradient (the GPU's cuBLASLt epilogues)
// compute what the separate calls compute, so a GPT-2 trains to the same bits with and without
// it: 5 steps of 3 micro-batches, under each recomputation and the split backward (whose
// input half takes the fused gradient and whose weight half reads the recomputed act).
TEST_P(FusedBiasGelu, Fp32TrainsToTheBitsOfTheSeparateKernels) {
  omp_set_num_threads(1);
  const Case c = GetParam();
  const ModelConfig m = small_model(c.arch);
  auto comm = make_self_communicator("tensor");
  Model separate(m, with_fused_gelu(m, c.mode, false), *comm, CpuKernels<float>());
  Model fused(m, with_fused_gelu(m, c.mode, true), *comm, CpuKernels<float>());
  separate.init_weights(5);
  fused.init_weights(5);
  const int64_t steps = 5;
  const SideBySide r = train_side_by_side(separate, fused, steps, c.split, [](int64_t) {});
  const int64_t compared = r.compared, differing = r.differing, losses_equal = r.losses_equal;
  EXPECT_EQ(compared, steps * fused.flat_size());
  EXPECT_EQ(differing, 0) << "of " << compared << " gradients";
  EXPECT_GT(r.nonzero, compared / 2) << "most gradients carry a contribution";
  EXPECT_EQ(losses_equal, steps);
  std::printf("[ measured ] fused bias-GELU, recompute=%s%s: %lld gradients over %lld steps, "
              "%lld differing from the separate kernels; %lld of %lld losses equal\n",
              to_string(c.mode).c_str(), c.split ? " (split backward)" : "",
              static_cast<long long>(compared), static_cast<long long>(steps),
              static_cast<long long>(differing), static_cast<long long>(losses_equal),
              static_cast<long long>(steps));
}

INSTANTIATE_TEST_SUITE_P(Modes, FusedBiasGelu,
                         ::testing::Values(Case{"gpt2", Recompute::None, false},
                                           Case{"gpt2", Recompute::Full, false},
                                           Case{"gpt2", Recompute::None, true},
                                           Case{"gpt2", Recompute::Selective, true}),
                         case_name);

// In bf16 the fused GELU is taken of the product before its rounding (one rounding of act and
// of its gradient where the separate kernels make two), as the GPU's epilogues take it: the
// bits differ from the separate kernels' (so the fused path ran), by bf16's rounding only: the
// two runs' gradients within 2e-2 relative L2 of each other over 3 steps (bf16 rounds at 2^-9
// relative; tinier than the 5e-2 each keeps to the double model, Bf16Model), the losses within
// 1e-3 relative. Recomputation stays bitwise with the fusion (full against none).
TEST(FusedBiasGelu, Bf16RoundsOnceAndStaysWithinBf16OfTheSeparateKernels) {
  omp_set_num_threads(1);
  const ModelConfig m = small_model("gpt2");
  auto comm = make_self_communicator("tensor");
  auto host = make_cpu_device();
  using Bf16 = Transformer<CpuBf16Kernels>;
  auto model = [&](Recompute mode, bool fused) {
    auto t = std::make_unique<Bf16>(m, with_fused_gelu(m, mode, fused), *comm,
                                    CpuBf16Kernels(*host, Bf16Gemm::Fma));
    t->init_weights(5);
    return t;
  };
  const int64_t steps = 3;
  auto separate = model(Recompute::None, false), fused = model(Recompute::None, true);
  const SideBySide r = train_side_by_side(*separate, *fused, steps, false, [](int64_t) {});
  auto fused_again = model(Recompute::None, true), fused_full = model(Recompute::Full, true);
  const SideBySide full = train_side_by_side(*fused_again, *fused_full, steps, false,
                                             [](int64_t) {});
  EXPECT_GT(r.differing, r.compared / 10) << "the fused GELU rounds once: other bits";
  EXPECT_LE(r.worst_grad, 2e-2);
  EXPECT_LE(r.worst_loss, 1e-3);
  EXPECT_EQ(full.compared, r.compared);
  EXPECT_EQ(full.differing, 0) << "full recomputation with the fusion: the same bits as none";
  EXPECT_EQ(full.losses_equal, steps);
  std::printf("[ measured ] bf16 fused bias-GELU against the separate kernels over %lld steps: "
              "%lld of %lld gradients differ, worst relative L2 %.2e, worst loss %.2e; full "
              "recomputation: %lld of %lld differ\n",
              static_cast<long long>(steps), static_cast<long long>(r.differing),
              static_cast<long long>(r.compared), r.worst_grad, r.worst_loss,
              static_cast<long long>(full.differing), static_cast<long long>(full.compared));
}

namespace {

// Bytes make_activations allocates for a middle stage of `layers` layers (no embedding, no
// head), measured on a counting device.
struct Measured {
  int64_t chunk_bytes = 0;     // the micro-batch's stash, measured
  int64_t reported_bytes = 0;  // activation_bytes(): what the executor counts
  ActivationShape shape;
};

Measured measure_stash(ModelConfig m, int64_t layers, Recompute mode, int64_t B, bool split) {
  m.layers = layers;
  ModelShard s = ModelShard::whole(m);
  s.has_embedding = s.has_head = false;
  s.recompute = mode;
  CountingDevice device;
  auto comm = make_self_communicator("tensor");
  Model model(m, s, *comm, CpuKernels<float>(device));
  const int64_t before = device.live_bytes();
  Measured r;
  {
    auto a = model.make_activations(B, split);
    r.chunk_bytes = device.live_bytes() - before;
  }
  EXPECT_EQ(device.live_bytes(), before) << "the stash is freed with its activations";
  r.reported_bytes = model.activation_bytes(B, split);
  r.shape = model.activation_shape(B, split);
  return r;
}

// Per layer per micro-batch: the difference of two stage sizes over their layer difference.
int64_t measured_layer_bytes(const ModelConfig& m, Recompute mode, int64_t B, bool split,
                             int64_t* formula) {
  const Measured one = measure_stash(m, 1, mode, B, split);
  const Measured three = measure_stash(m, 3, mode, B, split);
  EXPECT_EQ(one.chunk_bytes, one.reported_bytes);
  EXPECT_EQ(three.chunk_bytes, three.reported_bytes);
  *formula = layer_activation_bytes(m, three.shape);
  return (three.chunk_bytes - one.chunk_bytes) / 2;
}

// The workspace a model keeps after a forward and backward, beyond the `none` model's scratch.
int64_t measured_workspace(const ModelConfig& m, Recompute mode, int64_t B) {
  auto held_after_step = [&](Recompute r) {
    CountingDevice device;
    auto comm = make_self_communicator("tensor");
    Model model(m, shard_with(m, r), *comm, CpuKernels<float>(device));
    model.init_weights(3);
    const int64_t before = device.live_bytes();
    const int64_t N = B * m.seq_len;
    const auto tokens = sequence(N, m.vocab_size, 1), targets = sequence(N, m.vocab_size, 2);
    {
      auto a = model.make_activations(B);
      model.forward(a, tokens.data(), targets.data(), nullptr, 1.0f);
      model.backward(a, 1.0f, nullptr, nullptr);
    }
    return device.live_bytes() - before;
  };
  return held_after_step(mode) - held_after_step(Recompute::None);
}

}  // namespace

TEST(RecomputeMemory, MeasuredLayerBytesAreTheFormulas) {
  omp_set_num_threads(1);
  int64_t compared = 0;
  for (const std::string arch : {"gpt2", "llama"}) {
    const ModelConfig m = small_model(arch);
    const int64_t B = 2;
    for (bool split : {false, true}) {
      int64_t bytes[3] = {0, 0, 0};
      for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        int64_t formula = 0;
        const int64_t measured = measured_layer_bytes(m, mode, B, split, &formula);
        EXPECT_EQ(measured, formula) << arch << " " << to_string(mode) << " split " << split;
        EXPECT_GT(measured, 0);
        bytes[static_cast<int>(mode)] = measured;
        ++compared;
      }
      // Selective drops attention's row log-sum-exp [B, NH, T] fp32; full keeps the input
      // [B*T, C] fp32 (and, split, the linear layers' inputs and output gradients).
      const int64_t N = B * m.seq_len;
      EXPECT_EQ(bytes[0] - bytes[1], 4 * B * m.heads * m.seq_len);
      if (!split) {
        EXPECT_EQ(bytes[2], 4 * N * m.width);
      }
      EXPECT_LT(bytes[2], bytes[1]);
    }
    for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
      ModelShard s = shard_with(m, mode);
      auto comm = make_self_communicator("tensor");
      const Model model(m, s, *comm, CpuKernels<float>());
      EXPECT_EQ(measured_workspace(m, mode, 2), model.recompute_workspace_bytes(2))
          << arch << " " << to_string(mode);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 16);
}

// A MoE layer's stash (docs/moe.md): the dense layer's plus moe_layer_extra_bytes, what
// activation_bytes() reports (checked in measured_layer_bytes), and the full recomputation's
// workspace holds one MoE layer's.
// The norms' outputs and the MLP activation, not stashed, are computed and recomputed in the
// backward's gradient scratch: a `none` model holds after a step exactly that scratch and one
// chunk of the head's logits, nothing for them.
TEST(RecomputeMemory, NormAndActivationNeedNoBufferOfTheirOwn) {
  omp_set_num_threads(1);
  int64_t compared = 0;
  for (const std::string arch : {"gpt2", "llama"}) {
    const ModelConfig m = small_model(arch);
    const int64_t B = 2, N = B * m.seq_len, C = m.width, F = m.ffn_size();
    const int64_t U = m.is_llama() ? 2 * F : F;
    const int64_t QKV = (m.heads + 2 * m.kv_head_count()) * m.head_size();
    CountingDevice device;
    auto comm = make_self_communicator("tensor");
    Model model(m, shard_with(m, Recompute::None), *comm, CpuKernels<float>(device));
    model.init_weights(3);
    const int64_t before = device.live_bytes();
    const auto tokens = sequence(N, m.vocab_size, 1), targets = sequence(N, m.vocab_size, 2);
    {
      auto a = model.make_activations(B);
      model.forward(a, tokens.data(), targets.data(), nullptr, 1.0f);
      model.backward(a, 1.0f, nullptr, nullptr);
    }
    // d_stream, d_norm, d_tmp [N,C]; d_qkv, d_atty, d_up, d_act.
    const int64_t gradients = 4 * N * (3 * C + QKV + m.heads * m.head_size() + U + F);
    EXPECT_EQ(device.live_bytes() - before, gradients + model.head_scratch_bytes(B)) << arch;
    EXPECT_EQ(model.backward_scratch_bytes(B), gradients) << arch;  // what the plan counts
    EXPECT_EQ(model.recompute_workspace_bytes(B), 0) << arch;
    ++compared;
  }
  EXPECT_EQ(compared, 2);
}

TEST(RecomputeMemory, MoeLayerBytesAreTheFormulas) {
  omp_set_num_threads(1);
  int64_t compared = 0;
  for (const std::string variant : {"gpt2-moe", "llama-moe"}) {
    const ModelConfig m = small_model(variant);
    for (bool split : {false, true}) {
      for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        int64_t formula = 0;
        const int64_t measured = measured_layer_bytes(m, mode, 2, split, &formula);
        ActivationShape shape = measure_stash(m, 1, mode, 2, split).shape;
        const int64_t extra = moe_layer_extra_bytes(m, shape);
        EXPECT_EQ(measured, formula + extra) << variant << " " << to_string(mode);
        if (mode != Recompute::Full) EXPECT_GT(extra, 0);
        ++compared;
      }
    }
    for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
      auto comm = make_self_communicator("tensor");
      const Model model(m, shard_with(m, mode), *comm, CpuKernels<float>());
      EXPECT_EQ(measured_workspace(m, mode, 2), model.recompute_workspace_bytes(2))
          << variant << " " << to_string(mode);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 16);
}

// The CPU device's allocation meter (what the trainer's "memory rank" lines report as device
// allocated / peak): live bytes follow every allocation and release, the peak keeps the most
// held at once, and a handle outliving the device still releases its bytes.
TEST(DeviceMeter, CpuDeviceCountsLiveAndPeakBytes) {
  auto device = make_cpu_device();
  EXPECT_EQ(device->allocated_bytes(), 0);
  DeviceArray<float> a(*device, 1000);
  {
    DeviceArray<double> b(*device, 500);
    EXPECT_EQ(device->allocated_bytes(), 4000 + 4000);
    EXPECT_EQ(device->peak_allocated_bytes(), 8000);
  }
  EXPECT_EQ(device->allocated_bytes(), 4000);
  EXPECT_EQ(device->peak_allocated_bytes(), 8000);
  DeviceArray<float> c(*device, 250);
  EXPECT_EQ(device->allocated_bytes(), 5000);
  EXPECT_EQ(device->peak_allocated_bytes(), 8000);
  DeviceArray<float> d(*device, 2000);
  EXPECT_EQ(device->peak_allocated_bytes(), 13000);
  device.reset();  // the arrays still hold their memory; releasing them later is safe
}

// The table of docs/model.md: bytes per layer per micro-batch (B = 1), fp32 on the CPU, for the
// tiny config and GPT-2 124M at seq 1024, the formula against the bytes measured. The
// Korthikanti et al. column is the paper's count for Megatron-LM's own 16-bit stash
// (sbh(34 + 5as/h), 34sbh, 2sbh), for scale.
TEST(RecomputeMemory, TableTinyAndGpt2Small) {
  ModelConfig tiny;  // configs/tiny.toml's model
  tiny.layers = 2, tiny.heads = 4, tiny.width = 64, tiny.vocab_size = 256, tiny.seq_len = 64;
  ModelConfig gpt2;
  gpt2.layers = 12, gpt2.heads = 12, gpt2.width = 768, gpt2.vocab_size = 50257,
  gpt2.seq_len = 1024;
  int64_t compared = 0;
  std::printf("[ measured ] bytes per layer per micro-batch (B = 1, fp32, CPU backend)\n");
  std::printf("[ measured ] %-22s %-9s %14s %14s %14s\n", "model", "recompute", "formula",
              "measured", "paper 16-bit");
  for (const auto& [name, m] : {std::pair<std::string, ModelConfig>{"tiny (C64 T64 H4)", tiny},
                                {"gpt2 124M (T 1024)", gpt2}}) {
    const double s = static_cast<double>(m.seq_len), h = static_cast<double>(m.width),
                 a = static_cast<double>(m.heads);
    const double paper[3] = {s * h * (34.0 + 5.0 * a * s / h), 34.0 * s * h, 2.0 * s * h};
    for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      int64_t formula = 0;
      const int64_t measured = measured_layer_bytes(m, mode, 1, false, &formula);
      EXPECT_EQ(measured, formula) << name << " " << to_string(mode);
      ++compared;
      std::printf("[ measured ] %-22s %-9s %14lld %14lld %14.0f\n", name.c_str(),
                  to_string(mode).c_str(), static_cast<long long>(formula),
                  static_cast<long long>(measured), paper[static_cast<int>(mode)]);
    }
  }
  EXPECT_EQ(compared, 6);
}

TEST(RecomputeConfig, BadValueNamesTheKey) {
  const std::string data = "[data]\ntrain = \"x.bin\"\n";
  try {
    parse_config("[train]\nrecompute = \"partial\"\n" + data, "run.toml", {});
    FAIL() << "accepted train.recompute = partial";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.recompute"), std::string::npos) << what;
    EXPECT_NE(what.find("partial"), std::string::npos) << what;
  }
  EXPECT_EQ(parse_config("[train]\nrecompute = \"full\"\n" + data, "run.toml", {}).train.recompute,
            "full");
  EXPECT_EQ(parse_recompute("selective"), Recompute::Selective);
  EXPECT_THROW(parse_recompute("partial"), Error);
}

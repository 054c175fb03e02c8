// The CPU's bf16 precision (model/cpu_bf16_kernels.hpp): what it stores is bf16, what it
// computes is within bf16's bound of the double-precision model, and the attention rounds its
// P and dS operands (kernels/cpu/ops.hpp, bf16_operands).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "kernel_vectors.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/cpu_bf16_kernels.hpp"
#include "model/cpu_model.hpp"
#include "util/bf16.hpp"
#include "util/error.hpp"

using namespace trident;
using trident::test::token_sequence;

namespace {

bool is_bf16(float x) { return bf16_to_float(float_to_bf16(x)) == x || std::isnan(x); }

// How many of x[0, n) are not bf16 values.
int64_t off_grid(const float* x, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += is_bf16(x[i]) ? 0 : 1;
  return bad;
}

template <class A>
int64_t off_grid(const A& a) {
  return off_grid(a.data(), a.size());
}

ModelConfig tiny(const std::string& variant) {
  ModelConfig m;
  m.arch = variant.rfind("llama", 0) == 0 ? "llama" : "gpt2";
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = m.arch == "llama" ? 2 : 4;
  m.width = 32;
  m.ffn_width = m.arch == "llama" ? 40 : 0;
  m.vocab_size = 61;
  m.vocab_multiple = 4;
  m.seq_len = 16;
  m.tie_embeddings = m.arch != "llama";
  if (variant.find("moe") != std::string::npos) {
    m.moe_experts = 4;
    m.moe_top_k = 2;
    m.moe_aux_loss_coeff = 0.01;
  }
  return m;
}


template <typename R>
double rel_l2(const float* got, const R* ref, int64_t n) {
  double d2 = 0, r2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(ref[i]);
    d2 += d * d;
    r2 += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return std::sqrt(d2 / r2);
}

class Bf16Model : public ::testing::TestWithParam<std::string> {};

}  // namespace

// One forward and backward of the bf16 model beside the double one from the same weights:
// every activation it keeps (the residual stream, qkv, the attention's output, the MLP's
// pre-activation, the MoE router's and experts' tensors, the final norm) and its compute
// weights are bf16 values; the loss is within 1e-2 of the
// double model's and each gradient's relative L2 error within 5e-2 (bf16's 8-bit mantissa,
// 2^-9 relative per rounding, over a few dozen roundings on each path); and the fp32 model's
// gradients are 100x closer (so the bf16 path rounded).
TEST_P(Bf16Model, StoresBf16AndTracksTheDoubleModel) {
  const ModelConfig m = tiny(GetParam());
  const ModelShard shard = ModelShard::whole(m);
  auto comm = make_self_communicator("tensor");
  auto host = make_cpu_device();
  Transformer<CpuBf16Kernels> bf16(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::Fma));
  CpuModel<double> ref(m, shard, *comm);
  CpuModel<float> fp32(m, shard, *comm);
  bf16.init_weights(11);
  ref.init_weights(11);
  fp32.init_weights(11);
  ASSERT_EQ(bf16.flat_size(), ref.flat_size());
  ASSERT_NE(bf16.compute_weights(), nullptr);
  EXPECT_EQ(off_grid(bf16.compute_weights(), bf16.flat_size()), 0);
  EXPECT_GT(off_grid(bf16.weights(), bf16.flat_size()), bf16.flat_size() / 2)
      << "the master weights are fp32";

  const int64_t B = 2, N = B * m.seq_len;
  const auto tokens = token_sequence(N, m.vocab_size, 1);
  const auto targets = token_sequence(N, m.vocab_size, 2);
  auto a = bf16.make_activations(B);
  auto r = ref.make_activations(B);
  auto f = fp32.make_activations(B);
  bf16.zero_grads();
  ref.zero_grads();
  fp32.zero_grads();
  bf16.forward(a, tokens.data(), targets.data(), nullptr, 1.0f);
  ref.forward(r, tokens.data(), targets.data(), nullptr, 1.0);
  fp32.forward(f, tokens.data(), targets.data(), nullptr, 1.0f);
  int64_t checked = 0;
  for (const auto& la : a.layers) {
    // A MoE layer keeps its router's and experts' tensors in place of `up` (empty then).
    for (const auto* t : {&la.input, &la.qkv, &la.atty, &la.residual1, &la.up, &la.moe.logits,
                          &la.moe.probs, &la.moe.weight, &la.moe.xp, &la.moe.h, &la.moe.a,
                          &la.moe.y}) {
      EXPECT_EQ(off_grid(*t), 0);
      checked += t->size();
    }
  }
  for (const auto* t : {&a.output, &a.final_norm}) {
    EXPECT_EQ(off_grid(*t), 0);
    checked += t->size();
  }
  EXPECT_GT(checked, 10 * N);
  // A mixture of experts routes each token to its top-k experts by probability: where two of
  // the double model's probabilities lie closer than bf16's rounding moves them, bf16 may pick
  // the other expert, and the gradients then differ by what that expert contributes, not by
  // rounding. Such a token is allowed only at a near tie (the k-th and (k+1)-th probabilities
  // within 2 % of each other); the gradients are compared where no token was routed otherwise.
  int64_t flips = 0;
  if (m.moe_experts > 0) {
    const int64_t E = m.moe_experts, K = m.moe_top_k;
    for (size_t l = 0; l < a.layers.size(); ++l) {
      const auto& x = a.layers[l].moe;
      const auto& y = r.layers[l].moe;
      if (x.expert.size() == 0) continue;  // a dense layer
      for (int64_t n = 0; n < N; ++n) {
        std::vector<int32_t> ex(x.expert.data() + n * K, x.expert.data() + (n + 1) * K);
        std::vector<int32_t> ey(y.expert.data() + n * K, y.expert.data() + (n + 1) * K);
        std::sort(ex.begin(), ex.end());
        std::sort(ey.begin(), ey.end());
        if (ex == ey) continue;
        ++flips;
        std::vector<double> p(y.probs.data() + n * E, y.probs.data() + (n + 1) * E);
        std::sort(p.rbegin(), p.rend());
        EXPECT_LE(p[K - 1] - p[K], 0.02 * p[K - 1]) << "layer " << l << " token " << n
                                                    << " routed otherwise without a near tie";
      }
    }
  }
  const double loss = bf16.take_loss_sum(), loss_ref = ref.take_loss_sum();
  EXPECT_LE(std::fabs(loss - loss_ref) / loss_ref, 1e-2);
  bf16.backward(a, 1.0f, nullptr, nullptr);
  ref.backward(r, 1.0, nullptr, nullptr);
  fp32.backward(f, 1.0f, nullptr, nullptr);
  std::printf("[bf16 %s] %lld tokens routed to other experts than in double\n",
              GetParam().c_str(), static_cast<long long>(flips));
  if (flips > 0) return;
  double worst = 0, worst_fp32 = 0;
  int compared = 0;
  for (const ParamInfo& p : bf16.params()) {
    double ref2 = 0;
    for (int64_t i = 0; i < p.numel(); ++i) ref2 += ref.grads()[p.offset + i] * ref.grads()[p.offset + i];
    if (ref2 == 0) continue;  // an unused padding row's block, or a bias without gradient
    const double e = rel_l2(bf16.grads() + p.offset, ref.grads() + p.offset, p.numel());
    const double e32 = rel_l2(fp32.grads() + p.offset, ref.grads() + p.offset, p.numel());
    EXPECT_LE(e, 5e-2) << p.name << " (fp32: " << e32 << ")";
    worst = std::max(worst, e);
    worst_fp32 = std::max(worst_fp32, e32);
    ++compared;
  }
  EXPECT_GT(compared, 10);
  EXPECT_LT(worst_fp32 * 100, worst) << "bf16's gradients are as close as fp32's";
  std::printf("[bf16 %s] loss %.6f vs double %.6f; gradients: worst relative L2 %.2e (fp32 "
              "%.2e) over %d tensors; %lld stored values checked\n",
              GetParam().c_str(), loss, loss_ref, worst, worst_fp32, compared,
              static_cast<long long>(checked));
}

INSTANTIATE_TEST_SUITE_P(Variants, Bf16Model,
                         ::testing::Values("gpt2", "llama", "gpt2-moe", "llama-moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

namespace {

// Random bf16 inputs of the attention (qkv scaled by 2, dout), and each sequence's document
// starts for documents beginning at rows 0, `second` and `third`.
struct AttentionCase {
  int64_t B, T, NH, KVH, HS, CQ, C;
  std::vector<float> qkv, dout;
  std::vector<int32_t> docs;
  AttentionCase(int64_t B_, int64_t T_, int64_t NH_, int64_t KVH_, int64_t HS_, uint64_t seed,
                int32_t second, int32_t third)
      : B(B_), T(T_), NH(NH_), KVH(KVH_), HS(HS_), CQ((NH_ + 2 * KVH_) * HS_), C(NH_ * HS_),
        qkv(B_ * T_ * CQ), dout(B_ * T_ * C), docs(B_ * T_) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& v : qkv) v = bf16_to_float(float_to_bf16(2.f * normal(rng)));
    for (float& v : dout) v = bf16_to_float(float_to_bf16(normal(rng)));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        docs[b * T + t] = t < second ? 0 : (t < third ? second : third);
  }
  // The double attention's output and dqkv on the same inputs (documents `d` or none).
  std::pair<std::vector<double>, std::vector<double>> reference(const int32_t* d) const {
    std::vector<double> qkv_d(qkv.begin(), qkv.end()), dout_d(dout.begin(), dout.end());
    std::vector<double> out_d(B * T * C), lse_d(B * NH * T), dqkv_d(B * T * CQ);
    cpu::attention_forward<double>(out_d.data(), lse_d.data(), qkv_d.data(), B, T, NH, KVH, HS,
                                   d);
    cpu::attention_backward<double>(dqkv_d.data(), dout_d.data(), qkv_d.data(), out_d.data(),
                                    lse_d.data(), B, T, NH, KVH, HS, d);
    return {out_d, dqkv_d};
  }
};

}  // namespace

// The attention with bf16 operands on bf16 inputs: its output and gradients within 1e-2
// (relative L2) of the double attention, and different from the fp32 attention on the same
// inputs (P and dS were rounded); with documents too.
TEST(Bf16Attention, RoundsPAndDsAndTracksDouble) {
  const AttentionCase a(2, 200, 4, 2, 16, 3, 70, 150);  // two key blocks of 128
  const int64_t B = a.B, T = a.T, NH = a.NH, KVH = a.KVH, HS = a.HS, CQ = a.CQ, C = a.C;
  const std::vector<float>&qkv = a.qkv, &dout = a.dout;
  for (const bool with_docs : {false, true}) {
    const int32_t* d = with_docs ? a.docs.data() : nullptr;
    const auto [out_d, dqkv_d] = a.reference(d);
    double e[2][2];  // [rounded][out, dqkv]
    std::vector<float> out[2];
    for (const bool rounded : {false, true}) {
      std::vector<float> o(B * T * C), lse(B * NH * T), dqkv(B * T * CQ);
      cpu::attention_forward<float>(o.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS, d,
                                    rounded);
      cpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), o.data(), lse.data(),
                                     B, T, NH, KVH, HS, d, rounded);
      e[rounded][0] = rel_l2(o.data(), out_d.data(), B * T * C);
      e[rounded][1] = rel_l2(dqkv.data(), dqkv_d.data(), B * T * CQ);
      out[rounded] = o;
    }
    EXPECT_LE(e[1][0], 1e-2);
    EXPECT_LE(e[1][1], 1e-2);
    EXPECT_GT(e[1][0], 10 * e[0][0]) << "P was not rounded";
    EXPECT_GT(e[1][1], 10 * e[0][1]) << "P or dS was not rounded";
    std::printf("[bf16 attention%s] relative L2 to double: out %.2e (fp32 %.2e), dqkv %.2e "
                "(fp32 %.2e)\n",
                with_docs ? ", documents" : "", e[1][0], e[0][0], e[1][1], e[0][1]);
  }
}

// The oneDNN engine's attention (attention_bf16.cpp: a query block against up to 1024 keys per
// product) beside the FMA engine's (attention.cpp with bf16 operands) on the same bf16 inputs:
// T = 1100 takes two key chunks (the online softmax across them) and a 76-row last block;
// grouped-query heads; with documents, one of which starts inside the second chunk. Both
// round P and dS and sum in fp32: they differ by what moving a score across a bf16 rounding of
// P now and then does (the sums' order; the forward rounds P against the final row max, the FMA
// engine against a running one), within 2e-3 for the output and 3e-3 for the gradients
// (relative L2; measured 6.6e-4-8.5e-4 and 1.6e-3-2.0e-3, each engine 1.7e-3 and
// 4.1e-3-4.3e-3 from the double attention, its stored outputs rounded). The oneDNN engine is
// within 1e-2 of double and no more than 1.25x as far as the FMA engine, and gives the same
// bits on 1 and 2 threads; it stores its outputs rounded.
TEST(Bf16OneDnnAttention, TracksTheFmaEngineAndDouble) {
  if (!cpu::bf16_gemm_available())
    GTEST_SKIP() << "this core has no AVX512-BF16 or AMX: the oneDNN engine cannot run here";
  const AttentionCase a(2, 1100, 4, 2, 16, 5, 300, 1050);
  const int64_t B = a.B, T = a.T, NH = a.NH, KVH = a.KVH, HS = a.HS, CQ = a.CQ, C = a.C;
  const std::vector<float>&qkv = a.qkv, &dout = a.dout;
  int64_t compared = 0;
  for (const bool with_docs : {false, true}) {
    const int32_t* d = with_docs ? a.docs.data() : nullptr;
    const auto [out_d, dqkv_d] = a.reference(d);
    struct Run {
      std::vector<float> out, lse, dqkv;
    };
    auto run = [&](bool onednn, int threads) {
      Run r{std::vector<float>(B * T * C), std::vector<float>(B * NH * T),
            std::vector<float>(B * T * CQ)};
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      if (onednn)
        cpu::attention_forward_bf16(r.out.data(), r.lse.data(), qkv.data(), B, T, NH, KVH, HS, d);
      else
        cpu::attention_forward<float>(r.out.data(), r.lse.data(), qkv.data(), B, T, NH, KVH, HS,
                                      d, true);
      // Stored in bf16: by the kernel set after the FMA engine's kernel, by the oneDNN one itself.
      if (!onednn) cpu::round_to_bf16_values(r.out.data(), B * T * C);
      if (onednn)
        cpu::attention_backward_bf16(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(),
                                     r.lse.data(), B, T, NH, KVH, HS, d);
      else
        cpu::attention_backward<float>(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(),
                                       r.lse.data(), B, T, NH, KVH, HS, d, true);
      if (!onednn) cpu::round_to_bf16_values(r.dqkv.data(), B * T * CQ);
      omp_set_num_threads(saved);
      return r;
    };
    const Run fma = run(false, 2), dnn = run(true, 2), dnn1 = run(true, 1);
    EXPECT_EQ(off_grid(dnn.out), 0) << "the oneDNN attention stores its output in bf16";
    EXPECT_EQ(off_grid(dnn.dqkv), 0) << "the oneDNN attention stores its gradients in bf16";
    const double out_fma = rel_l2(dnn.out.data(), fma.out.data(), B * T * C);
    const double lse_fma = rel_l2(dnn.lse.data(), fma.lse.data(), B * NH * T);
    const double dqkv_fma = rel_l2(dnn.dqkv.data(), fma.dqkv.data(), B * T * CQ);
    const double out_dnn_d = rel_l2(dnn.out.data(), out_d.data(), B * T * C);
    const double out_fma_d = rel_l2(fma.out.data(), out_d.data(), B * T * C);
    const double dqkv_dnn_d = rel_l2(dnn.dqkv.data(), dqkv_d.data(), B * T * CQ);
    const double dqkv_fma_d = rel_l2(fma.dqkv.data(), dqkv_d.data(), B * T * CQ);
    EXPECT_LE(out_fma, 2e-3);
    EXPECT_LE(lse_fma, 1e-5);
    EXPECT_LE(dqkv_fma, 3e-3);
    EXPECT_LE(out_dnn_d, 1e-2);
    EXPECT_LE(dqkv_dnn_d, 1e-2);
    EXPECT_LE(out_dnn_d, 1.25 * out_fma_d);
    EXPECT_LE(dqkv_dnn_d, 1.25 * dqkv_fma_d);
    std::printf("  to double: out %.2e (FMA %.2e), dqkv %.2e (FMA %.2e)\n", out_dnn_d, out_fma_d,
                dqkv_dnn_d, dqkv_fma_d);
    for (const auto& [a, b] : {std::pair{&dnn.out, &dnn1.out}, std::pair{&dnn.lse, &dnn1.lse},
                               std::pair{&dnn.dqkv, &dnn1.dqkv}}) {
      ASSERT_EQ(a->size(), b->size());
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0)
          << "the oneDNN attention depends on the thread count";
      compared += static_cast<int64_t>(a->size());
    }
    std::printf("[bf16 attention engines%s] oneDNN vs FMA relative L2: out %.2e, lse %.2e, "
                "dqkv %.2e\n",
                with_docs ? ", documents" : "", out_fma, lse_fma, dqkv_fma);
  }
  EXPECT_EQ(compared, 2 * B * T * (C + NH + CQ));
}

namespace {

// GELU (tanh form) and its derivative in double.
double gelu_d(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_grad_d(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}
// |got - exact| in units of the last place of bf16 at `exact`.
double bf16_ulps(float got, double exact) {
  if (exact == 0.0) return got == 0.0f ? 0.0 : 1e9;
  return std::fabs(got - exact) / std::ldexp(1.0, std::ilogb(exact) - 7);
}
std::vector<float> bf16_normals(int64_t n, float sd, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_float(float_to_bf16(normal(rng)));
  return v;
}

}  // namespace

// train.fused_bias_gelu on the bf16 kernel set (the GPU's cuBLASLt GELU_AUX_BIAS and DGELU
// epilogues' reference), on each engine: act is the GELU of the product before its rounding and
// dpre the GELU's gradient times the input gradient before its rounding, each rounded once:
// within 0.51 of bf16's last place of the double-precision values (0.5: the rounding; the rest
// the fp32 sums and exp), where the separate kernels, rounding the product (or dX) first, miss
// by more. pre is what linear_forward stores; dW and db are linear_backward's, bit for bit.
TEST(Bf16FusedGelu, RoundsTheGeluOfTheProductOnce) {
  const int64_t N = 64, C = 96, OC = 80;
  const std::vector<float> inp = bf16_normals(N * C, 1.0f, 1), w = bf16_normals(OC * C, 0.15f, 2),
                           b = bf16_normals(OC, 0.5f, 3), dout = bf16_normals(N * C, 1.0f, 4),
                           dact = bf16_normals(N * OC, 1.0f, 5);
  auto host = make_cpu_device();
  std::vector<Bf16Gemm> engines = {Bf16Gemm::Fma};
  if (cpu::bf16_gemm_available()) engines.push_back(Bf16Gemm::OneDnn);
  for (const Bf16Gemm engine : engines) {
    CpuBf16Kernels k(*host, engine);
    std::vector<float> act(N * OC), pre(N * OC), pre_alone(N * OC), act_alone(N * OC);
    k.linear_gelu_forward(act.data(), pre.data(), inp.data(), w.data(), b.data(), N, C, OC);
    k.linear_forward(pre_alone.data(), inp.data(), w.data(), b.data(), N, C, OC);
    k.gelu_forward(act_alone.data(), pre_alone.data(), N * OC);
    EXPECT_EQ(std::memcmp(pre.data(), pre_alone.data(), sizeof(float) * N * OC), 0);
    double fused = 0, alone = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OC; ++o) {
        double p = b[o];
        for (int64_t c = 0; c < C; ++c) p += static_cast<double>(inp[n * C + c]) * w[o * C + c];
        fused = std::max(fused, bf16_ulps(act[n * OC + o], gelu_d(p)));
        alone = std::max(alone, bf16_ulps(act_alone[n * OC + o], gelu_d(p)));
      }
    EXPECT_LE(fused, 0.51);
    EXPECT_GT(alone, 0.51) << "the separate kernels round twice";

    // Backward: the input gradient of a down projection [N, OC] -> [N, C] (weights [C, OC])
    // whose input was act = gelu(pre).
    const std::vector<float> wd = bf16_normals(C * OC, 0.15f, 6);
    std::vector<float> dpre(N * OC), dact_alone(N * OC), dpre_alone(N * OC);
    std::vector<float> dw(C * OC, 0.f), db(C, 0.f), dw_alone(C * OC, 0.f), db_alone(C, 0.f);
    k.linear_backward_dgelu(dpre.data(), dw.data(), db.data(), dout.data(), act.data(),
                            wd.data(), pre.data(), N, OC, C);
    k.linear_backward(dact_alone.data(), dw_alone.data(), db_alone.data(), dout.data(),
                      act.data(), wd.data(), N, OC, C);
    k.gelu_backward(dpre_alone.data(), pre.data(), dact_alone.data(), N * OC);
    EXPECT_EQ(std::memcmp(dw.data(), dw_alone.data(), sizeof(float) * C * OC), 0);
    EXPECT_EQ(std::memcmp(db.data(), db_alone.data(), sizeof(float) * C), 0);
    double fused_grad = 0, alone_grad = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OC; ++o) {
        double dx = 0;
        for (int64_t c = 0; c < C; ++c) dx += static_cast<double>(dout[n * C + c]) * wd[c * OC + o];
        const double exact = dx * gelu_grad_d(pre[n * OC + o]);
        fused_grad = std::max(fused_grad, bf16_ulps(dpre[n * OC + o], exact));
        alone_grad = std::max(alone_grad, bf16_ulps(dpre_alone[n * OC + o], exact));
      }
    EXPECT_LE(fused_grad, 0.51);
    EXPECT_GT(alone_grad, 0.51) << "the separate kernels round twice";
    std::printf("[bf16 fused GELU, %s engine] act within %.3f of bf16's last place of the "
                "double GELU (separate kernels %.3f); dpre %.3f (separate %.3f)\n",
                engine == Bf16Gemm::Fma ? "fma" : "onednn", fused, alone, fused_grad, alone_grad);
  }
}

// The rounding in place is util/bf16.hpp's, bit for bit, NaN kept NaN, on a team and inside a
// parallel region alike.
TEST(Bf16Round, InPlaceMatchesFloatToBf16) {
  std::mt19937_64 rng(9);
  std::vector<float> x(300000);
  std::uniform_int_distribution<uint32_t> bits;
  for (float& v : x) {
    const uint32_t u = bits(rng);
    std::memcpy(&v, &u, sizeof v);
  }
  std::vector<float> y = x;
  cpu::round_to_bf16_values(y.data(), static_cast<int64_t>(y.size()));
  int64_t compared = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = bf16_to_float(float_to_bf16(x[i]));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(y[i])) << i;
    } else {
      ASSERT_EQ(std::memcmp(&want, &y[i], sizeof want), 0) << i << " " << x[i];
    }
    ++compared;
  }
  EXPECT_EQ(compared, 300000);
}

// The loss rounding its rows in cache (cross_entropy_fused's bf16_rows, what the bf16 kernel set
// runs on the LM head's unrounded logits) gives the bits of rounding the whole chunk, the fused
// kernel, then rounding the gradient: losses, statistics and gradient, with padding columns
// and a target in every row; without aliasing (or in double) it is refused.
TEST(Bf16Loss, RowsRoundedInCacheEqualWholeChunkRounding) {
  const int64_t N = 37, Vl = 1031, V = 1027;  // 4 padding columns
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(N * Vl);
  for (float& v : logits) v = normal(rng);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = static_cast<int32_t>((n * 131) % V);
  std::vector<float> dloss(N, 1.0f / N);
  std::vector<uint16_t> bits(N * Vl, 0);
  auto run = [&](bool in_cache, std::vector<float>& buf, std::vector<float>& losses,
                 std::vector<float>& row_max, std::vector<float>& sums) {
    buf = logits;
    losses.assign(N, 0.f);
    row_max.assign(N, 0.f);
    sums.assign(2 * N, 0.f);
    if (in_cache) {  // with the gradient's bits written from the rows too
      cpu::cross_entropy_fused(losses.data(), row_max.data(), sums.data(), buf.data(), buf.data(),
                               targets.data(), dloss.data(), N, Vl, V, true, bits.data());
    } else {
      cpu::round_to_bf16_values(buf.data(), N * Vl);
      cpu::cross_entropy_fused(losses.data(), row_max.data(), sums.data(), buf.data(), buf.data(),
                               targets.data(), dloss.data(), N, Vl, V);
      cpu::round_to_bf16_values(buf.data(), N * Vl);
    }
  };
  std::vector<float> a, la, ma, sa, b, lb, mb, sb;
  run(true, a, la, ma, sa);
  run(false, b, lb, mb, sb);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(off_grid(a.data(), N * Vl), 0);
  // The bits are those of the rounded gradient, every column (padding included).
  std::vector<uint16_t> want(N * Vl);
  cpu::round_to_bf16(a.data(), N * Vl, want.data());
  EXPECT_EQ(bits, want);
  EXPECT_GT(std::count_if(bits.begin(), bits.end(), [](uint16_t u) { return u != 0; }), N * V / 2);
  std::vector<float> other(N * Vl);
  EXPECT_THROW(cpu::cross_entropy_fused(la.data(), ma.data(), sa.data(), other.data(),
                                        logits.data(), targets.data(), dloss.data(), N, Vl, V,
                                        true),
               Error);
  EXPECT_THROW(cpu::cross_entropy_fused(la.data(), ma.data(), sa.data(), b.data(), b.data(),
                                        targets.data(), dloss.data(), N, Vl, V, false,
                                        bits.data()),
               Error)
      << "bits of a gradient that was not rounded";
}

namespace {

// One forward and backward of a bf16 model on B sequences: its gradients, then its loss.
std::vector<float> gradients_and_loss(Transformer<CpuBf16Kernels>& t, int64_t B,
                                      const std::vector<int32_t>& tokens,
                                      const std::vector<int32_t>& targets) {
  auto a = t.make_activations(B);
  t.zero_grads();
  t.forward(a, tokens.data(), targets.data(), nullptr, 1.0f);
  t.backward(a, 1.0f, nullptr, nullptr);
  std::vector<float> out(t.grads(), t.grads() + t.flat_size());
  out.push_back(static_cast<float>(t.take_loss_sum()));
  return out;
}

// After `model`'s weights were updated (its step before: `before`), its next step equals, to
// the bit, that of `fresh` given the same master weights and weights_changed(); `what` names
// the way the update reached the model.
void expect_step_of_a_fresh_model(Transformer<CpuBf16Kernels>& model,
                                  Transformer<CpuBf16Kernels>& fresh,
                                  const std::vector<float>& before, int64_t B,
                                  const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& targets, const char* what) {
  const int64_t P = model.flat_size();
  fresh.init_weights(1);
  std::copy(model.weights(), model.weights() + P, fresh.weights());
  fresh.weights_changed();
  const std::vector<float> after = gradients_and_loss(model, B, tokens, targets);
  const std::vector<float> reference = gradients_and_loss(fresh, B, tokens, targets);
  EXPECT_NE(after, before) << "the update changed nothing";
  ASSERT_EQ(after.size(), reference.size());
  EXPECT_EQ(std::memcmp(after.data(), reference.data(), after.size() * sizeof(float)), 0)
      << what << ": a product or a kernel read weights from before the update";
  std::printf("[%s] loss %.6f before the update, %.6f after (a fresh model: %.6f); %lld "
              "gradients compared\n",
              what, before.back(), after.back(), reference.back(), static_cast<long long>(P));
}

}  // namespace

// The oneDNN engine reads its weights from the packed bf16 copy the model keeps (2 bytes a
// parameter beside the 4-byte compute copy, counted in state_bytes) and re-packs it whenever
// the weights change: after an update, the model computes what a fresh model given the same
// master weights computes, to the bit; the FMA engine keeps no packed copy.
TEST(Bf16PackedWeights, KeptCurrentAndCounted) {
  if (!cpu::bf16_gemm_available())
    GTEST_SKIP() << "this core has no AVX512-BF16 or AMX: the oneDNN engine cannot run here";
  const ModelConfig m = tiny("gpt2");
  const ModelShard shard = ModelShard::whole(m);
  auto comm = make_self_communicator("tensor");
  auto host = make_cpu_device();
  Transformer<CpuBf16Kernels> fma(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::Fma));
  Transformer<CpuBf16Kernels> moved(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::OneDnn));
  Transformer<CpuBf16Kernels> fresh(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::OneDnn));
  const int64_t P = moved.flat_size();
  EXPECT_EQ(fma.state_bytes().compute, 4 * P);
  EXPECT_EQ(moved.state_bytes().compute, 6 * P) << "the compute copy and its packed bf16 bits";

  const int64_t B = 2, N = B * m.seq_len;
  const auto tokens = token_sequence(N, m.vocab_size, 1);
  const auto targets = token_sequence(N, m.vocab_size, 2);
  moved.init_weights(11);
  const std::vector<float> before = gradients_and_loss(moved, B, tokens, targets);
  // An update: every master weight moved, then the model told, as the optimizer does.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> noise(0.f, 0.05f);
  for (int64_t i = 0; i < P; ++i) moved.weights()[i] += noise(rng);
  moved.weights_changed();
  expect_step_of_a_fresh_model(moved, fresh, before, B, tokens, targets, "bf16 packed");
}

// The trainer's update on the oneDNN engine: AdamW writes the packed bf16 weights as it stores
// each master weight (Device::adamw's w_bf16 = packed_weights(), as AdamW::update passes it
// the trainer's StageModel::bf16_weights()) and the compute copy is
// derived from them (bf16_copy_written). The next step equals, to the bit, that of a fresh model
// given the updated master weights and the usual weights_changed(); a compute copy left from
// before the update, or a packed weight AdamW did not write, fails it.
TEST(Bf16PackedWeights, WrittenByAdamW) {
  if (!cpu::bf16_gemm_available())
    GTEST_SKIP() << "this core has no AVX512-BF16 or AMX: the oneDNN engine cannot run here";
  const ModelConfig m = tiny("llama");
  const ModelShard shard = ModelShard::whole(m);
  auto comm = make_self_communicator("tensor");
  auto host = make_cpu_device();
  Transformer<CpuBf16Kernels> model(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::OneDnn));
  Transformer<CpuBf16Kernels> fresh(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::OneDnn));
  const int64_t P = model.flat_size();
  ASSERT_NE(model.packed_weights(), nullptr);
  const int64_t B = 2, N = B * m.seq_len;
  const auto tokens = token_sequence(N, m.vocab_size, 1);
  const auto targets = token_sequence(N, m.vocab_size, 2);
  model.init_weights(11);
  const std::vector<float> before = gradients_and_loss(model, B, tokens, targets);
  // AdamW's first update (what AdamW::update asks of the device when it owns every weight).
  std::vector<float> m1(P, 0.0f), m2(P, 0.0f);
  AdamWStep adam;
  adam.lr = 1e-2f;
  adam.beta1 = 0.9f;
  adam.beta2 = 0.95f;
  adam.eps = 1e-8f;
  adam.bias1 = 0.1f;
  adam.bias2 = 0.05f;
  adam.grad_scale = 1.0f;
  adam.weight_decay = 0.1f;
  host->adamw(model.weights(), model.grads(), m1.data(), m2.data(), P, adam,
              model.packed_weights());
  model.bf16_copy_written();
  expect_step_of_a_fresh_model(model, fresh, before, B, tokens, targets, "bf16 packed by AdamW");
}

// The oneDNN engine against the FMA engine on one forward and backward with the LM head in four
// chunks: both compute bf16 products with fp32 sums, so every gradient within 1e-3 relative L2
// (the sums' order moves a value across a bf16 rounding now and then); a product that read
// another chunk's gradient bits (the loss writes them for the head's backward) or stale weights
// would be off by the whole term.
TEST(Bf16OneDnnEngine, TracksTheFmaEngineOverHeadChunks) {
  if (!cpu::bf16_gemm_available())
    GTEST_SKIP() << "this core has no AVX512-BF16 or AMX: the oneDNN engine cannot run here";
  int compared = 0;
  for (const std::string variant : {"gpt2", "llama"}) {
    const ModelConfig m = tiny(variant);
    ModelShard shard = ModelShard::whole(m);
    shard.lm_head_chunk_rows = 8;  // 32 rows: four chunks
    auto comm = make_self_communicator("tensor");
    auto host = make_cpu_device();
    Transformer<CpuBf16Kernels> fma(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::Fma));
    Transformer<CpuBf16Kernels> dnn(m, shard, *comm, CpuBf16Kernels(*host, Bf16Gemm::OneDnn));
    fma.init_weights(7);
    dnn.init_weights(7);
    const int64_t B = 2, N = B * m.seq_len;
    const auto tokens = token_sequence(N, m.vocab_size, 3);
    const auto targets = token_sequence(N, m.vocab_size, 4);
    for (auto* model : {&fma, &dnn}) {
      auto a = model->make_activations(B);
      model->zero_grads();
      model->forward(a, tokens.data(), targets.data(), nullptr, 1.0f);
      model->backward(a, 1.0f, nullptr, nullptr);
    }
    const double loss_fma = fma.take_loss_sum(), loss_dnn = dnn.take_loss_sum();
    EXPECT_LE(std::fabs(loss_dnn - loss_fma) / loss_fma, 1e-4) << variant;
    double worst = 0;
    for (const ParamInfo& p : dnn.params()) {
      const double e = rel_l2(dnn.grads() + p.offset, fma.grads() + p.offset, p.numel());
      if (std::isnan(e)) continue;  // a tensor with no gradient (0 / 0)
      EXPECT_LE(e, 1e-3) << variant << " " << p.name;
      worst = std::max(worst, e);
      ++compared;
    }
    std::printf("[bf16 engines] %s, head in 4 chunks: loss %.7f (oneDNN) vs %.7f (FMA); worst "
                "gradient relative L2 %.2e\n",
                variant.c_str(), loss_dnn, loss_fma, worst);
  }
  EXPECT_GT(compared, 20);
}

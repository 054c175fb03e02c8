// Finite-difference gradient checks of every CPU kernel (in double), and agreement of the float
// instantiation with the double one.
//
// Each op below is a small struct: make() draws its inputs (all in double, including R, the
// fixed random weights of the scalar loss L = sum(out * R)), run<T>() casts them to T, runs the
// forward and the backward with dout = R, and returns the output "out" and the gradients
// "d<input>" in double. The FD check perturbs every element of every differentiated input by
// +-h and compares (L(x+h) - L(x-h)) / 2h with the analytic gradient, per tensor, as
// ||g_fd - g|| / max(||g_fd||, tiny).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernel_vectors.hpp"
#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cpu/ops.hpp"

namespace {

using namespace trident::cpu;
using trident::test::document_starts_of;  // kernel_vectors.hpp
using Vec = std::vector<double>;
using Tensors = std::map<std::string, Vec>;

constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-6;      // double: far tighter than the required 1e-4
constexpr double kFloatTol = 1e-5;   // float instantiation vs double, relative (norm)

Vec random_vec(std::mt19937_64& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// Values exactly representable in float, so that float and double runs see the same inputs.
Vec float_exact(Vec v) {
  for (double& x : v) x = static_cast<double>(static_cast<float>(x));
  return v;
}

template <typename T>
std::vector<T> cast(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <typename T>
Vec to_double(const std::vector<T>& v) {
  return Vec(v.begin(), v.end());
}

double norm(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}
double rel_diff(const Vec& ref, const Vec& x) {
  EXPECT_EQ(ref.size(), x.size());
  double s = 0;
  for (size_t i = 0; i < ref.size(); i++) s += (ref[i] - x[i]) * (ref[i] - x[i]);
  return std::sqrt(s) / std::max(norm(ref), 1e-30);
}
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// ------------------------------------------------------------------------------------- ops

struct TokenEmbeddingOp {
  int64_t N = 10, C = 8, vocab_begin = 3, rows = 6;
  // Ids below, inside and above this rank's range [3, 9), with repeats.
  std::vector<int32_t> ids{0, 3, 5, 8, 9, 12, 5, 3, 2, 7};
  Tensors make(std::mt19937_64& rng) const {
    return {{"wte", random_vec(rng, rows * C)}, {"R", random_vec(rng, N * C)}};
  }
  std::vector<std::string> wrt() const { return {"wte"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto wte = cast<T>(in.at("wte"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> out(N * C), dwte(rows * C, T(0));
    token_embedding_forward(out.data(), ids.data(), wte.data(), N, C, vocab_begin, rows);
    token_embedding_backward(dwte.data(), R.data(), ids.data(), N, C, vocab_begin, rows);
    return {{"out", to_double(out)}, {"dwte", to_double(dwte)}};
  }
};

struct PositionEmbeddingOp {
  int64_t B = 2, T = 5, Tmax = 7, C = 8;  // rows T..Tmax-1 of wpe are unused: zero gradient
  Tensors make(std::mt19937_64& rng) const {
    return {{"x", random_vec(rng, B * T * C)},
            {"wpe", random_vec(rng, Tmax * C)},
            {"R", random_vec(rng, B * T * C)}};
  }
  std::vector<std::string> wrt() const { return {"wpe"}; }
  template <typename F>
  Tensors run(const Tensors& in) const {
    auto out = cast<F>(in.at("x"));
    auto wpe = cast<F>(in.at("wpe"));
    auto R = cast<F>(in.at("R"));
    std::vector<F> dwpe(Tmax * C, F(0));
    position_embedding_forward(out.data(), wpe.data(), B, T, C);
    position_embedding_backward(dwpe.data(), R.data(), B, T, C);
    return {{"out", to_double(out)}, {"dwpe", to_double(dwpe)}};
  }
};

struct LayerNormOp {
  int64_t N = 10, C = 8;
  Tensors make(std::mt19937_64& rng) const {
    Vec inp = random_vec(rng, N * C, -2.0, 2.0);
    for (int64_t n = 0; n < N; n++)  // rows with different offsets and scales
      for (int64_t c = 0; c < C; c++) inp[n * C + c] = inp[n * C + c] * (0.5 + n) + 0.3 * n;
    return {{"inp", inp},
            {"weight", random_vec(rng, C, 0.5, 1.5)},
            {"bias", random_vec(rng, C)},
            {"R", random_vec(rng, N * C)}};
  }
  std::vector<std::string> wrt() const { return {"inp", "weight", "bias"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto inp = cast<T>(in.at("inp"));
    auto w = cast<T>(in.at("weight"));
    auto b = cast<T>(in.at("bias"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> out(N * C), mean(N), rstd(N), dinp(N * C), dw(C, T(0)), db(C, T(0));
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(),
                       mean.data(), rstd.data(), N, C);
    return {{"out", to_double(out)},
            {"dinp", to_double(dinp)},
            {"dweight", to_double(dw)},
            {"dbias", to_double(db)}};
  }
};

struct LinearOp {
  int64_t N = 10, C = 8, OC = 12;
  bool with_bias = true;
  Tensors make(std::mt19937_64& rng) const {
    return {{"inp", random_vec(rng, N * C)},
            {"weight", random_vec(rng, OC * C)},
            {"bias", random_vec(rng, OC)},
            {"R", random_vec(rng, N * OC)}};
  }
  std::vector<std::string> wrt() const {
    if (with_bias) return {"inp", "weight", "bias"};
    return {"inp", "weight"};
  }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto inp = cast<T>(in.at("inp"));
    auto w = cast<T>(in.at("weight"));
    auto b = cast<T>(in.at("bias"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> out(N * OC), dinp(N * C), dw(OC * C, T(0)), db(OC, T(0));
    linear_forward(out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
    linear_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(),
                    inp.data(), w.data(), N, C, OC);
    Tensors r{{"out", to_double(out)}, {"dinp", to_double(dinp)}, {"dweight", to_double(dw)}};
    if (with_bias) r["dbias"] = to_double(db);
    return r;
  }
};

// Grouped-query attention: KVH = NH is multi-head attention, KVH < NH shares each kv head
// among NH/KVH query heads (their k and v gradients add up).
// Packed documents: `docs` [B*T] each row's document start (model/documents.hpp); empty: none.
struct AttentionOp {
  int64_t B = 2, T = 5, NH = 2, KVH = 2, HS = 4;
  double qkv_scale = 1.0;
  std::vector<int32_t> docs;
  Tensors make(std::mt19937_64& rng) const {
    return {{"qkv", random_vec(rng, B * T * (NH + 2 * KVH) * HS, -qkv_scale, qkv_scale)},
            {"R", random_vec(rng, B * T * NH * HS)}};
  }
  std::vector<std::string> wrt() const { return {"qkv"}; }
  template <typename F>
  Tensors run(const Tensors& in) const {
    auto qkv = cast<F>(in.at("qkv"));
    auto R = cast<F>(in.at("R"));
    std::vector<F> out(B * T * NH * HS), lse(B * NH * T), dqkv(qkv.size());
    const int32_t* doc_start = docs.empty() ? nullptr : docs.data();
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS, doc_start);
    attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), B, T, NH, KVH,
                       HS, doc_start);
    return {{"out", to_double(out)}, {"lse", to_double(lse)}, {"dqkv", to_double(dqkv)}};
  }
};

// RoPE on the q and k heads of a GQA qkv (v passes through). The forward is linear, so the FD
// gradient is the transpose of the rotation: the check confirms that rope_backward is it.
// theta = 10 turns every pair by a sizeable angle already at these short positions.
struct RopeOp {
  int64_t B = 2, T = 6, NH = 4, KVH = 2, HS = 8;
  double theta = 10.0;
  Tensors make(std::mt19937_64& rng) const {
    const int64_t n = B * T * (NH + 2 * KVH) * HS;
    return {{"qkv", random_vec(rng, n)}, {"R", random_vec(rng, n)}};
  }
  std::vector<std::string> wrt() const { return {"qkv"}; }
  template <typename F>
  Tensors run(const Tensors& in) const {
    auto out = cast<F>(in.at("qkv"));
    auto dqkv = cast<F>(in.at("R"));
    rope_forward(out.data(), B, T, NH, KVH, HS, theta);
    rope_backward(dqkv.data(), B, T, NH, KVH, HS, theta);
    return {{"out", to_double(out)}, {"dqkv", to_double(dqkv)}};
  }
};

struct RmsNormOp {
  int64_t N = 10, C = 8;
  double eps = 1e-5;
  Tensors make(std::mt19937_64& rng) const {
    Vec inp = random_vec(rng, N * C, -2.0, 2.0);
    for (int64_t n = 0; n < N; n++)  // rows with different offsets and scales
      for (int64_t c = 0; c < C; c++) inp[n * C + c] = inp[n * C + c] * (0.5 + n) + 0.3 * n;
    return {{"inp", inp}, {"weight", random_vec(rng, C, 0.5, 1.5)}, {"R", random_vec(rng, N * C)}};
  }
  std::vector<std::string> wrt() const { return {"inp", "weight"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto inp = cast<T>(in.at("inp"));
    auto w = cast<T>(in.at("weight"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> out(N * C), rstd(N), dinp(N * C), dw(C, T(0));
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
    rmsnorm_backward(dinp.data(), dw.data(), R.data(), inp.data(), w.data(), rstd.data(), N, C);
    return {{"out", to_double(out)}, {"dinp", to_double(dinp)}, {"dweight", to_double(dw)}};
  }
};

struct SwigluOp {
  int64_t N = 6, Fh = 10;
  Tensors make(std::mt19937_64& rng) const {
    return {{"gate_up", random_vec(rng, N * 2 * Fh, -5.0, 5.0)}, {"R", random_vec(rng, N * Fh)}};
  }
  std::vector<std::string> wrt() const { return {"gate_up"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto gate_up = cast<T>(in.at("gate_up"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> out(N * Fh), dgate_up(N * 2 * Fh);
    swiglu_forward(out.data(), gate_up.data(), N, Fh);
    swiglu_backward(dgate_up.data(), R.data(), gate_up.data(), N, Fh);
    return {{"out", to_double(out)}, {"dgate_up", to_double(dgate_up)}};
  }
};

struct GeluOp {
  int64_t N = 64;
  Tensors make(std::mt19937_64& rng) const {
    return {{"inp", random_vec(rng, N, -5.0, 5.0)}, {"R", random_vec(rng, N)}};
  }
  std::vector<std::string> wrt() const { return {"inp"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto inp = cast<T>(in.at("inp"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> out(N), dinp(N);
    gelu_forward(out.data(), inp.data(), N);
    gelu_backward(dinp.data(), inp.data(), R.data(), N);
    return {{"out", to_double(out)}, {"dinp", to_double(dinp)}};
  }
};

// out = (a + b) + c via add_forward then add_inplace. Neither has a backward kernel: the
// gradient of a residual add is dout for every operand (the model adds it into the residual
// gradient stream with add_inplace), which is what the FD check confirms.
struct ResidualOp {
  int64_t N = 80;
  Tensors make(std::mt19937_64& rng) const {
    return {{"a", random_vec(rng, N)},
            {"b", random_vec(rng, N)},
            {"c", random_vec(rng, N)},
            {"R", random_vec(rng, N)}};
  }
  std::vector<std::string> wrt() const { return {"a", "b", "c"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto a = cast<T>(in.at("a"));
    auto b = cast<T>(in.at("b"));
    auto c = cast<T>(in.at("c"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> out(N), dres(N, T(0));
    add_forward(out.data(), a.data(), b.data(), N);
    add_inplace(out.data(), c.data(), N);
    add_inplace(dres.data(), R.data(), N);
    const Vec g = to_double(dres);
    return {{"out", to_double(out)}, {"da", g}, {"db", g}, {"dc", g}};
  }
};

// Single-rank cross-entropy: the three passes with identity reductions, then the backward.
// Vl = 11 columns of which vocab_size = 9 are real: the 2 padding columns must get zero grad.
struct CrossEntropyOp {
  int64_t N = 6, Vl = 11, vocab_size = 9;
  std::vector<int32_t> targets{0, 8, 3, 3, 5, 1};
  double logit_scale = 3.0;
  Tensors make(std::mt19937_64& rng) const {
    return {{"logits", random_vec(rng, N * Vl, -logit_scale, logit_scale)},
            {"R", random_vec(rng, N, 0.1, 1.0)}};
  }
  std::vector<std::string> wrt() const { return {"logits"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto logits = cast<T>(in.at("logits"));
    auto dloss = cast<T>(in.at("R"));
    std::vector<T> row_max(N), sums(2 * N), losses(N), dlogits(N * Vl);
    cross_entropy_local_max(row_max.data(), logits.data(), N, Vl, 0, vocab_size);
    cross_entropy_local_sums(sums.data(), logits.data(), targets.data(), row_max.data(), N, Vl, 0,
                             vocab_size);
    cross_entropy_loss(losses.data(), row_max.data(), sums.data(), N);
    cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), row_max.data(),
                           sums.data(), dloss.data(), N, Vl, 0, vocab_size);
    return {{"out", to_double(losses)}, {"dlogits", to_double(dlogits)}};
  }
};

// ------------------------------------------------------------------------------ checkers

// Worst (over the differentiated inputs) FD relative error of op in double.
template <class Op>
double fd_worst(const Op& op, const char* name, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  Tensors in = op.make(rng);
  const Vec& R = in.at("R");
  const Tensors analytic = op.template run<double>(in);
  double worst = 0;
  for (const std::string& x : op.wrt()) {
    Vec& v = in.at(x);
    const Vec& g = analytic.at("d" + x);
    Vec g_fd(v.size());
    for (size_t i = 0; i < v.size(); i++) {
      const double x0 = v[i];
      v[i] = x0 + kFdStep;
      const double lp = dot(op.template run<double>(in).at("out"), R);
      v[i] = x0 - kFdStep;
      const double lm = dot(op.template run<double>(in).at("out"), R);
      v[i] = x0;
      g_fd[i] = (lp - lm) / (2 * kFdStep);
    }
    const double rel = rel_diff(g_fd, g);
    EXPECT_LE(rel, kFdTol) << name << " d" << x;
    EXPECT_GT(norm(g_fd), 0.0) << name << " d" << x << ": degenerate check";
    worst = std::max(worst, rel);
  }
  std::cout << "[fd] " << std::setw(20) << std::left << name << " worst rel err "
            << std::scientific << std::setprecision(2) << worst << std::endl;
  return worst;
}

// Worst relative difference between the float and the double instantiation, over every
// returned tensor (forward outputs and gradients), on inputs exactly representable in float.
template <class Op>
double float_vs_double(const Op& op, const char* name, double tol = kFloatTol,
                       uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  Tensors in = op.make(rng);
  for (auto& [k, v] : in) v = float_exact(v);
  const Tensors d = op.template run<double>(in);
  const Tensors f = op.template run<float>(in);
  double worst = 0;
  for (const auto& [k, ref] : d) {
    const double rel = rel_diff(ref, f.at(k));
    EXPECT_LE(rel, tol) << name << " " << k;
    worst = std::max(worst, rel);
  }
  std::cout << "[float] " << std::setw(20) << std::left << name << " worst rel diff "
            << std::scientific << std::setprecision(2) << worst << std::endl;
  return worst;
}

// ---------------------------------------------------------------------- FD gradient tests

TEST(KernelsGrad, TokenEmbedding) { fd_worst(TokenEmbeddingOp{}, "token_embedding"); }
TEST(KernelsGrad, PositionEmbedding) { fd_worst(PositionEmbeddingOp{}, "position_embedding"); }
TEST(KernelsGrad, LayerNorm) { fd_worst(LayerNormOp{}, "layernorm"); }
TEST(KernelsGrad, Linear) { fd_worst(LinearOp{}, "linear"); }
TEST(KernelsGrad, LinearNoBias) {
  LinearOp op;
  op.with_bias = false;
  fd_worst(op, "linear (no bias)");
}
TEST(KernelsGrad, Attention) { fd_worst(AttentionOp{}, "attention"); }
TEST(KernelsGrad, AttentionPeakedSoftmax) {
  AttentionOp op;  // large scores: nearly one-hot rows
  op.qkv_scale = 3.0;
  fd_worst(op, "attention (peaked)");
}
TEST(KernelsGrad, AttentionGqa) {
  AttentionOp op;  // 2 query heads per kv head
  op.NH = 4;
  op.KVH = 2;
  fd_worst(op, "attention (gqa 4/2)");
}
TEST(KernelsGrad, AttentionMqa) {
  AttentionOp op;  // one kv head for all 4 query heads
  op.NH = 4;
  op.KVH = 1;
  fd_worst(op, "attention (gqa 4/1)");
}
TEST(KernelsGrad, AttentionGqaPeakedSoftmax) {
  AttentionOp op;
  op.NH = 4;
  op.KVH = 2;
  op.qkv_scale = 3.0;
  fd_worst(op, "attention (gqa, peaked)");
}
TEST(KernelsGrad, AttentionDocuments) {
  AttentionOp op;  // a one-row document, one at the start, one at the end
  op.T = 7;
  op.docs = document_starts_of({{1, 3, 3}, {4, 2, 1}});
  fd_worst(op, "attention (documents)");
}
TEST(KernelsGrad, AttentionDocumentsGqaPeaked) {
  AttentionOp op;
  op.T = 7;
  op.NH = 4;
  op.KVH = 2;
  op.qkv_scale = 3.0;
  op.docs = document_starts_of({{2, 5}, {7}});
  fd_worst(op, "attention (documents gqa)");
}
TEST(KernelsGrad, Rope) { fd_worst(RopeOp{}, "rope"); }
TEST(KernelsGrad, RmsNorm) { fd_worst(RmsNormOp{}, "rmsnorm"); }
TEST(KernelsGrad, Swiglu) { fd_worst(SwigluOp{}, "swiglu"); }
TEST(KernelsGrad, Gelu) { fd_worst(GeluOp{}, "gelu"); }
TEST(KernelsGrad, Residual) { fd_worst(ResidualOp{}, "residual"); }
TEST(KernelsGrad, CrossEntropy) { fd_worst(CrossEntropyOp{}, "cross_entropy"); }

// -------------------------------------------------------- float instantiation vs double
// Larger shapes than the FD checks so that the vectorised loop bodies (8 floats per AVX2
// vector), the vectorised exp and the attention's row blocks (128 rows) are all exercised.

TEST(KernelsFloat, TokenEmbedding) {
  TokenEmbeddingOp op;
  op.C = 72;
  float_vs_double(op, "token_embedding");
}
TEST(KernelsFloat, PositionEmbedding) {
  PositionEmbeddingOp op;
  op.T = 33;
  op.Tmax = 40;
  op.C = 72;
  float_vs_double(op, "position_embedding");
}
TEST(KernelsFloat, LayerNorm) {
  LayerNormOp op;
  op.N = 70;
  op.C = 200;
  float_vs_double(op, "layernorm");
}
TEST(KernelsFloat, Linear) {
  LinearOp op;
  op.N = 70;
  op.C = 96;
  op.OC = 130;
  float_vs_double(op, "linear");
}
TEST(KernelsFloat, Attention) {
  AttentionOp op;
  op.B = 1;
  op.T = 300;
  op.NH = 2;
  op.KVH = 2;
  op.HS = 16;
  float_vs_double(op, "attention");
}
TEST(KernelsFloat, AttentionGqa) {
  AttentionOp op;
  op.B = 1;
  op.T = 300;
  op.NH = 4;
  op.KVH = 2;
  op.HS = 16;
  float_vs_double(op, "attention (gqa 4/2)");
}
TEST(KernelsFloat, AttentionDocuments) {
  AttentionOp op;  // documents across and inside the 128-row blocks: some blocks skipped
  op.B = 2;
  op.T = 300;
  op.NH = 4;
  op.KVH = 2;
  op.HS = 16;
  op.docs = document_starts_of({{100, 40, 150, 10}, {1, 258, 41}});
  float_vs_double(op, "attention (documents)");
}

// Packed documents against each document alone: the rows of a document in a packed sequence
// get the output, log-sum-exp and gradients of attention over that document by itself (a
// sequence of its length), to rounding: nothing crosses a document boundary. Lengths straddle
// the 128-row blocks, so the skipped blocks and the per-row masks are both on the path.
template <typename F>
void expect_documents_alone(const std::vector<int32_t>& lengths, double tol) {
  AttentionOp packed;
  packed.B = 1;
  packed.NH = 4;
  packed.KVH = 2;
  packed.HS = 8;
  packed.T = 0;
  for (int32_t len : lengths) packed.T += len;
  packed.docs = document_starts_of({lengths});
  std::mt19937_64 rng(11);
  const Tensors in = packed.make(rng);
  const Tensors whole = packed.template run<F>(in);
  const int64_t CQ = (packed.NH + 2 * packed.KVH) * packed.HS, C = packed.NH * packed.HS;
  int64_t t0 = 0, compared = 0;
  double worst = 0;
  for (int32_t len : lengths) {
    AttentionOp alone = packed;
    alone.T = len;
    alone.docs.clear();
    const Tensors part = alone.template run<F>(
        {{"qkv", Vec(in.at("qkv").begin() + t0 * CQ, in.at("qkv").begin() + (t0 + len) * CQ)},
         {"R", Vec(in.at("R").begin() + t0 * C, in.at("R").begin() + (t0 + len) * C)}});
    const auto rows = [&](const std::string& name, int64_t width) {
      const Vec& w = whole.at(name);
      return Vec(w.begin() + t0 * width, w.begin() + (t0 + len) * width);
    };
    Vec lse_rows;  // lse is [NH, T]: the document's columns of each head
    for (int64_t h = 0; h < packed.NH; h++)
      lse_rows.insert(lse_rows.end(), whole.at("lse").begin() + h * packed.T + t0,
                      whole.at("lse").begin() + h * packed.T + t0 + len);
    for (const auto& [name, got] :
         {std::pair{"out", rows("out", C)}, {"dqkv", rows("dqkv", CQ)}, {"lse", lse_rows}}) {
      const double rel = rel_diff(part.at(name), got);
      EXPECT_LE(rel, tol) << name << " of the document at row " << t0 << " (" << len << " rows)";
      worst = std::max(worst, rel);
      compared += static_cast<int64_t>(got.size());
    }
    t0 += len;
  }
  EXPECT_EQ(compared, packed.T * (C + CQ + packed.NH));
  std::cout << "[documents] " << lengths.size() << " documents, " << compared
            << " values, worst rel diff " << std::scientific << std::setprecision(2) << worst
            << std::endl;
}

TEST(KernelsDocuments, EachDocumentAsIfAlone) {
  expect_documents_alone<double>({130, 1, 200, 60, 9}, 1e-12);
  expect_documents_alone<float>({130, 1, 200, 60, 9}, 1e-5);
  expect_documents_alone<double>({400}, 1e-12);  // one document: the causal kernel itself
}
TEST(KernelsFloat, Rope) {
  RopeOp op;  // Llama's theta and positions where float angles would be visibly off
  op.B = 1;
  op.T = 2048;
  op.HS = 64;
  op.theta = 10000.0;
  float_vs_double(op, "rope");
}
TEST(KernelsFloat, RmsNorm) {
  RmsNormOp op;
  op.N = 70;
  op.C = 200;
  float_vs_double(op, "rmsnorm");
}
TEST(KernelsFloat, Swiglu) {
  SwigluOp op;
  op.N = 40;
  op.Fh = 1000;  // above the threshold of the threaded loop
  float_vs_double(op, "swiglu");
}
TEST(KernelsFloat, Gelu) {
  GeluOp op;
  op.N = 100000;  // above the threshold of the threaded loop
  float_vs_double(op, "gelu");
}
TEST(KernelsFloat, Residual) {
  ResidualOp op;
  op.N = 100000;
  float_vs_double(op, "residual");
}
TEST(KernelsFloat, CrossEntropy) {
  CrossEntropyOp op;
  op.N = 16;
  op.Vl = 5000;
  op.vocab_size = 4990;
  op.logit_scale = 8.0;
  op.targets = {0, 4989, 17, 17, 2500, 1, 3, 4000, 4500, 12, 13, 14, 15, 16, 100, 200};
  float_vs_double(op, "cross_entropy");
}

// ------------------------------------------------------------------ mixture of experts

// The router: out = [gate weights [N,K] | probs [N,E]], both differentiated through (the loss
// weights R of the gate weights and of the probabilities enter the backward as dweight and
// dprobs_extra). Logits spread enough that no +-h step changes the top-k choice.
struct MoeRouterOp {
  int64_t N = 7, E = 6, K = 2;
  Tensors make(std::mt19937_64& rng) const {
    return {{"logits", random_vec(rng, N * E, -2.0, 2.0)}, {"R", random_vec(rng, N * (K + E))}};
  }
  std::vector<std::string> wrt() const { return {"logits"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    auto logits = cast<T>(in.at("logits"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> probs(N * E), weight(N * K), dlogits(N * E);
    std::vector<int32_t> expert(N * K);
    moe_router_forward(probs.data(), expert.data(), weight.data(), logits.data(), N, E, K);
    moe_router_backward(dlogits.data(), R.data(), R.data() + N * K, probs.data(), expert.data(),
                        weight.data(), N, E, K);
    Vec out = to_double(weight);
    out.insert(out.end(), probs.begin(), probs.end());
    return {{"out", out}, {"dlogits", to_double(dlogits)}};
  }
};

// The load-balancing loss per sequence and the z-loss per sequence, from the router logits:
// out = [aux [B] | z [B]]. f (the routed fractions) is piecewise constant in the logits.
struct MoeAuxLossOp {
  int64_t B = 2, Tn = 5, E = 4, K = 2;
  Tensors make(std::mt19937_64& rng) const {
    return {{"logits", random_vec(rng, B * Tn * E, -2.0, 2.0)},
            {"R", random_vec(rng, 2 * B, 0.5, 1.5)}};
  }
  std::vector<std::string> wrt() const { return {"logits"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    const int64_t N = B * Tn;
    auto logits = cast<T>(in.at("logits"));
    auto R = cast<T>(in.at("R"));
    std::vector<T> probs(N * E), weight(N * K), aux(B), z(B), dprobs(N * E, T(0)),
        dweight(N * K, T(0)), dlogits(N * E);
    std::vector<int32_t> expert(N * K);
    moe_router_forward(probs.data(), expert.data(), weight.data(), logits.data(), N, E, K);
    moe_aux_loss_forward(aux.data(), probs.data(), expert.data(), B, Tn, E, K);
    moe_z_loss_forward(z.data(), logits.data(), B, Tn, E);
    moe_aux_loss_backward(dprobs.data(), R.data(), expert.data(), B, Tn, E, K);
    moe_router_backward(dlogits.data(), dweight.data(), dprobs.data(), probs.data(),
                        expert.data(), weight.data(), N, E, K);
    moe_z_loss_backward(dlogits.data(), R.data() + B, logits.data(), B, Tn, E);
    Vec out = to_double(aux);
    out.insert(out.end(), z.begin(), z.end());
    return {{"out", out}, {"dlogits", to_double(dlogits)}};
  }
};

// The experts' path of a MoE MLP for fixed routing: permute, fc1 (+bias) per expert, GELU, fc2
// (+bias) per expert, weighted unpermute. Expert 1 is over-subscribed: with `capacity` = 2 per
// sequence its third and later assignments of a sequence are dropped (zero gradient there).
struct MoeExpertsOp {
  int64_t B = 2, Tn = 4, E = 3, K = 2, C = 5, F = 6, capacity = 0;
  std::vector<int32_t> expert{1, 0, 1, 2, 1, 0, 2, 1,   // sequence 0: expert 1 four times
                              0, 2, 1, 0, 2, 0, 1, 2};  // sequence 1
  Tensors make(std::mt19937_64& rng) const {
    const int64_t N = B * Tn;
    return {{"x", random_vec(rng, N * C)},          {"w1", random_vec(rng, E * F * C)},
            {"b1", random_vec(rng, E * F)},         {"w2", random_vec(rng, E * C * F)},
            {"b2", random_vec(rng, E * C)},         {"gate", random_vec(rng, N * K, 0.2, 1.0)},
            {"R", random_vec(rng, N * C)}};
  }
  std::vector<std::string> wrt() const { return {"x", "w1", "b1", "w2", "b2", "gate"}; }
  template <typename T>
  Tensors run(const Tensors& in) const {
    const int64_t N = B * Tn;
    auto x = cast<T>(in.at("x"));
    auto w1 = cast<T>(in.at("w1")), b1 = cast<T>(in.at("b1"));
    auto w2 = cast<T>(in.at("w2")), b2 = cast<T>(in.at("b2"));
    auto gate = cast<T>(in.at("gate"));
    auto R = cast<T>(in.at("R"));
    std::vector<int64_t> slot(N * K), slot_token(N * K), offsets(E + 1), load(E);
    const int64_t M = moe_dispatch_plan(slot.data(), slot_token.data(), offsets.data(),
                                        load.data(), expert.data(), B, Tn, E, K, capacity);
    std::vector<T> xp(M * C), h(M * F), a(M * F), y(M * C), out(N * C);
    moe_permute(xp.data(), x.data(), slot_token.data(), M, C);
    moe_expert_linear_forward(h.data(), xp.data(), w1.data(), b1.data(), offsets.data(), E, C, F);
    gelu_forward(a.data(), h.data(), M * F);
    moe_expert_linear_forward(y.data(), a.data(), w2.data(), b2.data(), offsets.data(), E, F, C);
    moe_unpermute(out.data(), y.data(), slot.data(), gate.data(), N, K, C);

    std::vector<T> dy(M * C), dgate(N * K), da(M * F), dh(M * F), dxp(M * C), dx(N * C);
    std::vector<T> dw1(E * F * C, T(0)), db1(E * F, T(0)), dw2(E * C * F, T(0)), db2(E * C, T(0));
    moe_unpermute_backward(dy.data(), dgate.data(), R.data(), y.data(), slot.data(), gate.data(),
                           N, K, C);
    moe_expert_linear_backward(da.data(), dw2.data(), db2.data(), dy.data(), a.data(), w2.data(),
                               offsets.data(), E, F, C);
    gelu_backward(dh.data(), h.data(), da.data(), M * F);
    moe_expert_linear_backward(dxp.data(), dw1.data(), db1.data(), dh.data(), xp.data(),
                               w1.data(), offsets.data(), E, C, F);
    moe_permute_backward(dx.data(), dxp.data(), slot.data(), N, K, C);
    return {{"out", to_double(out)}, {"dx", to_double(dx)},   {"dw1", to_double(dw1)},
            {"db1", to_double(db1)}, {"dw2", to_double(dw2)}, {"db2", to_double(db2)},
            {"dgate", to_double(dgate)}};
  }
};

TEST(KernelsGrad, MoeRouter) { fd_worst(MoeRouterOp{}, "moe_router"); }
TEST(KernelsGrad, MoeRouterTop1) {
  MoeRouterOp op;
  op.K = 1;  // the renormalised weight is 1: only the probabilities carry a gradient
  fd_worst(op, "moe_router_top1");
}
TEST(KernelsGrad, MoeAuxAndZLoss) { fd_worst(MoeAuxLossOp{}, "moe_aux_z_loss"); }
TEST(KernelsGrad, MoeExpertsDropless) { fd_worst(MoeExpertsOp{}, "moe_experts"); }
TEST(KernelsGrad, MoeExpertsCapacity) {
  MoeExpertsOp op;
  op.capacity = 2;
  fd_worst(op, "moe_experts_capacity");
}
TEST(KernelsFloat, MoeRouter) { float_vs_double(MoeRouterOp{}, "moe_router"); }
TEST(KernelsFloat, MoeExperts) { float_vs_double(MoeExpertsOp{}, "moe_experts"); }

// The dispatch plan: capacity ceil(factor*T*K/E), drops in (token, choice) order per sequence,
// rows sorted by expert then token, loads counted before dropping.
TEST(KernelsMoe, DispatchPlanDropsInTokenOrder) {
  EXPECT_EQ(moe_capacity(0.0, 4, 3, 2), 0);
  EXPECT_EQ(moe_capacity(1.0, 4, 3, 2), 3);   // ceil(8/3)
  EXPECT_EQ(moe_capacity(0.75, 4, 3, 2), 2);  // ceil(2)
  const MoeExpertsOp op;
  std::vector<int64_t> slot(16), token(16), offsets(4), load(3);
  const int64_t M = moe_dispatch_plan(slot.data(), token.data(), offsets.data(), load.data(),
                                      op.expert.data(), 2, 4, 3, 2, 2);
  EXPECT_EQ(load, (std::vector<int64_t>{5, 6, 5}));
  // Sequence 0 sends expert 1 four assignments (tokens 0, 1, 2, 3): the last two are dropped;
  // sequence 1 sends experts 0 and 2 three each: their third (tokens 6 and 7) is dropped.
  EXPECT_EQ(M, 12);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 4, 8, 12}));
  for (int64_t dropped : {4, 7, 13, 15}) EXPECT_EQ(slot[dropped], -1) << dropped;
  EXPECT_EQ(slot[0], 4);  // token 0 -> expert 1's first row
  EXPECT_EQ(slot[2], 5);  // token 1 -> expert 1's second row
  EXPECT_EQ(slot[1], 0);  // token 0 -> expert 0's first row
  for (int64_t m = 1; m < M; m++)
    if (m != offsets[1] && m != offsets[2]) EXPECT_LE(token[m - 1], token[m]) << m;
}


// The exchange's bookkeeping: a rank's rows leave in expert blocks per owner, and the owner
// orders what arrives expert-major, sources in rank order inside (never arrival timing).
TEST(KernelsMoe, ExpertParallelPlans) {
  // 4 experts over 2 ranks; expert-sorted rows 0-1 expert 0, 2 expert 1, none 2, 3-5 expert 3.
  const std::vector<int64_t> offsets{0, 2, 3, 3, 6};
  std::vector<int64_t> send_rows(2), expert_rows(4);
  moe_ep_send_counts(send_rows.data(), expert_rows.data(), offsets.data(), 4, 2);
  EXPECT_EQ(send_rows, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(expert_rows, (std::vector<int64_t>{2, 1, 0, 3}));
  // An owner of 2 experts receives from source 0: 2 rows of its expert 0, 1 of expert 1; from
  // source 1: 1 and 2. Arrival order: rows 0,1 (0,0), 2 (0,1), 3 (1,0), 4,5 (1,1).
  const std::vector<int64_t> counts{2, 1, 1, 2};
  std::vector<int64_t> local(3), src_row(6, -1);
  EXPECT_EQ(moe_ep_receive_plan(local.data(), src_row.data(), counts.data(), 2, 2), 6);
  EXPECT_EQ(local, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(src_row, (std::vector<int64_t>{0, 1, 3, 2, 4, 5}));
  // Gather then scatter with the plan is the identity on the rows.
  const std::vector<float> arrived{0, 1, 2, 3, 4, 5};
  std::vector<float> sorted(6), back(6, -1);
  moe_permute(sorted.data(), arrived.data(), src_row.data(), 6, 1);
  EXPECT_EQ(sorted, (std::vector<float>{0, 1, 3, 2, 4, 5}));
  moe_scatter_rows(back.data(), sorted.data(), src_row.data(), 6, 1);
  EXPECT_EQ(back, arrived);
}

// The expert-parallel exchange on one process: EP = 2 "ranks" of one sequence each, E = 4
// experts (2 per rank), capacity 2 (some drops). Each rank sends its expert-sorted rows to the
// experts' owners, the owners run their experts on the rows ordered by moe_ep_receive_plan and
// scatter the outputs back: every token's output equals the one-rank run over both sequences.
TEST(KernelsMoe, ExpertParallelExchangeMatchesOneRank) {
  const int64_t EP = 2, E = 4, El = E / EP, Tn = 4, K = 2, C = 3, F = 5, capacity = 2;
  const std::vector<int32_t> expert{1, 0, 1, 3, 1, 2, 1, 0,   // sequence 0 (rank 0): 1 x4
                                    3, 2, 3, 0, 2, 1, 3, 2};  // sequence 1 (rank 1)
  std::mt19937_64 rng(18);
  const Vec x = random_vec(rng, 2 * Tn * C), w1 = random_vec(rng, E * F * C),
            b1 = random_vec(rng, E * F), w2 = random_vec(rng, E * C * F),
            b2 = random_vec(rng, E * C), gate = random_vec(rng, 2 * Tn * K, 0.2, 1.0);
  // The experts over expert-sorted rows; w* point at the first of the experts in `offsets`.
  auto experts = [&](const Vec& xp, const int64_t* offsets, int64_t n_experts, int64_t first) {
    const int64_t M = offsets[n_experts];
    Vec h(M * F), a(M * F), y(M * C);
    moe_expert_linear_forward(h.data(), xp.data(), w1.data() + first * F * C,
                              b1.data() + first * F, offsets, n_experts, C, F);
    gelu_forward(a.data(), h.data(), M * F);
    moe_expert_linear_forward(y.data(), a.data(), w2.data() + first * C * F,
                              b2.data() + first * C, offsets, n_experts, F, C);
    return y;
  };
  struct Rank {
    std::vector<int64_t> slot, token, offsets, load, send_rows, expert_rows;
    Vec xp, y, out;
  };
  // One rank: both sequences.
  Rank ref;
  {
    const int64_t N = 2 * Tn;
    ref.slot.resize(N * K), ref.token.resize(N * K), ref.offsets.resize(E + 1), ref.load.resize(E);
    const int64_t M = moe_dispatch_plan(ref.slot.data(), ref.token.data(), ref.offsets.data(),
                                        ref.load.data(), expert.data(), 2, Tn, E, K, capacity);
    ref.xp.resize(M * C);
    moe_permute(ref.xp.data(), x.data(), ref.token.data(), M, C);
    ref.y = experts(ref.xp, ref.offsets.data(), E, 0);
    ref.out.resize(N * C);
    moe_unpermute(ref.out.data(), ref.y.data(), ref.slot.data(), gate.data(), N, K, C);
  }
  // EP = 2: rank r routes sequence r.
  std::vector<Rank> ranks(EP);
  for (int64_t r = 0; r < EP; r++) {
    Rank& k = ranks[r];
    k.slot.resize(Tn * K), k.token.resize(Tn * K), k.offsets.resize(E + 1), k.load.resize(E);
    const int64_t M = moe_dispatch_plan(k.slot.data(), k.token.data(), k.offsets.data(),
                                        k.load.data(), expert.data() + r * Tn * K, 1, Tn, E, K,
                                        capacity);
    k.xp.resize(M * C);
    moe_permute(k.xp.data(), x.data() + r * Tn * C, k.token.data(), M, C);
    k.send_rows.resize(EP), k.expert_rows.resize(E);
    moe_ep_send_counts(k.send_rows.data(), k.expert_rows.data(), k.offsets.data(), E, EP);
    EXPECT_EQ(k.send_rows[0] + k.send_rows[1], M);
    k.y.assign(M * C, -1.0);
  }
  int64_t received_total = 0;
  for (int64_t q = 0; q < EP; q++) {
    // What rank q receives (the all-to-all): each source's block for q, in source order.
    std::vector<int64_t> counts(EP * El);
    Vec recv;
    for (int64_t p = 0; p < EP; p++) {
      const Rank& src = ranks[p];
      for (int64_t j = 0; j < El; j++) counts[p * El + j] = src.expert_rows[q * El + j];
      recv.insert(recv.end(), src.xp.begin() + src.offsets[q * El] * C,
                  src.xp.begin() + src.offsets[(q + 1) * El] * C);
    }
    std::vector<int64_t> offsets(El + 1), src_row(recv.size() / C);
    const int64_t R = moe_ep_receive_plan(offsets.data(), src_row.data(), counts.data(), EP, El);
    ASSERT_EQ(R * C, static_cast<int64_t>(recv.size()));
    std::vector<int64_t> sorted = src_row;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t m = 0; m < R; m++) ASSERT_EQ(sorted[m], m);  // a permutation
    Vec xe(R * C), back(R * C);
    moe_permute(xe.data(), recv.data(), src_row.data(), R, C);
    const Vec ye = experts(xe, offsets.data(), El, q * El);
    moe_scatter_rows(back.data(), ye.data(), src_row.data(), R, C);
    // The way back: each source's block returns to where it was sent from.
    int64_t at = 0;
    for (int64_t p = 0; p < EP; p++) {
      Rank& dst = ranks[p];
      const int64_t n = dst.send_rows[q] * C;
      std::copy(back.begin() + at, back.begin() + at + n, dst.y.begin() + dst.offsets[q * El] * C);
      at += n;
    }
    received_total += R;
  }
  EXPECT_EQ(received_total, ref.offsets[E]);  // every kept assignment went to exactly one expert
  int64_t compared = 0;
  for (int64_t r = 0; r < EP; r++) {
    Rank& k = ranks[r];
    k.out.resize(Tn * C);
    moe_unpermute(k.out.data(), k.y.data(), k.slot.data(), gate.data() + r * Tn * K, Tn, K, C);
    for (int64_t i = 0; i < Tn * C; i++, compared++)
      EXPECT_NEAR(k.out[i], ref.out[r * Tn * C + i], 1e-12) << "rank " << r << " element " << i;
  }
  EXPECT_EQ(compared, 2 * Tn * C);
}

}  // namespace

// Properties of the CPU kernels beyond their gradients: vocab-parallel cross-entropy split over
// simulated ranks (with padding), out-of-range embedding ids, attention causality and its
// row-blocked GEMMs against a naive reference, grouped-query attention against multi-head
// attention (the pre-GQA kernel bit for bit, and on replicated kv heads), RoPE against the
// Hugging Face formula and its invariants, RMSNorm scale invariance, SwiGLU against its
// formula, accumulate/overwrite conventions, bitwise determinism of the threaded float
// kernels, the accuracy of the vectorised exp, and one rule of the kernels' OpenMP pragmas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernel_vectors.hpp"
#include "kernels/cpu/vecmath.hpp"

namespace {

using namespace trident::cpu;
using trident::test::bitwise_equal;
using trident::test::random_vec;

template <typename T>
double max_abs_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); i++)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

template <typename T>
std::vector<T> nan_vec(size_t n) {
  return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
}

// Runs the test body with a given thread count, restoring the previous one.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }

 private:
  int saved_;
};

// ------------------------------------------------------------- vocab-parallel cross-entropy

template <typename T>
struct CeResult {
  std::vector<T> losses, dlogits;
};

// The three passes on `ranks` simulated ranks that split the Vtot = ranks * Vl columns; the
// MAX and SUM all-reduces are done here by hand (in rank order).
template <typename T>
CeResult<T> ce_split(const std::vector<T>& logits, const std::vector<int32_t>& targets,
                     const std::vector<T>& dloss, int64_t N, int64_t Vtot, int64_t vocab_size,
                     int ranks) {
  const int64_t Vl = Vtot / ranks;
  std::vector<std::vector<T>> local(ranks, std::vector<T>(N * Vl));
  for (int r = 0; r < ranks; r++)
    for (int64_t n = 0; n < N; n++)
      std::copy_n(logits.begin() + n * Vtot + r * Vl, Vl, local[r].begin() + n * Vl);
  std::vector<T> row_max(N, -std::numeric_limits<T>::infinity()), m(N);
  for (int r = 0; r < ranks; r++) {
    cross_entropy_local_max(m.data(), local[r].data(), N, Vl, r * Vl, vocab_size);
    for (int64_t n = 0; n < N; n++) row_max[n] = std::max(row_max[n], m[n]);
  }
  std::vector<T> sums(2 * N, T(0)), s(2 * N);
  for (int r = 0; r < ranks; r++) {
    cross_entropy_local_sums(s.data(), local[r].data(), targets.data(), row_max.data(), N, Vl,
                             r * Vl, vocab_size);
    for (int64_t i = 0; i < 2 * N; i++) sums[i] += s[i];
  }
  CeResult<T> res;
  res.losses.resize(N);
  cross_entropy_loss(res.losses.data(), row_max.data(), sums.data(), N);
  res.dlogits.resize(N * Vtot);
  for (int r = 0; r < ranks; r++) {
    // in place over this rank's logits, as the trainer does
    cross_entropy_backward(local[r].data(), local[r].data(), targets.data(), row_max.data(),
                           sums.data(), dloss.data(), N, Vl, r * Vl, vocab_size);
    for (int64_t n = 0; n < N; n++)
      std::copy_n(local[r].begin() + n * Vl, Vl, res.dlogits.begin() + n * Vtot + r * Vl);
  }
  return res;
}

template <typename T>
void check_ce_split(int64_t vocab_size, double tol) {
  const int64_t N = 7, Vtot = 24;  // divisible by 1, 2 and 3 ranks
  std::mt19937_64 rng(11);
  auto logits = random_vec<T>(rng, N * Vtot, -4.0, 4.0);
  // Huge values in the padding columns: they must not affect anything.
  for (int64_t n = 0; n < N; n++)
    for (int64_t v = vocab_size; v < Vtot; v++) logits[n * Vtot + v] = T(1000 + v);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; n++) targets[n] = static_cast<int32_t>((n * 5) % vocab_size);
  targets[N - 1] = static_cast<int32_t>(vocab_size - 1);
  auto dloss = random_vec<T>(rng, N, 0.1, 1.0);

  // Naive reference in double.
  std::vector<double> ref_loss(N), ref_grad(N * Vtot, 0.0);
  for (int64_t n = 0; n < N; n++) {
    double mx = -1e300;
    for (int64_t v = 0; v < vocab_size; v++) mx = std::max(mx, double(logits[n * Vtot + v]));
    double s = 0;
    for (int64_t v = 0; v < vocab_size; v++) s += std::exp(double(logits[n * Vtot + v]) - mx);
    ref_loss[n] = std::log(s) + mx - double(logits[n * Vtot + targets[n]]);
    for (int64_t v = 0; v < vocab_size; v++)
      ref_grad[n * Vtot + v] = double(dloss[n]) *
                               (std::exp(double(logits[n * Vtot + v]) - mx) / s -
                                (v == targets[n] ? 1.0 : 0.0));
  }

  const CeResult<T> one = ce_split(logits, targets, dloss, N, Vtot, vocab_size, 1);
  for (int64_t n = 0; n < N; n++) EXPECT_NEAR(one.losses[n], ref_loss[n], tol * 10);
  for (int64_t i = 0; i < N * Vtot; i++) EXPECT_NEAR(one.dlogits[i], ref_grad[i], tol);
  for (int ranks : {2, 3}) {
    const CeResult<T> split = ce_split(logits, targets, dloss, N, Vtot, vocab_size, ranks);
    EXPECT_LE(max_abs_diff(split.losses, one.losses), tol) << ranks << " ranks";
    EXPECT_LE(max_abs_diff(split.dlogits, one.dlogits), tol) << ranks << " ranks";
    for (int64_t n = 0; n < N; n++)
      for (int64_t v = vocab_size; v < Vtot; v++)
        EXPECT_EQ(split.dlogits[n * Vtot + v], T(0)) << "padding column " << v;
  }
}

TEST(KernelsCrossEntropy, VocabParallelSplitDouble) {
  check_ce_split<double>(22, 1e-13);  // 2 padding columns, on the last rank
  check_ce_split<double>(15, 1e-13);  // with 3 ranks the last rank holds only padding
}
TEST(KernelsCrossEntropy, VocabParallelSplitFloat) {
  check_ce_split<float>(22, 2e-6);
  check_ce_split<float>(15, 2e-6);
}

// The single-rank fused kernel against the three passes and the backward: the same outputs bit
// for bit, forward alone and with the gradient, in place and out of place. A vocabulary of
// 50,304 with 60 padding columns holding huge values.
template <typename T>
void check_ce_fused_equals_passes() {
  const int64_t N = 5, Vl = 50364, vocab_size = 50304;
  std::mt19937_64 rng(17);
  auto logits = random_vec<T>(rng, N * Vl, -8.0, 8.0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t v = vocab_size; v < Vl; v++) logits[n * Vl + v] = T(1000);
  const std::vector<int32_t> targets{0, 50303, 777, 777, 31337};
  auto dloss = random_vec<T>(rng, N, 0.1, 1.0);

  std::vector<T> row_max(N), sums(2 * N), losses(N);
  cross_entropy_local_max(row_max.data(), logits.data(), N, Vl, 0, vocab_size);
  cross_entropy_local_sums(sums.data(), logits.data(), targets.data(), row_max.data(), N, Vl, 0,
                           vocab_size);
  cross_entropy_loss(losses.data(), row_max.data(), sums.data(), N);
  auto dlogits = nan_vec<T>(N * Vl);
  cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), row_max.data(),
                         sums.data(), dloss.data(), N, Vl, 0, vocab_size);

  auto f_max = nan_vec<T>(N), f_sums = nan_vec<T>(2 * N), f_losses = nan_vec<T>(N);
  cross_entropy_fused<T>(f_losses.data(), f_max.data(), f_sums.data(), nullptr, logits.data(),
                         targets.data(), nullptr, N, Vl, vocab_size);
  EXPECT_TRUE(bitwise_equal(f_max, row_max));
  EXPECT_TRUE(bitwise_equal(f_sums, sums));
  EXPECT_TRUE(bitwise_equal(f_losses, losses));

  auto g_max = nan_vec<T>(N), g_sums = nan_vec<T>(2 * N), g_losses = nan_vec<T>(N);
  auto out_of_place = nan_vec<T>(N * Vl);
  cross_entropy_fused(g_losses.data(), g_max.data(), g_sums.data(), out_of_place.data(),
                      logits.data(), targets.data(), dloss.data(), N, Vl, vocab_size);
  EXPECT_TRUE(bitwise_equal(g_losses, losses));
  EXPECT_TRUE(bitwise_equal(g_sums, sums));
  EXPECT_TRUE(bitwise_equal(out_of_place, dlogits));
  auto in_place = logits;
  cross_entropy_fused(g_losses.data(), g_max.data(), g_sums.data(), in_place.data(),
                      in_place.data(), targets.data(), dloss.data(), N, Vl, vocab_size);
  EXPECT_TRUE(bitwise_equal(in_place, dlogits));
  EXPECT_TRUE(bitwise_equal(g_losses, losses));
  for (int64_t n = 0; n < N; n++) EXPECT_EQ(in_place[n * Vl + vocab_size], T(0)) << n;
}

// Over a tensor group: the sums' pass keeping its exponentials, and the backward from them,
// against the sums' pass and the backward that takes the exp again: the same bits, in place
// and out of place, on every rank's columns of a split vocabulary (padding on the last, the
// target on one rank only).
template <typename T>
void check_ce_kept_exps_equal_the_passes() {
  const int64_t N = 4, vocab_size = 990, ranks = 3, Vl = 334;  // 3 x 334 = 1002 columns
  std::mt19937_64 rng(23);
  auto all = random_vec<T>(rng, N * Vl * ranks, -8.0, 8.0);
  const std::vector<int32_t> targets{0, 989, 400, 333};
  auto dloss = random_vec<T>(rng, N, 0.1, 1.0);
  int64_t compared = 0;
  for (int64_t r = 0; r < ranks; r++) {
    const int64_t vb = r * Vl;
    std::vector<T> logits(all.begin() + r * N * Vl, all.begin() + (r + 1) * N * Vl);
    std::vector<T> row_max(N);
    cross_entropy_local_max(row_max.data(), logits.data(), N, Vl, vb, vocab_size);
    for (T& m : row_max) m = std::max(m, T(7.5));  // as if another rank's maximum were larger
    std::vector<T> sums(2 * N), dlogits = nan_vec<T>(N * Vl);
    cross_entropy_local_sums(sums.data(), logits.data(), targets.data(), row_max.data(), N, Vl,
                             vb, vocab_size);
    for (int64_t n = 0; n < N; n++) sums[n] *= T(2.5);  // as if summed over the group
    cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), row_max.data(),
                           sums.data(), dloss.data(), N, Vl, vb, vocab_size);
    auto k_sums = nan_vec<T>(2 * N), exps = nan_vec<T>(N * Vl);
    cross_entropy_local_sums(k_sums.data(), logits.data(), targets.data(), row_max.data(), N, Vl,
                             vb, vocab_size, exps.data());
    for (int64_t n = 0; n < N; n++) k_sums[n] *= T(2.5);
    EXPECT_TRUE(bitwise_equal(k_sums, sums)) << "rank " << r;
    auto out_of_place = nan_vec<T>(N * Vl);
    cross_entropy_backward_kept(out_of_place.data(), exps.data(), targets.data(), k_sums.data(),
                                dloss.data(), N, Vl, vb, vocab_size);
    EXPECT_TRUE(bitwise_equal(out_of_place, dlogits)) << "rank " << r;
    auto in_place = logits;
    cross_entropy_local_sums(k_sums.data(), in_place.data(), targets.data(), row_max.data(), N,
                             Vl, vb, vocab_size, in_place.data());
    for (int64_t n = 0; n < N; n++) k_sums[n] *= T(2.5);
    EXPECT_TRUE(bitwise_equal(k_sums, sums)) << "rank " << r << " in place";
    cross_entropy_backward_kept(in_place.data(), in_place.data(), targets.data(), k_sums.data(),
                                dloss.data(), N, Vl, vb, vocab_size);
    EXPECT_TRUE(bitwise_equal(in_place, dlogits)) << "rank " << r << " in place";
    compared += static_cast<int64_t>(in_place.size());
  }
  EXPECT_EQ(compared, N * Vl * ranks);
}

TEST(KernelsCrossEntropy, KeptExponentialsEqualThePassesFloat) {
  check_ce_kept_exps_equal_the_passes<float>();
}
TEST(KernelsCrossEntropy, KeptExponentialsEqualThePassesDouble) {
  check_ce_kept_exps_equal_the_passes<double>();
}

TEST(KernelsCrossEntropy, FusedSingleRankEqualsThePassesFloat) {
  check_ce_fused_equals_passes<float>();
}
TEST(KernelsCrossEntropy, FusedSingleRankEqualsThePassesDouble) {
  check_ce_fused_equals_passes<double>();
}

TEST(KernelsCrossEntropy, InPlaceEqualsOutOfPlace) {
  const int64_t N = 9, V = 1000, vocab_size = 990;
  std::mt19937_64 rng(5);
  auto logits = random_vec<float>(rng, N * V, -6.0, 6.0);
  std::vector<int32_t> targets{0, 1, 989, 500, 500, 7, 8, 9, 900};
  auto dloss = random_vec<float>(rng, N, 0.1, 1.0);
  std::vector<float> row_max(N), sums(2 * N);
  cross_entropy_local_max(row_max.data(), logits.data(), N, V, 0, vocab_size);
  cross_entropy_local_sums(sums.data(), logits.data(), targets.data(), row_max.data(), N, V, 0,
                           vocab_size);
  auto out_of_place = nan_vec<float>(N * V);
  cross_entropy_backward(out_of_place.data(), logits.data(), targets.data(), row_max.data(),
                         sums.data(), dloss.data(), N, V, 0, vocab_size);
  cross_entropy_backward(logits.data(), logits.data(), targets.data(), row_max.data(),
                         sums.data(), dloss.data(), N, V, 0, vocab_size);
  EXPECT_TRUE(bitwise_equal(out_of_place, logits));
  // Each row of the gradient sums to zero (softmax minus one-hot).
  for (int64_t n = 0; n < N; n++) {
    double s = 0;
    for (int64_t v = 0; v < V; v++) s += logits[n * V + v];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

// --------------------------------------------------------------------------- embeddings

TEST(KernelsEmbedding, OutOfRangeIdsContributeZero) {
  const int64_t N = 8, C = 16, vocab_begin = 10, rows = 5;
  const std::vector<int32_t> ids{-1, 9, 10, 14, 15, 100, 12, 12};
  std::mt19937_64 rng(3);
  auto wte = random_vec<double>(rng, rows * C);
  auto out = nan_vec<double>(N * C);
  token_embedding_forward(out.data(), ids.data(), wte.data(), N, C, vocab_begin, rows);
  for (int64_t n = 0; n < N; n++) {
    const int64_t r = ids[n] - vocab_begin;
    for (int64_t c = 0; c < C; c++)
      EXPECT_EQ(out[n * C + c], (r >= 0 && r < rows) ? wte[r * C + c] : 0.0) << n << "," << c;
  }
  auto dout = random_vec<double>(rng, N * C);
  std::vector<double> dwte(rows * C, 0.5);
  token_embedding_backward(dwte.data(), dout.data(), ids.data(), N, C, vocab_begin, rows);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < C; c++) {
      double expect = 0.5;
      for (int64_t n = 0; n < N; n++)
        if (ids[n] - vocab_begin == r) expect += dout[n * C + c];
      EXPECT_DOUBLE_EQ(dwte[r * C + c], expect) << r << "," << c;
    }
}

// --------------------------------------------------------------------------- attention

// Naive causal grouped-query attention in double, the softmax materialised row by row:
// forward (out, and lse: each row's log-sum-exp of its scaled scores) and backward. qkv rows
// hold [q of NH heads | k of KVH | v of KVH]; query head h reads kv head h / (NH / KVH).
void attention_reference(std::vector<double>& out, std::vector<double>& lse,
                         std::vector<double>& dqkv, const std::vector<double>& qkv,
                         const std::vector<double>& dout, int64_t B, int64_t T, int64_t NH,
                         int64_t KVH, int64_t HS) {
  const int64_t C = NH * HS, CQ = (NH + 2 * KVH) * HS, G = NH / KVH;
  const double scale = 1.0 / std::sqrt(double(HS));
  out.assign(B * T * C, 0.0);
  lse.assign(B * NH * T, 0.0);
  dqkv.assign(B * T * CQ, 0.0);
  std::vector<double> p(T), dp(T);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const int64_t ko = (NH + h / G) * HS, vo = (NH + KVH + h / G) * HS;
      for (int64_t t = 0; t < T; t++) {
        const double* q = &qkv[(b * T + t) * CQ + h * HS];
        double mx = -1e300;
        for (int64_t s = 0; s <= t; s++) {
          const double* k = &qkv[(b * T + s) * CQ + ko];
          double d = 0;
          for (int64_t i = 0; i < HS; i++) d += q[i] * k[i];
          p[s] = d * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; s++) sum += (p[s] = std::exp(p[s] - mx));
        for (int64_t s = 0; s <= t; s++) p[s] /= sum;
        lse[(b * NH + h) * T + t] = mx + std::log(sum);
        const double* g = &dout[(b * T + t) * C + h * HS];
        double pdp = 0;
        for (int64_t s = 0; s <= t; s++) {
          const double* v = &qkv[(b * T + s) * CQ + vo];
          double d = 0;
          for (int64_t i = 0; i < HS; i++) {
            out[(b * T + t) * C + h * HS + i] += p[s] * v[i];
            d += g[i] * v[i];
          }
          dp[s] = d;
          pdp += p[s] * d;
        }
        for (int64_t s = 0; s <= t; s++) {
          const double ds = p[s] * (dp[s] - pdp) * scale;
          const double* k = &qkv[(b * T + s) * CQ + ko];
          for (int64_t i = 0; i < HS; i++) {
            dqkv[(b * T + t) * CQ + h * HS + i] += ds * k[i];
            dqkv[(b * T + s) * CQ + ko + i] += ds * q[i];
            dqkv[(b * T + s) * CQ + vo + i] += p[s] * g[i];
          }
        }
      }
    }
}

// The blocked online-softmax kernel against the materialised softmax, in double: sequence
// lengths around the 128-row blocks (T = 129, 300: not multiples), MHA and GQA.
TEST(KernelsAttention, BlockedMatchesNaiveReference) {
  int64_t compared = 0;
  double worst = 0;
  for (auto [NH, KVH] : {std::pair<int64_t, int64_t>{3, 3}, {4, 2}})
    for (int64_t T : {1, 2, 127, 128, 129, 300}) {
      const int64_t B = 2, HS = 8, C = NH * HS, CQ = (NH + 2 * KVH) * HS;
      std::mt19937_64 rng(100 + T + 10 * KVH);
      auto qkv = random_vec<double>(rng, B * T * CQ, -2.0, 2.0);
      auto dout = random_vec<double>(rng, B * T * C);
      std::vector<double> ref_out, ref_lse, ref_dqkv;
      attention_reference(ref_out, ref_lse, ref_dqkv, qkv, dout, B, T, NH, KVH, HS);
      auto out = nan_vec<double>(B * T * C), lse = nan_vec<double>(B * NH * T);
      auto dqkv = nan_vec<double>(B * T * CQ);
      attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS);
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH,
                         KVH, HS);
      const std::string what = "T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                               " KVH=" + std::to_string(KVH);
      // The outputs start as NaN: an entry the kernel leaves unwritten stays non-finite.
      for (const auto& [got, ref, name] : {std::tuple{&out, &ref_out, "out"},
                                           {&lse, &ref_lse, "lse"},
                                           {&dqkv, &ref_dqkv, "dqkv"}}) {
        ASSERT_EQ(got->size(), ref->size());
        const auto finite = [](double x) { return std::isfinite(x); };
        EXPECT_TRUE(std::all_of(got->begin(), got->end(), finite)) << name << " " << what;
        const double diff = max_abs_diff(*got, *ref);
        EXPECT_LE(diff, 1e-12) << name << " " << what;
        worst = std::max(worst, diff);
        compared += static_cast<int64_t>(got->size());
      }
    }
  EXPECT_GT(compared, 0);
  std::cout << "[attention] blocked vs materialised softmax (double): " << compared
            << " values, max |diff| " << worst << std::endl;
}

template <typename F>
void check_causality(int64_t T, int64_t t0) {
  const int64_t B = 2, NH = 2, HS = 16, C = NH * HS;
  std::mt19937_64 rng(9);
  auto qkv = random_vec<F>(rng, B * T * 3 * C, -2.0, 2.0);
  std::vector<F> out1(B * T * C), out2(B * T * C), lse(B * NH * T);
  attention_forward(out1.data(), lse.data(), qkv.data(), B, T, NH, NH, HS);
  for (int64_t j = 0; j < 3 * C; j++) qkv[(0 * T + t0) * 3 * C + j] += F(0.5);  // batch 0
  attention_forward(out2.data(), lse.data(), qkv.data(), B, T, NH, NH, HS);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      bool same = true;
      for (int64_t c = 0; c < C; c++)
        same = same && out1[(b * T + t) * C + c] == out2[(b * T + t) * C + c];
      if (b == 0 && t >= t0) {
        EXPECT_FALSE(same) << "t=" << t << " should see token " << t0;
      } else {
        EXPECT_TRUE(same) << "b=" << b << " t=" << t << " changed with token " << t0;
      }
    }
}

TEST(KernelsAttention, Causality) {
  check_causality<double>(5, 3);
  check_causality<float>(300, 150);  // several row blocks
  check_causality<float>(300, 0);
}

// ------------------------------------------------------ grouped-query attention (GQA)

// The multi-head kernel as it was before grouped-query attention (lib/kernels/cpu/attention.cpp
// at fd13173, only renamed), kept verbatim: the materialised-softmax kernel (probabilities
// [B,NH,T,T] saved) that the blocked online-softmax kernel replaced, whose results it must give
// up to rounding.
namespace pre_gqa {

constexpr int64_t kBlock = 128;

// row[0, len) <- softmax(row[0, len));  row[len, T) <- 0.  (Loops run to a length, not to
// `s <= t`, which GCC does not vectorise.)
template <typename T>
inline void causal_softmax_row(T* row, int64_t len, int64_t T_) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t s = 0; s < len; s++) mx = mx > row[s] ? mx : row[s];  // (std::max: scalar code)
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < len; s++) {
    const T e = trident::cpu::detail::exp_fast(row[s] - mx);
    row[s] = e;
    sum += e;
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (int64_t s = 0; s < len; s++) row[s] *= inv;
  std::fill(row + len, row + T_, T(0));
}

// Softmax backward of one row: d[s] <- p[s] * (d[s] - sum_s' p[s'] d[s']) for s < len, where d
// holds dP on entry and dS on exit; d[len, end) <- 0.
template <typename T>
inline void softmax_backward_row(T* d, const T* p, int64_t len, int64_t end) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t s = 0; s < len; s++) dot += p[s] * d[s];
#pragma omp simd
  for (int64_t s = 0; s < len; s++) d[s] = p[s] * (d[s] - dot);
  std::fill(d + len, d + end, T(0));
}

template <typename T>
void mha_forward(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t NH,
                       int64_t HS) {
  const int64_t C = NH * HS;
  const int64_t C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
  const int64_t blocks = (T_ + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < BH * blocks; task++) {
    const int64_t i = blocks - 1 - task / BH;  // largest (last) row blocks first
    const int64_t bh = task % BH;
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const int64_t r0 = i * kBlock;
    const int64_t r1 = std::min(T_, r0 + kBlock);
    const T* q = qkv + b * T_ * C3 + h * HS;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* P = att + bh * T_ * T_;
    // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
    gemm<T>(false, true, r1 - r0, r1, HS, scale, q + r0 * C3, C3, k, C3, T(0), P + r0 * T_, T_);
    for (int64_t t = r0; t < r1; t++) causal_softmax_row(P + t * T_, t + 1, T_);
    // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
    gemm<T>(false, false, r1 - r0, HS, r1, T(1), P + r0 * T_, T_, v, C3, T(0),
            out + (b * T_ + r0) * C + h * HS, C);
  }
}

// With G = dO (the output gradient):
//   dV = P^T G,   dP = G V^T,   dS = P * (dP - rowsum(P * dP))   (softmax backward),
//   dQ = scale * dS K,   dK = scale * dS^T Q.
// Phase 1 (tasks over row blocks i): dP and dS of rows [r0, r1) into scratch, then dQ rows.
// Phase 2 (tasks over column blocks j, after all of phase 1): dK and dV rows [c0, c1) need
// dS and P in rows t >= c0 of columns [c0, c1), i.e. row blocks i >= j.
template <typename T>
void mha_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                        int64_t B, int64_t T_, int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  const int64_t C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
  const int64_t blocks = (T_ + kBlock - 1) / kBlock;
  const int64_t BH = B * NH;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BH * blocks; task++) {
      const int64_t i = blocks - 1 - task / BH;
      const int64_t bh = task % BH;
      const int64_t b = bh / NH;
      const int64_t h = bh % NH;
      const int64_t r0 = i * kBlock;
      const int64_t r1 = std::min(T_, r0 + kBlock);
      const T* k = qkv + b * T_ * C3 + h * HS + C;
      const T* v = k + C;
      const T* g = dout + b * T_ * C + h * HS;
      const T* P = att + bh * T_ * T_;
      T* dS = scratch + bh * T_ * T_;
      T* dq = dqkv + b * T_ * C3 + h * HS;
      // dP[r0:r1, 0:r1] = G[r0:r1] V[0:r1]^T
      gemm<T>(false, true, r1 - r0, r1, HS, T(1), g + r0 * C, C, v, C3, T(0), dS + r0 * T_, T_);
      // dS; its masked entries up to column r1 are zeroed: the GEMMs below read them.
      for (int64_t t = r0; t < r1; t++) softmax_backward_row(dS + t * T_, P + t * T_, t + 1, r1);
      // dQ[r0:r1] = scale * dS[r0:r1, 0:r1] K[0:r1]
      gemm<T>(false, false, r1 - r0, HS, r1, scale, dS + r0 * T_, T_, k, C3, T(0), dq + r0 * C3,
              C3);
    }
    // (implicit barrier)
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BH * blocks; task++) {
      const int64_t j = task / BH;  // first column blocks have the most rows below them
      const int64_t bh = task % BH;
      const int64_t b = bh / NH;
      const int64_t h = bh % NH;
      const int64_t c0 = j * kBlock;
      const int64_t c1 = std::min(T_, c0 + kBlock);
      const T* q = qkv + b * T_ * C3 + h * HS;
      const T* g = dout + b * T_ * C + h * HS;
      const T* P = att + bh * T_ * T_;
      const T* dS = scratch + bh * T_ * T_;
      T* dk = dqkv + b * T_ * C3 + h * HS + C;
      T* dv = dk + C;
      // dK[c0:c1] = scale * dS[c0:T, c0:c1]^T Q[c0:T]
      gemm<T>(true, false, c1 - c0, HS, T_ - c0, scale, dS + c0 * T_ + c0, T_, q + c0 * C3, C3,
              T(0), dk + c0 * C3, C3);
      // dV[c0:c1] = P[c0:T, c0:c1]^T G[c0:T]
      gemm<T>(true, false, c1 - c0, HS, T_ - c0, T(1), P + c0 * T_ + c0, T_, g + c0 * C, C, T(0),
              dv + c0 * C3, C3);
    }
  }
}

}  // namespace pre_gqa

// Runs the GQA kernel forward and backward; returns {out, lse, dqkv}.
template <typename F>
std::vector<std::vector<F>> run_attention(const std::vector<F>& qkv, const std::vector<F>& dout,
                                          int64_t B, int64_t T, int64_t NH, int64_t KVH,
                                          int64_t HS) {
  auto out = nan_vec<F>(B * T * NH * HS), lse = nan_vec<F>(B * NH * T);
  auto dqkv = nan_vec<F>(qkv.size());
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, KVH,
                     HS);
  return {out, lse, dqkv};
}

// The blocked kernel with KVH == NH against the materialised-softmax MHA kernel it replaced, in
// float and double (they differ by rounding only: the online softmax rescales partial sums).
template <typename F>
void check_blocked_is_materialized_mha(int64_t T, double tol) {
  const int64_t B = 2, NH = 3, HS = 16, C = NH * HS;
  std::mt19937_64 rng(200 + T);
  auto qkv = random_vec<F>(rng, B * T * 3 * C, -2.0, 2.0);
  auto dout = random_vec<F>(rng, B * T * C);
  const auto blocked = run_attention(qkv, dout, B, T, NH, NH, HS);
  auto out = nan_vec<F>(B * T * C), att = nan_vec<F>(B * NH * T * T);
  auto dqkv = nan_vec<F>(qkv.size()), scratch = nan_vec<F>(att.size());
  pre_gqa::mha_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
  pre_gqa::mha_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T,
                        NH, HS);
  ASSERT_EQ(blocked[0].size(), out.size());
  ASSERT_EQ(blocked[2].size(), dqkv.size());
  for (const auto* v : {&blocked[0], &blocked[2]})
    EXPECT_TRUE(std::all_of(v->begin(), v->end(), [](F x) { return std::isfinite(x); }));
  const double d_out = max_abs_diff(blocked[0], out), d_dqkv = max_abs_diff(blocked[2], dqkv);
  EXPECT_LE(d_out, tol) << "out T=" << T;
  EXPECT_LE(d_dqkv, tol) << "dqkv T=" << T;
  std::cout << "[attention] " << (sizeof(F) == 4 ? "float " : "double") << " T=" << T
            << ": blocked vs materialised kernel, max |out diff| " << d_out << ", max |dqkv diff| "
            << d_dqkv << std::endl;
}

TEST(KernelsAttention, BlockedMatchesMaterializedMhaKernel) {
  for (int64_t T : {5, 128, 300}) {  // one, one full and three row blocks
    check_blocked_is_materialized_mha<float>(T, 1e-5);
    check_blocked_is_materialized_mha<double>(T, 1e-12);
  }
}

// GQA equals MHA on the qkv whose k and v heads are the GQA kv heads replicated to their query
// heads; the GQA k/v gradient of a kv head is the sum of the MHA ones over its query heads.
template <typename F>
void check_gqa_is_replicated_mha(int64_t T, int64_t NH, int64_t KVH, double tol) {
  const int64_t B = 2, HS = 16, G = NH / KVH, C = NH * HS;
  const int64_t CQ = (NH + 2 * KVH) * HS, C3 = 3 * C;
  std::mt19937_64 rng(300 + T + NH * 10 + KVH);
  auto qkv = random_vec<F>(rng, B * T * CQ, -2.0, 2.0);
  auto dout = random_vec<F>(rng, B * T * C);
  std::vector<F> rep(B * T * C3);
  for (int64_t n = 0; n < B * T; n++) {
    const F* src = &qkv[n * CQ];
    F* dst = &rep[n * C3];
    std::copy_n(src, C, dst);  // q
    for (int64_t h = 0; h < NH; h++) {
      std::copy_n(src + (NH + h / G) * HS, HS, dst + C + h * HS);            // k
      std::copy_n(src + (NH + KVH + h / G) * HS, HS, dst + 2 * C + h * HS);  // v
    }
  }
  const auto gqa = run_attention(qkv, dout, B, T, NH, KVH, HS);
  const auto mha = run_attention(rep, dout, B, T, NH, NH, HS);
  EXPECT_LE(max_abs_diff(gqa[0], mha[0]), tol) << "out";
  EXPECT_LE(max_abs_diff(gqa[1], mha[1]), tol) << "lse";
  // dq as is, dk/dv of kv head j = sum over h in group j in head order.
  std::vector<F> expect(B * T * CQ);
  for (int64_t n = 0; n < B * T; n++) {
    const F* d = &mha[2][n * C3];
    F* e = &expect[n * CQ];
    std::copy_n(d, C, e);
    for (int64_t j = 0; j < KVH; j++)
      for (int64_t i = 0; i < HS; i++) {
        F dk = 0, dv = 0;
        for (int64_t h = j * G; h < (j + 1) * G; h++) {
          dk += d[C + h * HS + i];
          dv += d[2 * C + h * HS + i];
        }
        e[(NH + j) * HS + i] = dk;
        e[(NH + KVH + j) * HS + i] = dv;
      }
  }
  const double diff = max_abs_diff(gqa[2], expect);
  EXPECT_LE(diff, tol) << "dqkv T=" << T << " NH=" << NH << " KVH=" << KVH;
  std::cout << "[gqa] " << (sizeof(F) == 4 ? "float " : "double") << " T=" << T << " NH=" << NH
            << " KVH=" << KVH << ": max |dqkv - replicated MHA group sums| " << diff
            << std::endl;
}

TEST(KernelsAttention, GqaEqualsMhaOnReplicatedKv) {
  for (int64_t T : {7, 300})
    for (auto [NH, KVH] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}, {6, 3}}) {
      check_gqa_is_replicated_mha<double>(T, NH, KVH, 1e-12);
      check_gqa_is_replicated_mha<float>(T, NH, KVH, 1e-5);
    }
}

// A token's k/v must not reach earlier queries of any head of its group.
TEST(KernelsAttention, GqaCausality) {
  const int64_t B = 1, T = 300, NH = 4, KVH = 2, HS = 16, CQ = (NH + 2 * KVH) * HS, C = NH * HS;
  const int64_t t0 = 150;
  std::mt19937_64 rng(19);
  auto qkv = random_vec<float>(rng, B * T * CQ, -2.0, 2.0);
  std::vector<float> out1(B * T * C), out2(B * T * C), lse(B * NH * T);
  attention_forward(out1.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS);
  for (int64_t j = 0; j < CQ; j++) qkv[t0 * CQ + j] += 0.5f;
  attention_forward(out2.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS);
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < NH; h++) {
      bool same = true;
      for (int64_t i = 0; i < HS; i++)
        same = same && out1[t * C + h * HS + i] == out2[t * C + h * HS + i];
      EXPECT_EQ(same, t < t0) << "t=" << t << " h=" << h;
    }
}

// ------------------------------------------------------------------------------- RoPE

// The Hugging Face Llama formula written out (modeling_llama.py, rotate_half convention):
//   inv_freq = 1 / theta^(arange(0, HS, 2) / HS);  freqs = outer(t, inv_freq);
//   emb = cat(freqs, freqs);  cos, sin = emb.cos(), emb.sin();
//   x_embed = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[HS/2:], x[:HS/2]).
// Applied to every q head and k head; v is left alone.
std::vector<double> rope_hf_reference(std::vector<double> qkv, int64_t B, int64_t T, int64_t NH,
                                      int64_t KVH, int64_t HS, double theta) {
  const int64_t half = HS / 2, CQ = (NH + 2 * KVH) * HS;
  std::vector<double> inv_freq(half);
  for (int64_t k = 0; k < half; k++) inv_freq[k] = 1.0 / std::pow(theta, double(2 * k) / HS);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      std::vector<double> cos(HS), sin(HS);
      for (int64_t d = 0; d < HS; d++) {
        const double emb = double(t) * inv_freq[d % half];  // cat(freqs, freqs)
        cos[d] = std::cos(emb);
        sin[d] = std::sin(emb);
      }
      for (int64_t h = 0; h < NH + KVH; h++) {
        double* x = &qkv[(b * T + t) * CQ + h * HS];
        std::vector<double> rot(HS), y(HS);
        for (int64_t d = 0; d < HS; d++) rot[d] = d < half ? -x[d + half] : x[d - half];
        for (int64_t d = 0; d < HS; d++) y[d] = x[d] * cos[d] + rot[d] * sin[d];
        std::copy(y.begin(), y.end(), x);
      }
    }
  return qkv;
}

TEST(KernelsRope, MatchesHuggingFaceFormula) {
  const int64_t B = 2, T = 64, NH = 4, KVH = 2, HS = 32, CQ = (NH + 2 * KVH) * HS;
  for (double theta : {10000.0, 500000.0}) {
    std::mt19937_64 rng(31);
    auto x = random_vec<double>(rng, B * T * CQ);
    const auto ref = rope_hf_reference(x, B, T, NH, KVH, HS, theta);
    auto d = x;
    rope_forward(d.data(), B, T, NH, KVH, HS, theta);
    std::vector<float> f(x.begin(), x.end());
    rope_forward(f.data(), B, T, NH, KVH, HS, theta);
    const double dd = max_abs_diff(d, ref);
    const double df = max_abs_diff(std::vector<double>(f.begin(), f.end()), ref);
    std::cout << "[rope] theta " << theta << ": max |kernel - HF formula| double " << dd
              << ", float " << df << std::endl;
    EXPECT_LE(dd, 1e-14);
    EXPECT_LE(df, 1e-6);
  }
}

TEST(KernelsRope, PairNormsKeptPositionZeroIdentityVUntouched) {
  const int64_t B = 2, T = 50, NH = 4, KVH = 1, HS = 16, half = HS / 2;
  const int64_t CQ = (NH + 2 * KVH) * HS;
  std::mt19937_64 rng(41);
  const auto x = random_vec<double>(rng, B * T * CQ);
  auto y = x;
  rope_forward(y.data(), B, T, NH, KVH, HS, 10000.0);
  double worst = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const int64_t row = (b * T + t) * CQ;
      for (int64_t h = 0; h < NH + KVH; h++)
        for (int64_t i = 0; i < half; i++) {
          const int64_t lo = row + h * HS + i, hi = lo + half;
          const double n0 = x[lo] * x[lo] + x[hi] * x[hi];
          const double n1 = y[lo] * y[lo] + y[hi] * y[hi];
          worst = std::max(worst, std::abs(n1 - n0) / n0);
          if (t == 0) {  // cos 0 = 1, sin 0 = 0: exactly the identity
            ASSERT_EQ(y[lo], x[lo]) << "b=" << b << " h=" << h << " i=" << i;
            ASSERT_EQ(y[hi], x[hi]) << "b=" << b << " h=" << h << " i=" << i;
          }
        }
      for (int64_t c = (NH + KVH) * HS; c < CQ; c++) ASSERT_EQ(y[row + c], x[row + c]) << "v";
    }
  std::cout << "[rope] max relative change of a pair's squared norm: " << worst << std::endl;
  EXPECT_LE(worst, 1e-14);
}

TEST(KernelsRope, BackwardUndoesForwardFloat) {
  // Long sequence and Llama's theta: large angles, where a float angle would lose digits.
  const int64_t B = 1, T = 4096, NH = 4, KVH = 2, HS = 64, CQ = (NH + 2 * KVH) * HS;
  std::mt19937_64 rng(43);
  const auto x = random_vec<float>(rng, B * T * CQ);
  auto y = x;
  rope_forward(y.data(), B, T, NH, KVH, HS, 10000.0);
  rope_backward(y.data(), B, T, NH, KVH, HS, 10000.0);
  const double d = max_abs_diff(x, y);
  std::cout << "[rope] float max |backward(forward(x)) - x|: " << d << std::endl;
  EXPECT_LE(d, 1e-6);
}

// ------------------------------------------------------------- residual add fused with norm

// The fused forms against the separate kernels, bit for bit: add_*norm_forward against
// add_inplace then the norm; the backward with add_to_dinp against the overwrite into a
// scratch then add_inplace (the weight and bias gradients as well). 70 rows: three chunks of
// the backward's weight-gradient partial sums.
template <typename T>
void check_fused_residual_norm(bool rms) {
  const int64_t N = 70, C = 200;
  const double eps = 1e-6;
  std::mt19937_64 rng(rms ? 61 : 67);
  const auto residual0 = random_vec<T>(rng, N * C, -2.0, 2.0);
  const auto x = random_vec<T>(rng, N * C, -2.0, 2.0);
  const auto w = random_vec<T>(rng, C, 0.5, 1.5), b = random_vec<T>(rng, C);
  const auto dout = random_vec<T>(rng, N * C), stream0 = random_vec<T>(rng, N * C);

  auto r_sep = residual0, r_fused = residual0;
  auto out_sep = nan_vec<T>(N * C), out_fused = nan_vec<T>(N * C);
  auto m_sep = nan_vec<T>(N), m_fused = nan_vec<T>(N), s_sep = nan_vec<T>(N),
       s_fused = nan_vec<T>(N);
  add_inplace(r_sep.data(), x.data(), N * C);
  if (rms) {
    rmsnorm_forward(out_sep.data(), s_sep.data(), r_sep.data(), w.data(), N, C, eps);
    add_rmsnorm_forward(out_fused.data(), s_fused.data(), r_fused.data(), x.data(), w.data(), N,
                        C, eps);
  } else {
    layernorm_forward(out_sep.data(), m_sep.data(), s_sep.data(), r_sep.data(), w.data(),
                      b.data(), N, C);
    add_layernorm_forward(out_fused.data(), m_fused.data(), s_fused.data(), r_fused.data(),
                          x.data(), w.data(), b.data(), N, C);
    EXPECT_TRUE(bitwise_equal(m_fused, m_sep));
  }
  EXPECT_TRUE(bitwise_equal(r_fused, r_sep));
  EXPECT_TRUE(bitwise_equal(out_fused, out_sep));
  EXPECT_TRUE(bitwise_equal(s_fused, s_sep));

  auto tmp = nan_vec<T>(N * C);
  auto d_sep = stream0, d_fused = stream0;
  std::vector<T> dw_sep(C, T(0.25)), db_sep(C, T(-0.5));
  auto dw_fused = dw_sep, db_fused = db_sep;
  if (rms) {
    rmsnorm_backward(tmp.data(), dw_sep.data(), dout.data(), r_sep.data(), w.data(),
                     s_sep.data(), N, C);
    rmsnorm_backward(d_fused.data(), dw_fused.data(), dout.data(), r_sep.data(), w.data(),
                     s_sep.data(), N, C, true);
  } else {
    layernorm_backward(tmp.data(), dw_sep.data(), db_sep.data(), dout.data(), r_sep.data(),
                       w.data(), m_sep.data(), s_sep.data(), N, C);
    layernorm_backward(d_fused.data(), dw_fused.data(), db_fused.data(), dout.data(),
                       r_sep.data(), w.data(), m_sep.data(), s_sep.data(), N, C, true);
  }
  add_inplace(d_sep.data(), tmp.data(), N * C);
  EXPECT_TRUE(bitwise_equal(d_fused, d_sep));
  EXPECT_TRUE(bitwise_equal(dw_fused, dw_sep));
  EXPECT_TRUE(bitwise_equal(db_fused, db_sep));
  EXPECT_FALSE(bitwise_equal(d_fused, stream0));  // the gradient did reach the stream
}

TEST(KernelsResidualNorm, FusedLayerNormEqualsTheSeparateKernels) {
  check_fused_residual_norm<float>(false);
  check_fused_residual_norm<double>(false);
}
TEST(KernelsResidualNorm, FusedRmsNormEqualsTheSeparateKernels) {
  check_fused_residual_norm<float>(true);
  check_fused_residual_norm<double>(true);
}

// ----------------------------------------------------------------------------- RMSNorm

// y(s x) = w x / sqrt(ms + eps / s^2): scale-invariant up to the eps term, whose relative
// effect is at most eps / (2 ms) |1 - 1/s^2|; with eps = 0 only rounding remains.
TEST(KernelsRmsNorm, RowScaleInvariance) {
  const int64_t N = 8, C = 64;
  std::mt19937_64 rng(51);
  const auto x = random_vec<double>(rng, N * C);
  const auto w = random_vec<double>(rng, C, 0.5, 1.5);
  for (double eps : {0.0, 1e-5})
    for (double s : {0.5, 3.0, 100.0}) {
      std::vector<double> xs(x), y(N * C), ys(N * C), r(N), rs(N);
      for (double& v : xs) v *= s;
      rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, eps);
      rmsnorm_forward(ys.data(), rs.data(), xs.data(), w.data(), N, C, eps);
      for (int64_t n = 0; n < N; n++) {
        double ms = 0;
        for (int64_t c = 0; c < C; c++) ms += x[n * C + c] * x[n * C + c] / C;
        const double bound = eps / (2 * ms) * std::abs(1 - 1 / (s * s)) * 1.01 + 1e-15;
        for (int64_t c = 0; c < C; c++) {
          const double a = y[n * C + c], b = ys[n * C + c];
          ASSERT_LE(std::abs(a - b), bound * std::abs(a) + 1e-15)
              << "eps=" << eps << " s=" << s << " n=" << n << " c=" << c;
        }
      }
    }
}

TEST(KernelsRmsNorm, MatchesDirectFormulaAndAccumulates) {
  const int64_t N = 5, C = 300;
  const double eps = 1e-6;
  std::mt19937_64 rng(53);
  const auto xd = random_vec<double>(rng, N * C, -3.0, 3.0);
  const auto wd = random_vec<double>(rng, C, 0.5, 1.5);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end());
  std::vector<float> y(N * C), r(N);
  rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, eps);
  double worst = 0;
  for (int64_t n = 0; n < N; n++) {
    double ms = 0;
    for (int64_t c = 0; c < C; c++) ms += double(x[n * C + c]) * x[n * C + c];
    const double rstd = 1.0 / std::sqrt(ms / C + eps);
    EXPECT_NEAR(r[n], rstd, 1e-7 * rstd);
    for (int64_t c = 0; c < C; c++) {
      const double ref = double(w[c]) * (double(x[n * C + c]) * rstd);
      worst = std::max(worst, std::abs(y[n * C + c] - ref) / std::max(std::abs(ref), 1e-3));
    }
  }
  EXPECT_LE(worst, 1e-6);
  // dweight accumulates, dinp is overwritten.
  const auto dout = random_vec<float>(rng, N * C);
  std::vector<float> dinp0(N * C, 0.f), dw1(C, 0.f);
  rmsnorm_backward(dinp0.data(), dw1.data(), dout.data(), x.data(), w.data(), r.data(), N, C);
  auto dinp = nan_vec<float>(N * C);
  auto dw2 = dw1;
  rmsnorm_backward(dinp.data(), dw2.data(), dout.data(), x.data(), w.data(), r.data(), N, C);
  EXPECT_TRUE(bitwise_equal(dinp, dinp0));
  for (int64_t c = 0; c < C; c++) EXPECT_EQ(dw2[c], 2 * dw1[c]) << c;  // x + x is exact
}

// ------------------------------------------------------------------------------ SwiGLU

// Reference values from silu(a) = a / (1 + exp(-a)) in double, including saturated gates.
template <typename T>
void check_swiglu_reference(double tol) {
  const int64_t N = 3, Fh = 40;
  std::mt19937_64 rng(61);
  auto gu = random_vec<T>(rng, N * 2 * Fh, -6.0, 6.0);
  const double extremes[] = {-100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0};
  for (int64_t i = 0; i < int64_t(std::size(extremes)); i++) gu[i] = T(extremes[i]);
  const auto dout = random_vec<T>(rng, N * Fh);
  auto out = nan_vec<T>(N * Fh), dgu = nan_vec<T>(N * 2 * Fh);
  swiglu_forward(out.data(), gu.data(), N, Fh);
  swiglu_backward(dgu.data(), dout.data(), gu.data(), N, Fh);
  double worst = 0;
  const auto check = [&](double got, double ref, const char* what, int64_t i) {
    const double err = std::abs(got - ref) / std::max(std::abs(ref), 1.0);
    worst = std::max(worst, err);
    EXPECT_LE(err, tol) << what << " " << i << " got " << got << " ref " << ref;
  };
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < Fh; i++) {
      const double a = gu[n * 2 * Fh + i], u = gu[n * 2 * Fh + Fh + i], g = dout[n * Fh + i];
      const double sig = 1.0 / (1.0 + std::exp(-a));
      const double silu = a / (1.0 + std::exp(-a));
      check(out[n * Fh + i], silu * u, "out", n * Fh + i);
      check(dgu[n * 2 * Fh + i], g * u * (sig + a * sig * (1.0 - sig)), "dgate", n * Fh + i);
      check(dgu[n * 2 * Fh + Fh + i], g * silu, "dup", n * Fh + i);
    }
  std::cout << "[swiglu] " << (sizeof(T) == 4 ? "float " : "double")
            << " max err vs direct formula (relative, absolute below 1): " << worst << std::endl;
}

TEST(KernelsSwiglu, MatchesDirectFormula) {
  check_swiglu_reference<double>(1e-14);
  check_swiglu_reference<float>(1e-6);
}

// -------------------------------------------------- accumulate (params) / overwrite (acts)

TEST(KernelsConventions, ParamGradsAccumulateActivationGradsOverwrite) {
  std::mt19937_64 rng(21);
  const int64_t B = 2, T = 6, C = 16, NH = 2, HS = 8, OC = 24, N = B * T;
  auto dout = random_vec<double>(rng, N * C);
  const auto twice = [](const std::vector<double>& once, const std::vector<double>& two,
                        const char* what) {
    for (size_t i = 0; i < once.size(); i++)
      ASSERT_NEAR(two[i], 2 * once[i], 1e-13 * (1 + std::abs(once[i]))) << what << " " << i;
  };
  {  // token embedding
    const std::vector<int32_t> ids{0, 1, 2, 3, 3, 3, 1, 0, 5, 6, 2, 2};
    std::vector<double> d1(7 * C, 0.0);
    token_embedding_backward(d1.data(), dout.data(), ids.data(), N, C, 0, 7);
    auto d2 = d1;
    token_embedding_backward(d2.data(), dout.data(), ids.data(), N, C, 0, 7);
    twice(d1, d2, "dwte");
  }
  {  // position embedding
    std::vector<double> d1(T * C, 0.0);
    position_embedding_backward(d1.data(), dout.data(), B, T, C);
    auto d2 = d1;
    position_embedding_backward(d2.data(), dout.data(), B, T, C);
    twice(d1, d2, "dwpe");
  }
  {  // layernorm
    auto inp = random_vec<double>(rng, N * C), w = random_vec<double>(rng, C),
         bias = random_vec<double>(rng, C);
    std::vector<double> out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias.data(),
                      N, C);
    std::vector<double> dinp0(N * C, 0.0), dw1(C, 0.0), db1(C, 0.0);
    layernorm_backward(dinp0.data(), dw1.data(), db1.data(), dout.data(), inp.data(), w.data(),
                       mean.data(), rstd.data(), N, C);
    auto dinp = nan_vec<double>(N * C);
    auto dw2 = dw1, db2 = db1;
    layernorm_backward(dinp.data(), dw2.data(), db2.data(), dout.data(), inp.data(), w.data(),
                       mean.data(), rstd.data(), N, C);
    twice(dw1, dw2, "ln dweight");
    twice(db1, db2, "ln dbias");
    EXPECT_TRUE(bitwise_equal(dinp, dinp0));
  }
  {  // linear
    auto inp = random_vec<double>(rng, N * C), w = random_vec<double>(rng, OC * C);
    auto g = random_vec<double>(rng, N * OC);
    std::vector<double> dinp0(N * C, 0.0), dw1(OC * C, 0.0), db1(OC, 0.0);
    linear_backward(dinp0.data(), dw1.data(), db1.data(), g.data(), inp.data(), w.data(), N, C,
                    OC);
    auto dinp = nan_vec<double>(N * C);
    auto dw2 = dw1, db2 = db1;
    linear_backward(dinp.data(), dw2.data(), db2.data(), g.data(), inp.data(), w.data(), N, C,
                    OC);
    twice(dw1, dw2, "linear dweight");
    twice(db1, db2, "linear dbias");
    EXPECT_TRUE(bitwise_equal(dinp, dinp0));
    // dinp == nullptr and dbias == nullptr are skipped; dweight still accumulates.
    auto dw3 = dw1;
    linear_backward<double>(nullptr, dw3.data(), nullptr, g.data(), inp.data(), w.data(), N, C,
                            OC);
    twice(dw1, dw3, "linear dweight (no dinp, no dbias)");
  }
  {  // attention: dqkv overwritten
    auto qkv = random_vec<double>(rng, N * 3 * C);
    std::vector<double> out(N * C), lse(B * NH * T), dq0(N * 3 * C, 0.0);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS);
    attention_backward(dq0.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NH,
                       HS);
    auto dq = nan_vec<double>(N * 3 * C);
    attention_backward(dq.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NH,
                       HS);
    EXPECT_TRUE(bitwise_equal(dq, dq0));
  }
  {  // gelu
    auto x = random_vec<double>(rng, N * C, -3.0, 3.0);
    std::vector<double> d0(N * C, 0.0);
    gelu_backward(d0.data(), x.data(), dout.data(), N * C);
    auto d = nan_vec<double>(N * C);
    gelu_backward(d.data(), x.data(), dout.data(), N * C);
    EXPECT_TRUE(bitwise_equal(d, d0));
  }
}

// ------------------------------------------------------------------------- determinism

// Runs every float kernel (forward and backward) at a moderate size and returns all outputs.
std::vector<std::vector<float>> run_all_float() {
  const int64_t B = 2, T = 200, NH = 4, HS = 16, C = NH * HS, N = B * T, OC = 3 * C;
  const int64_t V = 3000, vocab_size = 2990;
  std::mt19937_64 rng(77);
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; n++) ids[n] = static_cast<int32_t>((n * 7) % 50);  // repeats
  auto wte = random_vec<float>(rng, 50 * C), wpe = random_vec<float>(rng, T * C);
  auto lnw = random_vec<float>(rng, C), lnb = random_vec<float>(rng, C);
  auto w = random_vec<float>(rng, OC * C), bias = random_vec<float>(rng, OC);
  auto dres = random_vec<float>(rng, N * C);
  auto logits = random_vec<float>(rng, N * V, -5.0, 5.0);
  auto dloss = random_vec<float>(rng, N, 0.0, 1.0 / N);

  std::vector<std::vector<float>> r;
  std::vector<float> x(N * C);
  token_embedding_forward(x.data(), ids.data(), wte.data(), N, C, 0, 50);
  position_embedding_forward(x.data(), wpe.data(), B, T, C);
  std::vector<float> ln(N * C), mean(N), rstd(N);
  layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), N, C);
  std::vector<float> qkv(N * OC);
  linear_forward(qkv.data(), ln.data(), w.data(), bias.data(), N, C, OC);
  std::vector<float> y(N * C), att(B * NH * T);  // att: the saved row log-sum-exp
  attention_forward(y.data(), att.data(), qkv.data(), B, T, NH, NH, HS);
  std::vector<float> gl(N * C), res(N * C);
  gelu_forward(gl.data(), y.data(), N * C);
  add_forward(res.data(), gl.data(), x.data(), N * C);
  r.insert(r.end(), {x, ln, mean, rstd, qkv, y, att, gl, res});

  std::vector<float> dy(N * C);
  gelu_backward(dy.data(), y.data(), dres.data(), N * C);
  std::vector<float> dqkv(N * OC);
  attention_backward(dqkv.data(), dy.data(), qkv.data(), y.data(), att.data(), B, T, NH, NH, HS);
  std::vector<float> dln(N * C), dw(OC * C, 0.f), db(OC, 0.f);
  linear_backward(dln.data(), dw.data(), db.data(), dqkv.data(), ln.data(), w.data(), N, C, OC);
  std::vector<float> dx(N * C), dlnw(C, 0.f), dlnb(C, 0.f);
  layernorm_backward(dx.data(), dlnw.data(), dlnb.data(), dln.data(), x.data(), lnw.data(),
                     mean.data(), rstd.data(), N, C);
  add_inplace(dx.data(), dres.data(), N * C);
  std::vector<float> dwte(50 * C, 0.f), dwpe(T * C, 0.f);
  token_embedding_backward(dwte.data(), dx.data(), ids.data(), N, C, 0, 50);
  position_embedding_backward(dwpe.data(), dx.data(), B, T, C);
  r.insert(r.end(), {dy, dqkv, dln, dw, db, dx, dlnw, dlnb, dwte, dwpe});

  std::vector<float> row_max(N), sums(2 * N), losses(N);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; n++) targets[n] = static_cast<int32_t>((n * 13) % vocab_size);
  cross_entropy_local_max(row_max.data(), logits.data(), N, V, 0, vocab_size);
  cross_entropy_local_sums(sums.data(), logits.data(), targets.data(), row_max.data(), N, V, 0,
                           vocab_size);
  cross_entropy_loss(losses.data(), row_max.data(), sums.data(), N);
  cross_entropy_backward(logits.data(), logits.data(), targets.data(), row_max.data(),
                         sums.data(), dloss.data(), N, V, 0, vocab_size);
  r.insert(r.end(), {row_max, sums, losses, logits});
  return r;
}

const char* const kOutputNames[] = {
    "x",     "ln",   "mean", "rstd", "qkv",  "attn_out", "att",  "gelu",  "res",    "dy",
    "dqkv",  "dln",  "dw",   "db",   "dx",   "dlnw",     "dlnb", "dwte",  "dwpe",   "row_max",
    "sums",  "loss", "dlogits"};

// A linear layer's weight gradient against the sums written out: the scale on the product
// (dweight_scale) and the accumulation onto what dweight held, for layers wider out than in,
// narrower, and square.
template <typename T>
void weight_gradient_against_the_sums(double tolerance) {
  std::mt19937_64 rng(29);
  for (const auto& [N, C, OC] : {std::tuple<int64_t, int64_t, int64_t>{7, 520, 2100},
                                 {5, 19, 37}, {6, 37, 19}, {3, 40, 40}}) {
    const auto inp = random_vec<T>(rng, N * C), g = random_vec<T>(rng, N * OC);
    const auto w = random_vec<T>(rng, OC * C), held = random_vec<T>(rng, OC * C);
    auto dw = held;
    linear_backward<T>(nullptr, dw.data(), nullptr, g.data(), inp.data(), w.data(), N, C, OC,
                       T(1), T(0.5));
    double worst = 0;
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < C; ++c) {
        double sum = 0;
        for (int64_t n = 0; n < N; ++n)
          sum += static_cast<double>(g[n * OC + o]) * static_cast<double>(inp[n * C + c]);
        const double want = static_cast<double>(held[o * C + c]) + 0.5 * sum;
        worst = std::max(worst, std::abs(static_cast<double>(dw[o * C + c]) - want));
      }
    EXPECT_LE(worst, tolerance) << "N " << N << " C " << C << " OC " << OC;
  }
}
TEST(KernelsLinear, WeightGradientIsTheSumsOnBothSidesFloat) {
  weight_gradient_against_the_sums<float>(1e-5);
}
TEST(KernelsLinear, WeightGradientIsTheSumsOnBothSidesDouble) {
  weight_gradient_against_the_sums<double>(1e-13);
}

TEST(KernelsDeterminism, FloatTwoThreadsBitwiseReproducible) {
  ThreadCount threads(2);
  ASSERT_EQ(num_threads(), 2);
  const auto a = run_all_float();
  const auto b = run_all_float();
  ASSERT_EQ(a.size(), std::size(kOutputNames));
  int differing = 0;
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_TRUE(bitwise_equal(a[i], b[i])) << kOutputNames[i];
    differing += !bitwise_equal(a[i], b[i]);
  }
  std::cout << "[determinism] 2 threads, two calls: " << a.size() - differing << "/" << a.size()
            << " outputs bitwise identical" << std::endl;
}

// Everything except the multithreaded OpenBLAS GEMMs of the linear layer (and what depends
// on them) is also independent of the thread count: fixed row chunks, column-parallel sums,
// and single-threaded GEMMs inside the attention tasks.
TEST(KernelsDeterminism, ThreadCountIndependentWhereDesigned) {
  std::vector<std::vector<float>> one, two;
  {
    ThreadCount threads(1);
    one = run_all_float();
  }
  {
    ThreadCount threads(2);
    two = run_all_float();
  }
  int same = 0;
  for (size_t i = 0; i < one.size(); i++) same += bitwise_equal(one[i], two[i]);
  std::cout << "[determinism] 1 vs 2 threads: " << same << "/" << one.size()
            << " outputs bitwise identical" << std::endl;
  // Kernels fed only by thread-count independent inputs.
  for (const char* name : {"x", "ln", "mean", "rstd", "row_max", "sums", "loss", "dlogits"}) {
    const size_t i = std::find_if(std::begin(kOutputNames), std::end(kOutputNames),
                                  [&](const char* s) { return std::strcmp(s, name) == 0; }) -
                     std::begin(kOutputNames);
    EXPECT_TRUE(bitwise_equal(one[i], two[i])) << name;
  }
  // Same for attention, layernorm backward and the embedding backwards on fixed inputs.
  const int64_t B = 2, T = 260, NH = 3, HS = 16, C = NH * HS, N = B * T;
  std::mt19937_64 rng(8);
  auto qkv = random_vec<float>(rng, N * 3 * C), dout = random_vec<float>(rng, N * C);
  auto inp = random_vec<float>(rng, N * C), w = random_vec<float>(rng, C);
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; n++) ids[n] = static_cast<int32_t>(n % 17);
  const auto run = [&] {
    std::vector<std::vector<float>> r;
    std::vector<float> out(N * C), att(B * NH * T), dqkv(N * 3 * C);  // att: the saved lse
    attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, NH, HS);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(), B, T, NH, NH,
                       HS);
    std::vector<float> ln(N * C), mean(N), rstd(N), dinp(N * C), dw(C, 0.f), db(C, 0.f);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), inp.data(), w.data(), w.data(), N, C);
    layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                       mean.data(), rstd.data(), N, C);
    std::vector<float> dwte(17 * C, 0.f), dwpe(T * C, 0.f);
    token_embedding_backward(dwte.data(), dout.data(), ids.data(), N, C, 0, 17);
    position_embedding_backward(dwpe.data(), dout.data(), B, T, C);
    r.insert(r.end(), {out, att, dqkv, dinp, dw, db, dwte, dwpe});
    return r;
  };
  std::vector<std::vector<float>> three;
  {
    ThreadCount threads(1);
    one = run();
  }
  {
    ThreadCount threads(2);
    two = run();
  }
  {
    ThreadCount threads(3);  // an odd count: another split of the attention tasks
    three = run();
  }
  const char* names[] = {"attn out", "att", "dqkv", "ln dinp", "ln dw", "ln db", "dwte", "dwpe"};
  ASSERT_EQ(one.size(), std::size(names));
  for (size_t i = 0; i < one.size(); i++) {
    EXPECT_TRUE(bitwise_equal(one[i], two[i])) << names[i] << " (1 vs 2 threads)";
    EXPECT_TRUE(bitwise_equal(one[i], three[i])) << names[i] << " (1 vs 3 threads)";
  }
}

// The Llama kernels (GQA attention, RoPE, RMSNorm, SwiGLU) give the same bits for 1 and 2
// threads (and 5) and for two calls: static partitions, fixed chunking, one attention task per
// (batch, kv head) in the backward.
TEST(KernelsDeterminism, LlamaKernelsThreadCountIndependent) {
  const int64_t B = 2, T = 260, NH = 4, KVH = 2, HS = 16, CQ = (NH + 2 * KVH) * HS;
  const int64_t N = B * T, C = NH * HS, Fh = 96;
  std::mt19937_64 rng(88);
  const auto qkv0 = random_vec<float>(rng, N * CQ), dout = random_vec<float>(rng, N * C);
  const auto w = random_vec<float>(rng, C), gu = random_vec<float>(rng, N * 2 * Fh, -4.0, 4.0);
  const auto dsw = random_vec<float>(rng, N * Fh);
  const auto run = [&] {
    auto qkv = qkv0;
    rope_forward(qkv.data(), B, T, NH, KVH, HS, 10000.0);
    auto r = run_attention(qkv, dout, B, T, NH, KVH, HS);
    auto dqkv = r[2];
    rope_backward(dqkv.data(), B, T, NH, KVH, HS, 10000.0);
    std::vector<float> y(N * C), rstd(N), dx(N * C), dw(C, 0.f);
    rmsnorm_forward(y.data(), rstd.data(), r[0].data(), w.data(), N, C, 1e-5);
    rmsnorm_backward(dx.data(), dw.data(), dout.data(), r[0].data(), w.data(), rstd.data(), N, C);
    std::vector<float> o(N * Fh), dgu(N * 2 * Fh);
    swiglu_forward(o.data(), gu.data(), N, Fh);
    swiglu_backward(dgu.data(), dsw.data(), gu.data(), N, Fh);
    r.insert(r.end(), {qkv, dqkv, y, rstd, dx, dw, o, dgu});
    return r;
  };
  std::vector<std::vector<float>> one, two, again, five;
  {
    ThreadCount threads(1);
    one = run();
  }
  {
    ThreadCount threads(2);
    two = run();
    again = run();
  }
  {
    ThreadCount threads(5);  // more threads than the attention backward's B * KVH = 4 tasks
    five = run();
  }
  const char* names[] = {"attn out", "att",        "dqkv",       "rope qkv",
                         "rope dqkv", "rmsnorm y",  "rmsnorm rstd", "rmsnorm dx",
                         "rmsnorm dw", "swiglu out", "swiglu dgu"};
  ASSERT_EQ(one.size(), std::size(names));
  for (size_t i = 0; i < one.size(); i++) {
    EXPECT_TRUE(bitwise_equal(one[i], two[i])) << names[i] << " (1 vs 2 threads)";
    EXPECT_TRUE(bitwise_equal(two[i], again[i])) << names[i] << " (two calls)";
    EXPECT_TRUE(bitwise_equal(one[i], five[i])) << names[i] << " (1 vs 5 threads)";
  }
}

TEST(KernelsThreads, SetAndGet) {
  ThreadCount threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
}

// --------------------------------------------------------------------------- vector exp

TEST(KernelsVecMath, FastExpAccuracy) {
  double worst = 0;
  const int64_t n = 2000001;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; i++) x[i] = -87.0f + 175.3f * float(i) / float(n - 1);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = trident::cpu::detail::exp_fast(x[i]);
  for (int64_t i = 0; i < n; i++) {
    const double ref = std::exp(double(x[i]));
    worst = std::max(worst, std::abs(y[i] - ref) / ref);
  }
  std::cout << "[exp_fast] max rel err over [-87, 88.3]: " << worst << std::endl;
  EXPECT_LE(worst, 3e-7);  // ~2.5 ulp
  EXPECT_EQ(trident::cpu::detail::exp_fast(-88.0f), 0.0f);
  EXPECT_EQ(trident::cpu::detail::exp_fast(-1e30f), 0.0f);
  EXPECT_EQ(trident::cpu::detail::exp_fast(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(trident::cpu::detail::exp_fast(1e30f)));
  EXPECT_TRUE(std::isnan(trident::cpu::detail::exp_fast(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace

// An OpenMP `if` clause without a directive name on a combined `parallel for simd` applies to
// the simd construct too (OpenMP 5.0), and a false one makes the loop scalar: the GELU and
// residual kernels ran 10-12x slower below their threading threshold until they said
// `if (parallel : ...)`. Every such pragma of the CPU kernels' sources names `parallel`.
TEST(KernelsSource, ParallelForSimdIfClausesNameParallel) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(TRIDENT_SOURCE_DIR) / "lib" / "kernels" / "cpu";
  const std::regex combined(R"(#\s*pragma\s+omp\s+parallel\s+for\s+simd\b)");
  const std::regex bare_if(R"(\bif\s*\((?!\s*parallel\s*:))");
  int pragmas = 0, with_if = 0;
  std::vector<std::string> bad;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp") continue;
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (!std::regex_search(line, combined)) continue;
      ++pragmas;
      if (line.find(" if") != std::string::npos) ++with_if;
      if (std::regex_search(line, bare_if))
        bad.push_back(e.path().filename().string() + ":" + std::to_string(n) + ": " + line);
    }
  }
  EXPECT_GE(pragmas, 4) << "the GELU and residual kernels' pragmas were not found in " << dir;
  EXPECT_GE(with_if, 4);
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

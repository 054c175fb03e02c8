// The CPU's bf16 GEMM (kernels/cpu/bf16_gemm.hpp) against a double-precision reference on the
// bf16-rounded inputs, for every transposition, beta 0 and 1, odd sizes and padded leading
// dimensions; the rounding (nearest even, NaN kept) bit for bit; the refusal without the
// instructions. On a core without AVX512-BF16 or AMX the product cases are skipped (with the
// reason), and the refusal case checks the error line instead.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/ops.hpp"
#include "run_util.hpp"
#include "util/bf16.hpp"

namespace trident::cpu {
namespace {

#define SKIP_WITHOUT_BF16()                                                          \
  if (!bf16_gemm_available()) GTEST_SKIP() << "no bf16 GEMM on this core: " <<       \
                                 bf16_gemm_description()

float rounded(float x) { return bf16_to_float(float_to_bf16(x)); }

// A row-major matrix of rows x cols in an array with leading dimension ld >= cols; the padding
// holds a sentinel that no product may read into C or overwrite.
struct Matrix {
  int64_t rows, cols, ld;
  std::vector<float> v;
  Matrix(int64_t r, int64_t c, int64_t pad, float fill = 0.0f)
      : rows(r), cols(c), ld(c + pad), v(static_cast<size_t>(r * (c + pad)), 1e30f) {
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) at(i, j) = fill;
  }
  float& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * ld + j)]; }
  float at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * ld + j)]; }
};

// Random values that are not bf16 values (24 significant bits): the rounding matters.
Matrix random_matrix(int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Matrix m(rows, cols, pad);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m.at(i, j) = u(rng);
  return m;
}

struct Comparison {
  int64_t compared = 0;
  int64_t failed = 0;
  double worst_ratio = 0.0;  // max |C - ref| / bound
  double worst_abs = 0.0;
};

// C = alpha op(A) op(B) + beta C0 checked element by element against the double sum of the
// products of the RNE-rounded inputs. Bound, per element: the products of two bf16 values
// (8-bit significands) have at most 16 significant bits, so every product is exact in fp32;
// what is left is fp32 addition. oneDNN adds the K products (AVX512-BF16's vdpbf16ps two at
// a time into an fp32 accumulator, AMX's tdpbf16ps likewise, blocks of K summed in fp32) and
// then alpha's scaling and beta C0's addition: at most K + 1 roundings of relative size
// u = 2^-24 in any order, and the classic bound for a sum in any order is
//   |C - ref| <= gamma_{K+1} (|alpha| sum_k |a_k||b_k| + |beta||C0|),
//   gamma_n = n u / (1 - n u).
// Both instructions flush denormals to zero, which the bound does not cover: the inputs here
// are in [-1, 1] away from the denormal range, and so are the products.
// With a bias ([1, N]): alpha (sum + bias_j) + beta C0, one more addition (K + 2 roundings).
Comparison compare(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const Matrix& A, const Matrix& B, float beta, const Matrix& C0,
                   const Matrix& C, const Matrix* bias = nullptr) {
  const double u = std::ldexp(1.0, -24);
  const double n = static_cast<double>(K + (bias ? 2 : 1));
  const double gamma = n * u / (1.0 - n * u);
  Comparison out;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = rounded(ta ? A.at(k, i) : A.at(i, k));
        const double b = rounded(tb ? B.at(j, k) : B.at(k, j));
        ref += a * b;
        mag += std::fabs(a * b);
      }
      if (bias) {
        ref += bias->at(0, j);
        mag += std::fabs(bias->at(0, j));
      }
      const double c0 = beta == 0.0f ? 0.0 : static_cast<double>(C0.at(i, j));
      ref = alpha * ref + beta * c0;
      const double bound = gamma * (std::fabs(alpha) * mag + std::fabs(beta * c0));
      const double err = std::fabs(static_cast<double>(C.at(i, j)) - ref);
      if (!(err <= bound) && ++out.failed <= 5)
        ADD_FAILURE() << "C(" << i << "," << j << ") = " << C.at(i, j) << ", reference " << ref
                      << ", error " << err << " > bound " << bound;
      out.worst_abs = std::max(out.worst_abs, err);
      out.worst_ratio = std::max(out.worst_ratio, bound > 0 ? err / bound : 0.0);
      ++out.compared;
    }
  EXPECT_EQ(out.failed, 0) << "elements outside the bound";
  // C's padding is not written.
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < C.ld; ++j) EXPECT_EQ(C.at(i, j), 1e30f) << i << "," << j;
  return out;
}

struct Case {
  int64_t M, N, K;
  int64_t pad_a, pad_b, pad_c;
};

// Odd sizes (none a multiple of 16, the vector and tile widths), one row or column, K longer
// than oneDNN's K blocks, and K longer than one call's sum (kMaxProductK = 8192: an NN product
// is cut into pieces added to C, 17001 into 5696 + 5696 + 5609; 9000 into two); paddings of the
// leading dimensions from 0 to 13. oneDNN 2.6
// runs a dense C (no padding) on its brgemm kernels (brg:avx512_core_bf16 on an AVX512-BF16
// core) and a padded one on its bf16 GEMM (gemm:jit): both are reached (ONEDNN_VERBOSE=1).
const Case kCases[] = {
    {37, 53, 71, 5, 3, 7},  {67, 97, 45, 0, 0, 0},  {1, 129, 33, 2, 11, 1},
    {130, 1, 17, 13, 1, 4}, {19, 23, 301, 1, 2, 3}, {101, 83, 607, 3, 0, 0},
    {7, 9, 17001, 1, 2, 0}, {33, 20, 9000, 0, 0, 3},
};

// Case c's operands, random: op(A) M x K and op(B) K x N, each stored transposed where ta, tb
// say (A drawn first, then B).
struct Operands {
  Matrix A, B;
};
Operands random_operands(const Case& c, bool ta, bool tb, std::mt19937& rng) {
  Matrix A = ta ? random_matrix(c.K, c.M, c.pad_a, rng) : random_matrix(c.M, c.K, c.pad_a, rng);
  Matrix B = tb ? random_matrix(c.N, c.K, c.pad_b, rng) : random_matrix(c.K, c.N, c.pad_b, rng);
  return {std::move(A), std::move(B)};
}

TEST(Bf16Gemm, MatchesReferenceForEveryTranspositionAndBeta) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(55);
  Comparison all;
  for (const Case& c : kCases)
    for (int t = 0; t < 4; ++t)
      for (float beta : {0.0f, 1.0f})
        for (float alpha : {1.0f, -0.75f}) {
          const bool ta = t & 1, tb = t & 2;
          const auto [A, B] = random_operands(c, ta, tb, rng);
          Matrix C0 = random_matrix(c.M, c.N, c.pad_c, rng);
          // With beta 0 C's old contents are not read: NaN there must not reach the result.
          if (beta == 0.0f) C0.at(0, 0) = std::numeric_limits<float>::quiet_NaN();
          Matrix C = C0;
          gemm_bf16(ta, tb, c.M, c.N, c.K, alpha, A.v.data(), A.ld, B.v.data(), B.ld, beta,
                    C.v.data(), C.ld);
          SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.N) + "x" +
                       std::to_string(c.K) + (ta ? " T" : " N") + (tb ? "T" : "N") +
                       " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta));
          const Comparison r = compare(ta, tb, c.M, c.N, c.K, alpha, A, B, beta, C0, C);
          all.compared += r.compared;
          all.worst_ratio = std::max(all.worst_ratio, r.worst_ratio);
          all.worst_abs = std::max(all.worst_abs, r.worst_abs);
        }
  EXPECT_GT(all.compared, 0);
  std::printf("compared %lld elements; worst |error| %.3g, %.3f of the bound\n",
              static_cast<long long>(all.compared), all.worst_abs, all.worst_ratio);
}

// With B the identity, C = op(A) exactly (one exact product and zeros per element): the
// result shows how each element of A was rounded, bit for bit. Likewise B with A = I.
TEST(Bf16Gemm, InputsAreRoundedToNearestEven) {
  SKIP_WITHOUT_BF16();
  // 1 + f 2^-7 for fractions f of bf16's last place: below, at and above the half (ties go to
  // the even neighbour: 1 + 0.5 ulp -> 1, 1 + 1.5 ulp -> 1 + 2 ulp), negative ones too.
  std::vector<float> values;
  for (float f : {0.25f, 0.5f, 0.75f, 1.5f, 2.5f, 0.49f, 0.51f, 3.99f})
    for (float s : {1.0f, -1.0f}) values.push_back(s * (1.0f + f * std::ldexp(1.0f, -7)));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  while (values.size() < 64) values.push_back(u(rng));
  const int64_t n = 8;  // 8 x 8
  int64_t checked = 0, differs_from_truncation = 0;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    for (bool on_a : {true, false}) {
      Matrix X(n, n, 3), I(n, n, 1), C(n, n, 2);
      for (int64_t i = 0; i < n; ++i) {
        I.at(i, i) = 1.0f;
        for (int64_t j = 0; j < n; ++j) X.at(i, j) = values[static_cast<size_t>(i * n + j)];
      }
      const Matrix& A = on_a ? X : I;
      const Matrix& B = on_a ? I : X;
      gemm_bf16(ta, tb, n, n, n, 1.0f, A.v.data(), A.ld, B.v.data(), B.ld, 0.0f, C.v.data(),
                C.ld);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          // C(i, j) = op(X)(i, j) with op(X) = X^T when X is the transposed operand.
          const bool trans = on_a ? ta : tb;
          const float x = trans ? X.at(j, i) : X.at(i, j);
          EXPECT_EQ(std::bit_cast<uint32_t>(C.at(i, j)), std::bit_cast<uint32_t>(rounded(x)))
              << "op(" << (on_a ? "A" : "B") << ")(" << i << "," << j << ") = " << x;
          const float truncated = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u);
          differs_from_truncation += rounded(x) != truncated;
          ++checked;
        }
    }
  }
  // The check can tell nearest-even from truncation: many of the values round up.
  EXPECT_GT(checked, 0);
  EXPECT_GT(differs_from_truncation, checked / 4);
}

TEST(Bf16Gemm, NaNInputStaysNaN) {
  SKIP_WITHOUT_BF16();
  // A NaN whose payload is only in the low 16 bits: truncated, or rounded with a carry, it
  // would become an infinity and then inf * 0 = NaN would still pass; so B has no zeros.
  Matrix A(2, 3, 0, 0.5f), B(3, 2, 0, 0.25f), C(2, 2, 0);
  A.at(1, 2) = std::bit_cast<float>(0x7f800001u);
  gemm_bf16(false, false, 2, 2, 3, 1.0f, A.v.data(), A.ld, B.v.data(), B.ld, 0.0f, C.v.data(),
            C.ld);
  EXPECT_EQ(C.at(0, 0), 0.375f);
  EXPECT_EQ(C.at(0, 1), 0.375f);
  EXPECT_TRUE(std::isnan(C.at(1, 0)));
  EXPECT_TRUE(std::isnan(C.at(1, 1)));
}

// The bias added in the product's epilogue (the linear layers' forward), for every
// transposition and beta, a padded C, and a K cut into pieces (the bias added once): within
// the bound of the sum with one more term; with K = 0, C = alpha bias + beta C.
TEST(Bf16Gemm, BiasInTheEpilogue) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(7);
  Comparison all;
  for (const Case& c : kCases)
    for (int t = 0; t < 4; ++t)
      for (float beta : {0.0f, 1.0f}) {
        const bool ta = t & 1, tb = t & 2;
        const auto [A, B] = random_operands(c, ta, tb, rng);
        const Matrix bias = random_matrix(1, c.N, 0, rng);
        const Matrix C0 = random_matrix(c.M, c.N, c.pad_c, rng);
        Matrix C = C0;
        gemm_bf16(ta, tb, c.M, c.N, c.K, 1.0f, A.v.data(), A.ld, B.v.data(), B.ld, beta,
                  C.v.data(), C.ld, bias.v.data());
        SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.N) + "x" +
                     std::to_string(c.K) + (ta ? " T" : " N") + (tb ? "T" : "N") + " beta " +
                     std::to_string(beta));
        const Comparison r = compare(ta, tb, c.M, c.N, c.K, 1.0f, A, B, beta, C0, C, &bias);
        all.compared += r.compared;
        all.worst_ratio = std::max(all.worst_ratio, r.worst_ratio);
      }
  EXPECT_GT(all.compared, 0);
  const float a = 2.0f, b = 3.0f, bias[3] = {1.0f, -2.0f, 0.5f};
  Matrix C(2, 3, 1, 4.0f);
  gemm_bf16(false, false, 2, 3, 0, 2.0f, &a, 1, &b, 3, 0.5f, C.v.data(), C.ld, bias);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(C.at(i, j), 2.0f * bias[j] + 2.0f);
  std::printf("bias in the epilogue: compared %lld elements; worst %.3f of the bound\n",
              static_cast<long long>(all.compared), all.worst_ratio);
}

// An empty sum (K = 0) leaves beta C: zeros with beta 0 (NaN there not read), C with beta 1;
// no rows or no columns is nothing to do.
TEST(Bf16Gemm, EmptyProducts) {
  SKIP_WITHOUT_BF16();
  const float a = 2.0f, b = 3.0f;
  Matrix C(2, 3, 1, std::numeric_limits<float>::quiet_NaN());
  gemm_bf16(false, false, 2, 3, 0, 1.0f, &a, 1, &b, 3, 0.0f, C.v.data(), C.ld);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(C.at(i, j), 0.0f);
  C.at(1, 2) = 5.0f;
  gemm_bf16(true, true, 2, 3, 0, 1.0f, &a, 2, &b, 1, 1.0f, C.v.data(), C.ld);
  EXPECT_EQ(C.at(1, 2), 5.0f);
  gemm_bf16(false, false, 0, 3, 4, 1.0f, &a, 4, &b, 3, 0.0f, C.v.data(), C.ld);
  gemm_bf16(false, false, 2, 0, 4, 1.0f, &a, 4, &b, 0, 0.0f, C.v.data(), C.ld);
  EXPECT_EQ(C.at(1, 2), 5.0f);
  EXPECT_EQ(C.at(0, 3), 1e30f);  // the padding
}

// The vectorized rounding gives the bits of util/bf16.hpp's float_to_bf16 (the GPU's) on the
// special values: NaNs with payload only in the dropped bits, infinities, the largest float
// (rounds to inf), denormals, signed zeros, halfway cases. No bf16 instructions needed.
TEST(Bf16Gemm, RoundingMatchesFloatToBf16Bits) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu,
                                0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x807fffffu,
                                0x00008000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu,
                                0x3f808001u, 0x7f7f8000u, 0x7f7f7fffu};
  std::mt19937 rng(3);
  for (int i = 0; i < 4096; ++i) bits.push_back(rng());
  std::vector<float> in(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) in[i] = std::bit_cast<float>(bits[i]);
  // As a 3-column block with leading dimension 5 (rows of 5 read 3 at a time), and dense.
  const int64_t rows = static_cast<int64_t>(in.size()) / 5;
  std::vector<uint16_t> strided(static_cast<size_t>(rows * 3)), dense(in.size());
  round_to_bf16(in.data(), rows, 3, 5, strided.data());
  round_to_bf16(in.data(), 1, static_cast<int64_t>(in.size()), 0, dense.data());
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(dense[i], float_to_bf16(in[i])) << std::hex << bits[i];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_EQ(strided[static_cast<size_t>(r * 3 + c)],
                float_to_bf16(in[static_cast<size_t>(r * 5 + c)]));
}

// More shapes than the per-thread cache holds, then the first again (evicted, made anew),
// and products from inside a parallel region (each thread its own cache and primitives).
TEST(Bf16Gemm, CacheEvictionAndParallelCallers) {
  SKIP_WITHOUT_BF16();
  auto check = [](int64_t M, int64_t N, int64_t K, unsigned seed) {
    std::mt19937 rng(seed);
    const Matrix A = random_matrix(M, K, 1, rng), B = random_matrix(N, K, 2, rng);
    const Matrix C0(M, N, 0);
    Matrix C = C0;
    gemm_bf16(false, true, M, N, K, 1.0f, A.v.data(), A.ld, B.v.data(), B.ld, 0.0f,
              C.v.data(), C.ld);
    return compare(false, true, M, N, K, 1.0f, A, B, 0.0f, C0, C).compared;
  };
  int64_t compared = 0;
  for (int64_t s = 0; s < 40; ++s) compared += check(5 + s, 7, 9, 100 + s);
  compared += check(5, 7, 9, 99);
  EXPECT_EQ(compared, 7 * (40 * 5 + (39 * 40) / 2) + 35);
  std::vector<int64_t> per_thread(2, 0);
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    for (int r = 0; r < 3; ++r) per_thread[t] += check(33 + t, 65, 40 + 7 * t, 10 * t + r);
  }
  EXPECT_EQ(per_thread[0], 3 * 33 * 65);
  EXPECT_EQ(per_thread[1], 3 * 34 * 65);
}

// train.cpu_bf16_gemm = "auto"'s rule: oneDNN's bf16 matmul where it runs natively and on
// AMX tiles or dot products at least kBf16DotLead x the FMAs' rate. The two kinds measured
// land on either side: an AVX512-BF16 Xeon without AMX (family 6 model 207, 0.5x) on the FMA
// engine, Zen 5 (family 26 model 2, 1.84x) on oneDNN.
TEST(Bf16GemmEngine, AutoTakesTheMatmulWhereItOutrunsTheFmas) {
  const Bf16DotRate xeon{110.0, 220.0}, zen5{512.5, 278.6}, none{};
  EXPECT_DOUBLE_EQ(xeon.ratio(), 0.5);
  EXPECT_DOUBLE_EQ(none.ratio(), 0.0);
  EXPECT_FALSE(bf16_products_outpace_fp32(true, false, xeon));
  EXPECT_TRUE(bf16_products_outpace_fp32(true, false, zen5));
  EXPECT_TRUE(bf16_products_outpace_fp32(true, true, xeon)) << "AMX: the tiles, whatever the dot";
  EXPECT_TRUE(bf16_products_outpace_fp32(true, true, none));
  EXPECT_FALSE(bf16_products_outpace_fp32(true, false, none));
  EXPECT_TRUE(bf16_products_outpace_fp32(true, false, {130.0, 100.0}));
  EXPECT_FALSE(bf16_products_outpace_fp32(true, false, {129.0, 100.0}));
  // Not available (no instructions, or oneDNN held below them): never, whatever the rates.
  EXPECT_FALSE(bf16_products_outpace_fp32(false, true, zen5));
  EXPECT_FALSE(bf16_products_outpace_fp32(false, false, zen5));

  // This core: the rule on its own measurement, which is kept (measured once).
  const Bf16DotRate& rate = bf16_dot_rate();
  EXPECT_EQ(&rate, &bf16_dot_rate());
  if (rate.dot_gflops > 0.0) EXPECT_GT(rate.fma_gflops, 0.0);
  EXPECT_EQ(bf16_gemm_outpaces_fp32(),
            bf16_products_outpace_fp32(bf16_gemm_available(), bf16_gemm_has_amx(), rate));
  std::printf("this core: %s; dot %.1f / FMA %.1f GFLOP/s = %.2fx: auto runs %s\n",
              bf16_gemm_description().c_str(), rate.dot_gflops, rate.fma_gflops, rate.ratio(),
              bf16_gemm_outpaces_fp32() ? "onednn" : "fma");
}

// Without AVX512-BF16 and AMX the call is refused with one line. On a core that has them,
// this case runs itself again with oneDNN limited to AVX-512 without BF16
// (ONEDNN_MAX_CPU_ISA=AVX512_CORE), where the refusal must happen.
TEST(Bf16GemmRefusal, WithoutInstructionsIsOneLineError) {
  if (!bf16_gemm_available()) {
    EXPECT_NE(bf16_gemm_description().find("bf16 unavailable"), std::string::npos);
    float a = 1.0f, b = 1.0f, c = 0.0f;
    const std::string msg = test::error_of([&] {
      gemm_bf16(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    });
    test::expect_one_line_with(msg, {"bf16 GEMM on the CPU needs AVX512-BF16 or AMX"});
    // The attention of the oneDNN engine refuses before its parallel region (an exception
    // thrown inside one would end the process).
    std::vector<float> qkv(3 * 4, 0.0f), out(4), lse(1), dqkv(3 * 4);
    const std::string attention = test::error_of([&] {
      attention_forward_bf16(out.data(), lse.data(), qkv.data(), 1, 1, 1, 1, 4, nullptr);
    });
    test::expect_one_line_with(attention, {"bf16 GEMM on the CPU needs AVX512-BF16 or AMX"});
    const std::string backward = test::error_of([&] {
      attention_backward_bf16(dqkv.data(), out.data(), qkv.data(), out.data(), lse.data(), 1, 1,
                              1, 1, 4, nullptr);
    });
    test::expect_one_line_with(backward, {"bf16 GEMM on the CPU needs AVX512-BF16 or AMX"});
    std::printf("refused: %s\n", msg.c_str());
    return;
  }
  const test::RunResult r = test::run_command(
      "ONEDNN_MAX_CPU_ISA=AVX512_CORE /proc/" + std::to_string(::getpid()) +
          "/exe --gtest_filter=Bf16GemmRefusal.WithoutInstructionsIsOneLineError",
      60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("refused: bf16 GEMM on the CPU needs AVX512-BF16 or AMX; oneDNN"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[  PASSED  ] 1 test"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trident::cpu

// CUDA kernels against the CPU reference kernels (trident::cpu, float).
//
// Every test draws random inputs, runs the CPU kernel and the CUDA kernel on the same values
// (for the bf16 path the inputs are rounded to bf16 first and the CPU reference runs in fp32 on
// the rounded values), and compares every output and gradient. The error printed and checked is
// the max-norm relative error
//     rel = max_i |gpu_i - ref_i| / max_i |ref_i|
// (elementwise relative error is meaningless next to zeros). Tolerances: fp32 path 1e-4
// (attention included), bf16 path 2e-2. Each comparison prints one line:
//     [ cuda ] <kernel> <tensor> <dtype>  max_abs=... max_ref=... rel=... (tol ...)
// Without a CUDA device every test is skipped with "no CUDA device: GPU tests skipped".
#include <gtest/gtest.h>

#ifndef TRIDENT_TEST_CUDA

TEST(CudaKernels, NotBuilt) { GTEST_SKIP() << "TRIDENT_CUDA is OFF: GPU tests not built"; }

#else

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/ops.hpp"
#include "cuda_storage.hpp"
#include "kernel_vectors.hpp"
#include "util/error.hpp"
#include "util/fp8.hpp"

namespace {

namespace gpu = trident::cuda;
namespace cpu = trident::cpu;
using gpu::bf16;
using namespace trident::testing_support;

#define REQUIRE_CUDA_DEVICE()                                                     \
  do {                                                                            \
    if (!gpu::device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped"; \
  } while (0)

// ---------------------------------------------------------------- host helpers
template <typename S>
constexpr const char* type_name() {
  return std::is_same_v<S, float> ? "fp32" : "bf16";
}
template <typename S>
constexpr double tolerance() {
  return std::is_same_v<S, float> ? 1e-4 : 2e-2;
}

// The values the storage type can hold (what the CPU reference must see).
template <typename S>
std::vector<float> quantize(std::vector<float> v) {
  if constexpr (!std::is_same_v<S, float>)
    for (float& x : v) x = __bfloat162float(__float2bfloat16_rn(x));
  return v;
}

std::vector<float> random_vec(std::mt19937_64& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Device buffer of n elements of T.
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload_raw(const std::vector<T>& h) {
    CUDA_CHECK(cudaMemcpy(p_, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download_raw() const {
    std::vector<T> h(n_);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost));
    return h;
  }
  // float <-> T conversions
  void upload(const std::vector<float>& h) {
    std::vector<T> s(h.size());
    for (size_t i = 0; i < h.size(); i++) s[i] = to_storage<T>(h[i]);
    upload_raw(s);
  }
  std::vector<float> download() const {
    const std::vector<T> s = download_raw();
    std::vector<float> h(s.size());
    for (size_t i = 0; i < s.size(); i++) h[i] = to_float<T>(s[i]);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

template <typename T>
DevBuf<T>* make_up(const std::vector<float>& h) {
  auto* d = new DevBuf<T>(h.size());
  d->upload(h);
  return d;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Prints and checks the max-norm relative error of gpu against ref. `scale_floor` is a lower
// bound for the denominator, for tensors whose exact value can be all zeros (the attention dq
// and dk at T = 1: the softmax of one element has zero gradient, and fp32 rounding leaves
// ~1e-7): the natural scale of such a gradient is passed instead (max |dv| there).
void expect_close(const std::string& kernel, const std::string& tensor, const char* dtype,
                  const std::vector<float>& got, const std::vector<float>& ref, double tol,
                  double scale_floor = 0.0) {
  ASSERT_EQ(got.size(), ref.size()) << kernel << " " << tensor;
  double max_abs = 0.0, max_ref = 0.0;
  size_t worst = 0, nonfinite = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    if (!std::isfinite(got[i])) nonfinite++;
    const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    if (d > max_abs) {
      max_abs = d;
      worst = i;
    }
    max_ref = std::max(max_ref, std::abs(static_cast<double>(ref[i])));
  }
  const double rel = max_abs / std::max({max_ref, scale_floor, 1e-30});
  std::printf("[ cuda ] %-26s %-14s %s  max_abs=%.3e max_ref=%.3e rel=%.3e (tol %.0e)%s\n",
              kernel.c_str(), tensor.c_str(), dtype, max_abs, max_ref, rel, tol,
              (rel <= tol && nonfinite == 0) ? "" : "  <-- FAIL");
  EXPECT_EQ(nonfinite, 0u) << kernel << " " << tensor << ": non-finite GPU values";
  EXPECT_LE(rel, tol) << kernel << " " << tensor << " " << dtype << ": worst index " << worst
                      << " gpu=" << (ref.empty() ? 0.f : got[worst])
                      << " ref=" << (ref.empty() ? 0.f : ref[worst]);
}

// Columns [c0, c0 + n) of a row-major [rows, cols] matrix.
std::vector<float> cols_of(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t c0,
                           int64_t n) {
  std::vector<float> out(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; r++)
    std::copy_n(m.begin() + r * cols + c0, n, out.begin() + r * n);
  return out;
}

// ================================================================ device
TEST(CudaDevice, Summary) {
  REQUIRE_CUDA_DEVICE();
  std::printf("[ cuda ] device: %s\n", gpu::device_summary().c_str());
  // CUDA_CHECK reports the failing call with file:line through trident::Error.
  try {
    CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "CUDA_CHECK did not throw";
  } catch (const trident::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test_cuda_kernels.cpp"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
  }
  // A failed call that threw leaves no error behind for the next launch check to report (the
  // runtime keeps it as its last error; before the fix a caught cudaErrorInvalidValue of a
  // device-to-host copy from host memory failed the next test's first kernel, 2026-12-04).
  std::vector<float> host_src(4), host_dst(4);
  EXPECT_THROW(CUDA_CHECK(cudaMemcpyAsync(host_dst.data(), host_src.data(), 16,
                                          static_cast<cudaMemcpyKind>(42), nullptr)),
               trident::Error);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // Bad arguments are rejected before any launch.
  DevBuf<float> x(16);
  EXPECT_THROW(gpu::attention_forward<float>(x.get(), x.get(), x.get(), 1, 1, 1, 1, 48),
               trident::Error);
  EXPECT_THROW(gpu::attention_forward<float>(x.get(), x.get(), x.get(), 1, 1, 4, 3, 64),
               trident::Error);  // NH not a multiple of KVH
}

// ================================================================ gemm
template <typename TAB, typename TC>
void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool bias, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
  const int64_t a_rows = ta ? K : M, b_rows = tb ? N : K;
  const std::vector<float> A = quantize<TAB>(random_vec(rng, a_rows * lda));
  const std::vector<float> B = quantize<TAB>(random_vec(rng, b_rows * ldb));
  const std::vector<float> C0 = quantize<TC>(random_vec(rng, M * ldc));
  const std::vector<float> bv = quantize<TC>(random_vec(rng, N));
  const float alpha = 0.7f, beta = 0.3f;
  std::vector<float> ref = C0;
  cpu::gemm<float>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), ldc);
  if (bias)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) ref[m * ldc + n] += bv[n];
  DevBuf<TAB> dA(A.size()), dB(B.size());
  DevBuf<TC> dC(C0.size()), dbias(N);
  dA.upload(A);
  dB.upload(B);
  dC.upload(C0);
  dbias.upload(bv);
  gpu::CublasContext ctx;
  gpu::gemm<TAB, TC>(ctx, ta, tb, M, N, K, alpha, dA.get(), lda, dB.get(), ldb, beta, dC.get(),
                     ldc, nullptr, bias ? dbias.get() : nullptr);
  const std::string name = std::string("gemm ") + (ta ? "T" : "N") + (tb ? "T" : "N") + " " +
                           std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                           (bias ? "+b" : "");
  const std::string dt = std::string(type_name<TAB>()) + "->" + type_name<TC>();
  expect_close(name, "C", dt.c_str(), dC.download(), ref,
               std::is_same_v<TC, float> && std::is_same_v<TAB, float> ? 1e-4
               : std::is_same_v<TC, float>                             ? 1e-4
                                                                       : 2e-2);
}

TEST(CudaGemm, AllTransposesAndTypes) {
  REQUIRE_CUDA_DEVICE();
  uint64_t seed = 1;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      // Odd sizes and odd leading dimensions (unaligned: Lt heuristics or the GemmEx fallback).
      check_gemm<float, float>(ta, tb, 67, 45, 33, ta == tb, seed++);
      check_gemm<bf16, bf16>(ta, tb, 67, 45, 33, ta == tb, seed++);
      check_gemm<bf16, float>(ta, tb, 67, 45, 33, ta != tb, seed++);
      // Aligned tensor-core friendly sizes with bias.
      check_gemm<float, float>(ta, tb, 128, 256, 64, true, seed++);
      check_gemm<bf16, bf16>(ta, tb, 128, 256, 64, true, seed++);
      check_gemm<bf16, float>(ta, tb, 128, 256, 64, false, seed++);
    }
}

// ================================================================ linear
template <typename S>
void run_linear(int64_t N, int64_t C, int64_t OC, bool with_bias, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto inp = quantize<S>(random_vec(rng, N * C));
  const auto w = quantize<S>(random_vec(rng, OC * C));
  const auto b = quantize<S>(random_vec(rng, OC));
  const auto dout = quantize<S>(random_vec(rng, N * OC));
  const auto dw0 = random_vec(rng, OC * C);  // fp32 gradients, accumulated into
  const auto db0 = random_vec(rng, OC);
  std::vector<float> out(N * OC), dinp(N * C), dw = dw0, db = db0;
  cpu::linear_forward<float>(out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, N,
                             C, OC);
  cpu::linear_backward<float>(dinp.data(), dw.data(), with_bias ? db.data() : nullptr,
                              dout.data(), inp.data(), w.data(), N, C, OC);

  DevBuf<S> d_inp(inp.size()), d_w(w.size()), d_b(b.size()), d_dout(dout.size()),
      d_out(out.size()), d_dinp(dinp.size());
  DevBuf<float> d_dw(dw0.size()), d_db(db0.size());
  d_inp.upload(inp);
  d_w.upload(w);
  d_b.upload(b);
  d_dout.upload(dout);
  d_dw.upload(dw0);
  d_db.upload(db0);
  gpu::CublasContext ctx;
  gpu::linear_forward<S>(ctx, d_out.get(), d_inp.get(), d_w.get(), with_bias ? d_b.get() : nullptr,
                         N, C, OC);
  gpu::linear_backward<S>(ctx, d_dinp.get(), d_dw.get(), with_bias ? d_db.get() : nullptr,
                          d_dout.get(), d_inp.get(), d_w.get(), N, C, OC);
  const std::string k = "linear " + std::to_string(N) + "x" + std::to_string(C) + "->" +
                        std::to_string(OC);
  expect_close(k, "out", type_name<S>(), d_out.download(), out, tolerance<S>());
  expect_close(k, "dinp", type_name<S>(), d_dinp.download(), dinp, tolerance<S>());
  // fp32 gradients from fp32 accumulation: tight for both storage types.
  expect_close(k, "dweight(+=)", type_name<S>(), d_dw.download(), dw, 1e-4);
  if (with_bias) expect_close(k, "dbias(+=)", type_name<S>(), d_db.download(), db, 1e-4);
}

TEST(CudaLinear, Fp32) {
  REQUIRE_CUDA_DEVICE();
  run_linear<float>(300, 64, 192, true, 11);
  run_linear<float>(128, 96, 40, false, 12);
}
TEST(CudaLinear, Bf16) {
  REQUIRE_CUDA_DEVICE();
  run_linear<bf16>(300, 64, 192, true, 13);
  run_linear<bf16>(128, 96, 40, false, 14);
}

// train.fused_bias_gelu: in bf16 the up projection with cuBLASLt's GELU_AUX_BIAS epilogue and
// the down projection's input gradient with DGELU, against the CPU's definition (the GELU of the
// fp32 product before its rounding, model/cpu_bf16_kernels.hpp); in fp32 the separate kernels
// (the parity path): act, the kept pre-activation, dpre, dW and db. A bf16 OC that is a
// multiple of 8 takes the epilogues (checked: gemm_gelu says whether cuBLASLt runs them);
// OC = 36 the separate kernels (cuBLASLt's GELU input needs a leading dimension that is a
// multiple of 8).
template <typename S>
void run_linear_gelu(int64_t N, int64_t C, int64_t OC, uint64_t seed) {
  constexpr bool kBf16 = !std::is_same_v<S, float>;
  std::mt19937_64 rng(seed);
  const auto inp = quantize<S>(random_vec(rng, N * C, -2.f, 2.f));
  const auto w = quantize<S>(random_vec(rng, OC * C, -0.3f, 0.3f));
  const auto b = quantize<S>(random_vec(rng, OC));
  const auto wd = quantize<S>(random_vec(rng, C * OC, -0.3f, 0.3f));  // down: [C, OC]
  const auto dout = quantize<S>(random_vec(rng, N * C));
  std::vector<float> pre(N * OC), act(N * OC), dx(N * OC), dpre(N * OC), dw(C * OC, 0.f),
      db(C, 0.f);
  cpu::linear_forward<float>(pre.data(), inp.data(), w.data(), b.data(), N, C, OC);
  cpu::gelu_forward<float>(act.data(), pre.data(), N * OC, kBf16);
  const std::vector<float> pre_kept = quantize<S>(pre);
  cpu::linear_backward<float>(dx.data(), dw.data(), db.data(), dout.data(), act.data(), wd.data(),
                              N, OC, C);
  cpu::gelu_backward<float>(dpre.data(), pre_kept.data(), dx.data(), N * OC, kBf16);

  DevBuf<S> d_inp(inp.size()), d_w(w.size()), d_b(b.size()), d_wd(wd.size()),
      d_dout(dout.size()), d_pre(pre.size()), d_act(act.size()), d_dpre(dpre.size()),
      d_probe(act.size());
  DevBuf<float> d_dw(dw.size()), d_db(db.size());
  d_inp.upload(inp);
  d_w.upload(w);
  d_b.upload(b);
  d_wd.upload(wd);
  d_dout.upload(dout);
  d_dw.upload(std::vector<float>(dw.size(), 0.f));
  d_db.upload(std::vector<float>(db.size(), 0.f));
  gpu::CublasContext ctx;
  const bool epilogue = kBf16 && gpu::gemm_gelu(ctx, gpu::dtype_of<S>::value, false, true, N, OC,
                                                C, d_inp.get(), C, d_w.get(), C, d_probe.get(),
                                                OC, d_b.get(), gpu::Gelu::Forward, d_pre.get(),
                                                nullptr);
  if (kBf16) EXPECT_EQ(epilogue, OC % 8 == 0) << "cuBLASLt's GELU_AUX_BIAS epilogue";
  // The backward's two epilogues, probed the same way (a fallback would pass the checks below
  // too): DGELU in the down projection's input gradient, BGRADB in its weight gradient.
  const bool dgelu = kBf16 && gpu::gemm_gelu(ctx, gpu::dtype_of<S>::value, false, false, N, OC,
                                             C, d_dout.get(), C, d_wd.get(), OC, d_probe.get(),
                                             OC, nullptr, gpu::Gelu::Backward, d_pre.get(),
                                             nullptr);
  if (kBf16) EXPECT_EQ(dgelu, OC % 8 == 0) << "cuBLASLt's DGELU epilogue";
  {
    DevBuf<float> probe_dw(dw.size()), probe_db(db.size());
    const bool bgradb = gpu::linear_weight_bias_grad<S>(ctx, probe_dw.get(), probe_db.get(),
                                                        d_dout.get(), d_act.get(), N, OC, C);
    std::printf("[ measured ] %s %lldx%lld->%lld: BGRADB epilogue %s\n", type_name<S>(),
                static_cast<long long>(N), static_cast<long long>(OC), static_cast<long long>(C),
                bgradb ? "ran" : "not offered (the separate bias kernel)");
    if (kBf16) EXPECT_TRUE(bgradb) << "cuBLASLt's BGRADB epilogue for bf16";
  }
  gpu::linear_gelu_forward<S>(ctx, d_act.get(), d_pre.get(), d_inp.get(), d_w.get(), d_b.get(),
                              N, C, OC);
  // The down projection's backward: its input was act (its weight gradient reads it).
  gpu::linear_backward_dgelu<S>(ctx, d_dpre.get(), d_dw.get(), d_db.get(), d_dout.get(),
                                d_act.get(), d_wd.get(), d_pre.get(), N, OC, C);
  const std::string k = "linear+gelu " + std::to_string(N) + "x" + std::to_string(C) + "->" +
                        std::to_string(OC) + (epilogue ? " (epilogue)" : " (separate)");
  expect_close(k, "act", type_name<S>(), d_act.download(), act, tolerance<S>());
  expect_close(k, "pre (kept)", type_name<S>(), d_pre.download(), pre_kept, tolerance<S>());
  expect_close(k, "dpre", type_name<S>(), d_dpre.download(), dpre, tolerance<S>());
  expect_close(k, "dweight(+=)", type_name<S>(), d_dw.download(), dw, 1e-4);
  expect_close(k, "dbias(+=)", type_name<S>(), d_db.download(), db, 1e-4);
}

TEST(CudaLinearGelu, Fp32) {
  REQUIRE_CUDA_DEVICE();
  run_linear_gelu<float>(256, 64, 192, 21);
  run_linear_gelu<float>(130, 48, 36, 22);
}
TEST(CudaLinearGelu, Bf16) {
  REQUIRE_CUDA_DEVICE();
  run_linear_gelu<bf16>(256, 64, 192, 23);
  run_linear_gelu<bf16>(130, 48, 36, 24);
}

// ================================================================ embeddings
template <typename S>
void run_embedding(int64_t B, int64_t T, int64_t C, int64_t vocab_begin, int64_t rows,
                   int id_range, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t N = B * T, Tmax = T + 5;
  std::vector<int32_t> ids(N);
  std::uniform_int_distribution<int32_t> uid(0, id_range - 1);
  for (auto& id : ids) id = uid(rng);
  const auto wte = quantize<S>(random_vec(rng, rows * C));
  const auto wpe = quantize<S>(random_vec(rng, Tmax * C));
  const auto dout = quantize<S>(random_vec(rng, N * C));
  const auto dwte0 = random_vec(rng, rows * C);
  const auto dwpe0 = random_vec(rng, Tmax * C);

  std::vector<float> out(N * C), dwte = dwte0, dwpe = dwpe0;
  cpu::token_embedding_forward<float>(out.data(), ids.data(), wte.data(), N, C, vocab_begin, rows);
  cpu::position_embedding_forward<float>(out.data(), wpe.data(), B, T, C);
  cpu::token_embedding_backward<float>(dwte.data(), dout.data(), ids.data(), N, C, vocab_begin,
                                       rows);
  cpu::position_embedding_backward<float>(dwpe.data(), dout.data(), B, T, C);

  DevBuf<int32_t> d_ids(N);
  d_ids.upload_raw(ids);
  DevBuf<S> d_wte(wte.size()), d_wpe(wpe.size()), d_dout(dout.size()), d_out(out.size());
  DevBuf<float> d_dwte(dwte0.size()), d_dwpe(dwpe0.size());
  d_wte.upload(wte);
  d_wpe.upload(wpe);
  d_dout.upload(dout);
  d_dwte.upload(dwte0);
  d_dwpe.upload(dwpe0);
  gpu::token_embedding_forward<S>(d_out.get(), d_ids.get(), d_wte.get(), N, C, vocab_begin, rows);
  gpu::position_embedding_forward<S>(d_out.get(), d_wpe.get(), B, T, C);
  gpu::token_embedding_backward<S>(d_dwte.get(), d_dout.get(), d_ids.get(), N, C, vocab_begin,
                                   rows);
  gpu::position_embedding_backward<S>(d_dwpe.get(), d_dout.get(), B, T, C);
  const std::string k = "embedding N=" + std::to_string(N) + " C=" + std::to_string(C);
  // The forward is a copy plus one add: rounding of the add only.
  expect_close(k, "out", type_name<S>(), d_out.download(), out, tolerance<S>());
  expect_close(k, "dwte(+=)", type_name<S>(), d_dwte.download(), dwte, 1e-4);
  expect_close(k, "dwpe(+=)", type_name<S>(), d_dwpe.download(), dwpe, 1e-4);

  // Deterministic backward: same inputs, bitwise the same gradient.
  const std::vector<float> first = d_dwte.download();
  d_dwte.upload(dwte0);
  gpu::token_embedding_backward<S>(d_dwte.get(), d_dout.get(), d_ids.get(), N, C, vocab_begin,
                                   rows);
  EXPECT_TRUE(bitwise_equal(first, d_dwte.download())) << k << ": backward not deterministic";
}

TEST(CudaEmbedding, Fp32) {
  REQUIRE_CUDA_DEVICE();
  run_embedding<float>(2, 50, 96, 10, 37, 64, 21);          // ids outside [10, 47) skipped
  run_embedding<float>(8, 1024, 768, 0, 50304, 16, 22);     // long runs of repeated ids
  run_embedding<float>(4, 256, 200, 0, 50257, 50257, 23);   // sparse ids
}
TEST(CudaEmbedding, Bf16) {
  REQUIRE_CUDA_DEVICE();
  run_embedding<bf16>(2, 50, 96, 10, 37, 64, 24);
  run_embedding<bf16>(8, 1024, 768, 0, 50304, 16, 25);
}

// ================================================================ layernorm
template <typename S>
void run_layernorm(int64_t N, int64_t C, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto x = random_vec(rng, N * C, -2.f, 2.f);
  for (float& v : x) v += 0.5f;
  x = quantize<S>(x);
  const auto w = quantize<S>(random_vec(rng, C, 0.5f, 1.5f));
  const auto b = quantize<S>(random_vec(rng, C, -0.5f, 0.5f));
  const auto dout = quantize<S>(random_vec(rng, N * C));
  const auto dw0 = random_vec(rng, C), db0 = random_vec(rng, C);
  std::vector<float> out(N * C), mean(N), rstd(N), dinp(N * C), dw = dw0, db = db0;
  cpu::layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                N, C);
  cpu::layernorm_backward<float>(dinp.data(), dw.data(), db.data(), dout.data(), x.data(),
                                 w.data(), mean.data(), rstd.data(), N, C);
  DevBuf<S> d_x(x.size()), d_w(C), d_b(C), d_dout(dout.size()), d_out(out.size()),
      d_dinp(dinp.size());
  DevBuf<float> d_mean(N), d_rstd(N), d_dw(C), d_db(C);
  d_x.upload(x);
  d_w.upload(w);
  d_b.upload(b);
  d_dout.upload(dout);
  d_dw.upload(dw0);
  d_db.upload(db0);
  gpu::layernorm_forward<S>(d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(),
                            d_b.get(), N, C);
  gpu::layernorm_backward<S>(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_x.get(),
                             d_w.get(), d_mean.get(), d_rstd.get(), N, C);
  const std::string k = "layernorm " + std::to_string(N) + "x" + std::to_string(C);
  expect_close(k, "out", type_name<S>(), d_out.download(), out, tolerance<S>());
  expect_close(k, "mean", type_name<S>(), d_mean.download(), mean, 1e-4);
  expect_close(k, "rstd", type_name<S>(), d_rstd.download(), rstd, 1e-4);
  expect_close(k, "dinp", type_name<S>(), d_dinp.download(), dinp, tolerance<S>());
  expect_close(k, "dweight(+=)", type_name<S>(), d_dw.download(), dw, 1e-4);
  expect_close(k, "dbias(+=)", type_name<S>(), d_db.download(), db, 1e-4);
  // Deterministic parameter gradients.
  const auto first = d_dw.download();
  d_dw.upload(dw0);
  gpu::layernorm_backward<S>(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_x.get(),
                             d_w.get(), d_mean.get(), d_rstd.get(), N, C);
  EXPECT_TRUE(bitwise_equal(first, d_dw.download())) << k << ": dweight not deterministic";
}

TEST(CudaLayerNorm, Fp32) {
  REQUIRE_CUDA_DEVICE();
  run_layernorm<float>(300, 768, 31);
  run_layernorm<float>(7, 100, 32);
  run_layernorm<float>(1030, 64, 33);
  run_layernorm<float>(5, 30, 37);  // rows not 16-byte aligned: the scalar path
}
TEST(CudaLayerNorm, Bf16) {
  REQUIRE_CUDA_DEVICE();
  run_layernorm<bf16>(300, 768, 34);
  run_layernorm<bf16>(7, 100, 35);  // 100 columns: not whole packs of 8, the scalar path
  run_layernorm<bf16>(4100, 768, 36);  // 129 row chunks: each column-sum thread adds several
}

// ================================================================ residual add + norm, fused
// The transformer's add + norm pair in one kernel (kernels/cuda/ops.hpp): the forward is the
// unfused add_inplace + norm to the bit (out, statistics and the updated stream), and the CPU's
// fused twin within the usual bound; the backward's accumulate form adds dx to the stream
// gradient: against the CPU's, and in fp32 bitwise the unfused backward + add_inplace.
template <typename S>
void run_fused_residual_norm(bool rms, int64_t N, int64_t C, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto res0 = quantize<S>(random_vec(rng, N * C, -2.f, 2.f));
  const auto x = quantize<S>(random_vec(rng, N * C, -1.f, 1.f));
  const auto w = quantize<S>(random_vec(rng, C, 0.5f, 1.5f));
  const auto b = quantize<S>(random_vec(rng, C, -0.5f, 0.5f));
  const auto dout = quantize<S>(random_vec(rng, N * C));
  const auto dstream0 = quantize<S>(random_vec(rng, N * C));
  const float eps = 1e-5f;
  // CPU reference (fp32).
  std::vector<float> res = res0, out(N * C), mean(N), rstd(N), dstream = dstream0;
  std::vector<float> dw(C, 0.f), db(C, 0.f);
  if (rms) {
    cpu::add_rmsnorm_forward<float>(out.data(), rstd.data(), res.data(), x.data(), w.data(), N, C,
                                    eps);
    cpu::rmsnorm_backward<float>(dstream.data(), dw.data(), dout.data(), res.data(), w.data(),
                                 rstd.data(), N, C, true);
  } else {
    cpu::add_layernorm_forward<float>(out.data(), mean.data(), rstd.data(), res.data(), x.data(),
                                      w.data(), b.data(), N, C);
    cpu::layernorm_backward<float>(dstream.data(), dw.data(), db.data(), dout.data(), res.data(),
                                   w.data(), mean.data(), rstd.data(), N, C, true);
  }
  DevBuf<S> d_res(res0.size()), d_x(x.size()), d_w(C), d_b(C), d_out(out.size()),
      d_dout(dout.size()), d_ds(dstream0.size()), u_res(res0.size()), u_out(out.size()),
      u_tmp(out.size()), u_ds(dstream0.size());
  DevBuf<float> d_mean(N), d_rstd(N), d_dw(C), d_db(C), u_mean(N), u_rstd(N), u_dw(C), u_db(C);
  d_res.upload(res0);
  u_res.upload(res0);
  d_x.upload(x);
  d_w.upload(w);
  d_b.upload(b);
  d_dout.upload(dout);
  d_ds.upload(dstream0);
  u_ds.upload(dstream0);
  for (DevBuf<float>* g : {&d_dw, &d_db, &u_dw, &u_db}) g->upload(std::vector<float>(C, 0.f));
  gpu::add_inplace<S>(u_res.get(), d_x.get(), N * C);  // the unfused pair
  if (rms) {
    gpu::add_rmsnorm_forward<S>(d_out.get(), d_rstd.get(), d_res.get(), d_x.get(), d_w.get(), N, C,
                                eps);
    gpu::rmsnorm_forward<S>(u_out.get(), u_rstd.get(), u_res.get(), d_w.get(), N, C, eps);
    gpu::rmsnorm_backward<S>(d_ds.get(), d_dw.get(), d_dout.get(), d_res.get(), d_w.get(),
                             d_rstd.get(), N, C, nullptr, nullptr, true);
    gpu::rmsnorm_backward<S>(u_tmp.get(), u_dw.get(), d_dout.get(), u_res.get(), d_w.get(),
                             u_rstd.get(), N, C);
  } else {
    gpu::add_layernorm_forward<S>(d_out.get(), d_mean.get(), d_rstd.get(), d_res.get(), d_x.get(),
                                  d_w.get(), d_b.get(), N, C);
    gpu::layernorm_forward<S>(u_out.get(), u_mean.get(), u_rstd.get(), u_res.get(), d_w.get(),
                              d_b.get(), N, C);
    gpu::layernorm_backward<S>(d_ds.get(), d_dw.get(), d_db.get(), d_dout.get(), d_res.get(),
                               d_w.get(), d_mean.get(), d_rstd.get(), N, C, nullptr, nullptr,
                               true);
    gpu::layernorm_backward<S>(u_tmp.get(), u_dw.get(), u_db.get(), d_dout.get(), u_res.get(),
                               d_w.get(), u_mean.get(), u_rstd.get(), N, C);
  }
  gpu::add_inplace<S>(u_ds.get(), u_tmp.get(), N * C);
  const std::string k = std::string(rms ? "add_rmsnorm " : "add_layernorm ") +
                        std::to_string(N) + "x" + std::to_string(C);
  // Forward: the unfused pair to the bit.
  EXPECT_TRUE(bitwise_equal(d_res.download(), u_res.download())) << k << ": stream";
  EXPECT_TRUE(bitwise_equal(d_out.download(), u_out.download())) << k << ": out";
  EXPECT_TRUE(bitwise_equal(d_rstd.download(), u_rstd.download())) << k << ": rstd";
  if (!rms) EXPECT_TRUE(bitwise_equal(d_mean.download(), u_mean.download())) << k << ": mean";
  EXPECT_TRUE(bitwise_equal(d_dw.download(), u_dw.download())) << k << ": dweight";
  // Against the CPU's fused kernels.
  expect_close(k, "stream", type_name<S>(), d_res.download(), res, tolerance<S>());
  expect_close(k, "out", type_name<S>(), d_out.download(), out, tolerance<S>());
  expect_close(k, "rstd", type_name<S>(), d_rstd.download(), rstd, 1e-4);
  expect_close(k, "dstream(+=)", type_name<S>(), d_ds.download(), dstream, tolerance<S>());
  expect_close(k, "dweight(+=)", type_name<S>(), d_dw.download(), dw, 1e-4);
  if (!rms) expect_close(k, "dbias(+=)", type_name<S>(), d_db.download(), db, 1e-4);
  // fp32: the fused accumulation is the unfused backward + add_inplace to the bit (bf16 rounds
  // dx once fewer).
  if (std::is_same_v<S, float>)
    EXPECT_TRUE(bitwise_equal(d_ds.download(), u_ds.download())) << k << ": dstream";
}

TEST(CudaResidualNorm, FusedEqualsUnfusedFp32) {
  REQUIRE_CUDA_DEVICE();
  for (bool rms : {false, true}) {
    run_fused_residual_norm<float>(rms, 300, 768, 401);
    run_fused_residual_norm<float>(rms, 5, 30, 402);  // rows not 16-byte aligned: scalar path
  }
}
TEST(CudaResidualNorm, FusedEqualsUnfusedBf16) {
  REQUIRE_CUDA_DEVICE();
  for (bool rms : {false, true}) {
    run_fused_residual_norm<bf16>(rms, 1030, 768, 403);
    run_fused_residual_norm<bf16>(rms, 7, 100, 404);  // not whole packs of 8: scalar path
  }
}

// ================================================================ GELU, residual
template <typename S>
void run_elementwise(int64_t n, int64_t offset, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto x = quantize<S>(random_vec(rng, n, -6.f, 6.f));
  const auto y = quantize<S>(random_vec(rng, n));
  const auto g = quantize<S>(random_vec(rng, n));
  std::vector<float> gelu(n), dgelu(n), sum(n), acc = y;
  cpu::gelu_forward<float>(gelu.data(), x.data(), n);
  cpu::gelu_backward<float>(dgelu.data(), x.data(), g.data(), n);
  cpu::add_forward<float>(sum.data(), x.data(), y.data(), n);
  cpu::add_inplace<float>(acc.data(), g.data(), n);
  // `offset` elements in: exercises the unaligned (scalar) path.
  DevBuf<S> d_x(n + offset), d_y(n + offset), d_g(n + offset), d_o(n + offset);
  std::vector<float> pad(offset, 0.f), tmp;
  auto up = [&](DevBuf<S>& d, const std::vector<float>& v) {
    tmp = pad;
    tmp.insert(tmp.end(), v.begin(), v.end());
    d.upload(tmp);
  };
  auto down = [&](const DevBuf<S>& d) {
    const auto all = d.download();
    return std::vector<float>(all.begin() + offset, all.end());
  };
  up(d_x, x);
  up(d_y, y);
  up(d_g, g);
  const std::string k = "elementwise n=" + std::to_string(n) + (offset ? " unaligned" : "");
  gpu::gelu_forward<S>(d_o.get() + offset, d_x.get() + offset, n);
  expect_close(k, "gelu", type_name<S>(), down(d_o), gelu, tolerance<S>());
  gpu::gelu_backward<S>(d_o.get() + offset, d_x.get() + offset, d_g.get() + offset, n);
  expect_close(k, "gelu_backward", type_name<S>(), down(d_o), dgelu, tolerance<S>());
  gpu::add_forward<S>(d_o.get() + offset, d_x.get() + offset, d_y.get() + offset, n);
  expect_close(k, "add", type_name<S>(), down(d_o), sum, tolerance<S>());
  gpu::add_inplace<S>(d_y.get() + offset, d_g.get() + offset, n);
  expect_close(k, "add_inplace", type_name<S>(), down(d_y), acc, tolerance<S>());
}

TEST(CudaElementwise, Fp32) {
  REQUIRE_CUDA_DEVICE();
  run_elementwise<float>(10007, 0, 41);
  run_elementwise<float>(1001, 1, 42);
}
TEST(CudaElementwise, Bf16) {
  REQUIRE_CUDA_DEVICE();
  run_elementwise<bf16>(10007, 0, 43);
  run_elementwise<bf16>(1001, 3, 44);
}

// ================================================================ cross-entropy
// Vocabulary of vocab_size padded to Vtot columns, split over `ranks` simulated ranks; the
// MAX and SUM all-reduces between the passes are done here on the host. The reference is the
// CPU kernels on one rank over all Vtot columns.
template <typename S>
void run_cross_entropy(int64_t N, int64_t Vtot, int64_t vocab_size, int ranks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto logits = quantize<S>(random_vec(rng, N * Vtot, -4.f, 4.f));
  std::vector<int32_t> targets(N);
  std::uniform_int_distribution<int32_t> ut(0, static_cast<int32_t>(vocab_size - 1));
  for (auto& t : targets) t = ut(rng);
  const std::vector<float> dloss(N, 1.0f / static_cast<float>(N));

  std::vector<float> row_max(N), sums(2 * N), losses(N), dlogits(N * Vtot);
  cpu::cross_entropy_local_max<float>(row_max.data(), logits.data(), N, Vtot, 0, vocab_size);
  cpu::cross_entropy_local_sums<float>(sums.data(), logits.data(), targets.data(), row_max.data(),
                                       N, Vtot, 0, vocab_size);
  cpu::cross_entropy_loss<float>(losses.data(), row_max.data(), sums.data(), N);
  cpu::cross_entropy_backward<float>(dlogits.data(), logits.data(), targets.data(), row_max.data(),
                                     sums.data(), dloss.data(), N, Vtot, 0, vocab_size);

  const int64_t Vl = Vtot / ranks;
  DevBuf<int32_t> d_targets(N);
  d_targets.upload_raw(targets);
  DevBuf<float> d_max(N), d_sums(2 * N), d_loss(N), d_dloss(N);
  d_dloss.upload(dloss);
  std::vector<DevBuf<S>*> d_logits;
  for (int r = 0; r < ranks; r++) d_logits.push_back(make_up<S>(cols_of(logits, N, Vtot, r * Vl, Vl)));
  // pass 1 + MAX all-reduce
  std::vector<float> gmax(N, -std::numeric_limits<float>::infinity());
  for (int r = 0; r < ranks; r++) {
    gpu::cross_entropy_local_max<S>(d_max.get(), d_logits[r]->get(), N, Vl, r * Vl, vocab_size);
    const auto m = d_max.download();
    for (int64_t n = 0; n < N; n++) gmax[n] = std::max(gmax[n], m[n]);
  }
  d_max.upload(gmax);
  // pass 2 + SUM all-reduce
  std::vector<float> gsums(2 * N, 0.f);
  for (int r = 0; r < ranks; r++) {
    gpu::cross_entropy_local_sums<S>(d_sums.get(), d_logits[r]->get(), d_targets.get(),
                                     d_max.get(), N, Vl, r * Vl, vocab_size);
    const auto s = d_sums.download();
    for (int64_t i = 0; i < 2 * N; i++) gsums[i] += s[i];
  }
  d_sums.upload(gsums);
  gpu::cross_entropy_loss(d_loss.get(), d_max.get(), d_sums.get(), N);
  std::vector<float> got_d(N * Vtot);
  for (int r = 0; r < ranks; r++) {  // in place
    gpu::cross_entropy_backward<S>(d_logits[r]->get(), d_logits[r]->get(), d_targets.get(),
                                   d_max.get(), d_sums.get(), d_dloss.get(), N, Vl, r * Vl,
                                   vocab_size);
    const auto d = d_logits[r]->download();
    for (int64_t n = 0; n < N; n++)
      std::copy_n(d.begin() + n * Vl, Vl, got_d.begin() + n * Vtot + r * Vl);
  }
  for (auto* p : d_logits) delete p;
  const std::string k = "xent N=" + std::to_string(N) + " V=" + std::to_string(vocab_size) + "/" +
                        std::to_string(Vtot) + " ranks=" + std::to_string(ranks);
  expect_close(k, "row_max", type_name<S>(), gmax, row_max, 1e-4);
  expect_close(k, "sums", type_name<S>(), gsums, sums, 1e-4);
  expect_close(k, "losses", type_name<S>(), d_loss.download(), losses, 1e-4);
  expect_close(k, "dlogits(inplace)", type_name<S>(), got_d, dlogits, tolerance<S>());
  // Padding columns are exactly zero.
  bool pad_zero = true;
  for (int64_t n = 0; n < N; n++)
    for (int64_t v = vocab_size; v < Vtot; v++) pad_zero &= got_d[n * Vtot + v] == 0.f;
  EXPECT_TRUE(pad_zero) << k << ": padding columns of dlogits not zero";

  if (ranks == 1) {  // fused single-rank forward, and the out-of-place backward
    DevBuf<S> d_all(N * Vtot), d_dl(N * Vtot);
    d_all.upload(logits);
    DevBuf<float> f_max(N), f_sums(2 * N), f_loss(N);
    gpu::cross_entropy_forward_fused<S>(f_loss.get(), f_max.get(), f_sums.get(), d_all.get(),
                                        d_targets.get(), N, Vtot, vocab_size);
    expect_close(k, "fused losses", type_name<S>(), f_loss.download(), losses, 1e-4);
    expect_close(k, "fused row_max", type_name<S>(), f_max.download(), row_max, 1e-4);
    expect_close(k, "fused sums", type_name<S>(), f_sums.download(), sums, 1e-4);
    gpu::cross_entropy_backward<S>(d_dl.get(), d_all.get(), d_targets.get(), f_max.get(),
                                   f_sums.get(), d_dloss.get(), N, Vtot, 0, vocab_size);
    expect_close(k, "fused dlogits", type_name<S>(), d_dl.download(), dlogits, tolerance<S>());
  }
}

TEST(CudaCrossEntropy, Fp32) {
  REQUIRE_CUDA_DEVICE();
  run_cross_entropy<float>(64, 1024, 1000, 1, 51);
  run_cross_entropy<float>(64, 1024, 1000, 2, 52);  // rank 1: 488 real + 24 padding columns
  run_cross_entropy<float>(16, 50304, 50257, 1, 53);
  run_cross_entropy<float>(16, 1001, 990, 1, 56);  // rows not 16-byte aligned: the scalar path
}
TEST(CudaCrossEntropy, Bf16) {
  REQUIRE_CUDA_DEVICE();
  run_cross_entropy<bf16>(64, 1024, 1000, 1, 54);
  run_cross_entropy<bf16>(64, 1024, 1000, 2, 55);
  run_cross_entropy<bf16>(64, 1024, 997, 1, 57);   // 16-byte packs, then a 5-column tail
  run_cross_entropy<bf16>(16, 1003, 1003, 1, 58);  // rows not 16-byte aligned: the scalar path
}

// cross_entropy_fused_grad (the LM head's loss with its gradient in one launch, the row held in
// shared memory) against cross_entropy_forward_fused and cross_entropy_backward on the same
// logits: losses, the row statistics and the gradient bit for bit, in place and not, on the
// 16-byte pack path (a GPT-2 vocabulary padded to 50304, 50257 valid), the scalar path (rows not
// aligned) and, in fp32, a row past the shared memory (the two kernels then).
template <typename S>
void run_cross_entropy_fused_grad(int64_t N, int64_t Vl, int64_t vocab_size, bool in_place,
                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto logits = quantize<S>(random_vec(rng, N * Vl, -6.f, 6.f));
  std::vector<int32_t> targets(N);
  std::uniform_int_distribution<int32_t> ut(0, static_cast<int32_t>(vocab_size - 1));
  for (auto& t : targets) t = ut(rng);
  targets[0] = -1;  // a row without a target (masked)
  // Row 1 opens with -inf logits (a masked vocabulary): the first columns every thread of the
  // row reads, before its running max is finite (exp(-inf - -inf) would make the row NaN).
  for (int64_t v = 0; v < std::min<int64_t>(Vl, 4096); ++v)
    logits[Vl + v] = -std::numeric_limits<float>::infinity();
  targets[1] = static_cast<int32_t>(vocab_size - 1);
  DevBuf<int32_t> d_targets(N);
  d_targets.upload_raw(targets);
  DevBuf<float> d_dloss(N);
  d_dloss.upload(std::vector<float>(N, 0.37f / static_cast<float>(N)));
  struct Out {
    std::vector<float> losses, row_max, sums, dlogits;
  };
  auto run = [&](bool fused) {
    DevBuf<S> d_logits(N * Vl), d_out(N * Vl);
    d_logits.upload(logits);
    DevBuf<float> d_max(N), d_sums(2 * N), d_loss(N);
    S* out = in_place ? d_logits.get() : d_out.get();
    if (fused) {
      gpu::cross_entropy_fused_grad<S>(d_loss.get(), d_max.get(), d_sums.get(), out,
                                       d_logits.get(), d_targets.get(), d_dloss.get(), N, Vl,
                                       vocab_size);
    } else {
      gpu::cross_entropy_forward_fused<S>(d_loss.get(), d_max.get(), d_sums.get(),
                                          d_logits.get(), d_targets.get(), N, Vl, vocab_size);
      gpu::cross_entropy_backward<S>(out, d_logits.get(), d_targets.get(), d_max.get(),
                                     d_sums.get(), d_dloss.get(), N, Vl, 0, vocab_size);
    }
    return Out{d_loss.download(), d_max.download(), d_sums.download(),
               in_place ? d_logits.download() : d_out.download()};
  };
  const Out fused = run(true), apart = run(false);
  EXPECT_TRUE(bitwise_equal(fused.losses, apart.losses));
  EXPECT_TRUE(bitwise_equal(fused.row_max, apart.row_max));
  EXPECT_TRUE(bitwise_equal(fused.sums, apart.sums));
  EXPECT_TRUE(bitwise_equal(fused.dlogits, apart.dlogits));
  double total = 0;
  for (float x : fused.dlogits) total += std::fabs(x);
  EXPECT_GT(total, 0.0) << "a gradient was written";
  for (int64_t n = 0; n < N; ++n)
    EXPECT_TRUE(std::isfinite(fused.losses[n]) && std::isfinite(apart.losses[n]))
        << "row " << n << ": loss " << fused.losses[n] << " fused, " << apart.losses[n]
        << " apart";
  std::printf("[ cuda ] xent fused grad %s N=%lld Vl=%lld valid %lld%s: %zu gradients and %lld "
              "losses bitwise the two kernels'\n",
              type_name<S>(), static_cast<long long>(N), static_cast<long long>(Vl),
              static_cast<long long>(vocab_size), in_place ? " in place" : "",
              fused.dlogits.size(), static_cast<long long>(N));
}

TEST(CudaCrossEntropy, FusedGradIsTheTwoKernelsBitForBit) {
  REQUIRE_CUDA_DEVICE();
  run_cross_entropy_fused_grad<bf16>(37, 50304, 50257, true, 61);
  run_cross_entropy_fused_grad<bf16>(37, 50304, 50257, false, 62);
  run_cross_entropy_fused_grad<bf16>(9, 1003, 1003, true, 63);  // rows not 16-byte aligned
  run_cross_entropy_fused_grad<float>(21, 50304, 50257, true, 64);
  run_cross_entropy_fused_grad<float>(5, 70000, 69990, true, 65);  // 280 KB: past shared memory
}

// ================================================================ AdamW, grad norm
// The CPU AdamW formula (CpuDevice::adamw) on [lo, hi) of w, m, v with one weight decay.
void cpu_adamw(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
               std::vector<float>& v, size_t lo, size_t hi, const gpu::AdamWHyper& h,
               float bias1, float bias2) {
  for (size_t i = lo; i < hi; i++) {
    const float gi = g[i] * h.grad_scale;
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * gi * gi;
    const float m_hat = m[i] / bias1, v_hat = v[i] / bias2;
    w[i] -= h.lr * (m_hat / (std::sqrt(v_hat) + h.eps) + h.weight_decay * w[i]);
  }
}

// Three steps over two segments as the optimizer runs them (decay on the first, none on the
// second, which starts at an odd offset: 16-byte packs and a tail, then the scalar path),
// against the CPU formula; the bf16 copy is exactly the round-to-nearest-even of the GPU's own
// fp32 weights; and a run with every array one float off 16-byte alignment (the scalar path
// throughout) and one without the copy give the same fp32 bits.
TEST(CudaOptim, AdamW) {
  REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(61);
  const size_t n = 100003, split = 50001;
  auto w = random_vec(rng, n);
  std::vector<float> m(n, 0.f), v(n, 0.f);
  // Run 0: aligned, with the copy; run 1: every array at offset 1 (misaligned), with the copy;
  // run 2: aligned, without the copy.
  constexpr int kRuns = 3;
  std::vector<std::unique_ptr<DevBuf<float>>> d_w, d_g, d_m, d_v;
  std::vector<std::unique_ptr<DevBuf<bf16>>> d_wb;
  for (int r = 0; r < kRuns; r++) {
    const size_t off = r == 1 ? 1 : 0;
    std::vector<float> padded(n + 1, 0.f);
    std::copy(w.begin(), w.end(), padded.begin() + off);
    d_w.push_back(std::make_unique<DevBuf<float>>(n + 1));
    d_g.push_back(std::make_unique<DevBuf<float>>(n + 1));
    d_m.push_back(std::make_unique<DevBuf<float>>(n + 1));
    d_v.push_back(std::make_unique<DevBuf<float>>(n + 1));
    d_wb.push_back(std::make_unique<DevBuf<bf16>>(n + 1));
    d_w[r]->upload(padded);
    d_m[r]->upload(std::vector<float>(n + 1, 0.f));
    d_v[r]->upload(std::vector<float>(n + 1, 0.f));
  }
  gpu::AdamWHyper h;
  h.lr = 1e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.grad_scale = 0.5f;
  for (int64_t step = 0; step < 3; step++) {
    const auto g = random_vec(rng, n);
    h.step = step;
    for (int r = 0; r < kRuns; r++) {
      const size_t off = r == 1 ? 1 : 0;
      std::vector<float> padded(n + 1, 0.f);
      std::copy(g.begin(), g.end(), padded.begin() + off);
      d_g[r]->upload(padded);
      for (const auto [lo, hi, decay] : {std::tuple{size_t{0}, split, 0.1f},
                                         std::tuple{split, n, 0.0f}}) {
        gpu::AdamWHyper seg = h;
        seg.weight_decay = decay;
        gpu::adamw_update(d_w[r]->get() + off + lo, d_g[r]->get() + off + lo,
                          d_m[r]->get() + off + lo, d_v[r]->get() + off + lo,
                          static_cast<int64_t>(hi - lo), seg,
                          r == 2 ? nullptr : d_wb[r]->get() + off + lo);
      }
    }
    const double b1 = h.beta1, b2 = h.beta2;
    const float bias1 = static_cast<float>(1.0 - std::pow(b1, double(step + 1)));
    const float bias2 = static_cast<float>(1.0 - std::pow(b2, double(step + 1)));
    gpu::AdamWHyper seg = h;
    seg.weight_decay = 0.1f;
    cpu_adamw(w, g, m, v, 0, split, seg, bias1, bias2);
    seg.weight_decay = 0.0f;
    cpu_adamw(w, g, m, v, split, n, seg, bias1, bias2);
  }
  auto first_n = [&](std::vector<float> x, size_t off) {
    return std::vector<float>(x.begin() + off, x.begin() + off + n);
  };
  const auto w0 = first_n(d_w[0]->download(), 0);
  expect_close("adamw 3 steps", "weights", "fp32", w0, w, 1e-6);
  expect_close("adamw 3 steps", "exp_avg", "fp32", first_n(d_m[0]->download(), 0), m, 1e-6);
  expect_close("adamw 3 steps", "exp_avg_sq", "fp32", first_n(d_v[0]->download(), 0), v, 1e-6);
  const auto wb = d_wb[0]->download_raw();
  size_t copy_differ = 0;
  for (size_t i = 0; i < n; i++) {
    uint16_t got, want;
    const bf16 rounded = __float2bfloat16_rn(w0[i]);
    std::memcpy(&got, &wb[i], sizeof got);
    std::memcpy(&want, &rounded, sizeof want);
    copy_differ += got != want;
  }
  std::printf("  adamw bf16 copy: %zu of %zu differ from the rounded fp32 weights\n", copy_differ,
              n);
  EXPECT_EQ(copy_differ, 0u);
  for (int r = 1; r < kRuns; r++) {
    const size_t off = r == 1 ? 1 : 0;
    const auto wr = first_n(d_w[r]->download(), off);
    const auto mr = first_n(d_m[r]->download(), off);
    EXPECT_EQ(std::memcmp(wr.data(), w0.data(), n * sizeof(float)), 0) << "run " << r;
    EXPECT_EQ(std::memcmp(mr.data(), first_n(d_m[0]->download(), 0).data(), n * sizeof(float)),
              0)
        << "run " << r;
  }
  const auto wb1 = d_wb[1]->download_raw();
  EXPECT_EQ(std::memcmp(wb1.data() + 1, wb.data(), n * sizeof(bf16)), 0)
      << "the scalar path's bf16 copy differs from the packed one";
}

TEST(CudaOptim, GradSquareSum) {
  REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(62);
  const int64_t n = 1000003;
  const auto g = random_vec(rng, n, -3.f, 3.f);
  double ref = 0.0;
  for (float x : g) ref += static_cast<double>(x) * x;
  DevBuf<float> d_g(n);
  d_g.upload(g);
  DevBuf<double> d_r(1);
  gpu::grad_square_sum(d_r.get(), d_g.get(), n);
  const double first = d_r.download_raw()[0];
  gpu::grad_square_sum(d_r.get(), d_g.get(), n);
  const double second = d_r.download_raw()[0];
  gpu::grad_square_sum(d_r.get(), d_g.get(), 1000, /*accumulate=*/true);
  double part = 0.0;
  for (int i = 0; i < 1000; i++) part += static_cast<double>(g[i]) * g[i];
  const double acc = d_r.download_raw()[0];
  std::printf("[ cuda ] grad_square_sum n=%lld: gpu=%.17g ref=%.17g rel=%.3e\n",
              static_cast<long long>(n), first, ref, std::abs(first - ref) / ref);
  EXPECT_LE(std::abs(first - ref) / ref, 1e-12);
  EXPECT_EQ(std::memcmp(&first, &second, sizeof(double)), 0) << "grad_square_sum not deterministic";
  EXPECT_LE(std::abs(acc - (first + part)) / acc, 1e-12);
}

// ================================================================ attention
// Grouped-query layout: qkv rows [q (NH heads) | k (KVH heads) | v (KVH heads)], HS each.
// The MHA layout of the same attention: every query head gets its own copy of its kv head.
std::vector<float> expand_kv_heads(const std::vector<float>& qkv, int64_t rows, int64_t NH,
                                   int64_t KVH, int64_t HS) {
  const int64_t C3 = (NH + 2 * KVH) * HS, C3m = 3 * NH * HS, G = NH / KVH;
  std::vector<float> out(static_cast<size_t>(rows * C3m));
  for (int64_t r = 0; r < rows; r++) {
    const float* src = qkv.data() + r * C3;
    float* dst = out.data() + r * C3m;
    std::copy_n(src, NH * HS, dst);
    for (int64_t h = 0; h < NH; h++) {
      std::copy_n(src + (NH + h / G) * HS, HS, dst + (NH + h) * HS);
      std::copy_n(src + (NH + KVH + h / G) * HS, HS, dst + (2 * NH + h) * HS);
    }
  }
  return out;
}

// train.deterministic = false (bf16; fp32 ignores it): the backward with dQ accumulated by
// atomics against the CPU's dQ (`ref_dq`), and its dK, dV bitwise the deterministic mma_sync
// backward's (the same arithmetic: only dQ's path changed; the atomic backward is mma_sync's
// on every GPU, so on an H100/H200 that is not `deterministic`, the wgmma kernels' result,
// and it runs here). fp32: bitwise `deterministic`. Every element written.
template <typename S>
void expect_atomic_dq_backward(const std::string& k, const std::vector<float>& deterministic,
                               const std::vector<float>& ref_dv, const std::vector<float>& ref_dq,
                               const DevBuf<S>& d_dout, const DevBuf<S>& d_qkv,
                               const DevBuf<S>& d_out, const DevBuf<float>& d_lse,
                               const int32_t* d_docs, int64_t B, int64_t T, int64_t NH,
                               int64_t KVH, int64_t HS, double dq_floor) {
  const int64_t C = NH * HS, Ckv = KVH * HS, C3 = C + 2 * Ckv, rows = B * T;
  DevBuf<S> a_dqkv(static_cast<size_t>(rows * C3));
  CUDA_CHECK(cudaMemset(a_dqkv.get(), 0xff, a_dqkv.size() * sizeof(S)));  // NaN: all written?
  gpu::attention_backward<S>(a_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), B,
                             T, NH, KVH, HS, nullptr, nullptr, d_docs, false,
                             gpu::AttentionKernel::mma_sync);
  const auto got = a_dqkv.download();
  const std::string ka = k + " (atomic dQ)";
  expect_close(ka, "dq", type_name<S>(), cols_of(got, rows, C3, 0, C), ref_dq, tolerance<S>(),
               dq_floor);
  expect_close(ka, "dv", type_name<S>(), cols_of(got, rows, C3, C + Ckv, Ckv), ref_dv,
               tolerance<S>());
  if (std::is_same_v<S, float>) {  // fp32 stays deterministic: the same bits
    EXPECT_TRUE(bitwise_equal(got, deterministic)) << ka << ": fp32 changed";
  } else {
    DevBuf<S> m_dqkv(static_cast<size_t>(rows * C3));
    gpu::attention_backward<S>(m_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                               B, T, NH, KVH, HS, nullptr, nullptr, d_docs, true,
                               gpu::AttentionKernel::mma_sync);
    EXPECT_TRUE(bitwise_equal(cols_of(got, rows, C3, C, 2 * Ckv),
                              cols_of(m_dqkv.download(), rows, C3, C, 2 * Ckv)))
        << ka << ": dk, dv differ from the deterministic mma_sync backward's";
  }
}

template <typename S>
void run_attention(int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t C = NH * HS, Ckv = KVH * HS, C3 = C + 2 * Ckv;
  const auto qkv = quantize<S>(random_vec(rng, B * T * C3));
  const auto dout = quantize<S>(random_vec(rng, B * T * C));
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * C3);
  cpu::attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS);
  cpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                                 T, NH, KVH, HS);
  DevBuf<S> d_qkv(qkv.size()), d_out(out.size()), d_dout(dout.size()), d_dqkv(dqkv.size());
  DevBuf<float> d_lse(B * NH * T);
  d_qkv.upload(qkv);
  d_dout.upload(dout);
  CUDA_CHECK(cudaMemset(d_dqkv.get(), 0xff, d_dqkv.size() * sizeof(S)));  // NaN: all written?
  gpu::attention_forward<S>(d_out.get(), d_lse.get(), d_qkv.get(), B, T, NH, KVH, HS);
  gpu::attention_backward<S>(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), B,
                             T, NH, KVH, HS);
  const std::string k = "attention B=" + std::to_string(B) + " T=" + std::to_string(T) +
                        " NH=" + std::to_string(NH) +
                        (KVH != NH ? " KVH=" + std::to_string(KVH) : std::string()) +
                        " HS=" + std::to_string(HS);
  const auto got_out = d_out.download();
  expect_close(k, "out", type_name<S>(), got_out, out, tolerance<S>());
  const auto got = d_dqkv.download();
  const int64_t rows = B * T;
  const auto ref_dv = cols_of(dqkv, rows, C3, C + Ckv, Ckv);
  double dv_scale = 0.0;  // the natural gradient scale (dq, dk are exactly 0 at T = 1)
  for (float x : ref_dv) dv_scale = std::max(dv_scale, std::abs(static_cast<double>(x)));
  expect_close(k, "dq", type_name<S>(), cols_of(got, rows, C3, 0, C), cols_of(dqkv, rows, C3, 0, C),
               tolerance<S>(), T == 1 ? dv_scale : 0.0);
  expect_close(k, "dk", type_name<S>(), cols_of(got, rows, C3, C, Ckv),
               cols_of(dqkv, rows, C3, C, Ckv), tolerance<S>(), T == 1 ? dv_scale : 0.0);
  expect_close(k, "dv", type_name<S>(), cols_of(got, rows, C3, C + Ckv, Ckv), ref_dv,
               tolerance<S>());
  const auto got_lse = d_lse.download();
  if (T <= 128) {  // logsumexp against a direct double-precision evaluation
    std::vector<float> lse(B * NH * T);
    const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < NH; h++)
        for (int64_t t = 0; t < T; t++) {
          const float* q = qkv.data() + (b * T + t) * C3 + h * HS;
          std::vector<double> s(t + 1);
          double mx = -1e300;
          for (int64_t u = 0; u <= t; u++) {
            const float* kk = qkv.data() + (b * T + u) * C3 + C + (h / (NH / KVH)) * HS;
            double dot = 0;
            for (int64_t d = 0; d < HS; d++) dot += double(q[d]) * kk[d];
            s[u] = dot * scale;
            mx = std::max(mx, s[u]);
          }
          double sum = 0;
          for (double x : s) sum += std::exp(x - mx);
          lse[(b * NH + h) * T + t] = static_cast<float>(mx + std::log(sum));
        }
    expect_close(k, "lse", type_name<S>(), got_lse, lse, std::is_same_v<S, float> ? 1e-5 : 1e-3);
  }
  if (T >= 1024 || KVH != NH) {  // deterministic backward
    gpu::attention_backward<S>(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                               B, T, NH, KVH, HS);
    EXPECT_TRUE(bitwise_equal(got, d_dqkv.download())) << k << ": backward not deterministic";
  }
  expect_atomic_dq_backward<S>(k, got, ref_dv, cols_of(dqkv, rows, C3, 0, C), d_dout, d_qkv,
                               d_out, d_lse, nullptr, B, T, NH, KVH, HS, T == 1 ? dv_scale : 0.0);
  if (KVH != NH) {
    // The kv head mapping changes addresses only: the GQA forward and dQ are bitwise the
    // multi-head kernels' on the expanded layout, and dK/dV are the expanded heads' gradients
    // summed over each group (in another order, so up to rounding).
    const int64_t G = NH / KVH;
    const auto qkv_m = expand_kv_heads(qkv, rows, NH, KVH, HS);
    DevBuf<S> m_qkv(qkv_m.size()), m_out(out.size()), m_dqkv(qkv_m.size());
    DevBuf<float> m_lse(B * NH * T);
    m_qkv.upload(qkv_m);
    gpu::attention_forward<S>(m_out.get(), m_lse.get(), m_qkv.get(), B, T, NH, NH, HS);
    gpu::attention_backward<S>(m_dqkv.get(), d_dout.get(), m_qkv.get(), m_out.get(), m_lse.get(),
                               B, T, NH, NH, HS);
    EXPECT_TRUE(bitwise_equal(got_out, m_out.download())) << k << ": out != MHA on expanded kv";
    EXPECT_TRUE(bitwise_equal(got_lse, m_lse.download())) << k << ": lse != MHA on expanded kv";
    const auto gm = m_dqkv.download();
    EXPECT_TRUE(bitwise_equal(cols_of(got, rows, C3, 0, C), cols_of(gm, rows, 3 * C, 0, C)))
        << k << ": dq != MHA on expanded kv";
    std::vector<float> dkv_sum(static_cast<size_t>(rows * 2 * Ckv), 0.f);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t h = 0; h < NH; h++)
        for (int64_t d = 0; d < HS; d++) {
          dkv_sum[r * 2 * Ckv + (h / G) * HS + d] += gm[r * 3 * C + C + h * HS + d];
          dkv_sum[r * 2 * Ckv + Ckv + (h / G) * HS + d] += gm[r * 3 * C + 2 * C + h * HS + d];
        }
    expect_close(k, "dk,dv vs MHA sum", type_name<S>(), cols_of(got, rows, C3, C, 2 * Ckv),
                 dkv_sum, tolerance<S>());
  }
}

TEST(CudaAttention, Fp32) {
  REQUIRE_CUDA_DEVICE();
  for (int64_t T : {1, 64, 100, 1024}) run_attention<float>(2, T, 4, 4, 64, 70 + T);
  run_attention<float>(2, 100, 4, 4, 32, 81);
  run_attention<float>(1, 200, 2, 2, 128, 82);
}
TEST(CudaAttention, Bf16) {
  REQUIRE_CUDA_DEVICE();
  for (int64_t T : {1, 64, 100, 1024}) run_attention<bf16>(2, T, 4, 4, 64, 90 + T);
  run_attention<bf16>(2, 100, 4, 4, 32, 101);
  run_attention<bf16>(1, 200, 2, 2, 128, 102);
}
// Grouped-query attention: (NH, KVH) = (4, 2) and (4, 1), HS 32 and 64; T = 100 (one or two
// tiles, lse checked) and T = 300 (several tiles of both kernels: 32 fp32, 64 bf16).
TEST(CudaAttention, GqaFp32) {
  REQUIRE_CUDA_DEVICE();
  uint64_t seed = 110;
  for (int64_t kvh : {2, 1})
    for (int64_t hs : {32, 64})
      for (int64_t T : {1, 100, 300}) run_attention<float>(2, T, 4, kvh, hs, seed++);
}
TEST(CudaAttention, GqaBf16) {
  REQUIRE_CUDA_DEVICE();
  uint64_t seed = 130;
  for (int64_t kvh : {2, 1})
    for (int64_t hs : {32, 64})
      for (int64_t T : {1, 100, 300}) run_attention<bf16>(2, T, 4, kvh, hs, seed++);
}

// Packed documents (doc_start): the GPU kernels against the CPU reference with the same
// document starts, per sequence a list of document lengths summing to T. Lengths cross and
// fill the 32-row (fp32) and 64-row (bf16) tiles, so the skipped tiles, the rows with no
// visible key in a tile and the masks inside tiles are all on the path.
template <typename S>
void run_document_attention(int64_t NH, int64_t KVH, int64_t HS,
                            const std::vector<std::vector<int32_t>>& lengths, uint64_t seed) {
  const int64_t B = static_cast<int64_t>(lengths.size());
  int64_t T = 0;
  for (int32_t len : lengths[0]) T += len;
  const std::vector<int32_t> doc_start = trident::test::document_starts_of(lengths);
  ASSERT_EQ(static_cast<int64_t>(doc_start.size()), B * T);
  std::mt19937_64 rng(seed);
  const int64_t C = NH * HS, Ckv = KVH * HS, C3 = C + 2 * Ckv;
  const auto qkv = quantize<S>(random_vec(rng, B * T * C3));
  const auto dout = quantize<S>(random_vec(rng, B * T * C));
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * C3);
  cpu::attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS,
                                doc_start.data());
  cpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                                 T, NH, KVH, HS, doc_start.data());
  DevBuf<S> d_qkv(qkv.size()), d_out(out.size()), d_dout(dout.size()), d_dqkv(dqkv.size());
  DevBuf<float> d_lse(B * NH * T);
  DevBuf<int32_t> d_docs(doc_start.size());
  d_qkv.upload(qkv);
  d_dout.upload(dout);
  d_docs.upload_raw(doc_start);
  CUDA_CHECK(cudaMemset(d_dqkv.get(), 0xff, d_dqkv.size() * sizeof(S)));  // NaN: all written?
  gpu::attention_forward<S>(d_out.get(), d_lse.get(), d_qkv.get(), B, T, NH, KVH, HS, nullptr,
                            d_docs.get());
  gpu::attention_backward<S>(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), B,
                             T, NH, KVH, HS, nullptr, nullptr, d_docs.get());
  const std::string k = "attention (documents) B=" + std::to_string(B) + " T=" +
                        std::to_string(T) + " NH=" + std::to_string(NH) + " KVH=" +
                        std::to_string(KVH) + " HS=" + std::to_string(HS);
  const int64_t rows = B * T;
  const auto got = d_dqkv.download();
  expect_close(k, "out", type_name<S>(), d_out.download(), out, tolerance<S>());
  expect_close(k, "lse", type_name<S>(), d_lse.download(), lse,
               std::is_same_v<S, float> ? 1e-5 : 1e-3);
  expect_close(k, "dq", type_name<S>(), cols_of(got, rows, C3, 0, C), cols_of(dqkv, rows, C3, 0, C),
               tolerance<S>());
  expect_close(k, "dk", type_name<S>(), cols_of(got, rows, C3, C, Ckv),
               cols_of(dqkv, rows, C3, C, Ckv), tolerance<S>());
  expect_close(k, "dv", type_name<S>(), cols_of(got, rows, C3, C + Ckv, Ckv),
               cols_of(dqkv, rows, C3, C + Ckv, Ckv), tolerance<S>());
  gpu::attention_backward<S>(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), B,
                             T, NH, KVH, HS, nullptr, nullptr, d_docs.get());
  EXPECT_TRUE(bitwise_equal(got, d_dqkv.download())) << k << ": backward not deterministic";
  expect_atomic_dq_backward<S>(k, got, cols_of(dqkv, rows, C3, C + Ckv, Ckv),
                               cols_of(dqkv, rows, C3, 0, C), d_dout, d_qkv, d_out, d_lse,
                               d_docs.get(), B, T, NH, KVH, HS, 0.0);
}

TEST(CudaAttention, DocumentsFp32) {
  REQUIRE_CUDA_DEVICE();
  run_document_attention<float>(4, 2, 64, {{1, 40, 23, 100, 36}, {200}}, 301);
  run_document_attention<float>(4, 4, 32, {{70, 1, 1, 128}, {33, 33, 134}}, 302);
  run_document_attention<float>(2, 1, 128, {{5, 95, 100}}, 303);
}
TEST(CudaAttention, DocumentsBf16) {
  REQUIRE_CUDA_DEVICE();
  run_document_attention<bf16>(4, 2, 64, {{1, 40, 23, 100, 36}, {200}}, 311);
  run_document_attention<bf16>(4, 4, 32, {{70, 1, 1, 128}, {33, 33, 134}}, 312);
  run_document_attention<bf16>(8, 2, 128, {{130, 64, 64, 1, 253}}, 313);
}

// The Hopper kernels (AttentionKernel::wgmma: wgmma, TMA, a producer warp; the forward, the
// deterministic backward and the atomic-dQ one) against the CPU's fp32 attention and against
// the mma_sync kernels on the same bf16 inputs, every element written (out, lse and dqkv start
// as NaN), and the same bits on a second run (the atomic dQ: dK and dV). The shapes cross their tiles: 128 query rows a forward / dQ block, key
// tiles of 128 (HS 64) and 64 (HS 128), 128 keys a dK/dV block over query tiles of 64, T below
// one tile and not a multiple of any, GQA (dK/dV summed over the group's heads), packed
// documents (the tiles before a document skipped, rows with no visible key in a tile).
void compare_attention_kernels(int64_t NH, int64_t KVH, int64_t HS,
                               const std::vector<std::vector<int32_t>>& lengths, bool docs,
                               uint64_t seed) {
  const int64_t B = static_cast<int64_t>(lengths.size());
  int64_t T = 0;
  for (int32_t len : lengths[0]) T += len;
  const std::vector<int32_t> doc_start = trident::test::document_starts_of(lengths);
  std::mt19937_64 rng(seed);
  const int64_t C = NH * HS, C3 = C + 2 * KVH * HS;
  const auto qkv = quantize<bf16>(random_vec(rng, B * T * C3));
  const auto dout = quantize<bf16>(random_vec(rng, B * T * C));
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * C3);
  cpu::attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS,
                                docs ? doc_start.data() : nullptr);
  cpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                                 T, NH, KVH, HS, docs ? doc_start.data() : nullptr);
  DevBuf<bf16> d_qkv(qkv.size()), w_out(out.size()), m_out(out.size()), d_dout(dout.size());
  DevBuf<bf16> w_dqkv(dqkv.size()), m_dqkv(dqkv.size());
  DevBuf<float> w_lse(lse.size()), m_lse(lse.size());
  DevBuf<int32_t> d_docs(doc_start.size());
  d_qkv.upload(qkv);
  d_dout.upload(dout);
  d_docs.upload_raw(doc_start);
  const int32_t* starts = docs ? d_docs.get() : nullptr;
  CUDA_CHECK(cudaMemset(w_out.get(), 0xff, w_out.size() * sizeof(bf16)));  // NaN: all written?
  CUDA_CHECK(cudaMemset(w_lse.get(), 0xff, w_lse.size() * sizeof(float)));
  gpu::attention_forward<bf16>(w_out.get(), w_lse.get(), d_qkv.get(), B, T, NH, KVH, HS, nullptr,
                               starts, gpu::AttentionKernel::wgmma);
  gpu::attention_forward<bf16>(m_out.get(), m_lse.get(), d_qkv.get(), B, T, NH, KVH, HS, nullptr,
                               starts, gpu::AttentionKernel::mma_sync);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::string k = std::string("attention wgmma") + (docs ? " (documents)" : "") +
                        " B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" +
                        std::to_string(NH) + " KVH=" + std::to_string(KVH) +
                        " HS=" + std::to_string(HS);
  const auto got_out = w_out.download(), got_lse = w_lse.download();
  expect_close(k, "out vs CPU", "bf16", got_out, out, tolerance<bf16>());
  expect_close(k, "lse vs CPU", "bf16", got_lse, lse, 1e-3);
  expect_close(k, "out vs mma_sync", "bf16", got_out, m_out.download(), tolerance<bf16>());
  expect_close(k, "lse vs mma_sync", "bf16", got_lse, m_lse.download(), 1e-3);
  // The backward of each kernel set from its own forward's out and lse.
  CUDA_CHECK(cudaMemset(w_dqkv.get(), 0xff, w_dqkv.size() * sizeof(bf16)));
  gpu::attention_backward<bf16>(w_dqkv.get(), d_dout.get(), d_qkv.get(), w_out.get(), w_lse.get(),
                                B, T, NH, KVH, HS, nullptr, nullptr, starts, true,
                                gpu::AttentionKernel::wgmma);
  gpu::attention_backward<bf16>(m_dqkv.get(), d_dout.get(), d_qkv.get(), m_out.get(), m_lse.get(),
                                B, T, NH, KVH, HS, nullptr, nullptr, starts, true,
                                gpu::AttentionKernel::mma_sync);
  const auto got = w_dqkv.download(), mma = m_dqkv.download();
  const int64_t rows = B * T, Ckv = KVH * HS;
  double dv_scale = 0.0;  // the natural gradient scale (dq, dk are exactly 0 at T = 1)
  for (float x : cols_of(dqkv, rows, C3, C + Ckv, Ckv))
    dv_scale = std::max(dv_scale, std::abs(static_cast<double>(x)));
  const double floor = T == 1 ? dv_scale : 0.0;
  const struct {
    const char* name;
    int64_t col, width;
  } parts[] = {{"dq", 0, C}, {"dk", C, Ckv}, {"dv", C + Ckv, Ckv}};
  for (const auto& part : parts) {
    const auto g = cols_of(got, rows, C3, part.col, part.width);
    expect_close(k, std::string(part.name) + " vs CPU", "bf16", g,
                 cols_of(dqkv, rows, C3, part.col, part.width), tolerance<bf16>(), floor);
    expect_close(k, std::string(part.name) + " vs mma_sync", "bf16", g,
                 cols_of(mma, rows, C3, part.col, part.width), tolerance<bf16>(), floor);
  }
  // The atomic dQ (deterministic = false): dQ against the CPU, dK and dV the deterministic
  // backward's bit for bit (the same code computes them).
  CUDA_CHECK(cudaMemset(m_dqkv.get(), 0xff, m_dqkv.size() * sizeof(bf16)));
  gpu::attention_backward<bf16>(m_dqkv.get(), d_dout.get(), d_qkv.get(), w_out.get(), w_lse.get(),
                                B, T, NH, KVH, HS, nullptr, nullptr, starts, false,
                                gpu::AttentionKernel::wgmma);
  const auto atomic = m_dqkv.download();
  expect_close(k + " (atomic dQ)", "dq vs CPU", "bf16", cols_of(atomic, rows, C3, 0, C),
               cols_of(dqkv, rows, C3, 0, C), tolerance<bf16>(), floor);
  EXPECT_TRUE(bitwise_equal(cols_of(atomic, rows, C3, C, 2 * Ckv),
                            cols_of(got, rows, C3, C, 2 * Ckv)))
      << k << " (atomic dQ): dk, dv differ from the deterministic backward's";
  // Deterministic: the same bits on a second run.
  gpu::attention_forward<bf16>(m_out.get(), m_lse.get(), d_qkv.get(), B, T, NH, KVH, HS, nullptr,
                               starts, gpu::AttentionKernel::wgmma);
  EXPECT_TRUE(bitwise_equal(got_out, m_out.download())) << k << ": forward not deterministic";
  gpu::attention_backward<bf16>(m_dqkv.get(), d_dout.get(), d_qkv.get(), w_out.get(), w_lse.get(),
                                B, T, NH, KVH, HS, nullptr, nullptr, starts, true,
                                gpu::AttentionKernel::wgmma);
  EXPECT_TRUE(bitwise_equal(got, m_dqkv.download())) << k << ": backward not deterministic";
}

TEST(CudaAttention, WgmmaMatchesMmaSyncAndTheCpu) {
  REQUIRE_CUDA_DEVICE();
  if (!gpu::attention_wgmma_available(64))
    GTEST_SKIP() << "the wgmma attention runs on compute capability 9.0 (H100, H200) only";
  compare_attention_kernels(4, 4, 64, {{1}, {1}}, false, 401);
  compare_attention_kernels(4, 4, 64, {{100}, {100}}, false, 402);
  compare_attention_kernels(4, 2, 64, {{300}, {300}}, false, 403);
  compare_attention_kernels(4, 4, 64, {{1024}, {1024}}, false, 404);
  compare_attention_kernels(4, 4, 128, {{200}, {200}}, false, 405);
  compare_attention_kernels(8, 2, 128, {{1000}}, false, 406);
  compare_attention_kernels(4, 2, 64, {{1, 40, 23, 100, 36}, {200}}, true, 407);
  compare_attention_kernels(8, 2, 128, {{130, 64, 64, 1, 253}}, true, 408);
  compare_attention_kernels(4, 1, 64, {{129, 127, 300}, {556}}, true, 409);
}

TEST(CudaAttention, WgmmaIsRefusedWhereItCannotRun) {
  REQUIRE_CUDA_DEVICE();
  DevBuf<float> f(3 * 64);
  DevBuf<float> lse(1);
  EXPECT_THROW(gpu::attention_forward<float>(f.get(), lse.get(), f.get(), 1, 1, 1, 1, 64, nullptr,
                                             nullptr, gpu::AttentionKernel::wgmma),
               trident::Error);
  EXPECT_THROW(gpu::attention_backward<float>(f.get(), f.get(), f.get(), f.get(), lse.get(), 1, 1,
                                              1, 1, 64, nullptr, nullptr, nullptr, true,
                                              gpu::AttentionKernel::wgmma),
               trident::Error);
  DevBuf<bf16> b(3 * 32);
  EXPECT_THROW(gpu::attention_forward<bf16>(b.get(), lse.get(), b.get(), 1, 1, 1, 1, 32, nullptr,
                                            nullptr, gpu::AttentionKernel::wgmma),
               trident::Error);  // HS 32: mma_sync only
  if (!gpu::attention_wgmma_available(64)) {
    DevBuf<bf16> c(3 * 64);
    EXPECT_THROW(gpu::attention_forward<bf16>(c.get(), lse.get(), c.get(), 1, 1, 1, 1, 64,
                                              nullptr, nullptr, gpu::AttentionKernel::wgmma),
                 trident::Error);
  }
}

// Timings (informational): GPT-2 124M attention shape, B=8 T=1024 NH=12 HS=64.
template <typename S>
void time_attention() {
  const int64_t B = 8, T = 1024, NH = 12, HS = 64, C = NH * HS;
  std::mt19937_64 rng(7);
  DevBuf<S> qkv(B * T * 3 * C), out(B * T * C), dout(B * T * C), dqkv(B * T * 3 * C);
  DevBuf<float> lse(B * NH * T);
  qkv.upload(random_vec(rng, qkv.size()));
  dout.upload(random_vec(rng, dout.size()));
  cudaEvent_t e0, e1, e2;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaEventCreate(&e2));
  gpu::attention_forward<S>(out.get(), lse.get(), qkv.get(), B, T, NH, NH, HS);  // warm-up
  gpu::attention_backward<S>(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.get(), B, T, NH,
                             NH, HS);
  const int iters = 10;
  CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; i++)
    gpu::attention_forward<S>(out.get(), lse.get(), qkv.get(), B, T, NH, NH, HS);
  CUDA_CHECK(cudaEventRecord(e1));
  for (int i = 0; i < iters; i++)
    gpu::attention_backward<S>(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.get(), B, T, NH,
                               NH, HS);
  CUDA_CHECK(cudaEventRecord(e2));
  CUDA_CHECK(cudaEventSynchronize(e2));
  float fwd_ms = 0, bwd_ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&fwd_ms, e0, e1));
  CUDA_CHECK(cudaEventElapsedTime(&bwd_ms, e1, e2));
  fwd_ms /= iters;
  bwd_ms /= iters;
  // Causal: half of the 2 (fwd) or 5 (bwd, useful) T x T x HS GEMMs per head.
  const double f = 2.0 * B * NH * double(T) * T * HS / 2;
  std::printf("[ cuda ] attention timing %s B=8 T=1024 NH=12 HS=64: fwd %.3f ms (%.1f TFLOP/s), "
              "bwd %.3f ms (%.1f TFLOP/s useful)\n",
              type_name<S>(), fwd_ms, 2 * f / fwd_ms * 1e-9, bwd_ms, 5 * f / bwd_ms * 1e-9);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
}

TEST(CudaAttention, TimingReport) {
  REQUIRE_CUDA_DEVICE();
  time_attention<float>();
  time_attention<bf16>();
}

// ================================================================ Llama: RoPE
// In place on qkv[B,T,(NH+2*KVH)*HS]: the q and k heads rotate, v stays bitwise as it was.
template <typename S>
void run_rope(int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS, double theta,
              uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t rows = B * T, C3 = (NH + 2 * KVH) * HS;
  const auto x = quantize<S>(random_vec(rng, rows * C3));
  const auto g = quantize<S>(random_vec(rng, rows * C3));
  std::vector<float> y = x, dx = g;
  cpu::rope_forward<float>(y.data(), B, T, NH, KVH, HS, theta);
  cpu::rope_backward<float>(dx.data(), B, T, NH, KVH, HS, theta);
  DevBuf<S> d_x(x.size()), d_g(g.size());
  d_x.upload(x);
  d_g.upload(g);
  gpu::rope_forward<S>(d_x.get(), B, T, NH, KVH, HS, theta);
  gpu::rope_backward<S>(d_g.get(), B, T, NH, KVH, HS, theta);
  const std::string k = "rope B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" +
                        std::to_string(NH) + " KVH=" + std::to_string(KVH) + " HS=" +
                        std::to_string(HS);
  const auto got_y = d_x.download(), got_dx = d_g.download();
  expect_close(k, "qkv (fwd)", type_name<S>(), got_y, y, tolerance<S>());
  expect_close(k, "dqkv (bwd)", type_name<S>(), got_dx, dx, tolerance<S>());
  const int64_t v0 = (NH + KVH) * HS, Cv = KVH * HS;
  EXPECT_TRUE(bitwise_equal(cols_of(got_y, rows, C3, v0, Cv), cols_of(x, rows, C3, v0, Cv)))
      << k << ": forward touched v";
  EXPECT_TRUE(bitwise_equal(cols_of(got_dx, rows, C3, v0, Cv), cols_of(g, rows, C3, v0, Cv)))
      << k << ": backward touched dv";
}

TEST(CudaLlama, RopeFp32) {
  REQUIRE_CUDA_DEVICE();
  run_rope<float>(2, 300, 4, 2, 64, 10000.0, 201);
  run_rope<float>(3, 17, 4, 4, 32, 10000.0, 202);     // multi-head layout
  run_rope<float>(1, 4096, 2, 1, 128, 500000.0, 203); // long positions, Llama-3 theta
}
TEST(CudaLlama, RopeBf16) {
  REQUIRE_CUDA_DEVICE();
  run_rope<bf16>(2, 300, 4, 2, 64, 10000.0, 204);
  run_rope<bf16>(1, 4096, 2, 1, 128, 500000.0, 205);
}

// ================================================================ Llama: RMSNorm
template <typename S>
void run_rmsnorm(int64_t N, int64_t C, float eps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto x = quantize<S>(random_vec(rng, N * C, -2.f, 2.f));
  const auto w = quantize<S>(random_vec(rng, C, 0.5f, 1.5f));
  const auto dout = quantize<S>(random_vec(rng, N * C));
  const auto dw0 = random_vec(rng, C);  // fp32 gradient, accumulated into
  std::vector<float> out(N * C), rstd(N), dinp(N * C), dw = dw0;
  cpu::rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), N, C,
                              static_cast<double>(eps));
  cpu::rmsnorm_backward<float>(dinp.data(), dw.data(), dout.data(), x.data(), w.data(),
                               rstd.data(), N, C);
  DevBuf<S> d_x(x.size()), d_w(C), d_dout(dout.size()), d_out(out.size()), d_dinp(dinp.size());
  DevBuf<float> d_rstd(N), d_dw(C);
  d_x.upload(x);
  d_w.upload(w);
  d_dout.upload(dout);
  d_dw.upload(dw0);
  gpu::rmsnorm_forward<S>(d_out.get(), d_rstd.get(), d_x.get(), d_w.get(), N, C, eps);
  gpu::rmsnorm_backward<S>(d_dinp.get(), d_dw.get(), d_dout.get(), d_x.get(), d_w.get(),
                           d_rstd.get(), N, C);
  const std::string k = "rmsnorm " + std::to_string(N) + "x" + std::to_string(C);
  expect_close(k, "out", type_name<S>(), d_out.download(), out, tolerance<S>());
  expect_close(k, "rstd", type_name<S>(), d_rstd.download(), rstd, 1e-4);
  expect_close(k, "dinp", type_name<S>(), d_dinp.download(), dinp, tolerance<S>());
  expect_close(k, "dweight(+=)", type_name<S>(), d_dw.download(), dw, 1e-4);
  // Deterministic parameter gradient, also with a caller-provided workspace.
  const auto first = d_dw.download();
  DevBuf<unsigned char> ws(gpu::rmsnorm_backward_workspace_bytes(N, C));
  d_dw.upload(dw0);
  gpu::rmsnorm_backward<S>(d_dinp.get(), d_dw.get(), d_dout.get(), d_x.get(), d_w.get(),
                           d_rstd.get(), N, C, nullptr, ws.get());
  EXPECT_TRUE(bitwise_equal(first, d_dw.download())) << k << ": dweight not deterministic";
}

TEST(CudaLlama, RmsNormFp32) {
  REQUIRE_CUDA_DEVICE();
  run_rmsnorm<float>(300, 768, 1e-5f, 211);
  run_rmsnorm<float>(7, 100, 1e-6f, 212);
  run_rmsnorm<float>(1030, 64, 1e-5f, 213);  // 33 row chunks
  run_rmsnorm<float>(5, 30, 1e-5f, 216);      // rows not 16-byte aligned: the scalar path
}
TEST(CudaLlama, RmsNormBf16) {
  REQUIRE_CUDA_DEVICE();
  run_rmsnorm<bf16>(300, 768, 1e-5f, 214);
  run_rmsnorm<bf16>(7, 100, 1e-6f, 215);      // 100 columns: not whole packs, the scalar path
  run_rmsnorm<bf16>(1100, 2048, 1e-5f, 217);  // Llama 3.2 1B's width, 35 row chunks
}

// ================================================================ Llama: SwiGLU
// Fh a multiple of 8 with aligned buffers takes the 16-byte vector path; odd Fh (or an offset
// start) the scalar path. Gates in [-12, 12] reach the saturated ends of silu.
template <typename S>
void run_swiglu(int64_t N, int64_t Fh, int64_t offset, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto gu = random_vec(rng, N * 2 * Fh);
  std::uniform_real_distribution<float> ug(-12.f, 12.f);
  for (int64_t n = 0; n < N; n++)
    for (int64_t f = 0; f < Fh; f++) gu[n * 2 * Fh + f] = ug(rng);
  gu = quantize<S>(gu);
  const auto dout = quantize<S>(random_vec(rng, N * Fh));
  std::vector<float> out(N * Fh), dgu(N * 2 * Fh);
  cpu::swiglu_forward<float>(out.data(), gu.data(), N, Fh);
  cpu::swiglu_backward<float>(dgu.data(), dout.data(), gu.data(), N, Fh);
  DevBuf<S> d_gu(gu.size() + offset), d_dout(dout.size() + offset), d_out(out.size() + offset),
      d_dgu(dgu.size() + offset);
  std::vector<float> tmp(offset, 0.f);
  tmp.insert(tmp.end(), gu.begin(), gu.end());
  d_gu.upload(tmp);
  tmp.assign(offset, 0.f);
  tmp.insert(tmp.end(), dout.begin(), dout.end());
  d_dout.upload(tmp);
  gpu::swiglu_forward<S>(d_out.get() + offset, d_gu.get() + offset, N, Fh);
  gpu::swiglu_backward<S>(d_dgu.get() + offset, d_dout.get() + offset, d_gu.get() + offset, N,
                          Fh);
  auto down = [&](const DevBuf<S>& d) {
    const auto all = d.download();
    return std::vector<float>(all.begin() + offset, all.end());
  };
  const std::string k = "swiglu " + std::to_string(N) + "x" + std::to_string(Fh) +
                        (offset ? " unaligned" : "");
  expect_close(k, "out", type_name<S>(), down(d_out), out, tolerance<S>());
  const auto got = down(d_dgu);
  expect_close(k, "dgate", type_name<S>(), cols_of(got, N, 2 * Fh, 0, Fh),
               cols_of(dgu, N, 2 * Fh, 0, Fh), tolerance<S>());
  expect_close(k, "dup", type_name<S>(), cols_of(got, N, 2 * Fh, Fh, Fh),
               cols_of(dgu, N, 2 * Fh, Fh, Fh), tolerance<S>());
}

TEST(CudaLlama, SwigluFp32) {
  REQUIRE_CUDA_DEVICE();
  run_swiglu<float>(64, 1024, 0, 221);  // vector path
  run_swiglu<float>(33, 101, 0, 222);   // scalar path (odd Fh)
  run_swiglu<float>(16, 256, 1, 223);   // scalar path (unaligned)
}
TEST(CudaLlama, SwigluBf16) {
  REQUIRE_CUDA_DEVICE();
  run_swiglu<bf16>(64, 1024, 0, 224);
  run_swiglu<bf16>(33, 101, 0, 225);
  run_swiglu<bf16>(16, 256, 3, 226);
}

// ================================================================ position rows (sequence shard)
template <typename S>
void run_position_rows(int64_t first_row, int64_t rows, int64_t T, int64_t C, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto wpe = quantize<S>(random_vec(rng, (T + 3) * C));
  const auto out0 = quantize<S>(random_vec(rng, rows * C));
  std::vector<float> out = out0;
  cpu::position_embedding_forward_rows<float>(out.data(), wpe.data(), first_row, rows, T, C);
  DevBuf<S> d_wpe(wpe.size()), d_out(out.size());
  d_wpe.upload(wpe);
  d_out.upload(out0);
  gpu::position_embedding_forward_rows<S>(d_out.get(), d_wpe.get(), first_row, rows, T, C);
  const std::string k = "position rows [" + std::to_string(first_row) + "," +
                        std::to_string(first_row + rows) + ") T=" + std::to_string(T);
  expect_close(k, "out(+=)", type_name<S>(), d_out.download(), out, tolerance<S>());
}

TEST(CudaEmbedding, PositionRows) {
  REQUIRE_CUDA_DEVICE();
  run_position_rows<float>(37, 41, 50, 96, 231);  // crosses a sequence boundary
  run_position_rows<float>(0, 200, 50, 33, 232);  // whole grid of B = 4, odd C
  run_position_rows<bf16>(37, 41, 50, 96, 233);
  run_position_rows<bf16>(150, 75, 50, 768, 234);
}

// ================================================================ FP8 quantisation
// The inputs of the FP8 checks: every value a bf16 holds (all 65,536 bit patterns: zeros,
// subnormals, infinities, NaNs of both signs), as floats.
std::vector<float> every_bf16_value() {
  std::vector<float> xs(65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t bits = b << 16;
    std::memcpy(&xs[b], &bits, sizeof bits);
  }
  return xs;
}

// gpu::fp8_quantize against the host's float_to_fp8 (util/fp8.hpp), which the CPU reference of
// train.precision = "fp8" quantises with and which claims the hardware conversion's bits: every
// bf16 value and 200,000 floats with full mantissas (ties and near-ties of both grids), times
// scales that carry them across both formats' normal, subnormal and saturating ranges, float
// and bf16 inputs, E4M3 and E5M2. Every code compared, none may differ.
TEST(CudaFp8, QuantizeIsTheHostConversionBitForBit) {
  REQUIRE_CUDA_DEVICE();
  std::vector<float> xs = every_bf16_value();
  std::mt19937_64 rng(53);
  std::uniform_real_distribution<float> wide(-70000.f, 70000.f), narrow(-1.f, 1.f);
  for (int i = 0; i < 100000; ++i) xs.push_back(wide(rng));
  for (int i = 0; i < 100000; ++i) xs.push_back(narrow(rng) * 1e-4f);
  const size_t n = xs.size();
  DevBuf<float> in(n);
  in.upload_raw(xs);
  DevBuf<uint8_t> out(n);
  std::vector<bf16> halves(65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    std::memcpy(&halves[b], &bits, sizeof bits);
  }
  DevBuf<bf16> in16(halves.size());
  in16.upload_raw(halves);
  DevBuf<uint8_t> out16(halves.size());
  int64_t compared = 0, differ = 0;
  for (const trident::Fp8Format f : {trident::Fp8Format::E4M3, trident::Fp8Format::E5M2}) {
    for (const float scale : {1.0f, 0.25f, 149.33333f, 1.0f / 1024.0f, 3.0e4f, 7.5e-6f}) {
      gpu::fp8_quantize<float>(out.get(), in.get(), static_cast<int64_t>(n), scale, f);
      gpu::fp8_quantize<bf16>(out16.get(), in16.get(), 65536, scale, f);
      const std::vector<uint8_t> got = out.download_raw(), got16 = out16.download_raw();
      for (size_t i = 0; i < n; ++i) {
        const uint8_t want = trident::float_to_fp8(xs[i] * scale, f);
        const bool bad = got[i] != want || (i < 65536 && got16[i] != want);
        if (bad && differ++ < 5)
          ADD_FAILURE() << trident::fp8_name(f) << " x = " << xs[i] << " (bits 0x" << std::hex
                        << (i < 65536 ? (i << 16) : 0) << std::dec << ") scale " << scale
                        << ": GPU 0x" << std::hex << int(got[i]) << " / bf16 input 0x"
                        << int(i < 65536 ? got16[i] : 0) << ", host 0x" << int(want);
        compared += i < 65536 ? 2 : 1;
      }
    }
  }
  std::printf("[ measured ] fp8_quantize: %lld codes compared with float_to_fp8, %lld differ\n",
              static_cast<long long>(compared), static_cast<long long>(differ));
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(compared, 2 * 6 * static_cast<int64_t>(n + 65536));
}

// gpu::abs_max against cpu::abs_max: random tensors (the amax somewhere in the middle, and
// negative), n = 0, a NaN anywhere, infinities, bf16 input.
TEST(CudaFp8, AbsMaxIsTheHostsWithNaNAndInfinity) {
  REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(54);
  DevBuf<float> amax(1);
  auto gpu_amax = [&](const std::vector<float>& v) {
    DevBuf<float> d(v.size());
    d.upload_raw(v);
    gpu::abs_max<float>(amax.get(), d.get(), static_cast<int64_t>(v.size()));
    return amax.download_raw()[0];
  };
  for (const size_t n : {size_t{1}, size_t{31}, size_t{1000}, size_t{1} << 20}) {
    std::vector<float> v = random_vec(rng, n, -3.f, 3.f);
    v[n / 2] = -7.25f;
    EXPECT_EQ(gpu_amax(v), cpu::abs_max<float>(v.data(), static_cast<int64_t>(n))) << n;
    EXPECT_EQ(gpu_amax(v), 7.25f) << n;
    v[n - 1] = -std::numeric_limits<float>::infinity();
    EXPECT_EQ(gpu_amax(v), std::numeric_limits<float>::infinity()) << n;
    v[n / 3] = -std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(gpu_amax(v))) << n;
    EXPECT_TRUE(std::isnan(cpu::abs_max<float>(v.data(), static_cast<int64_t>(n)))) << n;
  }
  gpu::abs_max<float>(amax.get(), amax.get(), 0);
  EXPECT_EQ(amax.download_raw()[0], 0.0f) << "n = 0";
  const std::vector<float> q = quantize<bf16>(random_vec(rng, 4097, -5.f, 5.f));
  DevBuf<bf16> d16(q.size());
  d16.upload(q);
  gpu::abs_max<bf16>(amax.get(), d16.get(), static_cast<int64_t>(q.size()));
  EXPECT_EQ(amax.download_raw()[0], cpu::abs_max<float>(q.data(), static_cast<int64_t>(q.size())));
}

// gpu::fp8_quantize's fused amax (the delayed recipe's device slots): the same codes as without
// it, and the slot becomes max(its value, abs_max of the input) by bit pattern: accumulated
// over calls (not reset), a NaN anywhere dominating, bf16 input; nullptr leaves it alone.
TEST(CudaFp8, QuantizeTakesTheAmaxIntoItsSlot) {
  REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(56);
  const trident::Fp8Format f = trident::Fp8Format::E4M3;
  DevBuf<float> slot(1);
  int64_t compared = 0;
  for (const size_t n : {size_t{1}, size_t{33}, size_t{1} << 20}) {
    std::vector<float> v = random_vec(rng, n, -3.f, 3.f), v2 = random_vec(rng, n, -1.f, 1.f);
    v[n / 2] = -7.25f;
    DevBuf<float> d(n), d2(n);
    d.upload_raw(v);
    d2.upload_raw(v2);
    DevBuf<uint8_t> with(n), without(n);
    slot.upload_raw(std::vector<float>{0.5f});
    gpu::fp8_quantize<float>(with.get(), d.get(), static_cast<int64_t>(n), 20.f, f, nullptr,
                             slot.get());
    gpu::fp8_quantize<float>(without.get(), d.get(), static_cast<int64_t>(n), 20.f, f);
    EXPECT_EQ(with.download_raw(), without.download_raw()) << n;
    compared += static_cast<int64_t>(n);
    EXPECT_EQ(slot.download_raw()[0], 7.25f) << n;
    gpu::fp8_quantize<float>(with.get(), d2.get(), static_cast<int64_t>(n), 20.f, f, nullptr,
                             slot.get());
    EXPECT_EQ(slot.download_raw()[0], 7.25f) << n << ": a smaller tensor keeps the slot's";
    gpu::fp8_quantize<float>(with.get(), d.get(), static_cast<int64_t>(n), 20.f, f);
    v2[n - 1] = std::numeric_limits<float>::quiet_NaN();
    d2.upload_raw(v2);
    gpu::fp8_quantize<float>(with.get(), d2.get(), static_cast<int64_t>(n), 20.f, f, nullptr,
                             slot.get());
    EXPECT_TRUE(std::isnan(slot.download_raw()[0])) << n;
  }
  const std::vector<float> q = quantize<bf16>(random_vec(rng, 4097, -5.f, 5.f));
  DevBuf<bf16> d16(q.size());
  d16.upload(q);
  DevBuf<uint8_t> out16(q.size());
  slot.upload_raw(std::vector<float>{0.f});
  gpu::fp8_quantize<bf16>(out16.get(), d16.get(), static_cast<int64_t>(q.size()), 20.f, f,
                          nullptr, slot.get());
  EXPECT_EQ(slot.download_raw()[0], cpu::abs_max<float>(q.data(), static_cast<int64_t>(q.size())));
  EXPECT_EQ(compared, 1 + 33 + (1 << 20));
}

// gpu::fp8_quantize_transposed (the backward's cast-transpose): every code where the host's
// float_to_fp8 and a host transpose put it, transposed and (when asked) row-major in the same
// pass, shapes from one element to several 32 x 32 tiles with ragged edges, float and bf16
// inputs, both formats; the amax as fp8_quantize's (into the slot, not reset).
TEST(CudaFp8, QuantizeTransposedIsTheHostsCodesTransposed) {
  REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(55);
  int64_t compared = 0, differ = 0;
  DevBuf<float> slot(1);
  for (const trident::Fp8Format f : {trident::Fp8Format::E4M3, trident::Fp8Format::E5M2})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {1, 77}, {33, 65},
                                     {100, 37}, {256, 512}}) {
      const size_t n = static_cast<size_t>(rows * cols);
      const std::vector<float> in = quantize<bf16>(random_vec(rng, n, -300.f, 300.f));
      DevBuf<float> d_in(n);
      d_in.upload_raw(in);
      DevBuf<bf16> d16(n);
      d16.upload(in);
      DevBuf<uint8_t> t(n), t16(n), rowmajor(n);
      slot.upload_raw(std::vector<float>{0.f});
      const float scale = 1.5f;
      gpu::fp8_quantize_transposed<float>(t.get(), rowmajor.get(), d_in.get(), rows, cols, scale,
                                          f, nullptr, slot.get());
      gpu::fp8_quantize_transposed<bf16>(t16.get(), nullptr, d16.get(), rows, cols, scale, f);
      const std::vector<uint8_t> got_t = t.download_raw(), got_t16 = t16.download_raw(),
                                 got_r = rowmajor.download_raw();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const uint8_t want = trident::float_to_fp8(in[r * cols + c] * scale, f);
          const auto at_t = static_cast<size_t>(c * rows + r),
                     at = static_cast<size_t>(r * cols + c);
          if (got_t[at_t] != want || got_t16[at_t] != want || got_r[at] != want) ++differ;
          compared += 3;
        }
      EXPECT_EQ(slot.download_raw()[0], cpu::abs_max<float>(in.data(), static_cast<int64_t>(n)))
          << rows << " x " << cols;
    }
  std::printf("[ measured ] fp8_quantize_transposed: %lld codes compared, %lld differ\n",
              static_cast<long long>(compared), static_cast<long long>(differ));
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(compared, 2 * 3 * (1 + 77 + 33 * 65 + 100 * 37 + 256 * 512));
}

// Random finite FP8 codes of a format (no NaN; every finite code may come).
std::vector<uint8_t> random_codes(std::mt19937_64& rng, size_t n, trident::Fp8Format f) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) {
    do b = static_cast<uint8_t>(rng());
    while (!std::isfinite(trident::fp8_to_float(b, f)));
  }
  return v;
}

// The current recipe's scales formed on the device (kernels_fp8_device_scales): gpu::fp8_scales
// is the host's fp8_scale to the bit (amaxes over the whole float range, 0, subnormals, infinity,
// NaN; margins 0 and 2; both formats), gpu::fp8_dequant is 1.0f / (a * b) to the bit, a
// quantisation reading its scale from the device gives the codes of the same scale passed by
// value, and fp8_gemm's device factor scales the product as alpha does (the same bits).
TEST(CudaFp8, ScalesFormedOnTheDeviceAreTheHosts) {
  REQUIRE_CUDA_DEVICE();
  using trident::Fp8Format;
  std::mt19937_64 rng(57);
  std::vector<float> amax = {0.f, 1e-45f, 1e-40f, 1.17549435e-38f, 3e-38f, 1e-30f, 1.f, 448.f,
                             57344.f, 3.4e38f, std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN()};
  std::uniform_real_distribution<float> exponent(-44.f, 38.f);
  for (int i = 0; i < 2000; ++i) amax.push_back(std::pow(10.f, exponent(rng)));
  DevBuf<float> d_amax(amax.size()), d_scale(amax.size());
  d_amax.upload_raw(amax);
  int64_t compared = 0, differ = 0;
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (const int margin : {0, 2}) {
      gpu::fp8_scales(d_scale.get(), d_amax.get(), static_cast<int64_t>(amax.size()), f, margin);
      const std::vector<float> got = d_scale.download_raw();
      for (size_t i = 0; i < amax.size(); ++i, ++compared) {
        const float want = trident::fp8_scale(amax[i], 1.0f, f, margin);
        if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want) && differ++ < 5)
          ADD_FAILURE() << "amax " << amax[i] << " margin " << margin << ": " << got[i]
                        << " vs host " << want;
      }
    }
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(compared, 4 * static_cast<int64_t>(amax.size()));
  // The output factor, and the quantisation through the device scale.
  DevBuf<float> a(1), b(1), factor(1);
  for (const auto& [sa, sb] : {std::pair{448.f / 3.f, 57344.f / 1e-3f}, {1.f, 1.f},
                               {3.0e4f, 7.5e-6f}}) {
    a.upload_raw(std::vector<float>{sa});
    b.upload_raw(std::vector<float>{sb});
    gpu::fp8_dequant(factor.get(), a.get(), b.get());
    EXPECT_EQ(factor.download_raw()[0], 1.0f / (sa * sb)) << sa << " " << sb;
  }
  const size_t n = 4099;
  const std::vector<float> x = random_vec(rng, n, -300.f, 300.f);
  DevBuf<float> dx(n);
  dx.upload_raw(x);
  DevBuf<uint8_t> by_value(n), by_pointer(n), t_value(n), t_pointer(n);
  a.upload_raw(std::vector<float>{1.37f});
  gpu::fp8_quantize<float>(by_value.get(), dx.get(), static_cast<int64_t>(n), 1.37f,
                           Fp8Format::E4M3);
  gpu::fp8_quantize<float>(by_pointer.get(), dx.get(), static_cast<int64_t>(n), 99.f,
                           Fp8Format::E4M3, nullptr, nullptr, a.get());
  EXPECT_EQ(by_pointer.download_raw(), by_value.download_raw());
  gpu::fp8_quantize_transposed<float>(t_value.get(), nullptr, dx.get(), 1,
                                      static_cast<int64_t>(n), 1.37f, Fp8Format::E4M3);
  gpu::fp8_quantize_transposed<float>(t_pointer.get(), nullptr, dx.get(), 1,
                                      static_cast<int64_t>(n), 99.f, Fp8Format::E4M3, nullptr,
                                      nullptr, a.get());
  EXPECT_EQ(t_pointer.download_raw(), t_value.download_raw());
  // fp8_gemm: alpha = 1/4096 against alpha = 1 with the factor 1/4096 on the device.
  gpu::CublasContext ctx;
  const int64_t M = 64, N = 48, K = 64;
  const std::vector<uint8_t> ca = random_codes(rng, M * K, Fp8Format::E4M3),
                             cb = random_codes(rng, N * K, Fp8Format::E4M3);
  DevBuf<uint8_t> da(ca.size()), db(cb.size());
  da.upload_raw(ca);
  db.upload_raw(cb);
  DevBuf<bf16> c_alpha(M * N), c_factor(M * N);
  factor.upload_raw(std::vector<float>{1.0f / 4096.0f});
  gpu::fp8_gemm(ctx, Fp8Format::E4M3, Fp8Format::E4M3, gpu::DType::BF16, M, N, K,
                1.0f / 4096.0f, da.get(), db.get(), 0.0f, c_alpha.get(), nullptr);
  gpu::fp8_gemm(ctx, Fp8Format::E4M3, Fp8Format::E4M3, gpu::DType::BF16, M, N, K, 1.0f,
                da.get(), db.get(), 0.0f, c_factor.get(), nullptr, nullptr, factor.get());
  // The factor (a power of two) scales exactly as alpha does; the two calls are cached under
  // different keys and may take different algorithms, whose sums may round the bf16 output a
  // last place apart: within 2^-8 of the largest value, where a missing or doubled factor is
  // 4096x off (a near-cancelled sum's own last place is no measure of either).
  const std::vector<float> want = c_alpha.download(), got = c_factor.download();
  double largest = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, double(std::fabs(want[i])));
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= worst)) worst = d;  // a NaN stays
  }
  EXPECT_GT(largest, 0.0) << "a product to compare";
  EXPECT_LE(worst, largest / 256) << "the device factor scales the product as alpha does";
}

// gpu::fp8_gemm against the host's double sums of the decoded codes: C = alpha A B^T + bias in
// bf16 (E4M3 x E4M3, the forward's) and C += alpha A B^T in f32 (E5M2 x E4M3, the weight
// gradient's), at shapes of the linear layers (K a multiple of 16). The bounds, against the sum
// of the products' magnitudes: 5e-3 with a bf16 output (its rounding, 2^-8 of the value), 1e-3
// in f32 (the FP8 tensor cores sum in less than fp32 between cuBLAS's promotions to fp32); a
// wrong layout, transpose or scale is off by the whole value.
TEST(CudaFp8, GemmIsTheHostsSumOfTheDecodedCodes) {
  REQUIRE_CUDA_DEVICE();
  using trident::Fp8Format;
  gpu::CublasContext ctx;
  std::mt19937_64 rng(56);
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{64, 48, 32},
                                {256, 768, 768}, {100, 200, 3072}}) {
    for (const bool f32 : {false, true}) {
      const Fp8Format fa = f32 ? Fp8Format::E5M2 : Fp8Format::E4M3, fb = Fp8Format::E4M3;
      const std::vector<uint8_t> a = random_codes(rng, M * K, fa), b = random_codes(rng, N * K, fb);
      const std::vector<float> bias = quantize<bf16>(random_vec(rng, N, -2.f, 2.f));
      const std::vector<float> c0 = random_vec(rng, M * N, -1.f, 1.f);
      const float alpha = 1.0f / 4096.0f;
      DevBuf<uint8_t> da(a.size()), db(b.size());
      da.upload_raw(a);
      db.upload_raw(b);
      DevBuf<bf16> dbias(N), c16(M * N);
      DevBuf<float> c32(M * N);
      dbias.upload(bias);
      c32.upload(c0);
      if (f32)
        gpu::fp8_gemm(ctx, fa, fb, gpu::DType::F32, M, N, K, alpha, da.get(), db.get(), 1.0f,
                      c32.get(), nullptr);
      else
        gpu::fp8_gemm(ctx, fa, fb, gpu::DType::BF16, M, N, K, alpha, da.get(), db.get(), 0.0f,
                      c16.get(), dbias.get());
      const std::vector<float> got = f32 ? c32.download() : c16.download();
      double worst = 0;
      int64_t compared = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double p = double(trident::fp8_to_float(a[m * K + k], fa)) *
                             trident::fp8_to_float(b[n * K + k], fb);
            sum += p;
            mag += std::fabs(p);
          }
          const double want = alpha * sum + (f32 ? c0[m * N + n] : bias[n]);
          const double scale = alpha * mag + std::fabs(want) + 1e-30;
          worst = std::max(worst, std::fabs(got[m * N + n] - want) / scale);
          ++compared;
        }
      EXPECT_EQ(compared, M * N);
      EXPECT_LE(worst, f32 ? 1e-3 : 5e-3)
          << M << " x " << N << " x " << K << (f32 ? " f32" : " bf16");
      std::printf("[ measured ] fp8_gemm %lld x %lld x %lld (%s): worst %.2e of the sum's scale\n",
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                  f32 ? "E5M2 x E4M3, f32 +=" : "E4M3 x E4M3, bf16 + bias", worst);
    }
  }
  // What the FP8 tensor cores cannot take is one line naming it.
  DevBuf<uint8_t> x(64);
  DevBuf<bf16> out(16);
  EXPECT_THROW(gpu::fp8_gemm(ctx, Fp8Format::E4M3, Fp8Format::E4M3, gpu::DType::BF16, 4, 4, 12,
                             1.0f, x.get(), x.get(), 0.0f, out.get(), nullptr),
               trident::Error)
      << "K = 12: not a multiple of 16";
  EXPECT_THROW(gpu::fp8_gemm(ctx, Fp8Format::E5M2, Fp8Format::E5M2, gpu::DType::BF16, 4, 4, 16,
                             1.0f, x.get(), x.get(), 0.0f, out.get(), nullptr),
               trident::Error)
      << "E5M2 x E5M2";
}

}  // namespace

#endif  // TRIDENT_TEST_CUDA

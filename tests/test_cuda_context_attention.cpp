// The CUDA kernels of context parallelism's ring attention (kernels/cuda/context_attention.cu,
// decode.cu's rope_backward_at, embedding.cu's position_embedding_*_at) against the CPU
// reference kernels (kernels/cpu/context_attention.cpp, decode.cpp, embedding.cpp), fp32 and
// bf16:
//  * the whole chunked scheme on N = 1, 2, 4 simulated context ranks on the GPU (rank i holds
//    chunks i and 2N-1-i; attention_forward on the local rows, the other ranks' kv blocks merged
//    in; the backward from the final out/lse, each block's dk/dv accumulated and unpacked) against
//    the CPU's attention_forward / attention_backward on the full sequence in double: out, lse,
//    dqkv. This is what checks that the merges use the GPU attention's saved lse layout;
//  * attention_merge_forward / attention_merge_backward against the CPU's on random inputs with
//    ranges that end inside the 32-row tiles, rows with lse = -inf (no keys yet), and the
//    buffers' other rows (which must be untouched: the whole buffers are compared);
//  * merge_backward run twice: bitwise equal (no atomics);
//  * kv_pack / kv_unpack exactly; rope_backward_at and position_embedding_{forward,backward}_at
//    at scattered, repeated positions.
// Inputs are rounded to the storage type first. The error is the max-norm relative error
// max |gpu - ref| / max |ref|: tolerance 1e-5 fp32, 2e-2 bf16. Each comparison prints one line.
// Without a CUDA device every test is skipped.
#include <gtest/gtest.h>

#ifndef TRIDENT_TEST_CUDA

TEST(CudaContextAttention, NotBuilt) {
  GTEST_SKIP() << "TRIDENT_CUDA is OFF: GPU tests not built";
}

#else

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/ops.hpp"
#include "context_ring_shape.hpp"
#include "cuda_storage.hpp"

namespace {

namespace gpu = trident::cuda;
namespace cpu = trident::cpu;
using gpu::bf16;
using namespace trident::testing_support;
using namespace trident::test;

template <typename S>
double tolerance() {
  return std::is_same_v<S, float> ? 1e-5 : 2e-2;
}
template <typename S>
std::string type_name() {
  return std::is_same_v<S, float> ? "fp32" : "bf16";
}


std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Device buffer of n elements of T, freed with the object.
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)),
              cudaSuccess);
  }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  void upload_raw(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n_);
    EXPECT_EQ(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download_raw() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// A device copy of float values in storage type S (float stays float).
template <typename S>
class Values : public DevBuf<S> {
 public:
  explicit Values(size_t n) : DevBuf<S>(n) {}
  explicit Values(const std::vector<float>& h) : DevBuf<S>(h.size()) { upload(h); }
  void upload(const std::vector<float>& h) {
    std::vector<S> s(h.size());
    for (size_t i = 0; i < h.size(); ++i) s[i] = to_storage<S>(h[i]);
    this->upload_raw(s);
  }
  std::vector<float> download() const {
    const std::vector<S> s = this->download_raw();
    std::vector<float> h(s.size());
    for (size_t i = 0; i < s.size(); ++i) h[i] = to_float<S>(s[i]);
    return h;
  }
};

template <typename R>
void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<R>& ref, double tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_FALSE(ref.empty()) << what << ": nothing compared";
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = static_cast<double>(ref[i]), g = got[i];
    if (std::isinf(r) || std::isinf(g)) {  // lse = -inf rows: equal infinities
      EXPECT_EQ(g, r) << what << " [" << i << "]";
      continue;
    }
    max_abs = std::max(max_abs, std::fabs(g - r));
    max_ref = std::max(max_ref, std::fabs(r));
  }
  const double rel = max_abs / std::max(max_ref, 1e-30);
  std::printf("[ cuda ] %-58s %8zu values max_abs=%.3e rel=%.3e (tol %.0e)\n", what.c_str(),
              ref.size(), max_abs, rel, tol);
  EXPECT_LE(rel, tol) << what;
}

#define REQUIRE_CUDA_DEVICE()                                                          \
  do {                                                                                 \
    if (!gpu::device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped"; \
  } while (0)

// ------------------------------------------------------------- the chunked scheme on N ranks

struct RingResult {
  std::vector<float> out, lse, dqkv;  // global layouts
};

// The ring on N simulated ranks with the GPU kernels, in the order the model runs them.
template <typename S>
RingResult gpu_ring(const RingShape& s, const std::vector<float>& qkv,
                    const std::vector<float>& dout) {
  const int64_t N = s.N, B = s.B, Tl = s.Tl(), rows = B * Tl;
  std::vector<std::unique_ptr<Values<S>>> lqkv, ldout, out, kv, dqkv, dkv;
  std::vector<std::unique_ptr<DevBuf<float>>> lse;
  for (int64_t i = 0; i < N; i++) {
    lqkv.push_back(std::make_unique<Values<S>>(to_local(qkv, s, i, s.CQ())));
    ldout.push_back(std::make_unique<Values<S>>(to_local(dout, s, i, s.C())));
    out.push_back(std::make_unique<Values<S>>(rows * s.C()));
    lse.push_back(std::make_unique<DevBuf<float>>(B * s.NH * Tl));
    kv.push_back(std::make_unique<Values<S>>(rows * s.KVC()));
    dqkv.push_back(std::make_unique<Values<S>>(rows * s.CQ()));
    dkv.push_back(std::make_unique<Values<S>>(rows * s.KVC()));
    gpu::attention_forward<S>(out[i]->get(), lse[i]->get(), lqkv[i]->get(), B, Tl, s.NH, s.KVH,
                              s.HS);
    gpu::kv_pack<S>(kv[i]->get(), lqkv[i]->get(), rows, s.NH, s.KVH, s.HS);
  }
  for (int64_t i = 0; i < N; i++)
    for (int64_t step = 1; step < N; step++) {  // the ring's order: blocks of i-1, i-2, ...
      const int64_t j = (i - step + N) % N;
      const BlockPair p = block_pair(s, i, j);
      gpu::attention_merge_forward<S>(out[i]->get(), lse[i]->get(), lqkv[i]->get(), kv[j]->get(),
                                      B, Tl, p.q0, p.Tq, p.k0, p.Tk, s.NH, s.KVH, s.HS);
    }
  for (int64_t i = 0; i < N; i++) {
    gpu::attention_backward<S>(dqkv[i]->get(), ldout[i]->get(), lqkv[i]->get(), out[i]->get(),
                               lse[i]->get(), B, Tl, s.NH, s.KVH, s.HS);
    gpu::kv_pack<S>(dkv[i]->get(), dqkv[i]->get(), rows, s.NH, s.KVH, s.HS);
  }
  for (int64_t i = 0; i < N; i++)
    for (int64_t step = 1; step < N; step++) {
      const int64_t j = (i - step + N) % N;
      const BlockPair p = block_pair(s, i, j);
      gpu::attention_merge_backward<S>(dqkv[i]->get(), dkv[j]->get(), ldout[i]->get(),
                                       lqkv[i]->get(), kv[j]->get(), out[i]->get(),
                                       lse[i]->get(), B, Tl, p.q0, p.Tq, p.k0, p.Tk, s.NH, s.KVH,
                                       s.HS);
    }
  RingResult r{std::vector<float>(B * s.T * s.C()), std::vector<float>(B * s.NH * s.T),
               std::vector<float>(qkv.size())};
  for (int64_t i = 0; i < N; i++) {
    gpu::kv_unpack<S>(dqkv[i]->get(), dkv[i]->get(), rows, s.NH, s.KVH, s.HS);
    from_local(r.out, out[i]->download(), s, i, s.C());
    lse_from_local(r.lse, lse[i]->download_raw(), s, i);
    from_local(r.dqkv, dqkv[i]->download(), s, i, s.CQ());
  }
  return r;
}

template <typename S>
void check_ring(const RingShape& s) {
  ASSERT_EQ(s.T % (2 * s.N), 0) << s.name();
  std::mt19937_64 rng(1000 + s.T + 10 * s.N + 100 * s.KVH + s.HS);
  // Scores of a few units: rows far from uniform, so that misplaced keys show.
  const auto qkv = random_values<S>(rng, s.B * s.T * s.CQ(), -1.5f, 1.5f);
  const auto dout = random_values<S>(rng, s.B * s.T * s.C());
  const std::vector<double> qkv_d = to_double(qkv), dout_d = to_double(dout);
  std::vector<double> out(s.B * s.T * s.C()), lse(s.B * s.NH * s.T), dqkv(qkv.size());
  cpu::attention_forward<double>(out.data(), lse.data(), qkv_d.data(), s.B, s.T, s.NH, s.KVH,
                                 s.HS);
  cpu::attention_backward<double>(dqkv.data(), dout_d.data(), qkv_d.data(), out.data(),
                                  lse.data(), s.B, s.T, s.NH, s.KVH, s.HS);
  const RingResult got = gpu_ring<S>(s, qkv, dout);
  const std::string tag = " " + type_name<S>() + " " + s.name();
  expect_close("ring out" + tag, got.out, out, tolerance<S>());
  expect_close("ring lse" + tag, got.lse, lse, tolerance<S>());
  expect_close("ring dqkv" + tag, got.dqkv, dqkv, tolerance<S>());
}

// T = 8 * 37: chunks of 37 (N = 4) and 74 (N = 2) rows, never a multiple of the 32-row tiles;
// every head size the attention takes; grouped-query and multi-head.
template <typename S>
void ring_cases() {
  for (int64_t N : {1, 2, 4}) {
    check_ring<S>({2, 296, N, 4, 2, 32});  // GQA
    check_ring<S>({2, 296, N, 3, 3, 64});  // MHA
  }
  check_ring<S>({1, 256, 2, 2, 1, 128});
  check_ring<S>({2, 600, 2, 4, 2, 32});  // 150-row chunks
}

// ------------------------------------------------------------- one merge against the CPU's

struct MergeCase {
  int64_t B, Tl, NH, KVH, HS, q0, Tq, k0, Tk;
  int64_t CQ() const { return (NH + 2 * KVH) * HS; }
  int64_t C() const { return NH * HS; }
  int64_t KVC() const { return 2 * KVH * HS; }
  std::string name() const {
    return "B=" + std::to_string(B) + " Tl=" + std::to_string(Tl) + " NH=" + std::to_string(NH) +
           " KVH=" + std::to_string(KVH) + " HS=" + std::to_string(HS) + " q[" +
           std::to_string(q0) + "+" + std::to_string(Tq) + ") k[" + std::to_string(k0) + "+" +
           std::to_string(Tk) + ")";
  }
};

template <typename S>
void check_merge(const MergeCase& c) {
  std::mt19937_64 rng(77 + c.Tl + c.q0 + c.HS);
  const auto qkv = random_values<S>(rng, c.B * c.Tl * c.CQ(), -1.5f, 1.5f);
  const auto kv = random_values<S>(rng, c.B * c.Tl * c.KVC(), -1.5f, 1.5f);
  const auto out0 = random_values<S>(rng, c.B * c.Tl * c.C());
  // The running log-sum-exp of the keys seen before: a few units, every 5th row none (-inf).
  std::vector<float> lse0 = random_values<float>(rng, c.B * c.NH * c.Tl, 0.5f, 3.f);
  for (size_t i = 0; i < lse0.size(); i += 5) lse0[i] = -std::numeric_limits<float>::infinity();
  const std::string tag = " " + type_name<S>() + " " + c.name();

  // Forward.
  std::vector<float> out = out0, lse = lse0;
  cpu::attention_merge_forward<float>(out.data(), lse.data(), qkv.data(), kv.data(), c.B, c.Tl,
                                      c.q0, c.Tq, c.k0, c.Tk, c.NH, c.KVH, c.HS);
  Values<S> d_qkv(qkv), d_kv(kv), d_out(out0);
  DevBuf<float> d_lse(lse0.size());
  d_lse.upload_raw(lse0);
  gpu::attention_merge_forward<S>(d_out.get(), d_lse.get(), d_qkv.get(), d_kv.get(), c.B, c.Tl,
                                  c.q0, c.Tq, c.k0, c.Tk, c.NH, c.KVH, c.HS);
  // Rows with lse = -inf before and outside the query range hold out0's values on both sides.
  expect_close("merge_forward out" + tag, d_out.download(), out, tolerance<S>());
  expect_close("merge_forward lse" + tag, d_lse.download_raw(), lse, tolerance<S>());

  // Backward from that (final) out and lse, accumulating into random dqkv and dkv. out as the
  // GPU holds it (rounded to S), so that both sides see the same delta = rowsum(dout * out).
  const std::vector<float> out_s = d_out.download();
  std::vector<float> lse_f = lse;
  for (float& x : lse_f)
    if (std::isinf(x)) x = 0.f;  // rows outside the query range are not read; keep it finite
  const auto dout = random_values<S>(rng, c.B * c.Tl * c.C());
  // fp32: small random gradients to accumulate onto (the CPU adds a kv head's query heads one
  // GEMM at a time, the GPU once: order-1 starting values would round the two apart by more
  // than the tolerance of the increment compared below); bf16: zeros, as the rounding of any
  // sum to bf16 would swamp the increment.
  const bool fp32 = std::is_same_v<S, float>;
  const auto dqkv0 = fp32 ? random_values<S>(rng, qkv.size(), -1e-2f, 1e-2f)
                          : std::vector<float>(qkv.size());
  const auto dkv0 = fp32 ? random_values<S>(rng, kv.size(), -1e-2f, 1e-2f)
                         : std::vector<float>(kv.size());
  std::vector<float> dqkv = dqkv0, dkv = dkv0;
  cpu::attention_merge_backward<float>(dqkv.data(), dkv.data(), dout.data(), qkv.data(),
                                       kv.data(), out_s.data(), lse_f.data(), c.B, c.Tl, c.q0,
                                       c.Tq, c.k0, c.Tk, c.NH, c.KVH, c.HS);
  Values<S> d_dout(dout), d_dqkv(dqkv0), d_dkv(dkv0), d_outs(out_s);
  DevBuf<float> d_lsef(lse_f.size());
  d_lsef.upload_raw(lse_f);
  auto backward = [&](Values<S>& dq, Values<S>& dk) {
    gpu::attention_merge_backward<S>(dq.get(), dk.get(), d_dout.get(), d_qkv.get(), d_kv.get(),
                                     d_outs.get(), d_lsef.get(), c.B, c.Tl, c.q0, c.Tq, c.k0,
                                     c.Tk, c.NH, c.KVH, c.HS);
  };
  backward(d_dqkv, d_dkv);
  // The accumulation onto values of order 1 hides small gradients: compare the increments.
  auto increment = [](std::vector<float> after, const std::vector<float>& before) {
    for (size_t i = 0; i < after.size(); ++i) after[i] -= before[i];
    return after;
  };
  const std::vector<float> g_dqkv = d_dqkv.download(), g_dkv = d_dkv.download();
  expect_close("merge_backward dqkv increment" + tag, increment(g_dqkv, dqkv0),
               increment(dqkv, dqkv0), tolerance<S>());
  expect_close("merge_backward dkv increment" + tag, increment(g_dkv, dkv0),
               increment(dkv, dkv0), tolerance<S>());
  // Rows outside the ranges untouched, to the bit.
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t t = 0; t < c.Tl; t++) {
      const size_t qrow = static_cast<size_t>((b * c.Tl + t) * c.CQ());
      const size_t krow = static_cast<size_t>((b * c.Tl + t) * c.KVC());
      if (t < c.q0 || t >= c.q0 + c.Tq)
        EXPECT_TRUE(std::equal(g_dqkv.begin() + qrow, g_dqkv.begin() + qrow + c.CQ(),
                               dqkv0.begin() + qrow)) << "dqkv row " << t << tag;
      else  // the k and v columns of dqkv are not the merge's
        EXPECT_TRUE(std::equal(g_dqkv.begin() + qrow + c.C(), g_dqkv.begin() + qrow + c.CQ(),
                               dqkv0.begin() + qrow + c.C())) << "dqkv kv columns " << t << tag;
      if (t < c.k0 || t >= c.k0 + c.Tk)
        EXPECT_TRUE(std::equal(g_dkv.begin() + krow, g_dkv.begin() + krow + c.KVC(),
                               dkv0.begin() + krow)) << "dkv row " << t << tag;
    }
  // Deterministic: the same call again gives the same bits.
  Values<S> d_dqkv2(dqkv0), d_dkv2(dkv0);
  backward(d_dqkv2, d_dkv2);
  const auto a = d_dqkv.download_raw(), a2 = d_dqkv2.download_raw();
  const auto k = d_dkv.download_raw(), k2 = d_dkv2.download_raw();
  EXPECT_EQ(std::memcmp(a.data(), a2.data(), a.size() * sizeof(S)), 0) << "dqkv rerun" << tag;
  EXPECT_EQ(std::memcmp(k.data(), k2.data(), k.size() * sizeof(S)), 0) << "dkv rerun" << tag;
}

template <typename S>
void merge_cases() {
  check_merge<S>({2, 75, 4, 2, 32, 10, 50, 3, 70});  // ranges ending inside tiles
  check_merge<S>({1, 96, 2, 2, 64, 0, 96, 0, 33});   // all rows, a 33-key block
  check_merge<S>({2, 64, 4, 1, 128, 32, 32, 0, 64});  // the second chunk sees the whole block
}

// ------------------------------------------------------------- packing and the _at kernels

template <typename S>
void check_pack_and_at_kernels() {
  const int64_t B = 3, T = 37, NH = 4, KVH = 2, HS = 32, C = 40, Tmax = 300;
  const int64_t N = B * T, CQ = (NH + 2 * KVH) * HS, KVC = 2 * KVH * HS;
  std::mt19937_64 rng(15);
  const std::string tag = " " + type_name<S>();

  // kv_pack / kv_unpack: plain copies, exact.
  const auto qkv = random_values<S>(rng, N * CQ);
  std::vector<float> kv(N * KVC), unpacked = random_values<S>(rng, N * CQ);
  cpu::kv_pack<float>(kv.data(), qkv.data(), N, NH, KVH, HS);
  Values<S> d_qkv(qkv), d_kv(N * KVC), d_unpacked(unpacked);
  gpu::kv_pack<S>(d_kv.get(), d_qkv.get(), N, NH, KVH, HS);
  EXPECT_EQ(d_kv.download(), kv) << "kv_pack" << tag;
  cpu::kv_unpack<float>(unpacked.data(), kv.data(), N, NH, KVH, HS);
  gpu::kv_unpack<S>(d_unpacked.get(), d_kv.get(), N, NH, KVH, HS);
  EXPECT_EQ(d_unpacked.download(), unpacked) << "kv_unpack" << tag;

  // A rank's positions (two chunks of each sequence), scattered and repeated over the batch.
  std::vector<int32_t> positions(N);
  for (int64_t n = 0; n < N; n++)
    positions[n] = static_cast<int32_t>((n % T) < 19 ? 19 + n % T : 250 + n % T - 19);
  positions[5] = positions[40] = 299;  // the last row of the table, twice
  DevBuf<int32_t> d_pos(N);
  d_pos.upload_raw(positions);

  std::vector<float> rot = qkv;
  cpu::rope_backward_at<float>(rot.data(), positions.data(), N, NH, KVH, HS, 10000.0);
  gpu::rope_backward_at<S>(d_qkv.get(), d_pos.get(), N, NH, KVH, HS, 10000.0);
  expect_close("rope_backward_at" + tag, d_qkv.download(), rot, tolerance<S>());

  const auto wpe = random_values<S>(rng, Tmax * C), x = random_values<S>(rng, N * C);
  std::vector<float> y = x;
  cpu::position_embedding_forward_at<float>(y.data(), wpe.data(), positions.data(), N, C);
  Values<S> d_wpe(wpe), d_y(x);
  gpu::position_embedding_forward_at<S>(d_y.get(), d_wpe.get(), d_pos.get(), N, C);
  expect_close("position_embedding_forward_at" + tag, d_y.download(), y, tolerance<S>());

  // Gradients are fp32 whatever S is; the increment is compared (dwpe starts random).
  const auto dwpe0 = random_values<float>(rng, Tmax * C);
  std::vector<float> dwpe = dwpe0;
  cpu::position_embedding_backward_at<float>(dwpe.data(), x.data(), positions.data(), N, C);
  DevBuf<float> d_dwpe(dwpe0.size());
  d_dwpe.upload_raw(dwpe0);
  Values<S> d_x(x);
  gpu::position_embedding_backward_at<S>(d_dwpe.get(), d_x.get(), d_pos.get(), N, C);
  std::vector<float> got = d_dwpe.download_raw();
  for (size_t i = 0; i < got.size(); ++i) got[i] -= dwpe0[i], dwpe[i] -= dwpe0[i];
  expect_close("position_embedding_backward_at increment" + tag, got, dwpe, 1e-5);
}

}  // namespace

TEST(CudaContextAttention, RingMatchesFullAttentionFp32) {
  REQUIRE_CUDA_DEVICE();
  ring_cases<float>();
}

TEST(CudaContextAttention, RingMatchesFullAttentionBf16) {
  REQUIRE_CUDA_DEVICE();
  ring_cases<bf16>();
}

TEST(CudaContextAttention, MergesMatchTheCpuFp32) {
  REQUIRE_CUDA_DEVICE();
  merge_cases<float>();
}

TEST(CudaContextAttention, MergesMatchTheCpuBf16) {
  REQUIRE_CUDA_DEVICE();
  merge_cases<bf16>();
}

TEST(CudaContextAttention, PackingAndAtKernelsMatchTheCpu) {
  REQUIRE_CUDA_DEVICE();
  check_pack_and_at_kernels<float>();
  check_pack_and_at_kernels<bf16>();
}

#endif  // TRIDENT_TEST_CUDA

// The CUDA decoding kernels (kernels/cuda/decode.cu) against their CPU twins
// (kernels/cpu/decode.cpp), fp32 and bf16: rope_forward_at on rows at scattered positions, and
// kv_cache_attention over caches filled to different lengths per sequence (the new rows
// appended, the attention output). Inputs are rounded to the storage type first; the error is
// the max-norm relative error max |gpu - ref| / max |ref| (tolerance 1e-4 fp32, 2e-2 bf16).
// Without a CUDA device every test is skipped.
#include <gtest/gtest.h>

#ifndef TRIDENT_TEST_CUDA

TEST(CudaDecode, NotBuilt) { GTEST_SKIP() << "TRIDENT_CUDA is OFF: GPU tests not built"; }

#else

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/ops.hpp"
#include "cuda_storage.hpp"

namespace {

namespace gpu = trident::cuda;
namespace cpu = trident::cpu;
using gpu::bf16;
using namespace trident::testing_support;

template <typename S>
double tolerance() {
  return std::is_same_v<S, float> ? 1e-4 : 2e-2;
}


template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(h.size(), 1) * sizeof(T)),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <typename S>
S* upload_values(const std::vector<float>& h) {
  std::vector<S> s(h.size());
  for (size_t i = 0; i < h.size(); ++i) s[i] = to_storage<S>(h[i]);
  return upload(s);
}
template <typename S>
std::vector<float> download_values(const S* d, size_t n) {
  std::vector<S> s(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(s.data(), d, n * sizeof(S), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = to_float<S>(s[i]);
  return h;
}

void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& ref, double tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_FALSE(ref.empty()) << what << ": nothing compared";
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(got[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  const double rel = max_abs / std::max(max_ref, 1e-30);
  std::printf("[ cuda ] %-44s %zu values max_abs=%.3e rel=%.3e (tol %.0e)\n", what.c_str(),
              ref.size(), max_abs, rel, tol);
  EXPECT_LE(rel, tol) << what;
}

template <typename S>
void run_decode(int64_t B, int64_t Tmax, int64_t NH, int64_t KVH, int64_t HS, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t CQ = (NH + 2 * KVH) * HS, cache = B * KVH * Tmax * HS;
  std::vector<int32_t> positions(B);
  for (int64_t b = 0; b < B; ++b) positions[b] = static_cast<int32_t>((b * 37 + 5) % Tmax);
  positions[0] = static_cast<int32_t>(Tmax - 1);  // a full cache
  const auto qkv = random_values<S>(rng, B * CQ);
  auto k_cache = random_values<S>(rng, cache), v_cache = random_values<S>(rng, cache);
  // CPU: rotate, append, attend (rounded to S where the GPU stores S).
  std::vector<float> rotated = qkv;
  cpu::rope_forward_at<float>(rotated.data(), positions.data(), B, NH, KVH, HS, 10000.0);
  for (float& x : rotated) x = to_float<S>(to_storage<S>(x));
  std::vector<float> out(B * NH * HS), k_ref = k_cache, v_ref = v_cache;
  cpu::kv_cache_attention<float>(out.data(), k_ref.data(), v_ref.data(), rotated.data(),
                                 positions.data(), B, Tmax, NH, KVH, HS);
  S* d_qkv = upload_values<S>(qkv);
  S* d_k = upload_values<S>(k_cache);
  S* d_v = upload_values<S>(v_cache);
  S* d_out = upload_values<S>(std::vector<float>(out.size(), 0.f));
  int32_t* d_pos = upload(positions);
  gpu::rope_forward_at<S>(d_qkv, d_pos, B, NH, KVH, HS, 10000.0);
  gpu::kv_cache_attention<S>(d_out, d_k, d_v, d_qkv, d_pos, B, Tmax, NH, KVH, HS);
  const std::string tag = std::string(std::is_same_v<S, float> ? "fp32" : "bf16") + " B=" +
                          std::to_string(B) + " Tmax=" + std::to_string(Tmax) + " NH=" +
                          std::to_string(NH) + " KVH=" + std::to_string(KVH) + " HS=" +
                          std::to_string(HS);
  expect_close("rope_forward_at " + tag, download_values(d_qkv, qkv.size()), rotated,
               tolerance<S>());
  expect_close("kv cache k " + tag, download_values(d_k, k_ref.size()), k_ref, tolerance<S>());
  expect_close("kv cache v " + tag, download_values(d_v, v_ref.size()), v_ref, tolerance<S>());
  expect_close("kv_cache_attention " + tag, download_values(d_out, out.size()), out,
               tolerance<S>());
  for (void* p : {static_cast<void*>(d_qkv), static_cast<void*>(d_k), static_cast<void*>(d_v),
                  static_cast<void*>(d_out), static_cast<void*>(d_pos)})
    cudaFree(p);
}

#define REQUIRE_CUDA_DEVICE()                                                          \
  do {                                                                                 \
    if (!gpu::device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped"; \
  } while (0)

}  // namespace

TEST(CudaDecode, MatchesTheCpuKernelsFp32) {
  REQUIRE_CUDA_DEVICE();
  run_decode<float>(3, 300, 4, 2, 64, 1);
  run_decode<float>(2, 17, 4, 4, 32, 2);     // multi-head
  run_decode<float>(1, 2048, 8, 1, 128, 3);  // one kv head, a long cache
}

TEST(CudaDecode, MatchesTheCpuKernelsBf16) {
  REQUIRE_CUDA_DEVICE();
  run_decode<bf16>(3, 300, 4, 2, 64, 4);
  run_decode<bf16>(1, 2048, 8, 1, 128, 5);
}

#endif  // TRIDENT_TEST_CUDA

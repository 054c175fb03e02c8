// The FP8 linear layer on the GPU's bf16 kernel set (CudaKernels<bf16>: cuBLASLt's FP8 GEMMs on
// codes, the backward's operands transposed first) against the CPU reference's
// (CpuKernels<float>: fp32 GEMMs on the quantised values), both through the same Fp8Linear
// (model/fp8_linear.hpp), on bf16-representable inputs: the same amaxes, scales and codes, so
// what differs is the order of the sums and the GPU's bf16 outputs. Bounds against the largest
// reference value: the output and the input gradient (bf16) 1e-2, the weight and bias gradients
// (fp32 on both) 1e-3 and 1e-5. Shapes of a GPT-2 layer's GEMMs, 256 rows.
// Without a CUDA device, or on one without FP8 tensor cores (compute capability < 8.9), every
// test is skipped, saying so. The whole trainer: GpuTrainer.Fp8TracksTheCpuReference
// (tests/mpi/test_cuda_train_np2.cpp).
#include <gtest/gtest.h>

#ifndef TRIDENT_TEST_CUDA

TEST(CudaFp8Linear, NotBuilt) { GTEST_SKIP() << "TRIDENT_CUDA is OFF: GPU tests not built"; }

#else

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda/cuda_kernels.hpp"
#include "model/cpu_kernels.hpp"
#include "model/fp8_linear.hpp"

namespace {

namespace gpu = trident::cuda;
using trident::CpuKernels;
using trident::CudaKernels;
using trident::Fp8Linear;

bool gpu_has_fp8() {
  cudaDeviceProp prop{};
  return gpu::device_available() && cudaGetDeviceProperties(&prop, 0) == cudaSuccess &&
         prop.major * 10 + prop.minor >= 89;
}

#define REQUIRE_FP8_GPU()                                                                   \
  do {                                                                                      \
    if (!gpu::device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";     \
    if (!gpu_has_fp8()) GTEST_SKIP() << "no FP8 tensor cores (compute capability < 8.9)"; \
  } while (0)

// n normal values times `scale`, rounded to bf16 (what both kernel sets can hold alike).
std::vector<float> bf16_values(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = __bfloat162float(__float2bfloat16_rn(scale * normal(rng)));
  return v;
}

template <typename T>
T* upload(const std::vector<float>& h) {
  std::vector<T> s(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    if constexpr (std::is_same_v<T, float>)
      s[i] = h[i];
    else
      s[i] = __float2bfloat16_rn(h[i]);
  }
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(s.size(), 1) * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(d, s.data(), s.size() * sizeof(T), cudaMemcpyHostToDevice));
  // The kernel set runs on a non-blocking stream, which a pageable copy on the legacy stream
  // does not order: done before it is read.
  CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

template <typename T>
std::vector<float> download(const T* d, size_t n) {
  std::vector<T> s(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(s.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>)
      h[i] = s[i];
    else
      h[i] = __bfloat162float(s[i]);
  }
  return h;
}

// max |got - want| / max |want|, printed; fails on an empty comparison.
double compare(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size()) << what;
  EXPECT_GT(want.size(), 0u) << what << ": nothing compared";
  double diff = 0, ref = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - want[i]));
    ref = std::max(ref, std::fabs(double(want[i])));
  }
  const double rel = ref > 0 ? diff / ref : diff;
  std::printf("[ cuda fp8 ] %s: %zu values, max-norm relative %.3g\n", what, want.size(), rel);
  return rel;
}

TEST(CudaFp8Linear, ForwardAndBackwardTrackTheCpuReference) {
  static_assert(trident::kernels_have_fp8<CudaKernels<gpu::bf16>>);
  static_assert(!trident::kernels_have_fp8<CudaKernels<float>>);
  REQUIRE_FP8_GPU();
  std::mt19937_64 rng(57);
  auto self = trident::make_self_communicator("tensor");
  trident::Fp8Settings settings;
  settings.enabled = true;
  for (const auto& [C, OC] : {std::pair<int64_t, int64_t>{768, 2304}, {3072, 768}}) {
    const int64_t N = 256;
    const std::vector<float> x = bf16_values(rng, N * C, 1.f), w = bf16_values(rng, OC * C, 0.02f),
                             b = bf16_values(rng, OC, 0.1f), dy = bf16_values(rng, N * OC, 1e-3f);
    // The reference.
    CpuKernels<float> kc;
    Fp8Linear<CpuKernels<float>> cpu_layer(settings, *self);
    std::vector<float> out(N * OC), dx(N * C), dw(OC * C, 0.f), db(OC, 0.f);
    cpu_layer.forward(kc, nullptr, out.data(), x.data(), w.data(), b.data(), N, C, OC);
    cpu_layer.backward(kc, nullptr, dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                       w.data(), N, C, OC);
    // The GPU.
    trident::CudaDevice dev(0);
    CudaKernels<gpu::bf16> kg(dev);
    Fp8Linear<CudaKernels<gpu::bf16>> gpu_layer(settings, *self);
    gpu::bf16 *d_x = upload<gpu::bf16>(x), *d_w = upload<gpu::bf16>(w),
              *d_b = upload<gpu::bf16>(b), *d_dy = upload<gpu::bf16>(dy);
    gpu::bf16* d_out = upload<gpu::bf16>(std::vector<float>(N * OC));
    gpu::bf16* d_dx = upload<gpu::bf16>(std::vector<float>(N * C));
    float* d_dw = upload<float>(std::vector<float>(OC * C));
    float* d_db = upload<float>(std::vector<float>(OC));
    gpu_layer.forward(kg, nullptr, d_out, d_x, d_w, d_b, N, C, OC);
    gpu_layer.backward(kg, nullptr, d_dx, d_dw, d_db, d_dy, d_x, d_w, N, C, OC);
    const std::string shape = std::to_string(C) + " -> " + std::to_string(OC);
    EXPECT_LE(compare(("out " + shape).c_str(), download(d_out, N * OC), out), 1e-2);
    EXPECT_LE(compare(("dx " + shape).c_str(), download(d_dx, N * C), dx), 1e-2);
    EXPECT_LE(compare(("dw " + shape).c_str(), download(d_dw, OC * C), dw), 1e-3);
    EXPECT_LE(compare(("db " + shape).c_str(), download(d_db, OC), db), 1e-5);
    for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_w), static_cast<void*>(d_b),
                    static_cast<void*>(d_dy), static_cast<void*>(d_out), static_cast<void*>(d_dx),
                    static_cast<void*>(d_dw), static_cast<void*>(d_db)})
      cudaFree(p);
  }
}

}  // namespace

#endif  // TRIDENT_TEST_CUDA

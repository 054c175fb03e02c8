// The Hopper building blocks of the wgmma attention, one assumption each (kernels/cuda/
// wgmma_probe.hpp), so that a failure of CudaAttention.WgmmaMatchesMmaSyncAndTheCpu says which
// one broke: TMA's 128-byte swizzle as gmma_layout.hpp models it (rows past the tensor as
// zeros), wgmma with two K-major shared-memory operands (S = Q K^T, A from either half of a
// 128-row tile), and wgmma with A in registers and an MN-major B (O += P V). Skipped without a
// GPU of compute capability 9.0.
#include <gtest/gtest.h>

#ifndef TRIDENT_TEST_CUDA

TEST(CudaWgmma, NotBuilt) { GTEST_SKIP() << "TRIDENT_CUDA is OFF: GPU tests not built"; }

#else

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/gmma_layout.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/cuda/wgmma_probe.hpp"

namespace gpu = trident::cuda;
namespace gm = trident::cuda::gmma;
using gpu::bf16;

namespace {

#define REQUIRE_WGMMA()                                                                    \
  do {                                                                                     \
    if (!gpu::device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";     \
    if (!gpu::attention_wgmma_available(64))                                               \
      GTEST_SKIP() << "wgmma needs a GPU of compute capability 9.0 (H100, H200)";          \
  } while (0)

template <typename T>
struct Dev {
  explicit Dev(size_t n) : n(n) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void upload(const std::vector<T>& h) {
    CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* p = nullptr;
  size_t n;
};

uint16_t bits(bf16 x) {
  uint16_t b;
  std::memcpy(&b, &x, 2);
  return b;
}
bf16 from_bits(uint16_t b) {
  bf16 x;
  std::memcpy(&x, &b, 2);
  return x;
}
// Random bf16 values in [-1, 1] and their exact float values.
std::vector<bf16> random_bf16(std::mt19937_64& rng, size_t n, std::vector<float>& exact) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<bf16> v(n);
  exact.resize(n);
  for (size_t i = 0; i < n; i++) {
    v[i] = __float2bfloat16_rn(u(rng));
    exact[i] = __bfloat162float(v[i]);
  }
  return v;
}

// Largest |got - ref| over the largest |ref|, with the count compared; infinity where a value
// is not finite (a NaN, say from a descriptor reading uninitialised shared memory, would drop
// out of std::max unseen).
double rel_error(const std::vector<float>& got, const std::vector<double>& ref, int64_t& n) {
  double err = 0, scale = 0;
  n = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); i++, n++) {
    const double d = std::abs(double(got[i]) - ref[i]);
    if (!std::isfinite(d)) return INFINITY;
    err = std::max(err, d);
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / scale;
}

}  // namespace

TEST(CudaWgmma, TmaWritesTheSwizzledLayoutTheDescriptorsRead) {
  REQUIRE_WGMMA();
  const int T = 200;
  const int64_t C = 320;  // five 64-column boxes a row
  std::vector<bf16> host(static_cast<size_t>(T * C));
  for (size_t i = 0; i < host.size(); i++) host[i] = from_bits(static_cast<uint16_t>(i * 7 + 1));
  Dev<bf16> data(host.size());
  data.upload(host);
  int64_t compared = 0, differing = 0;
  struct Case {
    int row0, col0, rows, cols;
  } cases[] = {{0, 0, 64, 64}, {64, 64, 128, 128}, {150, 192, 128, 128}, {192, 256, 64, 64}};
  for (const Case& k : cases) {  // the last two reach past T = 200: zeros
    Dev<unsigned char> out(static_cast<size_t>(k.rows) * k.cols * 2);
    gpu::wgmma_probe_tma(out.p, data.p, T, C, k.row0, k.col0, k.rows, k.cols);
    const auto smem = out.download();
    for (int r = 0; r < k.rows; r++)
      for (int c = 0; c < k.cols; c++) {
        const uint32_t at = gm::tile_address(0, k.rows, r, c);
        uint16_t got;
        std::memcpy(&got, smem.data() + at, 2);
        const int t = k.row0 + r;
        const uint16_t want = t < T ? bits(host[static_cast<size_t>(t * C + k.col0 + c)]) : 0;
        compared++;
        differing += got != want;
      }
  }
  std::printf("[wgmma] TMA tiles: %lld elements compared, %lld where gmma::tile_address says\n",
              static_cast<long long>(compared), static_cast<long long>(compared - differing));
  EXPECT_EQ(compared, 64 * 64 + 128 * 128 * 2 + 64 * 64);
  EXPECT_EQ(differing, 0);
}

TEST(CudaWgmma, SharedMemoryOperandsGiveTheProductOfKMajorTiles) {
  REQUIRE_WGMMA();
  std::mt19937_64 rng(11);
  for (int K : {64, 128})
    for (int N : {64, 128})
      for (int a_row0 : {0, 64}) {
        std::vector<float> ea, eb;
        const auto a = random_bf16(rng, static_cast<size_t>(128 * K), ea);
        const auto b = random_bf16(rng, static_cast<size_t>(N * K), eb);
        Dev<bf16> da(a.size()), db(b.size());
        Dev<float> out(static_cast<size_t>(64 * N));
        da.upload(a);
        db.upload(b);
        gpu::wgmma_probe_ss(out.p, da.p, db.p, N, K, a_row0);
        std::vector<double> ref(static_cast<size_t>(64 * N));
        for (int m = 0; m < 64; m++)
          for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += double(ea[(a_row0 + m) * K + k]) * eb[n * K + k];
            ref[static_cast<size_t>(m * N + n)] = s;
          }
        int64_t n_compared = 0;
        const double err = rel_error(out.download(), ref, n_compared);
        std::printf("[wgmma] ss m64n%dk16 x %d, A rows from %d: %lld values, rel error %.2e\n", N,
                    K / 16, a_row0, static_cast<long long>(n_compared), err);
        EXPECT_EQ(n_compared, 64 * N);
        EXPECT_LT(err, 1e-3) << "N " << N << " K " << K << " a_row0 " << a_row0;
      }
}

TEST(CudaWgmma, RegisterAAndMnMajorBGiveTheProduct) {
  REQUIRE_WGMMA();
  std::mt19937_64 rng(12);
  for (int K : {64, 128})
    for (int N : {64, 128}) {
      std::vector<float> ep, ev;
      random_bf16(rng, static_cast<size_t>(64 * K), ep);  // P: bf16 values held as fp32
      const auto v = random_bf16(rng, static_cast<size_t>(K * N), ev);
      Dev<float> dp(ep.size()), out(static_cast<size_t>(64 * N));
      Dev<bf16> dv(v.size());
      dp.upload(ep);
      dv.upload(v);
      gpu::wgmma_probe_rs(out.p, dp.p, dv.p, N, K);
      std::vector<double> ref(static_cast<size_t>(64 * N));
      for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
          double s = 0;
          for (int k = 0; k < K; k++) s += double(ep[m * K + k]) * ev[k * N + n];
          ref[static_cast<size_t>(m * N + n)] = s;
        }
      int64_t n_compared = 0;
      const double err = rel_error(out.download(), ref, n_compared);
      std::printf("[wgmma] rs m64n%dk16 x %d (B MN-major): %lld values, rel error %.2e\n", N,
                  K / 16, static_cast<long long>(n_compared), err);
      EXPECT_EQ(n_compared, 64 * N);
      EXPECT_LT(err, 1e-3) << "N " << N << " K " << K;
    }
}

#endif  // TRIDENT_TEST_CUDA

// The host as a Device: memory from the aligned allocator, loops parallelised with OpenMP in
// fixed chunks so every result is the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/scratch.hpp"
#include "tensor/device.hpp"

namespace trident {

namespace {

struct ChunkSums;  // range_square_sum's partial sums (cpu::thread_scratch)
using cpu::thread_scratch;

// Sum of squares of one chunk in 16 independent double lanes, added in lane order at the end:
// one running sum is bound by the add's latency (4 cycles an element); the lanes vectorise and
// keep the result the same on every machine, vector width or not.
double chunk_square_sum(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) {
      const double xi = x[i + l];
      lane[l] += xi * xi;
    }
  }
  double sum = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

double range_square_sum(const float* x, int64_t n) {
  // Fixed-size chunks summed in order: bitwise the same for any thread count (an OpenMP
  // reduction clause combines partial sums in whatever order threads finish).
  const int64_t chunk = 1 << 14, chunks = (n + chunk - 1) / chunk;
  double* partial = thread_scratch<ChunkSums, double>(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    partial[c] = chunk_square_sum(x + c * chunk, std::min(chunk, n - c * chunk));
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

class CpuDevice final : public Device {
 public:
  bool is_host() const override { return true; }
  std::string describe() const override { return "cpu"; }

  std::shared_ptr<void> allocate(int64_t bytes) override {
    const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));
    void* p = ::operator new(n, std::align_val_t(64));
    std::memset(p, 0, n);
    return counted(
        std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t(64)); }),
        bytes);
  }
  void to_host(void* host, const void* src, int64_t bytes) override { copy(host, src, bytes); }
  void from_host(void* dst, const void* host, int64_t bytes) override { copy(dst, host, bytes); }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  void fill_zero(void* dst, int64_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, static_cast<size_t>(bytes));
  }
  void scale(float* x, int64_t n, float s) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }
  void add(float* __restrict y, const float* __restrict x, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  double square_sum(const std::vector<Range>& ranges) override {
    double total = 0.0;
    for (const Range& r : ranges) total += range_square_sum(r.data, r.size);
    return total;
  }
  // Vectorised: the step's constants are copied to locals and the arrays marked __restrict, so
  // no store through w, m or v can be taken to change them (with `s` read through the
  // reference, every iteration reloaded it and the loop stayed scalar); -fno-math-errno lets
  // sqrt be the vector instruction. Elementwise, so the result is the scalar loop's, bit for bit.
  void adamw(float* __restrict w, const float* __restrict grad, float* __restrict m,
             float* __restrict v, int64_t n, const AdamWStep& step,
             uint16_t* __restrict w_bf16) override {
    if (w_bf16 != nullptr)
      adamw_pass<true>(w, grad, m, v, n, step, w_bf16);
    else
      adamw_pass<false>(w, grad, m, v, n, step, nullptr);
  }
  // One pass over the elements; with the bf16 copy, each updated w is rounded as it is stored
  // (cpu::detail::bf16_bits: float_to_bf16's bits without its branch, so the loop stays
  // vectorised), rather than re-read by a second loop.
  template <bool kBf16Copy>
  static void adamw_pass(float* __restrict w, const float* __restrict grad, float* __restrict m,
                         float* __restrict v, int64_t n, const AdamWStep& step,
                         uint16_t* __restrict w_bf16) {
    const AdamWStep s = step;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] * s.grad_scale;
      m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
      v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
      const float m_hat = m[i] / s.bias1, v_hat = v[i] / s.bias2;
      const float updated =
          w[i] - s.lr * (m_hat / (std::sqrt(v_hat) + s.eps) + s.weight_decay * w[i]);
      w[i] = updated;
      if constexpr (kBf16Copy) w_bf16[i] = cpu::detail::bf16_bits(updated);
    }
  }
  void synchronize() override {}
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

}  // namespace trident

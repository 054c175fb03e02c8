// The CPU attention kernels (kernels/cpu/attention.cpp, fp32) timed at given shapes, causal
// and with packed documents of given lengths side by side in one run: what skipping the key
// blocks before a query block's documents buys. One JSON object per (shape, documents) on
// stdout, the fields of bench/gpu_attention.cu.
//
//   bench_attention_cpu [--iters N] [--documents LEN ...] B:T:NH:KVH:HS ...
//
// Threads: OMP_NUM_THREADS (the kernels' OpenMP loops). FLOPs: the causal ones (forward
// 4 B NH T^2 HS / 2, backward 2.5 x), whatever the documents, so TFLOP/s compares times.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention_shape.hpp"
#include "kernels/cpu/ops.hpp"

namespace {

using Shape = AttentionShape;

template <typename Fn>
double median_ms(int iters, Fn fn) {
  fn();  // warm-up (thread pool, scratch)
  std::vector<double> ms;
  for (int i = 0; i < iters; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run(const Shape& s, int64_t doc_len, int iters) {
  const int64_t C3 = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS, rows = s.B * s.T;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> qkv(static_cast<size_t>(rows * C3)), dout(static_cast<size_t>(rows * C));
  for (float& x : qkv) x = u(rng);
  for (float& x : dout) x = u(rng);
  std::vector<float> out(dout.size()), lse(static_cast<size_t>(s.B * s.NH * s.T)),
      dqkv(qkv.size());
  std::vector<int32_t> docs;
  if (doc_len > 0)
    for (int64_t r = 0; r < rows; r++)
      docs.push_back(static_cast<int32_t>((r % s.T) / doc_len * doc_len));
  const int32_t* ds = docs.empty() ? nullptr : docs.data();
  const double fwd = median_ms(iters, [&] {
    trident::cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.KVH,
                                    s.HS, ds);
  });
  const double bwd = median_ms(iters, [&] {
    trident::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                     lse.data(), s.B, s.T, s.NH, s.KVH, s.HS, ds);
  });
  const double fwd_flops = 4.0 * s.B * s.NH * double(s.T) * s.T * s.HS / 2.0;
  std::printf("{\"impl\": \"trident-cpu\", \"dtype\": \"fp32\", \"threads\": %d, \"B\": %lld, "
              "\"T\": %lld, \"NH\": %lld, \"KVH\": %lld, \"HS\": %lld, \"documents\": %lld, "
              "\"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"fwd_gflops\": %.1f, "
              "\"bwd_gflops\": %.1f}\n",
              omp_get_max_threads(), (long long)s.B, (long long)s.T, (long long)s.NH,
              (long long)s.KVH, (long long)s.HS, (long long)doc_len, fwd, bwd, fwd + bwd,
              fwd_flops / fwd * 1e-6, 2.5 * fwd_flops / bwd * 1e-6);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 5;
  std::vector<int64_t> doc_lens = {0};  // 0: causal over the whole sequence
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--documents" && i + 1 < argc) {
      doc_lens.push_back(std::atoll(argv[++i]));
    } else {
      Shape s;
      if (!parse_attention_shape(argv[i], s)) {
        std::fprintf(stderr, "bench_attention_cpu: '%s' is not B:T:NH:KVH:HS\n", argv[i]);
        return 2;
      }
      shapes.push_back(s);
    }
  }
  if (shapes.empty()) shapes = {{1, 2048, 12, 12, 64}};
  if (iters < 1 || std::any_of(doc_lens.begin(), doc_lens.end(), [](int64_t d) { return d < 0; })) {
    std::fprintf(stderr, "usage: bench_attention_cpu [--iters N] [--documents LEN ...] "
                         "[B:T:NH:KVH:HS ...]\n");
    return 2;
  }
  for (const Shape& s : shapes)
    for (int64_t d : doc_lens) run(s, d, iters);
  return 0;
}

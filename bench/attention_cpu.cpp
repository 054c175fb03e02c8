// The CPU attention kernels timed at given shapes, causal and with packed documents of given
// lengths side by side in one run: what skipping the key blocks before a query block's documents
// buys; with --bf16 also the bf16 precision's two engines (kernels/cpu/attention.cpp with bf16
// operands, and kernels/cpu/attention_bf16.cpp on oneDNN's bf16 matmul) on the same inputs
// rounded to bf16, and how far apart their results are. One JSON object per (shape, documents,
// kernel) on stdout, the fields of bench/gpu_attention.cu.
//
//   bench_attention_cpu [--iters N] [--bf16] [--documents LEN ...] B:T:NH:KVH:HS ...
//
// Threads: OMP_NUM_THREADS (the kernels' OpenMP loops). FLOPs: the causal ones (forward
// 4 B NH T^2 HS / 2, backward 2.5 x), whatever the documents, so TFLOP/s compares times.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention_shape.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
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

// The kernels timed: fp32 (attention.cpp), and with --bf16 the bf16 precision's two engines on
// inputs rounded to bf16: "bf16-fma" (attention.cpp with bf16_operands: fp32 GEMMs on 128 x 128
// blocks) and "bf16-onednn" (attention_bf16.cpp: oneDNN's bf16 matmul, AMX where present).
enum class Kernel { Fp32, Bf16Fma, Bf16OneDnn };
const char* kernel_name(Kernel k) {
  return k == Kernel::Fp32 ? "fp32" : k == Kernel::Bf16Fma ? "bf16-fma" : "bf16-onednn";
}

struct Result {
  std::vector<float> out, lse, dqkv;
};

Result run(const Shape& s, int64_t doc_len, int iters, Kernel kernel) {
  const int64_t C3 = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS, rows = s.B * s.T;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> qkv(static_cast<size_t>(rows * C3)), dout(static_cast<size_t>(rows * C));
  for (float& x : qkv) x = u(rng);
  for (float& x : dout) x = u(rng);
  if (kernel != Kernel::Fp32) {
    trident::cpu::round_to_bf16_values(qkv.data(), static_cast<int64_t>(qkv.size()));
    trident::cpu::round_to_bf16_values(dout.data(), static_cast<int64_t>(dout.size()));
  }
  Result r{std::vector<float>(dout.size()),
           std::vector<float>(static_cast<size_t>(s.B * s.NH * s.T)),
           std::vector<float>(qkv.size())};
  std::vector<int32_t> docs;
  if (doc_len > 0)
    for (int64_t t = 0; t < rows; t++)
      docs.push_back(static_cast<int32_t>((t % s.T) / doc_len * doc_len));
  const int32_t* ds = docs.empty() ? nullptr : docs.data();
  const double fwd = median_ms(iters, [&] {
    if (kernel == Kernel::Bf16OneDnn)
      trident::cpu::attention_forward_bf16(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T,
                                           s.NH, s.KVH, s.HS, ds);
    else
      trident::cpu::attention_forward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.NH,
                                      s.KVH, s.HS, ds, kernel == Kernel::Bf16Fma);
  });
  // The backward reads the output as the trainer stores it: in bf16 for the bf16 kernels.
  if (kernel != Kernel::Fp32)
    trident::cpu::round_to_bf16_values(r.out.data(), static_cast<int64_t>(r.out.size()));
  const double bwd = median_ms(iters, [&] {
    if (kernel == Kernel::Bf16OneDnn)
      trident::cpu::attention_backward_bf16(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(),
                                            r.lse.data(), s.B, s.T, s.NH, s.KVH, s.HS, ds);
    else
      trident::cpu::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(),
                                       r.lse.data(), s.B, s.T, s.NH, s.KVH, s.HS, ds,
                                       kernel == Kernel::Bf16Fma);
  });
  const double fwd_flops = 4.0 * s.B * s.NH * double(s.T) * s.T * s.HS / 2.0;
  std::printf("{\"impl\": \"trident-cpu\", \"dtype\": \"%s\", \"threads\": %d, \"B\": %lld, "
              "\"T\": %lld, \"NH\": %lld, \"KVH\": %lld, \"HS\": %lld, \"documents\": %lld, "
              "\"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"fwd_gflops\": %.1f, "
              "\"bwd_gflops\": %.1f}\n",
              kernel_name(kernel), omp_get_max_threads(), (long long)s.B, (long long)s.T,
              (long long)s.NH, (long long)s.KVH, (long long)s.HS, (long long)doc_len, fwd, bwd,
              fwd + bwd, fwd_flops / fwd * 1e-6, 2.5 * fwd_flops / bwd * 1e-6);
  std::fflush(stdout);
  return r;
}

// Largest |a - b| over the elements, relative to the largest |a|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); i++) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(a[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void run_all(const Shape& s, int64_t doc_len, int iters, bool bf16) {
  run(s, doc_len, iters, Kernel::Fp32);
  if (!bf16) return;
  const Result fma = run(s, doc_len, iters, Kernel::Bf16Fma);
  const Result onednn = run(s, doc_len, iters, Kernel::Bf16OneDnn);
  // The two bf16 engines compute the same products up to the order of their fp32 sums (and the
  // forward's P rounded against a running or a final max): a check that the timed kernels agree.
  std::printf("{\"bf16_engines_differ\": {\"out\": %.3g, \"lse\": %.3g, \"dqkv\": %.3g}}\n",
              relative_difference(fma.out, onednn.out), relative_difference(fma.lse, onednn.lse),
              relative_difference(fma.dqkv, onednn.dqkv));
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 5;
  bool bf16 = false;
  std::vector<int64_t> doc_lens = {0};  // 0: causal over the whole sequence
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--bf16") {
      bf16 = true;
    } else if (a == "--iters" && i + 1 < argc) {
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
    std::fprintf(stderr, "usage: bench_attention_cpu [--iters N] [--bf16] [--documents LEN ...] "
                         "[B:T:NH:KVH:HS ...]\n");
    return 2;
  }
  for (const Shape& s : shapes)
    for (int64_t d : doc_lens) run_all(s, d, iters, bf16);
  return 0;
}

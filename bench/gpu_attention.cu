// Trident's causal attention kernels (trident::cuda::attention_forward / _backward, bf16 tensor
// cores or fp32) timed at given shapes, for the side-by-side with PyTorch's SDPA
// (bench/attention_sdpa.py prints the same fields). One JSON object per shape on stdout;
// without a CUDA device prints {"skipped": ...} and exits 0.
//
//   gpu_attention [--dtype bf16|fp32] [--iters N] [--documents LEN]
//                 [--kernel auto|mma_sync|wgmma] [B:T:NH:KVH:HS ...]
//
// --kernel: the bf16 kernels, forward and (deterministic) backward (train.attention_kernel;
// "kernel" in the JSON names the ones that ran: wgmma, mma_sync, or simt for fp32). When the
// wgmma kernels ran, their out and dqkv at the shape are compared with the mma_sync kernels'
// ("out_vs_mma_sync", "dqkv_vs_mma_sync": largest difference over the largest value; -1 when
// not compared).
// Without shapes: GPT-2 124M's (16:1024:12:12:64) and a Llama's (2:4096:32:8:128).
// FLOPs are the useful ones of causal attention (FlashAttention's convention): forward
// 4 * B * NH * T^2 * HS / 2 (two GEMMs, half the matrix), backward 2.5 x the forward.
// --documents LEN packs documents of LEN tokens (the masks of data.document_mask) and reports
// the same causal FLOPs, so its TFLOP/s shows what skipping the masked tiles buys.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <utility>
#include <string>
#include <vector>

#include "attention_shape.hpp"
#include "gpu_fill.cuh"
#include "kernels/cuda/ops.hpp"

namespace {

using trident::cuda::bf16;

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "gpu_attention: %s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

using Shape = AttentionShape;

// Median of `iters` timings (ms) of fn, after 3 warm-up calls.
template <typename Fn>
double median_ms(int iters, Fn fn) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) fn();
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; i++) {
    CHECK(cudaEventRecord(a));
    fn();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], a, b));
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

using trident::cuda::AttentionKernel;

const char* kernel_name(AttentionKernel k, bool bf16_inputs, int64_t HS) {
  if (!bf16_inputs) return "simt";
  if (k == AttentionKernel::automatic)
    return trident::cuda::attention_wgmma_available(HS) ? "wgmma" : "mma_sync";
  return k == AttentionKernel::wgmma ? "wgmma" : "mma_sync";
}

// v as a JSON number for Python's json module: "%.3e", or Infinity (not finite values).
std::string json_number(double v) {
  if (!std::isfinite(v)) return "Infinity";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

// Largest |a - b| over the largest |b| of two device bf16 arrays of n elements; infinity where
// either holds a value that is not finite (a NaN would drop out of the maxima unseen).
double relative_difference(const bf16* a, const bf16* b, int64_t n) {
  std::vector<bf16> ha(static_cast<size_t>(n)), hb(static_cast<size_t>(n));
  CHECK(cudaMemcpy(ha.data(), a, sizeof(bf16) * n, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hb.data(), b, sizeof(bf16) * n, cudaMemcpyDeviceToHost));
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ha.size(); i++) {
    const double x = __bfloat162float(ha[i]), y = __bfloat162float(hb[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    diff = std::max(diff, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  }
  return scale > 0 ? diff / scale : diff;
}

// The wgmma kernels' out and dqkv at this shape against the mma_sync kernels' (each backward
// from its own forward): {out, dqkv} relative differences.
std::pair<double, double> against_mma_sync(const Shape& s, const bf16* qkv, const bf16* dout,
                                           const bf16* out, const bf16* dqkv, float* ws,
                                           const int32_t* docs) {
  const int64_t C3 = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS, rows = s.B * s.T;
  bf16 *m_out, *m_dqkv;
  float* m_lse;
  CHECK(cudaMalloc(&m_out, sizeof(bf16) * rows * C));
  CHECK(cudaMalloc(&m_dqkv, sizeof(bf16) * rows * C3));
  CHECK(cudaMalloc(&m_lse, sizeof(float) * s.B * s.NH * s.T));
  trident::cuda::attention_forward<bf16>(m_out, m_lse, qkv, s.B, s.T, s.NH, s.KVH, s.HS, nullptr,
                                         docs, AttentionKernel::mma_sync);
  trident::cuda::attention_backward<bf16>(m_dqkv, dout, qkv, m_out, m_lse, s.B, s.T, s.NH, s.KVH,
                                          s.HS, nullptr, ws, docs, true,
                                          AttentionKernel::mma_sync);
  CHECK(cudaDeviceSynchronize());
  const std::pair<double, double> r = {relative_difference(out, m_out, rows * C),
                                       relative_difference(dqkv, m_dqkv, rows * C3)};
  cudaFree(m_out);
  cudaFree(m_dqkv);
  cudaFree(m_lse);
  return r;
}

template <typename S>
void run(const Shape& s, int iters, int64_t doc_len, const char* dtype, AttentionKernel kernel) {
  const int64_t C3 = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS, rows = s.B * s.T;
  S *qkv, *out, *dout, *dqkv;
  float *lse, *ws;
  int32_t* docs = nullptr;
  CHECK(cudaMalloc(&qkv, sizeof(S) * rows * C3));
  CHECK(cudaMalloc(&dqkv, sizeof(S) * rows * C3));
  CHECK(cudaMalloc(&out, sizeof(S) * rows * C));
  CHECK(cudaMalloc(&dout, sizeof(S) * rows * C));
  CHECK(cudaMalloc(&lse, sizeof(float) * s.B * s.NH * s.T));
  CHECK(cudaMalloc(&ws, trident::cuda::attention_backward_workspace_bytes(s.B, s.T, s.NH)));
  fill_uniform<S><<<1024, 256>>>(qkv, rows * C3, 1);
  fill_uniform<S><<<1024, 256>>>(dout, rows * C, 2);
  if (doc_len > 0) {
    std::vector<int32_t> host(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; r++)
      host[static_cast<size_t>(r)] = static_cast<int32_t>((r % s.T) / doc_len * doc_len);
    CHECK(cudaMalloc(&docs, sizeof(int32_t) * rows));
    CHECK(cudaMemcpy(docs, host.data(), sizeof(int32_t) * rows, cudaMemcpyHostToDevice));
  }
  CHECK(cudaDeviceSynchronize());
  const double fwd = median_ms(iters, [&] {
    trident::cuda::attention_forward<S>(out, lse, qkv, s.B, s.T, s.NH, s.KVH, s.HS, nullptr,
                                        docs, kernel);
  });
  const double bwd = median_ms(iters, [&] {
    trident::cuda::attention_backward<S>(dqkv, dout, qkv, out, lse, s.B, s.T, s.NH, s.KVH, s.HS,
                                         nullptr, ws, docs, true, kernel);
  });
  const double fwd_flops = 4.0 * s.B * s.NH * double(s.T) * s.T * s.HS / 2.0;
  const char* ran = kernel_name(kernel, sizeof(S) == 2, s.HS);
  std::pair<double, double> vs_mma = {-1.0, -1.0};  // -1: not compared (not the wgmma kernels)
  if constexpr (sizeof(S) == 2)
    if (std::string(ran) == "wgmma") vs_mma = against_mma_sync(s, qkv, dout, out, dqkv, ws, docs);
  std::printf("{\"impl\": \"trident\", \"kernel\": \"%s\", \"dtype\": \"%s\", \"B\": %lld, "
              "\"T\": %lld, \"NH\": %lld, \"KVH\": %lld, \"HS\": %lld, \"documents\": %lld, "
              "\"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, "
              "\"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f, \"fwd_bwd_tflops\": %.1f, "
              "\"out_vs_mma_sync\": %s, \"dqkv_vs_mma_sync\": %s}\n",
              ran, dtype, (long long)s.B, (long long)s.T,
              (long long)s.NH, (long long)s.KVH, (long long)s.HS, (long long)doc_len, fwd, bwd,
              fwd + bwd, fwd_flops / fwd * 1e-9, 2.5 * fwd_flops / bwd * 1e-9,
              3.5 * fwd_flops / (fwd + bwd) * 1e-9, json_number(vs_mma.first).c_str(),
              json_number(vs_mma.second).c_str());
  std::fflush(stdout);
  for (void* p : {static_cast<void*>(qkv), static_cast<void*>(dqkv), static_cast<void*>(out),
                  static_cast<void*>(dout), static_cast<void*>(lse), static_cast<void*>(ws),
                  static_cast<void*>(docs)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtype = "bf16";
  int iters = 20;
  int64_t doc_len = 0;
  std::string kernel = "auto";
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--dtype" && i + 1 < argc) {
      dtype = argv[++i];
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--kernel" && i + 1 < argc) {
      kernel = argv[++i];
    } else if (a == "--documents" && i + 1 < argc) {
      doc_len = std::atoll(argv[++i]);
    } else {
      Shape s;
      if (!parse_attention_shape(argv[i], s)) {
        std::fprintf(stderr, "gpu_attention: '%s' is not B:T:NH:KVH:HS\n", argv[i]);
        return 2;
      }
      shapes.push_back(s);
    }
  }
  if (shapes.empty()) shapes = {{16, 1024, 12, 12, 64}, {2, 4096, 32, 8, 128}};  // GPT-2, Llama
  if ((dtype != "bf16" && dtype != "fp32") || iters < 1 || doc_len < 0 ||
      (kernel != "auto" && kernel != "mma_sync" && kernel != "wgmma")) {
    std::fprintf(stderr, "usage: gpu_attention [--dtype bf16|fp32] [--iters N] "
                         "[--documents LEN] [--kernel auto|mma_sync|wgmma] [B:T:NH:KVH:HS ...]\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"skipped\": \"no CUDA device\"}\n");
    return 0;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "gpu_attention: %s\n", prop.name);
  const AttentionKernel k = kernel == "wgmma"      ? AttentionKernel::wgmma
                            : kernel == "mma_sync" ? AttentionKernel::mma_sync
                                                   : AttentionKernel::automatic;
  try {
    for (const Shape& s : shapes) {
      if (dtype == "bf16")
        run<bf16>(s, iters, doc_len, "bf16", k);
      else
        run<float>(s, iters, doc_len, "fp32", k);
    }
  } catch (const std::exception& e) {  // e.g. --kernel wgmma on a GPU that cannot run it
    std::fprintf(stderr, "gpu_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}

// cuBLAS(Lt) bf16 GEMM throughput (fp32 accumulation) through trident::cuda::gemm: the square
// 8192^3 ceiling and the GEMMs of a GPT-2 124M training step (tokens = 1024 * B); and beside it
// ("fp8") cuBLASLt's FP8 GEMM through trident::cuda::fp8_gemm (train.precision = "fp8"; TN,
// fp32 accumulation) at the square shape and a GPT-2 forward shape, on a GPU with FP8 tensor
// cores (else "fp8": {"skipped": ...}). Prints one JSON object on stdout; without a CUDA device
// prints {"skipped": ...} and exits 0.
//
//   gpu_gemm_ceiling [B=8] [iters=20]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_fill.cuh"
#include "kernels/cuda/ops.hpp"

namespace {

using trident::cuda::bf16;

struct Shape {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
  bool f32_out;  // C in fp32 (the fp32 parameter-gradient GEMMs)
};

// Milliseconds a call of `run` takes: 3 warm-up calls, then the mean of `iters` between events.
template <class F>
double time_ms(F&& run, int iters, cudaEvent_t e0, cudaEvent_t e1) {
  for (int w = 0; w < 3; w++) run();
  CUDA_CHECK(cudaEventRecord(e0));
  for (int it = 0; it < iters; it++) run();
  CUDA_CHECK(cudaEventRecord(e1));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0.f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return ms / iters;
}

// "fp8": [...] entries (each a JSON object, as the bf16 ones), or {"skipped": ...}: operands
// are bf16 uniform values quantised to codes (E4M3 at scale 256, E5M2 at 4096).
void fp8_results(trident::cuda::CublasContext& ctx, int64_t Tok, int64_t D, int iters,
                 cudaEvent_t e0, cudaEvent_t e1) {
  using trident::Fp8Format;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major * 10 + prop.minor < 89) {
    std::printf("  \"fp8\": {\"skipped\": \"compute capability %d.%d: no FP8 tensor cores\"},\n",
                prop.major, prop.minor);
    return;
  }
  struct Fp8Shape {
    const char* name;
    Fp8Format fa, fb;
    int64_t M, N, K;
    bool f32_out;
  };
  const Fp8Shape shapes[] = {
      {"fp8_square_8192_TN", Fp8Format::E4M3, Fp8Format::E4M3, 8192, 8192, 8192, false},
      {"fp8_square_8192_TN_e5m2_f32", Fp8Format::E5M2, Fp8Format::E4M3, 8192, 8192, 8192, true},
      {"fp8_fwd_fc", Fp8Format::E4M3, Fp8Format::E4M3, Tok, 4 * D, D, false}};
  std::printf("  \"fp8\": [\n");
  for (size_t i = 0; i < std::size(shapes); ++i) {
    const Fp8Shape& s = shapes[i];
    const int64_t a_elems = s.M * s.K, b_elems = s.N * s.K, c_elems = s.M * s.N;
    bf16* staging = nullptr;
    uint8_t *A = nullptr, *Bm = nullptr;
    void* Cm = nullptr;
    CUDA_CHECK(cudaMalloc(&staging, std::max(a_elems, b_elems) * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&A, a_elems));
    CUDA_CHECK(cudaMalloc(&Bm, b_elems));
    CUDA_CHECK(cudaMalloc(&Cm, c_elems * (s.f32_out ? 4 : 2)));
    CUDA_CHECK(cudaMemset(Cm, 0, c_elems * (s.f32_out ? 4 : 2)));
    auto codes = [&](uint8_t* out, int64_t n, Fp8Format f, uint32_t seed) {
      fill_uniform<<<4096, 256>>>(staging, n, seed);
      CUDA_CHECK(cudaGetLastError());
      trident::cuda::fp8_quantize<bf16>(out, staging, n, f == Fp8Format::E4M3 ? 256.f : 4096.f, f);
    };
    codes(A, a_elems, s.fa, 4321u + static_cast<uint32_t>(i));
    codes(Bm, b_elems, s.fb, 8765u + static_cast<uint32_t>(i));
    auto run = [&] {
      trident::cuda::fp8_gemm(ctx, s.fa, s.fb,
                              s.f32_out ? trident::cuda::DType::F32 : trident::cuda::DType::BF16,
                              s.M, s.N, s.K, 1.0f / 65536.0f, A, Bm, s.f32_out ? 1.f : 0.f, Cm,
                              nullptr);
    };
    const double ms = time_ms(run, iters, e0, e1);
    const double flop = 2.0 * s.M * s.N * s.K;
    std::printf("    {\"name\": \"%s\", \"op\": \"TN\", \"M\": %lld, \"N\": %lld, \"K\": %lld, "
                "\"out\": \"%s\", \"ms\": %.4f, \"tflops\": %.1f}%s\n",
                s.name, static_cast<long long>(s.M), static_cast<long long>(s.N),
                static_cast<long long>(s.K), s.f32_out ? "fp32" : "bf16", ms,
                flop / (ms * 1e-3) * 1e-12, i + 1 < std::size(shapes) ? "," : "");
    CUDA_CHECK(cudaFree(staging));
    CUDA_CHECK(cudaFree(A));
    CUDA_CHECK(cudaFree(Bm));
    CUDA_CHECK(cudaFree(Cm));
  }
  std::printf("  ],\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (!trident::cuda::device_available()) {
    std::printf("{\"skipped\": \"no CUDA device\"}\n");
    return 0;
  }
  const int64_t B = argc > 1 ? std::atoll(argv[1]) : 8;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20;
  const int64_t Tok = 1024 * B, D = 768, V = 50304;
  std::vector<Shape> shapes = {
      {"square_8192_NN", false, false, 8192, 8192, 8192, false},
      {"square_8192_NT", false, true, 8192, 8192, 8192, false},
      {"square_8192_TN", true, false, 8192, 8192, 8192, false},
      // forward: out[Tok, OC] = inp[Tok, C] W[OC, C]^T
      {"fwd_qkv", false, true, Tok, 3 * D, D, false},
      {"fwd_attn_proj", false, true, Tok, D, D, false},
      {"fwd_fc", false, true, Tok, 4 * D, D, false},
      {"fwd_fc_proj", false, true, Tok, D, 4 * D, false},
      {"fwd_lm_head", false, true, Tok, V, D, false},
      // backward dinp[Tok, C] = dout[Tok, OC] W[OC, C]
      {"bwd_dinp_qkv", false, false, Tok, D, 3 * D, false},
      {"bwd_dinp_attn_proj", false, false, Tok, D, D, false},
      {"bwd_dinp_fc", false, false, Tok, D, 4 * D, false},
      {"bwd_dinp_fc_proj", false, false, Tok, 4 * D, D, false},
      {"bwd_dinp_lm_head", false, false, Tok, D, V, false},
      // backward dweight[OC, C] += dout^T inp (fp32 gradients)
      {"bwd_dw_qkv_f32", true, false, 3 * D, D, Tok, true},
      {"bwd_dw_attn_proj_f32", true, false, D, D, Tok, true},
      {"bwd_dw_fc_f32", true, false, 4 * D, D, Tok, true},
      {"bwd_dw_fc_proj_f32", true, false, D, 4 * D, Tok, true},
      {"bwd_dw_lm_head_f32", true, false, V, D, Tok, true},
  };
  try {
    trident::cuda::CublasContext ctx;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    std::printf("{\n  \"device\": \"%s\",\n  \"dtype\": \"bf16\",\n  \"accumulate\": \"fp32\",\n"
                "  \"tokens\": %lld,\n  \"iters\": %d,\n  \"results\": [\n",
                trident::cuda::device_summary().c_str(), static_cast<long long>(Tok), iters);
    double total_ms = 0.0, total_flop = 0.0;
    for (size_t i = 0; i < shapes.size(); i++) {
      const Shape& s = shapes[i];
      const int64_t a_elems = s.M * s.K, b_elems = s.K * s.N, c_elems = s.M * s.N;
      bf16 *A = nullptr, *Bm = nullptr;
      void* Cm = nullptr;
      CUDA_CHECK(cudaMalloc(&A, a_elems * sizeof(bf16)));
      CUDA_CHECK(cudaMalloc(&Bm, b_elems * sizeof(bf16)));
      CUDA_CHECK(cudaMalloc(&Cm, c_elems * (s.f32_out ? 4 : 2)));
      fill_uniform<<<4096, 256>>>(A, a_elems, 1234u + static_cast<uint32_t>(i));
      CUDA_CHECK(cudaGetLastError());
      fill_uniform<<<4096, 256>>>(Bm, b_elems, 777u + static_cast<uint32_t>(i));
      CUDA_CHECK(cudaGetLastError());
      CUDA_CHECK(cudaMemset(Cm, 0, c_elems * (s.f32_out ? 4 : 2)));
      const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N, ldc = s.N;
      const float beta = s.f32_out ? 1.f : 0.f;  // gradient accumulation
      auto run = [&] {
        if (s.f32_out) {
          trident::cuda::gemm<bf16, float>(ctx, s.ta, s.tb, s.M, s.N, s.K, 1.f, A, lda, Bm, ldb,
                                           beta, static_cast<float*>(Cm), ldc, nullptr);
        } else {
          trident::cuda::gemm<bf16, bf16>(ctx, s.ta, s.tb, s.M, s.N, s.K, 1.f, A, lda, Bm, ldb,
                                          beta, static_cast<bf16*>(Cm), ldc, nullptr);
        }
      };
      const double ms = time_ms(run, iters, e0, e1);
      const double flop = 2.0 * s.M * s.N * s.K;
      if (s.name.rfind("square", 0) != 0) {
        total_ms += ms;
        total_flop += flop;
      }
      std::printf("    {\"name\": \"%s\", \"op\": \"%c%c\", \"M\": %lld, \"N\": %lld, \"K\": %lld, "
                  "\"out\": \"%s\", \"ms\": %.4f, \"tflops\": %.1f}%s\n",
                  s.name.c_str(), s.ta ? 'T' : 'N', s.tb ? 'T' : 'N',
                  static_cast<long long>(s.M), static_cast<long long>(s.N),
                  static_cast<long long>(s.K), s.f32_out ? "fp32" : "bf16", ms,
                  flop / (ms * 1e-3) * 1e-12, i + 1 < shapes.size() ? "," : "");
      CUDA_CHECK(cudaFree(A));
      CUDA_CHECK(cudaFree(Bm));
      CUDA_CHECK(cudaFree(Cm));
    }
    std::printf("  ],\n");
    fp8_results(ctx, Tok, D, iters, e0, e1);
    // One transformer layer's 12 GEMMs (forward, dinp, dweight) plus the LM head's 3.
    std::printf("  \"gpt2_layer_plus_head_gemms_ms\": %.4f,\n"
                "  \"gpt2_layer_plus_head_gemms_tflops\": %.1f\n}\n",
                total_ms, total_flop / (total_ms * 1e-3) * 1e-12);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_gemm_ceiling: %s\n", e.what());
    return 1;
  }
  return 0;
}

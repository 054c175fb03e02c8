// bench_sgemm: the GEMM ceiling that Trident's training step is measured against.
//
// Times row-major C = A*B (fp32 by default) with a fixed thread count on
//   - large square matrices (the ceiling: what the BLAS reaches at best on these cores), and
//   - GPT-2-like shapes (M = tokens in a micro-batch, N, K from the linear layers / LM head),
// each after warm-up, keeping the best of several repetitions (best, not mean: the question
// is what the hardware + BLAS can do, and noise on a shared 2-core box only ever slows it).
// By default it runs the linked OpenBLAS with the kernel Trident picks (the same start-up as
// `trident`: kernels/cpu/blas.hpp; OPENBLAS_CORETYPE set by the caller is respected), so
// OPENBLAS_CORETYPE=X bench_sgemm measures OpenBLAS's kernel X.
//
//   bench_sgemm [--threads N] [--reps R] [--min-time S] [--shapes LIST] [--human]
//               [--double | --bf16] [--in-parallel] [--lib PATH --api cblas|dnnl]
//     --threads N    threads for the BLAS and OpenMP (default 1)
//     --reps R       timed repetitions per shape, best kept (default 5)
//     --min-time S   each repetition loops the GEMM until S seconds have passed (default 0.2)
//     --shapes LIST  comma-separated MxNxK, each optionally :XY with X, Y in {N, T}: A, B
//                    transposed (op(A) is M x K, op(B) K x N, both stored row-major as
//                    given: the LM head's forward x*W^T is 160x50304x256:NT); default: NN,
//                    the square and GPT-like set below
//     --human        also print a table to stderr
//     --double       dgemm instead of sgemm (cblas only)
//     --bf16         also the bf16 GEMM (kernels/cpu/bf16_gemm.hpp: bf16 inputs, fp32
//                    accumulation) at each shape, after the fp32 one, twice: on fp32 inputs
//                    rounded to bf16 in every call (gemm_bf16: what a call on fp32 operands
//                    costs), and on operands rounded once beforehand (gemm_bf16_rounded: what
//                    a weight converted once per step costs, for both operands); with
//                    ratios to fp32. Linked libraries only; exits with one line where the
//                    core has neither AVX512-BF16 nor AMX
//     --cpu-time     time by the process's CPU time / N instead of the wall clock: on cores
//                    shared with other jobs, time slices spent elsewhere do not count. With
//                    N > 1 threads that wait by spinning count their waits, so the figure is
//                    a lower bound of the quiet machine's
//     --in-parallel  inside one `#pragma omp parallel` with N threads, each thread timing its
//                    own loop of GEMMs of the shape (as the attention kernels call it);
//                    GFLOP/s of all together (the sum of the threads' rates)
//     --lib PATH     dlopen another library instead of the linked OpenBLAS:
//     --api cblas    cblas_sgemm/cblas_dgemm (BLIS, MKL's libmkl_rt, another OpenBLAS)
//     --api dnnl     oneDNN's dnnl_sgemm (fp32 only)
//                    Their threads follow omp_set_num_threads (GNU OpenMP builds) and
//                    BLIS_NUM_THREADS / MKL_NUM_THREADS, set here to N before the dlopen.
//
// Prints ONE JSON line on stdout:
//   {"threads":N,"ceiling_gflops":X,"ceiling_shape":"MxNxK",
//    "shapes":[{"m":..,"n":..,"k":..,"gflops":..,"seconds":..},...],
//    "fma_gflops":P,"fma_bits":B,"ceiling_of_peak":X/(N*P),"library":"<what ran>",
//    "precision":"fp32|fp64","in_parallel":false}
// --bf16 adds to each shape "bf16_gflops" (rounding counted), "bf16_rounded_gflops" (not
// counted) and their ratios to "gflops" (fp32), and at the top "bf16_dot_gflops" (one
// thread's vdpbf16ps throughput, 4 FLOP per fp32 lane; 0 without AVX512-BF16) and "bf16"
// (what runs it: bf16_gemm_description()).
// ceiling_gflops is the best over the square shapes (over all shapes when none is square).
// fma_gflops is one thread's throughput of independent FMAs at the widest usable vector
// (the measured peak, clock included; halved for fp64). FLOPs of one GEMM: 2*M*N*K.
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/cpu_features.hpp"

extern "C" {
// OpenBLAS extensions (declared in OpenBLAS's cblas.h; repeated here so that a cblas.h from
// another BLAS would still compile against an OpenBLAS library).
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
}

namespace {

struct Shape {
  long m, n, k;
  bool trans_a = false, trans_b = false;
  long lda() const { return trans_a ? m : k; }
  long ldb() const { return trans_b ? k : n; }
  std::string ops() const { return std::string(1, trans_a ? 'T' : 'N') + (trans_b ? 'T' : 'N'); }
};

struct Result {
  Shape s;
  double gflops;
  double seconds;  // one GEMM, best repetition (the slowest thread's with --in-parallel)
  double bf16_gflops = 0.0, bf16_rounded_gflops = 0.0;  // --bf16
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr, "bench_sgemm: %s\n", msg);
  std::fprintf(stderr,
               "usage: bench_sgemm [--threads N] [--reps R] [--min-time S] "
               "[--shapes MxNxK,...] [--human] [--double | --bf16] [--in-parallel] "
               "[--lib PATH --api cblas|dnnl]\n");
  std::exit(2);
}

std::vector<Shape> parse_shapes(const std::string& list) {
  std::vector<Shape> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string tok = list.substr(pos, end - pos);
    if (!tok.empty()) {
      Shape s{};
      char ops[3] = "NN";
      int used = 0;
      const int got = std::sscanf(tok.c_str(), "%ldx%ldx%ld%n:%2[NT]%n", &s.m, &s.n, &s.k,
                                  &used, ops, &used);
      if (got < 3 || used != static_cast<int>(tok.size()) || s.m <= 0 || s.n <= 0 || s.k <= 0 ||
          (got == 4 && ops[1] == '\0'))
        usage(("bad shape '" + tok + "' (want MxNxK or MxNxK:XY, X and Y each N or T)").c_str());
      s.trans_a = ops[0] == 'T';
      s.trans_b = ops[1] == 'T';
      out.push_back(s);
    }
    pos = end + 1;
  }
  if (out.empty()) usage("empty --shapes");
  return out;
}

// One row-major C[m,n] = A[m,k] B[k,n] of the library under test.
template <typename T>
using GemmFn = std::function<void(const Shape&, const T*, const T*, T*)>;

// cblas enums by value (CblasRowMajor, CblasNoTrans), for a dlopen'ed library.
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int,
                            const float*, int, float, float*, int);
using CblasDgemm = void (*)(int, int, int, int, int, int, double, const double*, int,
                            const double*, int, double, double*, int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);

void* must_dlsym(void* lib, const char* name, const std::string& path) {
  void* f = dlsym(lib, name);
  if (!f) usage((path + " has no " + name).c_str());
  return f;
}

template <typename T>
GemmFn<T> linked_gemm() {
  return [](const Shape& s, const T* a, const T* b, T* c) {
    trident::cpu::gemm<T>(s.trans_a, s.trans_b, s.m, s.n, s.k, T(1), a, s.lda(), b, s.ldb(), T(0),
                          c, s.n);
  };
}

// gemm_bf16 on the fp32 operands: their rounding to bf16 is part of every call.
GemmFn<float> bf16_gemm() {
  return [](const Shape& s, const float* a, const float* b, float* c) {
    trident::cpu::gemm_bf16(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, s.lda(), b, s.ldb(),
                            0.0f, c, s.n);
  };
}

// gemm_bf16_rounded on bf16 copies of the operands, each made at its first call (in the
// warm-up) and reused: the rounding is not timed. One per shape (the operands' addresses key
// the copies); the lock serves --in-parallel, where each thread has its own operands.
GemmFn<float> bf16_gemm_pre_rounded() {
  struct Copies {
    std::mutex lock;
    std::map<const float*, std::vector<uint16_t>> of;
  };
  auto copies = std::make_shared<Copies>();
  return [copies](const Shape& s, const float* a, const float* b, float* c) {
    auto copy = [&](const float* x, long rows, long cols) {
      std::lock_guard<std::mutex> hold(copies->lock);
      std::vector<uint16_t>& v = copies->of[x];
      if (v.empty()) {
        v.resize(static_cast<size_t>(rows * cols));
        trident::cpu::round_to_bf16(x, rows, cols, cols, v.data());
      }
      return v.data();
    };
    const uint16_t* ab = s.trans_a ? copy(a, s.k, s.m) : copy(a, s.m, s.k);
    const uint16_t* bb = s.trans_b ? copy(b, s.n, s.k) : copy(b, s.k, s.n);
    trident::cpu::gemm_bf16_rounded(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, ab, s.lda(), bb,
                                    s.ldb(), 0.0f, c, s.n);
  };
}

template <typename T>
GemmFn<T> loaded_gemm(void* lib, const std::string& path, const std::string& api) {
  if (api == "dnnl") {
    if constexpr (std::is_same_v<T, double>) {
      usage("--api dnnl has no fp64 GEMM");
    } else {
      auto f = reinterpret_cast<DnnlSgemm>(must_dlsym(lib, "dnnl_sgemm", path));
      return [f](const Shape& s, const float* a, const float* b, float* c) {
        f(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a, s.lda(), b,
          s.ldb(), 0.0f, c, s.n);
      };
    }
  }
  constexpr int kRowMajor = 101;
  const auto op = [](bool trans) { return trans ? 112 : 111; };  // CblasTrans, CblasNoTrans
  if constexpr (std::is_same_v<T, float>) {
    auto f = reinterpret_cast<CblasSgemm>(must_dlsym(lib, "cblas_sgemm", path));
    return [f, op](const Shape& s, const float* a, const float* b, float* c) {
      f(kRowMajor, op(s.trans_a), op(s.trans_b), int(s.m), int(s.n), int(s.k), 1.0f, a,
        int(s.lda()), b, int(s.ldb()), 0.0f, c, int(s.n));
    };
  } else {
    auto f = reinterpret_cast<CblasDgemm>(must_dlsym(lib, "cblas_dgemm", path));
    return [f, op](const Shape& s, const double* a, const double* b, double* c) {
      f(kRowMajor, op(s.trans_a), op(s.trans_b), int(s.m), int(s.n), int(s.k), 1.0, a,
        int(s.lda()), b, int(s.ldb()), 0.0, c, int(s.n));
    };
  }
}

// Seconds from the wall clock, or (--cpu-time) the process's CPU time over its `threads`, or
// the calling thread's CPU time (thread_clock).
double now_s(bool cpu_time, int threads, bool thread_clock) {
  if (cpu_time) {
    timespec ts{};
    clock_gettime(thread_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec)) / threads;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <typename T>
Result time_gemm(const GemmFn<T>& gemm, const Shape& s, int reps, double min_time,
                 int copies, bool cpu_time, int threads) {
  // With --in-parallel every thread has its own A, B and C (as the attention tasks do).
  std::vector<std::vector<T>> a(copies), b(copies), c(copies);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int t = 0; t < copies; ++t) {
    a[t].resize(static_cast<size_t>(s.m * s.k));
    b[t].resize(static_cast<size_t>(s.k * s.n));
    c[t].assign(static_cast<size_t>(s.m * s.n), T(0));
    for (auto& x : a[t]) x = u(rng);
    for (auto& x : b[t]) x = u(rng);
  }
  // Keeps the results alive so the calls cannot be elided.
  auto keep = [&] {
    volatile T sink = c[0][static_cast<size_t>(s.m * s.n / 2)];
    (void)sink;
  };
  const double flops = 2.0 * static_cast<double>(s.m) * s.n * s.k;

  // The best seconds per call of one thread's loop of calls (first two: warm-up, thread pool
  // start, page faults on C, packing buffers).
  auto best_seconds = [&](int t, int divisor, bool thread_clock) {
    gemm(s, a[t].data(), b[t].data(), c[t].data());
    gemm(s, a[t].data(), b[t].data(), c[t].data());
    double best = 1e300;
    for (int r = 0; r < reps; ++r) {
      int iters = 0;
      const double t0 = now_s(cpu_time, divisor, thread_clock);
      double el = 0.0;
      do {
        gemm(s, a[t].data(), b[t].data(), c[t].data());
        ++iters;
        el = now_s(cpu_time, divisor, thread_clock) - t0;
      } while (el < min_time);
      best = std::min(best, el / iters);
    }
    return best;
  };

  if (copies == 1) {
    const double best = best_seconds(0, threads, false);
    keep();
    return {s, flops / best * 1e-9, best};
  }
  // --in-parallel: one parallel region, each thread timing its own loop of GEMMs (as an
  // attention task does), on its own CPU time with --cpu-time; the rate is the threads' sum.
  std::vector<double> per_thread(copies);
#pragma omp parallel num_threads(copies)
  {
    const int t = omp_get_thread_num();
    per_thread[t] = best_seconds(t, 1, true);
  }
  keep();
  double gflops = 0.0, slowest = 0.0;
  for (double sec : per_thread) {
    gflops += flops / sec * 1e-9;
    slowest = std::max(slowest, sec);
  }
  return {s, gflops, slowest};
}

std::string json_escaped(std::string s) {
  for (auto& ch : s)
    if (ch == '"' || ch == '\\') ch = '\'';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  // The kernel `trident` would run (may run this program again; see kernels/cpu/blas.hpp).
  trident::cpu::settle_gemm_kernel(argv);
  int threads = 1, reps = 5;
  double min_time = 0.2;
  bool human = false, fp64 = false, in_parallel = false, cpu_time = false, bf16 = false;
  std::string lib_path, api = "cblas";
  std::vector<Shape> shapes = {
      {2048, 2048, 2048},   // square: the ceiling
      {4096, 4096, 4096},   // square, larger
      {1024, 2304, 768},    // 124m: qkv projection, 1024 tokens
      {1024, 3072, 768},    // 124m: MLP up
      {1024, 768, 3072},    // 124m: MLP down
      {1024, 50304, 768},   // 124m: LM head
      {1024, 768, 256},     // small: qkv projection, 4x256 tokens
      {1024, 50304, 256},   // small: LM head
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--min-time") min_time = std::atof(next());
    else if (a == "--shapes") shapes = parse_shapes(next());
    else if (a == "--human") human = true;
    else if (a == "--double") fp64 = true;
    else if (a == "--bf16") bf16 = true;
    else if (a == "--in-parallel") in_parallel = true;
    else if (a == "--cpu-time") cpu_time = true;
    else if (a == "--lib") lib_path = next();
    else if (a == "--api") api = next();
    else if (a == "-h" || a == "--help") usage("help");
    else usage(("unknown argument '" + a + "'").c_str());
  }
  if (threads < 1) usage("--threads must be >= 1");
  if (reps < 1) usage("--reps must be >= 1");
  if (api != "cblas" && api != "dnnl") usage(("unknown --api '" + api + "'").c_str());
  if (bf16 && (fp64 || !lib_path.empty())) usage("--bf16 goes with neither --double nor --lib");
  if (bf16 && !trident::cpu::bf16_gemm_available())
    usage(("--bf16: " + trident::cpu::bf16_gemm_description()).c_str());

  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  std::string library = trident::cpu::gemm_description();
  void* lib = nullptr;
  if (!lib_path.empty()) {
    const std::string n = std::to_string(in_parallel ? 1 : threads);
    setenv("BLIS_NUM_THREADS", n.c_str(), 1);
    setenv("MKL_NUM_THREADS", n.c_str(), 1);
    lib = dlopen(lib_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) usage(("cannot load " + lib_path + ": " + dlerror()).c_str());
    library = lib_path + " (" + api + ")";
  }
  // Inside a parallel region the linked OpenBLAS runs single-threaded by itself (blas.cpp);
  // a loaded library is told so through its thread variables above.
  const int copies = in_parallel ? threads : 1;

  std::vector<Result> results;
  for (const auto& s : shapes) {
    results.push_back(fp64 ? time_gemm<double>(lib ? loaded_gemm<double>(lib, lib_path, api)
                                                   : linked_gemm<double>(),
                                               s, reps, min_time, copies, cpu_time, threads)
                           : time_gemm<float>(lib ? loaded_gemm<float>(lib, lib_path, api)
                                                  : linked_gemm<float>(),
                                              s, reps, min_time, copies, cpu_time, threads));
    Result& r = results.back();
    if (bf16) {
      r.bf16_gflops = time_gemm<float>(bf16_gemm(), s, reps, min_time, copies, cpu_time,
                                       threads).gflops;
      r.bf16_rounded_gflops = time_gemm<float>(bf16_gemm_pre_rounded(), s, reps, min_time,
                                               copies, cpu_time, threads).gflops;
    }
    if (human && bf16)
      std::fprintf(stderr,
                   "  %6ld x %6ld x %6ld %s  fp32 %8.2f  bf16 %8.2f (%.2fx)  bf16 pre-rounded "
                   "%8.2f (%.2fx) GFLOP/s\n",
                   s.m, s.n, s.k, s.ops().c_str(), r.gflops, r.bf16_gflops,
                   r.bf16_gflops / r.gflops, r.bf16_rounded_gflops,
                   r.bf16_rounded_gflops / r.gflops);
    else if (human)
      std::fprintf(stderr, "  %6ld x %6ld x %6ld %s  %8.2f GFLOP/s  (%.4f s)\n", s.m, s.n, s.k,
                   s.ops().c_str(), r.gflops, r.seconds);
  }

  const Result* ceil = nullptr;
  for (const auto& r : results)
    if (r.s.m == r.s.n && r.s.n == r.s.k && (!ceil || r.gflops > ceil->gflops)) ceil = &r;
  if (!ceil)
    for (const auto& r : results)
      if (!ceil || r.gflops > ceil->gflops) ceil = &r;

  // The measured peak of one thread, after the GEMMs (so their threads are idle again).
  const int bits = trident::cpu::fma_vector_bits(trident::cpu::read_cpu_features());
  const double fma = bits ? trident::cpu::fma_peak_gflops(bits, 0.2, cpu_time) / (fp64 ? 2.0 : 1.0) : 0.0;
  const double of_peak = fma > 0 ? ceil->gflops / (fma * threads) : 0.0;

  std::printf("{\"threads\":%d,\"openblas_threads\":%d,\"ceiling_gflops\":%.2f,"
              "\"ceiling_shape\":\"%ldx%ldx%ld\",\"shapes\":[",
              threads, openblas_get_num_threads(), ceil->gflops, ceil->s.m, ceil->s.n,
              ceil->s.k);
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    std::printf("%s{\"m\":%ld,\"n\":%ld,\"k\":%ld,\"ops\":\"%s\",\"gflops\":%.2f,"
                "\"seconds\":%.6f",
                i ? "," : "", r.s.m, r.s.n, r.s.k, r.s.ops().c_str(), r.gflops, r.seconds);
    if (bf16)
      std::printf(",\"bf16_gflops\":%.2f,\"bf16_ratio\":%.3f,\"bf16_rounded_gflops\":%.2f,"
                  "\"bf16_rounded_ratio\":%.3f",
                  r.bf16_gflops, r.bf16_gflops / r.gflops, r.bf16_rounded_gflops,
                  r.bf16_rounded_gflops / r.gflops);
    std::printf("}");
  }
  std::printf("],\"fma_gflops\":%.2f,\"fma_bits\":%d,\"ceiling_of_peak\":%.3f,"
              "\"precision\":\"%s\",\"in_parallel\":%s,\"clock\":\"%s\",\"library\":\"%s\"",
              fma, bits, of_peak, fp64 ? "fp64" : "fp32", in_parallel ? "true" : "false",
              cpu_time ? "cpu" : "wall",
              json_escaped(library).c_str());
  if (bf16)
    std::printf(",\"bf16_dot_gflops\":%.2f,\"bf16\":\"%s\"",
                trident::cpu::bf16_dot_peak_gflops(0.2, cpu_time),
                json_escaped(trident::cpu::bf16_gemm_description()).c_str());
  std::printf("}\n");
  return 0;
}

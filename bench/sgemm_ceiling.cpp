// bench_sgemm: the OpenBLAS sgemm ceiling that Trident's training step is measured against.
//
// Times cblas_sgemm (row-major, C = A*B, fp32) with a fixed thread count on
//   - large square matrices (the ceiling: what the BLAS reaches at best on these cores), and
//   - GPT-2-like shapes (M = tokens in a micro-batch, N, K from the linear layers / LM head),
// each after warm-up, keeping the best of several repetitions (best, not mean: the question
// is what the hardware + BLAS can do, and noise on a shared 2-core box only ever slows it).
//
//   bench_sgemm [--threads N] [--reps R] [--min-time S] [--shapes LIST] [--human]
//     --threads N   openblas_set_num_threads(N) and omp_set_num_threads(N) (default 1)
//     --reps R      timed repetitions per shape, best kept (default 5)
//     --min-time S  each repetition loops sgemm until S seconds have passed (default 0.2)
//     --shapes LIST comma-separated MxNxK; default: the square and GPT-like set below
//     --human       also print a table to stderr
//
// Prints ONE JSON line on stdout:
//   {"threads":N,"ceiling_gflops":X,"ceiling_shape":"MxNxK",
//    "shapes":[{"m":..,"n":..,"k":..,"gflops":..,"seconds":..},...],"openblas":"<config>"}
// ceiling_gflops is the best over the square shapes (over all shapes when none is square).
// FLOPs of one sgemm: 2*M*N*K.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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
};

struct Result {
  Shape s;
  double gflops;
  double seconds;  // one sgemm, best repetition
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr, "bench_sgemm: %s\n", msg);
  std::fprintf(stderr,
               "usage: bench_sgemm [--threads N] [--reps R] [--min-time S] "
               "[--shapes MxNxK,...] [--human]\n");
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
      if (std::sscanf(tok.c_str(), "%ldx%ldx%ld", &s.m, &s.n, &s.k) != 3 || s.m <= 0 ||
          s.n <= 0 || s.k <= 0)
        usage(("bad shape '" + tok + "' (want MxNxK)").c_str());
      out.push_back(s);
    }
    pos = end + 1;
  }
  if (out.empty()) usage("empty --shapes");
  return out;
}

Result time_sgemm(const Shape& s, int reps, double min_time) {
  std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
      c(static_cast<size_t>(s.m * s.n), 0.0f);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);

  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s.m),
                static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(),
                static_cast<int>(s.k), b.data(), static_cast<int>(s.n), 0.0f, c.data(),
                static_cast<int>(s.n));
  };
  using clk = std::chrono::steady_clock;
  // Warm-up: thread pool start, page faults on C, packing buffers.
  gemm();
  gemm();

  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    int iters = 0;
    auto t0 = clk::now();
    double el = 0.0;
    do {
      gemm();
      ++iters;
      el = std::chrono::duration<double>(clk::now() - t0).count();
    } while (el < min_time);
    best = std::min(best, el / iters);
  }
  // Keep the result alive so the calls cannot be elided.
  volatile float sink = c[static_cast<size_t>(s.m * s.n / 2)];
  (void)sink;
  const double flops = 2.0 * static_cast<double>(s.m) * s.n * s.k;
  return {s, flops / best * 1e-9, best};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 5;
  double min_time = 0.2;
  bool human = false;
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
    else if (a == "-h" || a == "--help") usage("help");
    else usage(("unknown argument '" + a + "'").c_str());
  }
  if (threads < 1) usage("--threads must be >= 1");
  if (reps < 1) usage("--reps must be >= 1");

  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  std::vector<Result> results;
  for (const auto& s : shapes) {
    results.push_back(time_sgemm(s, reps, min_time));
    if (human)
      std::fprintf(stderr, "  %6ld x %6ld x %6ld  %8.2f GFLOP/s  (%.4f s)\n", s.m, s.n, s.k,
                   results.back().gflops, results.back().seconds);
  }

  const Result* ceil = nullptr;
  for (const auto& r : results)
    if (r.s.m == r.s.n && r.s.n == r.s.k && (!ceil || r.gflops > ceil->gflops)) ceil = &r;
  if (!ceil)
    for (const auto& r : results)
      if (!ceil || r.gflops > ceil->gflops) ceil = &r;

  std::string cfg = openblas_get_config();
  for (auto& ch : cfg)
    if (ch == '"' || ch == '\\') ch = '\'';
  std::printf("{\"threads\":%d,\"openblas_threads\":%d,\"ceiling_gflops\":%.2f,"
              "\"ceiling_shape\":\"%ldx%ldx%ld\",\"shapes\":[",
              threads, openblas_get_num_threads(), ceil->gflops, ceil->s.m, ceil->s.n,
              ceil->s.k);
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    std::printf("%s{\"m\":%ld,\"n\":%ld,\"k\":%ld,\"gflops\":%.2f,\"seconds\":%.6f}",
                i ? "," : "", r.s.m, r.s.n, r.s.k, r.gflops, r.seconds);
  }
  std::printf("],\"openblas\":\"%s\"}\n", cfg.c_str());
  return 0;
}

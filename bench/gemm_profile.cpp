// Where a run's GEMM time goes, shape by shape, with nothing changed in Trident: preloaded
// (LD_PRELOAD=libtrident_gemm_profile.so), this library stands in front of oneDNN's dnnl_sgemm,
// its matmul primitives' execution (the bf16 products) and OpenBLAS's cblas_sgemm, times each
// call, and at exit writes one table per process to stderr: for every (library, M x N x K,
// transposes, who threads it) the calls, the milliseconds, the share of all GEMM time and the
// GFLOP/s (2·M·N·K a call). docs/gemm.md
// ("Where a run's GEMM time goes") shows how to run it, bench/README.md what it measured.
//
// Who threads it: a call made outside an OpenMP parallel region is threaded by the library
// itself ("library"), and its time is wall time. A call made inside a region of T threads is
// one thread's piece of a product ("T threads": the forward products split by columns, the
// attention's tiles), and the T threads run such pieces side by side; the table counts the
// pieces' summed time divided by T, the wall time they take together if they keep all T busy,
// and their GFLOP/s over that time, the team's rate. The cost of the wrapper is two clock
// reads and a mutex a call (well under a microsecond, against the tens of microseconds of the
// smallest product Trident runs).
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Key {
  const char* library;
  long long m, n, k;
  char trans_a, trans_b;
  int team;  // the threads of the parallel region the call was made in; 1 outside one
  bool operator<(const Key& o) const {
    return std::tie(library, m, n, k, trans_a, trans_b, team) <
           std::tie(o.library, o.m, o.n, o.k, o.trans_a, o.trans_b, o.team);
  }
};

struct Totals {
  long long calls = 0;
  double thread_seconds = 0.0;  // summed over the calls, whichever thread made them
};

// Wall-time equivalent of a row (above).
double seconds_of(const Key& key, const Totals& t) { return t.thread_seconds / key.team; }

// The team of the parallel region the caller is in: 1 outside one.
int caller_team() { return omp_in_parallel() ? omp_get_num_threads() : 1; }

class Profile {
 public:
  Profile() : start_(Clock::now()) {}
  ~Profile() { write_table(); }

  void add(const Key& key, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    Totals& t = totals_[key];
    t.calls++;
    t.thread_seconds += seconds;
  }

 private:
  void write_table() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (totals_.empty()) return;  // a process that ran no GEMM (the shell of a script, say)
    std::vector<std::pair<Key, Totals>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) {
                return seconds_of(a.first, a.second) > seconds_of(b.first, b.second);
              });
    double gemm_seconds = 0.0;
    long long calls = 0;
    for (const auto& [key, t] : rows) {
      gemm_seconds += seconds_of(key, t);
      calls += t.calls;
    }
    const double run_seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    const char* rank = std::getenv("PMI_RANK");
    std::string out = rank != nullptr ? std::string("gemm profile, rank ") + rank : "gemm profile";
    char line[256];
    std::snprintf(line, sizeof line,
                  " (pid %d): %lld calls, %.3f s in GEMMs, %.3f s since the process started\n",
                  static_cast<int>(getpid()), calls, gemm_seconds, run_seconds);
    out += line;
    out += "  library      M x      N x      K  ops  threaded by      calls          ms   share    GF/s\n";
    for (const auto& [key, t] : rows) {
      const double flop = 2.0 * static_cast<double>(key.m) * static_cast<double>(key.n) *
                          static_cast<double>(key.k) * static_cast<double>(t.calls);
      const double seconds = seconds_of(key, t);
      char who[32] = "library";
      if (key.team > 1) std::snprintf(who, sizeof who, "%d threads", key.team);
      // A tiny product (a 7 x 5 x 3 kernel check) runs well under 1 GF/s: three significant
      // digits there, so that a rate never reads as 0.0.
      const double rate = seconds > 0 ? flop / seconds / 1e9 : 0.0;
      const char* format =
          rate >= 1 ? "  %-8s %6lld x %6lld x %6lld  %c%c   %-11s %9lld %11.1f %6.1f%% %7.1f\n"
                    : "  %-8s %6lld x %6lld x %6lld  %c%c   %-11s %9lld %11.1f %6.1f%% %7.3g\n";
      std::snprintf(line, sizeof line, format,
                    key.library, key.m, key.n, key.k, key.trans_a, key.trans_b, who, t.calls,
                    seconds * 1e3, gemm_seconds > 0 ? 100.0 * seconds / gemm_seconds : 0.0,
                    rate);
      out += line;
    }
    // One write, so that the tables of ranks sharing a terminal do not interleave line by line.
    if (write(STDERR_FILENO, out.data(), out.size()) < 0) return;
  }

  const Clock::time_point start_;
  std::mutex mutex_;
  std::map<Key, Totals> totals_;
};

Profile& profile() {
  static Profile p;  // constructed at load (below), destroyed at exit
  return p;
}
[[maybe_unused]] const bool kLoaded = (profile(), true);

// The next definition of `name` after this library's: the real one.
template <typename F>
F next_symbol(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "gemm profile: %s not found after the preloaded library\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

char op_letter(CBLAS_TRANSPOSE t) { return t == CblasNoTrans ? 'N' : 'T'; }

}  // namespace

extern "C" {

dnnl_status_t dnnl_sgemm(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                         float alpha, const float* A, dnnl_dim_t lda, const float* B,
                         dnnl_dim_t ldb, float beta, float* C, dnnl_dim_t ldc) {
  using Fn = dnnl_status_t (*)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float,
                               const float*, dnnl_dim_t, const float*, dnnl_dim_t, float, float*,
                               dnnl_dim_t);
  static const Fn real = next_symbol<Fn>("dnnl_sgemm");
  const int team = caller_team();
  const auto t0 = Clock::now();
  const dnnl_status_t status = real(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto letter = [](char t) { return (t == 'T' || t == 't') ? 'T' : 'N'; };
  profile().add({"oneDNN", M, N, K, letter(transa), letter(transb), team}, seconds);
  return status;
}

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE trans_a,
                 const enum CBLAS_TRANSPOSE trans_b, const blasint M, const blasint N,
                 const blasint K, const float alpha, const float* A, const blasint lda,
                 const float* B, const blasint ldb, const float beta, float* C,
                 const blasint ldc) {
  using Fn = void (*)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                      blasint, blasint, float, const float*, blasint, const float*, blasint,
                      float, float*, blasint);
  static const Fn real = next_symbol<Fn>("cblas_sgemm");
  const int team = caller_team();
  const auto t0 = Clock::now();
  real(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Column-major calls are listed as the row-major product they compute (Trident's are
  // row-major): C^T = op(B)^T op(A)^T.
  const bool row_major = order == CblasRowMajor;
  profile().add({"OpenBLAS", row_major ? M : N, row_major ? N : M, K,
                 op_letter(row_major ? trans_a : trans_b), op_letter(row_major ? trans_b : trans_a),
                 team},
                seconds);
}

// oneDNN's matmul primitives (the CPU bf16 engine's products, kernels/cpu/bf16_gemm.cpp), listed
// as "matmul" with the row-major product they compute: M x K source, K x N weights, their
// transposes read off the descriptors' strides. Other primitives (reorders) pass untimed.
dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream,
                                     int nargs, const dnnl_exec_arg_t* args) {
  using Fn = dnnl_status_t (*)(const_dnnl_primitive_t, dnnl_stream_t, int,
                               const dnnl_exec_arg_t*);
  static const Fn real = next_symbol<Fn>("dnnl_primitive_execute");
  // The descriptor queries are oneDNN's too: found at run time, as the calls above are.
  using GetDesc = dnnl_status_t (*)(const_dnnl_primitive_t, const_dnnl_primitive_desc_t*);
  using Query = dnnl_status_t (*)(const_dnnl_primitive_desc_t, dnnl_query_t, int, void*);
  using QueryMd =
      const dnnl_memory_desc_t* (*)(const_dnnl_primitive_desc_t, dnnl_query_t, int);
  static const GetDesc get_desc = next_symbol<GetDesc>("dnnl_primitive_get_primitive_desc");
  static const Query query = next_symbol<Query>("dnnl_primitive_desc_query");
  static const QueryMd query_md = next_symbol<QueryMd>("dnnl_primitive_desc_query_md");
  const_dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_kind_t kind = dnnl_undefined_primitive;
  if (get_desc(primitive, &pd) != dnnl_success ||
      query(pd, dnnl_query_primitive_kind, 0, &kind) != dnnl_success || kind != dnnl_matmul)
    return real(primitive, stream, nargs, args);
  const dnnl_memory_desc_t* src = query_md(pd, dnnl_query_src_md, 0);
  const dnnl_memory_desc_t* weights = query_md(pd, dnnl_query_weights_md, 0);
  const int team = caller_team();
  const auto t0 = Clock::now();
  const dnnl_status_t status = real(primitive, stream, nargs, args);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (src == nullptr || weights == nullptr || src->ndims != 2 || weights->ndims != 2)
    return status;
  // A 2-D operand is transposed where its rows are the unit stride.
  auto letter = [](const dnnl_memory_desc_t* md) {
    const dnnl_dims_t& strides = md->format_desc.blocking.strides;
    return strides[0] == 1 && md->dims[0] > 1 ? 'T' : 'N';
  };
  profile().add({"matmul", src->dims[0], weights->dims[1], src->dims[1], letter(src),
                 letter(weights), team},
                seconds);
  return status;
}

}  // extern "C"

// bf16 GEMM on oneDNN's matmul primitive (oneDNN 2.6 has no public bf16 gemm function; its
// matmul with bf16 src/weights and an f32 dst accumulates in fp32). alpha is the primitive's
// output scale and beta its `sum` post-op, both fixed when the primitive is created.
#include "kernels/cpu/bf16_gemm.hpp"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/scratch.hpp"
#include "util/error.hpp"

namespace trident::cpu {

namespace {

using dnnl::memory;

std::string shape_text(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + ":" +
         (ta ? "T" : "N") + (tb ? "T" : "N");
}

// The primitive for one product. Everything that oneDNN fixes at creation is in the key: the
// shape, the strides, alpha and beta (compared by their bits), and the threads the primitive
// is planned for (oneDNN splits the work at creation by its maximum thread count, which is 1
// inside a parallel region), so a cached primitive always matches the call.
struct Key {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb;
  uint32_t alpha_bits, beta_bits;
  int threads;
  bool bias;
  bool operator==(const Key&) const = default;
};

// Primitives by key, per thread, least recently used evicted beyond kCapacity. Per thread
// because the attention kernels call GEMMs from inside a parallel region, one per task: a
// thread-local cache needs no lock on that path, and a primitive is only ever executed by the
// thread that created it (no question of oneDNN's scratchpad being shared between concurrent
// executions). Bounded because shapes can vary (the last micro-batch, documents' blocks);
// 128 holds a transformer's products: 3 per linear layer kind, the LM head's chunks, and the
// attention's (attention_bf16.cpp: 7 products per key length, one length per 128 rows of a
// sequence up to 1024: 56 at T = 1024). Creating a matmul primitive takes 0.2-0.5 ms here
// (its kernels are generated), as long as a 256^3 product: without the cache every call would
// pay it.
class PrimitiveCache {
 public:
  static constexpr size_t kCapacity = 128;

  PrimitiveCache() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  dnnl::stream& stream() { return stream_; }

  // A primitive with its execution arguments: memory objects made once, on no buffer, which a
  // call points at its arrays (set_data_handle), and their argument list in the C API's form.
  // Making the objects and the C++ API's argument map at every call cost 11 heap allocations of
  // the 16 a call made (the other 5 are oneDNN's own, inside its execute): the attention calls
  // a product per block of keys, hundreds a step.
  struct Entry {
    Key key;
    dnnl::matmul::primitive_desc pd;  // the memory descriptors of the call's arrays
    dnnl::matmul primitive;
    memory a, b, c, bias;  // bias: an empty object where the key has none
    std::vector<dnnl_exec_arg_t> args;
    uint64_t last_use;

    Entry(const Key& k, dnnl::matmul::primitive_desc desc, const dnnl::engine& engine,
          uint64_t use)
        : key(k),
          pd(std::move(desc)),
          primitive(pd),
          a(pd.src_desc(), engine, DNNL_MEMORY_NONE),
          b(pd.weights_desc(), engine, DNNL_MEMORY_NONE),
          c(pd.dst_desc(), engine, DNNL_MEMORY_NONE),
          args{{DNNL_ARG_SRC, a.get()}, {DNNL_ARG_WEIGHTS, b.get()}, {DNNL_ARG_DST, c.get()}},
          last_use(use) {
      if (k.bias) {
        bias = memory(pd.bias_desc(), engine, DNNL_MEMORY_NONE);
        args.push_back({DNNL_ARG_BIAS, bias.get()});
      }
    }
  };

  const Entry& get(const Key& key) {
    ++clock_;
    for (Entry& e : entries_)
      if (e.key == key) {
        e.last_use = clock_;
        return e;
      }
    Entry fresh(key, describe(key), engine_, clock_);
    if (entries_.size() < kCapacity) {
      entries_.push_back(std::move(fresh));
      return entries_.back();
    }
    Entry& oldest = *std::min_element(entries_.begin(), entries_.end(),
                                      [](const Entry& a, const Entry& b) {
                                        return a.last_use < b.last_use;
                                      });
    oldest = std::move(fresh);
    return oldest;
  }

  // The matmul's primitive descriptor for `key` (its implementation name: impl_info_str).
  dnnl::matmul::primitive_desc describe(const Key& key) const {
    // op(A) M x K and op(B) K x N in row-major storage: a transposed operand is the other
    // matrix read with swapped strides, so no copy is needed for any combination.
    const memory::desc a({key.M, key.K}, memory::data_type::bf16,
                         key.ta ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
    const memory::desc b({key.K, key.N}, memory::data_type::bf16,
                         key.tb ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
    const memory::desc c({key.M, key.N}, memory::data_type::f32, memory::dims{key.ldc, 1});
    const memory::desc bias({1, key.N}, memory::data_type::f32, memory::dims{key.N, 1});
    dnnl::primitive_attr attr;
    const float alpha = std::bit_cast<float>(key.alpha_bits);
    const float beta = std::bit_cast<float>(key.beta_bits);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    try {
      return dnnl::matmul::primitive_desc(
          key.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c), attr,
          engine_);
    } catch (const dnnl::error& e) {
      throw Error("oneDNN has no bf16 matmul for " + shape_text(key.ta, key.tb, key.M, key.N,
                                                                key.K) +
                  " (lda " + std::to_string(key.lda) + ", ldb " + std::to_string(key.ldb) +
                  ", ldc " + std::to_string(key.ldc) + "): " + e.what());
    }
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

PrimitiveCache& thread_cache() {
  thread_local PrimitiveCache cache;
  return cache;
}

Key make_key(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, int64_t lda,
             int64_t ldb, float beta, int64_t ldc, bool bias = false) {
  return {M,
          N,
          K,
          lda,
          ldb,
          ldc,
          ta,
          tb,
          std::bit_cast<uint32_t>(alpha),
          std::bit_cast<uint32_t>(beta),
          omp_in_parallel() ? 1 : omp_get_max_threads(),
          bias};
}

// The longest sum one NN matmul call takes. oneDNN 2.6's AMX matmul slows down on long sums of
// two untransposed operands: the LM head's input gradient, 512 x 768 x 50304 NN, ran at 288
// GFLOP/s on one thread of an AMX Xeon (bench_sgemm --bf16, pre-rounded), its quarter
// 512 x 768 x 12576 at 631 and 1024 x 768 x 8192 at 703; cut into pieces, the whole ran at 641
// (1024 rows: 305 -> 801). A transposed operand showed no such drop (768 x 3072 x 16384 TN 478
// against 476 at 8192), so only NN products are cut: into pieces of at most this many (a
// multiple of 32), each added to C by its own call.
constexpr int64_t kMaxProductK = 8192;

// Elements below which the rounding stays on one thread: a team costs a few microseconds.
constexpr int64_t kMinParallelElements = int64_t{1} << 16;

// Scratch tags (kernels/cpu/scratch.hpp): A's and B's rounded copies are in use at once.
struct RoundedA;
struct RoundedB;

}  // namespace

bool bf16_gemm_available() {
  // oneDNN's ISAs are nested bit masks: avx512_core_amx contains avx512_core_bf16's bits.
  const unsigned isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

bool bf16_gemm_has_amx() {
  return dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx;
}

const Bf16DotRate& bf16_dot_rate() {
  // Thread CPU time: a rank sharing its core with busy-polling ranks at start-up measures the
  // core, not its time slices. Both probes alike, so their ratio holds on a loaded machine.
  static const Bf16DotRate rate = [] {
    Bf16DotRate r;
    r.dot_gflops = bf16_dot_peak_gflops(0.03, /*cpu_time=*/true);
    if (r.dot_gflops > 0.0) r.fma_gflops = fma_peak_gflops(512, 0.03, /*cpu_time=*/true);
    return r;
  }();
  return rate;
}

bool bf16_products_outpace_fp32(bool available, bool amx, const Bf16DotRate& rate) {
  if (!available) return false;
  return amx || rate.ratio() >= kBf16DotLead;
}

bool bf16_gemm_outpaces_fp32() {
  if (!bf16_gemm_available()) return false;
  if (bf16_gemm_has_amx()) return true;  // no probe needed: the tiles
  return bf16_products_outpace_fp32(true, false, bf16_dot_rate());
}

void require_bf16_gemm() {
  if (!bf16_gemm_available())
    throw Error("bf16 GEMM on the CPU needs AVX512-BF16 or AMX; " + onednn_version() +
                " finds at most " + onednn_isa_name() + " on this core");
}

std::string bf16_gemm_description() {
  if (!bf16_gemm_available())
    return "bf16 unavailable (" + onednn_version() + " finds at most " + onednn_isa_name() +
           ": no AVX512-BF16 or AMX)";
  const int64_t n = 256;
  const Key key = make_key(false, true, n, n, n, 1.0f, n, n, 0.0f, n);
  const std::string impl = thread_cache().describe(key).impl_info_str();
  return "bf16 " + onednn_version() + " matmul " + impl +
         (bf16_gemm_has_amx() ? " (AMX)" : " (AVX512-BF16, no AMX)");
}

namespace {
using detail::bf16_bits;
using detail::rounded_to_bf16;

void round_values(float* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    dst[i] = rounded_to_bf16(src[i]);
}
}  // namespace

void round_to_bf16_values(float* dst, const float* src, int64_t n) {
  // The test is outside the pragma: an `if(false)` parallel region still starts (and frees) a
  // team of one in libgomp, which the attention's per-row calls would pay each time.
  if (omp_in_parallel() || n < kMinParallelElements) return round_values(dst, src, n);
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b)
    round_values(dst + b * kBlock, src + b * kBlock, std::min(kBlock, n - b * kBlock));
}

void round_to_bf16_values(float* x, int64_t n) { round_to_bf16_values(x, x, n); }

void bf16_bits_to_values(const uint16_t* bits, int64_t n, float* out) {
#pragma omp parallel for simd schedule(static) \
    if (parallel : !omp_in_parallel() && n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(bits[i]);
}

void round_to_bf16(const float* in, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && \
                                                  rows * cols >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = in + r * ld;
    uint16_t* dst = out + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      dst[c] = bf16_bits(src[c]);
    }
  }
}

void gemm_bf16_rounded(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                       float beta, float* C, int64_t ldc, const float* bias) {
  require_bf16_gemm();
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = alpha bias + beta C (oneDNN has no zero-sized reduction)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const float c = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        C[i * ldc + j] = bias ? alpha * bias[j] + c : c;
      }
    return;
  }
  if (K > kMaxProductK && !trans_a && !trans_b) {
    // Pieces of K, each added to C (beta 1 after the first): the sum of the pieces' products,
    // in a fixed order (results depend on the shape only).
    const int64_t pieces = (K + kMaxProductK - 1) / kMaxProductK;
    const int64_t step = ((K + pieces - 1) / pieces + 31) / 32 * 32;
    for (int64_t k0 = 0; k0 < K; k0 += step) {
      const int64_t k = std::min(step, K - k0);
      gemm_bf16_rounded(false, false, M, N, k, alpha, A + k0, lda, B + k0 * ldb, ldb,
                        k0 == 0 ? beta : 1.0f, C, ldc, k0 == 0 ? bias : nullptr);
    }
    return;
  }
  PrimitiveCache& cache = thread_cache();
  const PrimitiveCache::Entry& e =
      cache.get(make_key(trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc, bias != nullptr));
  // The entry's memory objects pointed at the callers' arrays (no copy); oneDNN does not write
  // A, B or bias.
  e.a.set_data_handle(const_cast<uint16_t*>(A));
  e.b.set_data_handle(const_cast<uint16_t*>(B));
  e.c.set_data_handle(C);
  if (bias) e.bias.set_data_handle(const_cast<float*>(bias));
  const dnnl_status_t status = dnnl_primitive_execute(
      e.primitive.get(), cache.stream().get(), static_cast<int>(e.args.size()), e.args.data());
  if (status != dnnl_success)
    throw Error("oneDNN's bf16 matmul failed on " + shape_text(trans_a, trans_b, M, N, K) +
                " (dnnl status " + std::to_string(static_cast<int>(status)) + ")");
  cache.stream().wait();
}

void round_to_bf16(const float* in, int64_t n, uint16_t* out) {
  constexpr int64_t kBlock = 4096;  // rows of one block: the 2-D form threads over rows
  const int64_t rows = n / kBlock, tail = n - rows * kBlock;
  round_to_bf16(in, rows, kBlock, kBlock, out);
  if (tail > 0) round_to_bf16(in + rows * kBlock, 1, tail, tail, out + rows * kBlock);
}

void gemm_bf16_b_rounded(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         float alpha, const float* A, int64_t lda, const uint16_t* B,
                         int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  require_bf16_gemm();
  // A's stored shape (row-major, rows x cols): op(A) is M x K, so A is K x M when transposed.
  // Its copy is dense: its leading dimension is its row length.
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  uint16_t* a = thread_scratch<RoundedA, uint16_t>(static_cast<size_t>(a_rows * a_cols));
  round_to_bf16(A, a_rows, a_cols, lda, a);
  gemm_bf16_rounded(trans_a, trans_b, M, N, K, alpha, a, a_cols, B, ldb, beta, C, ldc, bias);
}

void linear_backward_bf16(float* dx, float* dw, const float* dy, const uint16_t* dy_bits,
                          const float* x, const float* w, const uint16_t* w_bits, int64_t N,
                          int64_t C, int64_t OC) {
  require_bf16_gemm();
  if (!dx && !dw) return;
  const uint16_t* dy16 = dy_bits;
  if (!dy16) {
    uint16_t* rounded = thread_scratch<RoundedA, uint16_t>(static_cast<size_t>(N * OC));
    round_to_bf16(dy, N * OC, rounded);
    dy16 = rounded;
  }
  if (dw) {
    uint16_t* x16 = thread_scratch<RoundedB, uint16_t>(static_cast<size_t>(N * C));
    round_to_bf16(x, N * C, x16);
    gemm_bf16_rounded(true, false, OC, C, N, 1.0f, dy16, OC, x16, C, 1.0f, dw, C);
  }
  if (dx) {
    if (!w_bits) {
      uint16_t* w16 = thread_scratch<RoundedB, uint16_t>(static_cast<size_t>(OC * C));
      round_to_bf16(w, OC * C, w16);
      w_bits = w16;
    }
    gemm_bf16_rounded(false, false, N, C, OC, 1.0f, dy16, OC, w_bits, C, 0.0f, dx, C);
  }
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc, const float* bias) {
  require_bf16_gemm();
  // B's stored shape (row-major, rows x cols): op(B) is K x N, so B is N x K when transposed.
  // Its copy is dense: its leading dimension is its row length.
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  uint16_t* b = thread_scratch<RoundedB, uint16_t>(static_cast<size_t>(b_rows * b_cols));
  round_to_bf16(B, b_rows, b_cols, ldb, b);
  gemm_bf16_b_rounded(trans_a, trans_b, M, N, K, alpha, A, lda, b, b_cols, beta, C, ldc, bias);
}

}  // namespace trident::cpu

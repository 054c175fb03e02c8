// GEMM through cuBLASLt (fused bias epilogue), with a cublasGemmEx fallback, and the linear
// layer built on it.
//
// Row-major to column-major: a row-major matrix X[r,c] with leading dimension ld is the
// column-major matrix X^T with the same ld, so the row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T: cuBLAS gets (B, A) in that order with m = N, n = M. The
// row-major bias[N] (one value per output column) is then the column-major per-row bias, which
// is what CUBLASLT_EPILOGUE_BIAS adds.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_<unknown>";
  }
}

[[noreturn]] void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  throw Error(std::string("cuBLAS error at ") + file + ":" + std::to_string(line) + ": " + expr +
              ": " + cublas_status_name(s) + " (" + std::to_string(static_cast<int>(s)) + ")");
}

#define CUBLAS_CHECK(call)                                                    \
  do {                                                                        \
    const cublasStatus_t trident_cublas_st_ = (call);                         \
    if (trident_cublas_st_ != CUBLAS_STATUS_SUCCESS)                          \
      throw_cublas(trident_cublas_st_, #call, __FILE__, __LINE__);            \
  } while (0)

cudaDataType_t cuda_type(DType t) { return t == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }
size_t type_size(DType t) { return t == DType::F32 ? 4 : 2; }

// Largest power of two (<= 256) dividing the address and the row pitch: what cuBLASLt may
// assume about the alignment of every column (of the column-major view).
uint32_t alignment_of(const void* p, int64_t ld, size_t elsize) {
  const uint64_t v = reinterpret_cast<uint64_t>(p) | static_cast<uint64_t>(ld * elsize) | 256u;
  return static_cast<uint32_t>(v & (~v + 1));
}

// C[M,N] = beta * C + bias[N] (row-major): the K = 0 case and the bias of the fallback path.
template <typename TC>
__global__ void scale_add_bias_kernel(TC* C, int64_t ldc, const TC* bias, float beta, int64_t M,
                                      int64_t N, bool scale) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, c = i % N;
    float v = detail::to_f32(C[r * ldc + c]);
    if (scale) v = beta == 0.f ? 0.f : beta * v;
    if (bias != nullptr) v += detail::to_f32(bias[c]);
    C[r * ldc + c] = detail::from_f32<TC>(v);
  }
}

void launch_scale_add_bias(DType c, void* C, int64_t ldc, const void* bias, float beta, int64_t M,
                           int64_t N, bool scale, cudaStream_t stream) {
  const unsigned grid = detail::grid_for(M * N, 256);
  if (c == DType::F32) {
    scale_add_bias_kernel<float><<<grid, 256, 0, stream>>>(
        static_cast<float*>(C), ldc, static_cast<const float*>(bias), beta, M, N, scale);
  } else {
    scale_add_bias_kernel<bf16><<<grid, 256, 0, stream>>>(
        static_cast<bf16*>(C), ldc, static_cast<const bf16*>(bias), beta, M, N, scale);
  }
  CUDA_CHECK_LAUNCH();
}

struct LtAlgo {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // the heuristic query's, where it failed
};

// RAII for the per-call cuBLASLt descriptors.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~LtDescs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

struct CublasContext::Impl {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool allow_tf32 = false;
  std::mutex mutex;
  std::map<std::array<int64_t, 18>, LtAlgo> cache;  // heuristic results per problem
};

namespace {

// The heuristic's best algorithm for the descriptors d, cached per problem `key` (the heuristic
// is not free): found or not, the answer is kept.
LtAlgo cached_algo(CublasContext::Impl& im, const std::array<int64_t, 18>& key, const LtDescs& d,
                   uint32_t align_first, uint32_t align_second, uint32_t align_c) {
  std::lock_guard<std::mutex> lock(im.mutex);
  auto it = im.cache.find(key);
  if (it != im.cache.end()) return it->second;
  LtAlgo algo;
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = im.workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                       &align_first, sizeof(align_first));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                       &align_second, sizeof(align_second));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(im.lt, d.op, d.a, d.b, d.c, d.c, pref,
                                                           1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    algo.found = true;
    algo.algo = result.algo;
  } else {
    algo.status = st != CUBLAS_STATUS_SUCCESS ? st
                  : returned > 0              ? result.state
                                              : CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // Kept found or not, unless the query itself failed (a bad descriptor is not an answer about
  // the problem, and asking again costs nothing the failure did not).
  if (st == CUBLAS_STATUS_SUCCESS) im.cache.emplace(key, algo);
  return algo;
}

// What a matmul's epilogue does to alpha op(A) op(B) + beta C (row-major C[M,N]) before it is
// stored, in fp32.
struct Epilogue {
  const void* bias = nullptr;  // bias[N] added to every row
  Gelu gelu = Gelu::None;
  // Gelu::Forward: the GELU's input (after the bias) written here; Gelu::Backward: read from
  // here. Row-major [M, N] with C's leading dimension (cuBLASLt: a multiple of 8).
  const void* aux = nullptr;
  // CUBLASLT_EPILOGUE_BGRADB: bias_grad[M] = the sums of op(A)'s rows over the contraction
  // (cuBLASLt's B is this A: row-major C = op(A) op(B) is its column-major C^T = op(B)^T
  // op(A)^T), written (not accumulated), C's type. Not with a bias or a GELU.
  void* bias_grad = nullptr;
};

// d.op: a matmul of `compute` with fp32 scalars, the column-major operands' transposes, and the
// epilogue e: the bias (CUBLASLT_EPILOGUE_BIAS), or the GELU with the bias or without it and
// its input kept (GELU_AUX_BIAS, GELU_AUX), or the GELU's derivative at the kept input
// multiplied in (DGELU). ldc: C's leading dimension, the GELU input's too.
void create_op(LtDescs& d, cublasComputeType_t compute, cublasOperation_t op_first,
               cublasOperation_t op_second, const Epilogue& e, int64_t ldc = 0) {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                              sizeof(op_first)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                              sizeof(op_second)));
  cublasLtEpilogue_t epi = e.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (e.gelu == Gelu::Forward)
    epi = e.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (e.gelu == Gelu::Backward) epi = CUBLASLT_EPILOGUE_DGELU;
  if (e.bias_grad != nullptr) epi = CUBLASLT_EPILOGUE_BGRADB;
  if (epi == CUBLASLT_EPILOGUE_DEFAULT) return;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  const void* vector = e.bias_grad != nullptr ? e.bias_grad : e.bias;
  if (vector != nullptr)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector,
                                                sizeof(vector)));
  if (e.gelu == Gelu::None) return;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &e.aux, sizeof(e.aux)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldc,
                                              sizeof(ldc)));
}

}  // namespace


CublasContext::CublasContext(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.workspace_bytes = workspace_bytes;
  try {
    CUBLAS_CHECK(cublasCreate(&im.blas));
    CUBLAS_CHECK(cublasLtCreate(&im.lt));
    if (workspace_bytes > 0) {
      CUDA_CHECK(cudaMalloc(&im.workspace, workspace_bytes));
      CUBLAS_CHECK(cublasSetWorkspace(im.blas, im.workspace, workspace_bytes));
    }
    // Pointer-mode host (alpha/beta from host memory) is the default; no atomics in cuBLAS.
    CUBLAS_CHECK(cublasSetAtomicsMode(im.blas, CUBLAS_ATOMICS_NOT_ALLOWED));
  } catch (...) {
    if (im.workspace) cudaFree(im.workspace);
    if (im.lt) cublasLtDestroy(im.lt);
    if (im.blas) cublasDestroy(im.blas);
    throw;
  }
}

CublasContext::~CublasContext() {
  if (!impl_) return;
  // No throwing from a destructor: errors here are ignored.
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->lt) cublasLtDestroy(impl_->lt);
  if (impl_->blas) cublasDestroy(impl_->blas);
}

void CublasContext::set_allow_tf32(bool allow) { impl_->allow_tf32 = allow; }
bool CublasContext::allow_tf32() const { return impl_->allow_tf32; }

namespace {

// C = alpha op(A) op(B) + beta C through cuBLASLt with the epilogue e (row-major, the sizes
// checked by the caller, K > 0); false where cuBLASLt has no algorithm for it.
bool lt_gemm(CublasContext& ctx, DType ab, DType c, bool trans_a, bool trans_b, int64_t M,
             int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
             int64_t ldb, float beta, void* C, int64_t ldc, const Epilogue& e,
             cudaStream_t stream) {
  CublasContext::Impl& im = ctx.impl();
  const bool tf32 = ab == DType::F32 && im.allow_tf32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t tab = cuda_type(ab), tc = cuda_type(c);
  // Column-major operands: first = B (row-major), second = A (row-major).
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t first_rows = trans_b ? K : N, first_cols = trans_b ? N : K;
  const uint64_t second_rows = trans_a ? M : K, second_cols = trans_a ? K : M;
  const uint32_t align_first = alignment_of(B, ldb, type_size(ab));
  const uint32_t align_second = alignment_of(A, lda, type_size(ab));
  const uint32_t align_c = alignment_of(C, ldc, type_size(c));
  const void* vector = e.bias_grad != nullptr ? e.bias_grad : e.bias;
  // (with_bias: 1 a bias, 2 a bias gradient.)
  const int64_t with_bias = e.bias_grad != nullptr ? 2 : e.bias != nullptr ? 1 : 0;
  const int64_t align_vector = vector ? alignment_of(vector, 0, type_size(c)) : 0;
  const int64_t align_aux = e.aux != nullptr ? alignment_of(e.aux, ldc, type_size(c)) : 0;
  const std::array<int64_t, 18> key = {
      int64_t(ab), int64_t(c),   trans_a,      trans_b, M,    N,
      K,           lda,          ldb,          ldc,     with_bias, align_first,
      align_second, align_c,     tf32,         align_vector, int64_t(e.gelu), align_aux};

  LtDescs d;
  create_op(d, compute, op_first, op_second, e, ldc);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, tab, first_rows, first_cols, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, tab, second_rows, second_cols, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, tc, static_cast<uint64_t>(N),
                                          static_cast<uint64_t>(M), ldc));
  const LtAlgo algo = cached_algo(im, key, d, align_first, align_second, align_c);
  if (!algo.found) return false;
  const cublasStatus_t st = cublasLtMatmul(im.lt, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c,
                                           C, d.c, &algo.algo, im.workspace, im.workspace_bytes,
                                           stream);
  // An epilogue the heuristic offered but the matmul refuses (checked before it launches:
  // nothing written) takes the caller's separate kernels, from now on for this key.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && (e.gelu != Gelu::None || e.bias_grad != nullptr)) {
    std::lock_guard<std::mutex> lock(im.mutex);
    im.cache[key].found = false;
    return false;
  }
  CUBLAS_CHECK(st);
  return true;
}

void check_gemm_sizes(DType ab, DType c, bool trans_a, bool trans_b, int64_t M, int64_t N,
                      int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
  using detail::check_dims;
  check_dims(M >= 0 && N >= 0 && K >= 0, "gemm: negative size");
  check_dims(ab == c || (ab == DType::BF16 && c == DType::F32),
             "gemm: supported (A/B, C) types are (f32, f32), (bf16, bf16), (bf16, f32)");
  check_dims(ldc >= N, "gemm: ldc < N");
  check_dims(lda >= (trans_a ? M : K), "gemm: lda too small");
  check_dims(ldb >= (trans_b ? K : N), "gemm: ldb too small");
}

}  // namespace

void gemm_ex(CublasContext& ctx, DType ab, DType c, bool trans_a, bool trans_b, int64_t M,
             int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
             int64_t ldb, float beta, void* C, int64_t ldc, const void* bias,
             cudaStream_t stream) {
  using detail::check_dims;
  check_gemm_sizes(ab, c, trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  check_dims(C != nullptr, "gemm: C is null");
  if (K == 0) {  // C = beta C (+ bias)
    launch_scale_add_bias(c, C, ldc, bias, beta, M, N, true, stream);
    return;
  }
  check_dims(A != nullptr && B != nullptr, "gemm: A or B is null");
  if (lt_gemm(ctx, ab, c, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
              Epilogue{bias}, stream))
    return;
  // Fallback: cublasGemmEx (int sizes), then the bias.
  CublasContext::Impl& im = ctx.impl();
  const bool tf32 = ab == DType::F32 && im.allow_tf32;
  const cudaDataType_t tab = cuda_type(ab), tc = cuda_type(c);
  check_dims(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "gemm: sizes exceed int range of the cublasGemmEx fallback");
  CUBLAS_CHECK(cublasSetStream(im.blas, stream));
  CUBLAS_CHECK(cublasSetMathMode(im.blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  CUBLAS_CHECK(cublasGemmEx(im.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                            trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                            static_cast<int>(M), static_cast<int>(K), &alpha, B, tab,
                            static_cast<int>(ldb), A, tab, static_cast<int>(lda), &beta, C, tc,
                            static_cast<int>(ldc),
                            tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  if (bias != nullptr) launch_scale_add_bias(c, C, ldc, bias, 1.f, M, N, false, stream);
}

bool gemm_gelu(CublasContext& ctx, DType t, bool trans_a, bool trans_b, int64_t M, int64_t N,
               int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb, void* C,
               int64_t ldc, const void* bias, Gelu gelu, const void* aux, cudaStream_t stream) {
  using detail::check_dims;
  check_gemm_sizes(t, t, trans_a, trans_b, M, N, K, lda, ldb, ldc);
  check_dims(gelu != Gelu::None && aux != nullptr, "gemm_gelu: no GELU or no GELU input");
  check_dims(gelu == Gelu::Forward || bias == nullptr, "gemm_gelu: a bias in the GELU's backward");
  // cuBLASLt's GELU input has C's leading dimension, which must be a multiple of 8.
  if (M == 0 || N == 0 || K == 0 || ldc % 8 != 0) return false;
  check_dims(A != nullptr && B != nullptr && C != nullptr, "gemm_gelu: A, B or C is null");
  return lt_gemm(ctx, t, t, trans_a, trans_b, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc,
                 Epilogue{bias, gelu, aux}, stream);
}

// ---------------------------------------------------------------- FP8 GEMM
// Row-major C[M,N] = A[M,K] B[N,K]^T is the column-major C^T[N,M] = op(B) op(A) with B stored
// column-major [K,N] (op = T) and A stored [K,M] (op = N): the TN form, the one FP8 tensor cores
// take. No fast accumulation (the default): the tensor core's partial sums are promoted to fp32
// as they go, what the CPU reference's fp32 sums stand for.
void fp8_gemm(CublasContext& ctx, Fp8Format fa, Fp8Format fb, DType c, int64_t M, int64_t N,
              int64_t K, float alpha, const uint8_t* A, const uint8_t* B, float beta, void* C,
              const void* bias, cudaStream_t stream, const float* factor) {
  using detail::check_dims;
  check_dims(M >= 0 && N >= 0 && K >= 0, "fp8_gemm: negative size");
  check_dims(!(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2),
             "fp8_gemm: both operands E5M2 (cuBLASLt has no such FP8 GEMM)");
  check_dims(c == DType::BF16 || bias == nullptr, "fp8_gemm: a bias needs a bf16 output");
  if (M == 0 || N == 0) return;
  check_dims(C != nullptr, "fp8_gemm: C is null");
  if (K == 0) {
    launch_scale_add_bias(c, C, N, bias, beta, M, N, true, stream);
    return;
  }
  check_dims(A != nullptr && B != nullptr, "fp8_gemm: A or B is null");
  if (K % 16 != 0)
    throw Error("fp8_gemm: the contraction length " + std::to_string(K) +
                " is not a multiple of 16 (the FP8 tensor cores' 16-byte rows)");
  // cuBLASLt's FP8 kernels also need C's rows and every pointer 16-byte aligned (the cuBLAS
  // documentation's FP8 requirements); without them the heuristic finds nothing.
  if (N * static_cast<int64_t>(type_size(c)) % 16 != 0)
    throw Error("fp8_gemm: the output's row of " + std::to_string(N) + " " +
                (c == DType::F32 ? "f32" : "bf16") +
                " elements is not a multiple of 16 bytes (cuBLASLt's FP8 GEMMs need it)");
  auto misaligned = [](const void* p) { return alignment_of(p, 0, 1) < 16; };  // the address
  if (misaligned(A) || misaligned(B) || misaligned(C) || (bias && misaligned(bias)))
    throw Error("fp8_gemm: an operand, the output or the bias is not 16-byte aligned "
                "(cuBLASLt's FP8 GEMMs need it)");
  auto fp8_type = [](Fp8Format f) {
    return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  };
  CublasContext::Impl& im = ctx.impl();
  const uint32_t align_first = alignment_of(B, K, 1), align_second = alignment_of(A, K, 1);
  const uint32_t align_c = alignment_of(C, N, type_size(c));
  const bool with_bias = bias != nullptr;
  // (A distinct first entry keeps these apart from gemm_ex's keys in the shared cache.)
  const std::array<int64_t, 18> key = {-8,           int64_t(fa),   int64_t(fb), int64_t(c),
                                       M,            N,             K,           with_bias,
                                       align_first,  align_second,  align_c,     beta != 0.f,
                                       int64_t(with_bias ? alignment_of(bias, 0, 2) : 0),
                                       factor != nullptr, 0, 0,
                                       0,            0};
  LtDescs d;
  create_op(d, CUBLAS_COMPUTE_32F, CUBLAS_OP_T, CUBLAS_OP_N, Epilogue{bias});
  if (factor)  // D = alpha * scale_a * scale_b * (A B) + ...: the factor as cuBLASLt's A scale
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &factor, sizeof(factor)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, fp8_type(fb), static_cast<uint64_t>(K),
                                          static_cast<uint64_t>(N), K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, fp8_type(fa), static_cast<uint64_t>(K),
                                          static_cast<uint64_t>(M), K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, cuda_type(c), static_cast<uint64_t>(N),
                                          static_cast<uint64_t>(M), N));
  const LtAlgo algo = cached_algo(im, key, d, align_first, align_second, align_c);
  // No fallback: cublasGemmEx has no FP8 form. What cuBLASLt cannot run is one line.
  if (!algo.found)
    throw Error("fp8_gemm: cuBLASLt has no FP8 kernel for " + std::to_string(M) + " x " +
                std::to_string(N) + " x " + std::to_string(K) + " (" +
                (fa == Fp8Format::E4M3 ? "E4M3" : "E5M2") + " x " +
                (fb == Fp8Format::E4M3 ? "E4M3" : "E5M2") + ", " +
                (c == DType::F32 ? "f32" : "bf16") + " out) on this GPU (heuristic status " +
                std::to_string(static_cast<int>(algo.status)) +
                "; FP8 GEMMs need compute capability 8.9 or later)");
  CUBLAS_CHECK(cublasLtMatmul(im.lt, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c,
                              &algo.algo, im.workspace, im.workspace_bytes, stream));
}

// ---------------------------------------------------------------- bias gradient
namespace {
constexpr int kBiasRows = 256;  // rows per partial sum (fixed: the result depends on shapes only)

// Block (32, 8): lane = column, the 8 warps take rows y, y + 8, ... of the chunk, then the 8
// partials are summed in warp order.
template <typename T>
__global__ void bias_grad_partial_kernel(float* __restrict__ partial, const T* __restrict__ dout,
                                         int64_t N, int64_t OC) {
  __shared__ float sh[8][33];
  const int64_t col = blockIdx.x * 32LL + threadIdx.x;
  const int64_t r0 = blockIdx.y * int64_t(kBiasRows);
  const int64_t r1 = min(N, r0 + kBiasRows);
  float acc = 0.f;
  if (col < OC)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += detail::to_f32(dout[r * OC + col]);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) s += sh[w][threadIdx.x];
    partial[blockIdx.y * OC + col] = s;
  }
}

__global__ void bias_grad_final_kernel(float* __restrict__ dbias, const float* __restrict__ partial,
                                       int64_t chunks, int64_t OC) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= OC) return;
  float s = 0.f;
  for (int64_t k = 0; k < chunks; k++) s += partial[k * OC + col];
  dbias[col] += s;
}
}  // namespace

size_t bias_grad_workspace_bytes(int64_t N, int64_t OC) {
  const int64_t chunks = (N + kBiasRows - 1) / kBiasRows;
  return static_cast<size_t>(chunks * OC) * sizeof(float);
}

// dweight[OC,C] += dout[N,OC]^T inp[N,C] with dbias[OC] += the column sums of dout taken by the
// same GEMM (cuBLASLt's BGRADB epilogue over the rows it reads anyway: no pass of its own over
// dout), into scratch then added (the epilogue writes, the gradients accumulate); false, doing
// nothing, where cuBLASLt has no algorithm for it.
template <typename T>
bool linear_weight_bias_grad(CublasContext& ctx, float* dweight, float* dbias, const T* dout,
                          const T* inp, int64_t N, int64_t C, int64_t OC, cudaStream_t stream,
                          void* workspace) {
  if (N == 0 || C == 0 || OC == 0) return false;
  detail::Scratch scratch(workspace, bias_grad_workspace_bytes(N, OC), stream);
  float* sums = scratch.as<float>();
  Epilogue e;
  e.bias_grad = sums;
  if (!lt_gemm(ctx, dtype_of<T>::value, DType::F32, true, false, OC, C, N, 1.f, dout, OC, inp, C,
               1.f, dweight, C, e, stream))
    return false;
  add_inplace<float>(dbias, sums, OC, stream);
  return true;
}

template <typename T>
void bias_grad_accumulate(float* dbias, const T* dout, int64_t N, int64_t OC, cudaStream_t stream,
                          void* workspace) {
  detail::check_dims(N >= 0 && OC >= 0, "bias_grad: negative size");
  if (N == 0 || OC == 0) return;
  const int64_t chunks = (N + kBiasRows - 1) / kBiasRows;
  detail::check_dims(chunks <= 65535, "bias_grad: N too large (> 65535 * 256 rows)");
  detail::Scratch scratch(workspace, bias_grad_workspace_bytes(N, OC), stream);
  float* partial = scratch.as<float>();
  dim3 grid(static_cast<unsigned>((OC + 31) / 32), static_cast<unsigned>(chunks));
  bias_grad_partial_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(partial, dout, N, OC);
  CUDA_CHECK_LAUNCH();
  bias_grad_final_kernel<<<detail::grid_for(OC, 256), 256, 0, stream>>>(dbias, partial, chunks,
                                                                        OC);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- linear
template <typename T>
void linear_forward(CublasContext& ctx, T* out, const T* inp, const T* weight, const T* bias,
                    int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  gemm<T, T>(ctx, false, true, N, OC, C, 1.f, inp, C, weight, C, 0.f, out, OC, stream, bias);
}

template <typename T>
void linear_backward(CublasContext& ctx, T* dinp, float* dweight, float* dbias, const T* dout,
                     const T* inp, const T* weight, int64_t N, int64_t C, int64_t OC,
                     cudaStream_t stream, void* workspace) {
  // dweight[OC,C] += dout[N,OC]^T inp[N,C], dbias[OC] += sum_n dout: in one GEMM where
  // cuBLASLt can (its BGRADB epilogue), else the GEMM and the bias kernel. Any of dinp,
  // dweight, dbias may be nullptr (the split backward of the zero-bubble schedules: dinp first,
  // dweight and dbias later).
  const bool together = dweight != nullptr && dbias != nullptr &&
                        linear_weight_bias_grad(ctx, dweight, dbias, dout, inp, N, C, OC, stream,
                                             workspace);
  if (!together) {
    if (dbias != nullptr) bias_grad_accumulate<T>(dbias, dout, N, OC, stream, workspace);
    if (dweight != nullptr)
      gemm<T, float>(ctx, true, false, OC, C, N, 1.f, dout, OC, inp, C, 1.f, dweight, C, stream);
  }
  // dinp[N,C] = dout[N,OC] weight[OC,C]
  if (dinp != nullptr)
    gemm<T, T>(ctx, false, false, N, C, OC, 1.f, dout, OC, weight, C, 0.f, dinp, C, stream);
}

// act = gelu(inp weight^T + bias) with pre = inp weight^T + bias kept. bf16: one GEMM with
// cuBLASLt's GELU_AUX_BIAS epilogue (the GELU of the fp32 sum, before the output's rounding);
// where cuBLASLt has none for the shapes (OC not a multiple of 8, or no algorithm), and always
// in fp32 (the parity path, held to the CPU within 1e-5: cuBLASLt's GELU need not be the GELU
// kernel's to fp32's last bits), the GEMM with its bias, then the GELU kernel.
template <typename T>
void linear_gelu_forward(CublasContext& ctx, T* act, T* pre, const T* inp, const T* weight,
                         const T* bias, int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  if (std::is_same_v<T, bf16> &&
      gemm_gelu(ctx, dtype_of<T>::value, false, true, N, OC, C, inp, C, weight, C, act, OC, bias,
                Gelu::Forward, pre, stream))
    return;
  linear_forward(ctx, pre, inp, weight, bias, N, C, OC, stream);
  gelu_forward(act, pre, N * OC, stream);
}

// linear_backward with the input gradient through the GELU whose input was pre [N, C]: dpre =
// (dout weight) * gelu'(pre), in bf16 in the dX GEMM's DGELU epilogue (else, and in fp32, the
// GEMM, then the GELU's backward kernel in place). dW and db first: dpre may alias nothing
// they read.
template <typename T>
void linear_backward_dgelu(CublasContext& ctx, T* dpre, float* dweight, float* dbias,
                           const T* dout, const T* inp, const T* weight, const T* pre, int64_t N,
                           int64_t C, int64_t OC, cudaStream_t stream, void* workspace) {
  linear_backward(ctx, static_cast<T*>(nullptr), dweight, dbias, dout, inp, weight, N, C, OC,
                  stream, workspace);
  if (dpre == nullptr) return;
  if (std::is_same_v<T, bf16> &&
      gemm_gelu(ctx, dtype_of<T>::value, false, false, N, C, OC, dout, OC, weight, C, dpre, C,
                nullptr, Gelu::Backward, pre, stream))
    return;
  gemm<T, T>(ctx, false, false, N, C, OC, 1.f, dout, OC, weight, C, 0.f, dpre, C, stream);
  gelu_backward(dpre, pre, dpre, N * C, stream);
}

#define TRIDENT_INSTANTIATE(T)                                                                   \
  template void linear_gelu_forward<T>(CublasContext&, T*, T*, const T*, const T*, const T*,    \
                                       int64_t, int64_t, int64_t, cudaStream_t);                \
  template void linear_backward_dgelu<T>(CublasContext&, T*, float*, float*, const T*,          \
                                         const T*, const T*, const T*, int64_t, int64_t,        \
                                         int64_t, cudaStream_t, void*);                         \
  template void bias_grad_accumulate<T>(float*, const T*, int64_t, int64_t, cudaStream_t,       \
                                        void*);                                                  \
  template void linear_forward<T>(CublasContext&, T*, const T*, const T*, const T*, int64_t,    \
                                  int64_t, int64_t, cudaStream_t);                               \
  template void linear_backward<T>(CublasContext&, T*, float*, float*, const T*, const T*,      \
                                   const T*, int64_t, int64_t, int64_t, cudaStream_t, void*);  \
  template bool linear_weight_bias_grad<T>(CublasContext&, float*, float*, const T*, const T*,  \
                                           int64_t, int64_t, int64_t, cudaStream_t, void*);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

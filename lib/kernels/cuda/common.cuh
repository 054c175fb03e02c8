#pragma once
// Private helpers of the CUDA kernels (nvcc only).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "kernels/cuda/ops.hpp"
#include "util/error.hpp"

// After every kernel launch.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace trident::cuda::detail {

// Throws when a size does not fit the 32-bit index a kernel uses, or is negative.
inline void check_dims(bool ok, const char* what) {
  if (!ok) throw Error(std::string("trident::cuda: invalid arguments: ") + what);
}

inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 16) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<unsigned>(blocks);
}

// Stream-ordered scratch memory: uses the caller's workspace when given, else cudaMallocAsync
// on the stream, freed (stream-ordered) when the object dies.
class Scratch {
 public:
  Scratch(void* given, size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (given != nullptr || bytes == 0) {
      ptr_ = given;
    } else {
      CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
      owned_ = true;
    }
  }
  ~Scratch() {
    if (owned_) cudaFreeAsync(ptr_, stream_);  // (no throw from a destructor)
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename U>
  U* as(size_t byte_offset = 0) const {
    return reinterpret_cast<U*>(static_cast<char*>(ptr_) + byte_offset);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  bool owned_ = false;
};

inline size_t align_up(size_t x, size_t a = 256) { return (x + a - 1) / a * a; }

// ---------------------------------------------------------------- element conversions
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16-byte packets: 4 floats or 8 bf16.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// kStep consecutive elements of a row as floats: one 16-byte pack (kVector: the address must be
// 16-byte aligned) or a single element. Lets a kernel be written once for its vector and scalar
// paths.
template <typename T, bool kVector>
struct Cols {
  static constexpr int kStep = kVector ? Pack<T>::kSize : 1;
  float v[kStep];
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kVector) {
      const Pack<T> q = *reinterpret_cast<const Pack<T>*>(p);
#pragma unroll
      for (int k = 0; k < kStep; k++) v[k] = to_f32(q.v[k]);
    } else {
      v[0] = to_f32(*p);
    }
  }
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (kVector) {
      Pack<T> q;
#pragma unroll
      for (int k = 0; k < kStep; k++) q.v[k] = from_f32<T>(v[k]);
      *reinterpret_cast<Pack<T>*>(p) = q;
    } else {
      *p = from_f32<T>(v[0]);
    }
  }
};
// A norm backward's columns [c, c + kStep) of one row: its input x, its output gradient g and
// the norm's weight w (layernorm.cu, llama.cu's RMSNorm).
template <typename V, typename T>
__device__ __forceinline__ void load_norm_cols(V& x, V& g, V& w, const T* x_row, const T* g_row,
                                               const T* weight, int64_t c) {
  x.load(x_row + c);
  g.load(g_row + c);
  w.load(weight + c);
}
// Whether rows of C elements of T at every one of the pointers are all 16-byte aligned.
template <typename T, typename... Ptrs>
bool rows_aligned16(int64_t C, const Ptrs*... ptrs) {
  return C % Pack<T>::kSize == 0 && (aligned16(ptrs) && ...);
}

// residual[0, C) += x[0, C), rounded to T as add_inplace does, lane `lane` of a warp taking
// columns lane, lane + 32, ...: the first pass of the fused add + norm kernels (layernorm.cu,
// llama.cu), whose norm then reads back the columns each lane wrote.
template <typename T>
__device__ __forceinline__ void add_row(T* residual, const T* x, int64_t C, int lane) {
  for (int64_t c = lane; c < C; c += 32)
    residual[c] = from_f32<T>(to_f32(residual[c]) + to_f32(x[c]));
}

// Two floats rounded to bf16 in one 32-bit register, lo in the low half: a bf16 pair of an
// mma / wgmma A fragment, or two adjacent columns stored at once.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---------------------------------------------------------------- reductions
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Over the 4 lanes of a quad (lane / 4 the same): the row statistics of an mma / wgmma
// accumulator fragment, whose 4 threads of a quad hold one row's columns.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `shared` holds >= 33 elements. The tree is fixed: deterministic.
template <typename U, typename Op>
__device__ __forceinline__ U block_reduce(U v, U* shared, Op op, U identity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // shared may be reused by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    U w = lane < warps ? shared[lane] : identity;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (lane == 0) shared[32] = w;
  }
  __syncthreads();
  return shared[32];
}

// Column sums of per-chunk partials, partial[chunks, W] (row k = chunk k), for the norm
// backwards' parameter gradients: block (32 columns, kColumnSumRows), grid ceil(W / 32). Thread
// (x, y) adds chunks y, y + kColumnSumRows, ... of its column in order; row y = 0 then adds the
// kColumnSumRows sums in order and hands column j's total to add(j, total). Fixed tree:
// deterministic. Wide enough for hundreds of chunks (one thread per column summed them in
// series before: 16k rows in 64 chunks of 256 rows ran a 124M model's layernorm backward at
// 0.5 ms a call on an H200, 24 % of the step).
constexpr int kColumnSumRows = 32;
template <typename Add>
__global__ void column_sums_kernel(const float* __restrict__ partial, int64_t chunks, int64_t W,
                                   Add add) {
  __shared__ float sums[kColumnSumRows][33];
  const int64_t j = blockIdx.x * int64_t(32) + threadIdx.x;
  float s = 0.f;
  if (j < W)
    for (int64_t k = threadIdx.y; k < chunks; k += kColumnSumRows) s += partial[k * W + j];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < W) {
    float total = 0.f;
    for (int r = 0; r < kColumnSumRows; r++) total += sums[r][threadIdx.x];
    add(j, total);
  }
}
template <typename Add>
void launch_column_sums(const float* partial, int64_t chunks, int64_t W, Add add,
                        cudaStream_t stream) {
  const dim3 block(32, kColumnSumRows);
  column_sums_kernel<<<grid_for(W, 32, INT32_MAX), block, 0, stream>>>(partial, chunks, W, add);
  CUDA_CHECK_LAUNCH();
}

struct SumOp {
  template <typename U>
  __device__ __forceinline__ U operator()(U a, U b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// RoPE on pair i of one row's first `heads` heads (q then k, contiguous from `row`): the angle
// position * theta^(-2i/HS) and its cos/sin in double (large position * freq keep their
// phase), the rotation in fp32. sign -1: the backward (transposed) rotation. Shared by the
// training kernel (llama.cu, position t of the sequence) and decoding's (decode.cu, position
// read per row).
template <typename T>
__device__ __forceinline__ void rope_rotate_pair(T* row, int heads, int HS, int i,
                                                 double position, double theta, float sign) {
  const int half = HS / 2;
  const double inv_freq = pow(theta, -2.0 * i / static_cast<double>(HS));
  double sd, cd;
  sincos(position * inv_freq, &sd, &cd);
  const float c = static_cast<float>(cd), s = sign * static_cast<float>(sd);
  T* pair = row + i;
  for (int h = 0; h < heads; h++) {
    T* p = pair + int64_t(h) * HS;
    const float x0 = to_f32(p[0]), x1 = to_f32(p[half]);
    p[0] = from_f32<T>(x0 * c - x1 * s);
    p[half] = from_f32<T>(x1 * c + x0 * s);
  }
}

}  // namespace trident::cuda::detail

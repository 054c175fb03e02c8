// LayerNorm over the last dimension, eps = 1e-5, fp32 statistics.
//
// Forward: one warp per row, two-pass statistics (mean, then the centred second moment: no
// cancellation), like the CPU kernel.
// Backward: one block per chunk of kRowsPerChunk rows. Its warps compute dinp row by row
// (dx = rstd (w g - mean_c(w g) - xhat mean_c(w g xhat))); its threads, split over the columns,
// sum dout * xhat and dout over the chunk's rows in row order into per-chunk partials; a second
// kernel (common.cuh's column sums) adds the partials to dweight/dbias in a fixed tree. Fixed
// chunking, fixed order: deterministic, no atomics. The chunks are short so that a batch's rows
// make several blocks per SM (16k rows: 512 blocks on an H200's 132 SMs).
// Fused with the residual stream (the transformer's add + norm, model/transformer.hpp):
// add_layernorm_forward adds x to the stream row first (rounded to T and stored, as add_inplace
// would, so the norm reads what the unfused pair reads: bitwise the same), and
// layernorm_backward_add adds dx to the stream gradient in fp32 before its one rounding.
#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerChunk = 32;
constexpr int kThreads = 256;  // 8 warps

// One row x[C] by one warp: out, mean and rstd of the row.
template <typename T>
__device__ __forceinline__ void layernorm_row(T* __restrict__ out, float* __restrict__ mean,
                                              float* __restrict__ rstd, const T* x,
                                              const T* __restrict__ weight,
                                              const T* __restrict__ bias, int64_t row, int64_t C,
                                              int lane) {
  float sum = 0.f;
  for (int64_t c = lane; c < C; c += 32) sum += detail::to_f32(x[c]);
  const float m = detail::warp_sum(sum) / static_cast<float>(C);
  float var = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = detail::to_f32(x[c]) - m;
    var += d * d;
  }
  const float s = rsqrtf(detail::warp_sum(var) / static_cast<float>(C) + kEps);
  T* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32)
    o[c] = detail::from_f32<T>((detail::to_f32(x[c]) - m) * s * detail::to_f32(weight[c]) +
                               detail::to_f32(bias[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename T>
__global__ void layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const T* __restrict__ inp,
                                         const T* __restrict__ weight, const T* __restrict__ bias,
                                         int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  layernorm_row(out, mean, rstd, inp + row * C, weight, bias, row, C, lane);
}

// residual += x (each lane its own columns, read back by the same lane), then the row's norm.
template <typename T>
__global__ void add_layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean,
                                             float* __restrict__ rstd, T* residual,
                                             const T* __restrict__ x, const T* __restrict__ weight,
                                             const T* __restrict__ bias, int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  T* r = residual + row * C;
  detail::add_row(r, x + row * C, C, lane);
  layernorm_row(out, mean, rstd, static_cast<const T*>(r), weight, bias, row, C, lane);
}

// kVector: rows, dout, dinp and weight read and written in 16-byte packs (C a whole number of
// packs, every pointer 16-byte aligned: the launcher checks); otherwise one element at a time.
// kAccumulate: dinp += dx (dinp then must not alias dout), else dinp = dx.
template <typename T, bool kVector, bool kAccumulate>
__global__ void layernorm_backward_kernel(T* dinp, float* __restrict__ partial, const T* dout,
                                          const T* __restrict__ inp, const T* __restrict__ weight,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int64_t N, int64_t C) {
  using V = detail::Cols<T, kVector>;
  constexpr int kStep = V::kStep;
  const int64_t r0 = blockIdx.x * int64_t(kRowsPerChunk);
  const int64_t r1 = min(N, r0 + kRowsPerChunk);
  // Column partials first (they read dout; dinp is written after the barrier, so dinp may
  // alias dout). Thread t owns columns [c, c + kStep) for c = t kStep, (t + blockDim) kStep, ...
  float* pw = partial + blockIdx.x * 2 * C;
  float* pb = pw + C;
  for (int64_t c = threadIdx.x * int64_t(kStep); c < C; c += int64_t(blockDim.x) * kStep) {
    float sw[kStep] = {}, sb[kStep] = {};
    for (int64_t n = r0; n < r1; n++) {
      const float m = mean[n], s = rstd[n];
      V g, x;
      g.load(dout + n * C + c);
      x.load(inp + n * C + c);
#pragma unroll
      for (int k = 0; k < kStep; k++) {
        sw[k] += g.v[k] * ((x.v[k] - m) * s);
        sb[k] += g.v[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kStep; k++) {
      pw[c + k] = sw[k];
      pb[c + k] = sb[k];
    }
  }
  __syncthreads();
  // dinp, one warp per row: the row's two means, then dx. Lane l owns columns [c, c + kStep)
  // for c = l kStep, (l + 32) kStep, ...
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t n = r0 + warp; n < r1; n += warps) {
    const T* xr = inp + n * C;
    const T* gr = dout + n * C;
    const float m = mean[n], s = rstd[n];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int64_t c = lane * int64_t(kStep); c < C; c += 32 * kStep) {
      V x, g, w;
      detail::load_norm_cols(x, g, w, xr, gr, weight, c);
#pragma unroll
      for (int k = 0; k < kStep; k++) {
        const float gw = w.v[k] * g.v[k];
        sum_g += gw;
        sum_gx += gw * ((x.v[k] - m) * s);
      }
    }
    const float mean_g = detail::warp_sum(sum_g) / static_cast<float>(C);
    const float mean_gx = detail::warp_sum(sum_gx) / static_cast<float>(C);
    T* dx = dinp + n * C;
    for (int64_t c = lane * int64_t(kStep); c < C; c += 32 * kStep) {
      V x, g, w, out;
      detail::load_norm_cols(x, g, w, xr, gr, weight, c);
      if constexpr (kAccumulate) out.load(dx + c);
#pragma unroll
      for (int k = 0; k < kStep; k++) {
        const float d = s * (w.v[k] * g.v[k] - mean_g - ((x.v[k] - m) * s) * mean_gx);
        out.v[k] = kAccumulate ? out.v[k] + d : d;
      }
      out.store(dx + c);
    }
  }
}

// dweight[c] += column c's total, dbias[c] += column C + c's (partial rows are [dw | db]).
struct AddParamGrads {
  float* dweight;
  float* dbias;
  int64_t C;
  __device__ void operator()(int64_t j, float total) const {
    if (j < C) {
      dweight[j] += total;
    } else {
      dbias[j - C] += total;
    }
  }
};

}  // namespace

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int64_t N, int64_t C, cudaStream_t stream) {
  detail::check_dims(N >= 0 && C > 0, "layernorm_forward: N < 0 or C <= 0");
  if (N == 0) return;
  const int rows_per_block = kThreads / 32;
  layernorm_forward_kernel<T><<<detail::grid_for(N, rows_per_block, INT32_MAX), kThreads, 0,
                                stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_workspace_bytes(int64_t N, int64_t C) {
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  return static_cast<size_t>(chunks * 2 * C) * sizeof(float);
}

template <typename T>
void add_layernorm_forward(T* out, float* mean, float* rstd, T* residual, const T* x,
                           const T* weight, const T* bias, int64_t N, int64_t C,
                           cudaStream_t stream) {
  detail::check_dims(N >= 0 && C > 0, "add_layernorm_forward: N < 0 or C <= 0");
  if (N == 0) return;
  const int rows_per_block = kThreads / 32;
  add_layernorm_forward_kernel<T><<<detail::grid_for(N, rows_per_block, INT32_MAX), kThreads, 0,
                                    stream>>>(out, mean, rstd, residual, x, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, cudaStream_t stream, void* workspace, bool accumulate) {
  detail::check_dims(N >= 0 && C > 0, "layernorm_backward: N < 0 or C <= 0");
  detail::check_dims(!accumulate || dinp != dout,
                     "layernorm_backward: accumulating into dinp needs dinp != dout");
  if (N == 0) return;
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  detail::check_dims(chunks <= INT32_MAX, "layernorm_backward: N too large");
  detail::Scratch scratch(workspace, layernorm_backward_workspace_bytes(N, C), stream);
  float* partial = scratch.as<float>();
  const bool vector = detail::rows_aligned16<T>(C, dinp, dout, inp, weight);
  const auto kernel = vector ? (accumulate ? layernorm_backward_kernel<T, true, true>
                                           : layernorm_backward_kernel<T, true, false>)
                             : (accumulate ? layernorm_backward_kernel<T, false, true>
                                           : layernorm_backward_kernel<T, false, false>);
  kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(dinp, partial, dout, inp, weight,
                                                                 mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  detail::launch_column_sums(partial, chunks, 2 * C, AddParamGrads{dweight, dbias, C}, stream);
}

#define TRIDENT_INSTANTIATE(T)                                                                 \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, \
                                     int64_t, cudaStream_t);                                   \
  template void add_layernorm_forward<T>(T*, float*, float*, T*, const T*, const T*, const T*,  \
                                         int64_t, int64_t, cudaStream_t);                      \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*,       \
                                      const float*, const float*, int64_t, int64_t,            \
                                      cudaStream_t, void*, bool);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

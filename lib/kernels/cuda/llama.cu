// Llama ops: rotary position embeddings (RoPE), RMSNorm, SwiGLU. The CPU twins are in
// kernels/cpu (same layouts and formulas); storage T is float or bf16, arithmetic fp32.
//
// RoPE: one thread per (row, pair i) computes the angle t * theta^(-2i/HS) and its cos/sin in
// double once (double pow/sincos are the expensive part; the contract asks for double so that
// large t * freq keep their phase) and then rotates pair i of all NH + KVH q and k heads of
// the row in fp32. v is never touched.
// RMSNorm forward: one warp per row, fp32 sum of squares. Backward: the layernorm.cu scheme, one
// block per chunk of kRowsPerChunk rows: dinp row by row, and per-chunk dweight partials summed
// over the chunk's rows in row order; common.cuh's column sums add the partials in a fixed tree.
// Fixed chunking and order: deterministic, no atomics.
// SwiGLU: elementwise over [N, Fh], 16-byte vectors when the rows allow it.
#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr int kThreads = 256;         // 8 warps
constexpr int kRowsPerChunk = 32;     // rmsnorm backward: rows per dweight partial (layernorm.cu)

// ---------------------------------------------------------------- RoPE
// qkv[N, C3] (C3 = (NH + 2*KVH)*HS), in place on the first `heads` = NH + KVH heads of each row
// (the q heads, then the k heads: contiguous). Forward: (x0, x1) -> (x0 c - x1 s, x1 c + x0 s).
// Backward is the transposed rotation, i.e. the same with s -> -s.
template <typename T, bool kBackward>
__global__ void rope_kernel(T* __restrict__ qkv, int64_t N, int64_t T_, int heads, int64_t C3,
                            int HS, double theta) {
  const int half = HS / 2;
  const int64_t total = N * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = idx / half;
    const int i = static_cast<int>(idx % half);
    detail::rope_rotate_pair(qkv + n * C3, heads, HS, i, static_cast<double>(n % T_), theta,
                             kBackward ? -1.0f : 1.0f);
  }
}

template <typename T, bool kBackward>
void launch_rope(T* qkv, int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS, double theta,
                 cudaStream_t stream) {
  detail::check_dims(B >= 0 && T_ > 0 && NH > 0 && KVH > 0 && NH % KVH == 0,
                     "rope: B >= 0, T > 0, NH > 0, KVH > 0 dividing NH required");
  detail::check_dims(HS > 0 && HS % 2 == 0 && HS <= INT32_MAX / 2, "rope: HS must be even");
  detail::check_dims(NH + KVH <= INT32_MAX, "rope: too many heads");
  const int64_t N = B * T_;
  if (N == 0) return;
  const int64_t C3 = (NH + 2 * KVH) * HS;
  rope_kernel<T, kBackward><<<detail::grid_for(N * (HS / 2), kThreads), kThreads, 0, stream>>>(
      qkv, N, T_, static_cast<int>(NH + KVH), C3, static_cast<int>(HS), theta);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- RMSNorm
// out[N,C] = inp * rstd * weight, rstd[n] = 1/sqrt(mean(inp^2) + eps). One warp per row.
template <typename T>
__device__ __forceinline__ void rmsnorm_row(T* __restrict__ out, float* __restrict__ rstd,
                                            const T* x, const T* __restrict__ weight, int64_t row,
                                            int64_t C, float eps, int lane) {
  float ss = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = detail::to_f32(x[c]);
    ss += v * v;
  }
  // 1/sqrtf (correctly rounded) rather than rsqrtf (2 ulp): rstd is saved and compared with the
  // CPU twin's; the cost is once per row.
  const float r = 1.f / sqrtf(detail::warp_sum(ss) / static_cast<float>(C) + eps);
  T* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32)
    o[c] = detail::from_f32<T>(detail::to_f32(x[c]) * r * detail::to_f32(weight[c]));
  if (lane == 0) rstd[row] = r;
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd,
                                       const T* __restrict__ inp, const T* __restrict__ weight,
                                       int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  rmsnorm_row(out, rstd, inp + row * C, weight, row, C, eps, lane);
}

// residual += x (rounded to T, each lane its own columns, read back by the same lane), then
// the row's norm: bitwise add_inplace + rmsnorm_forward.
template <typename T>
__global__ void add_rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd,
                                           T* residual, const T* __restrict__ x,
                                           const T* __restrict__ weight, int64_t N, int64_t C,
                                           float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  T* r = residual + row * C;
  detail::add_row(r, x + row * C, C, lane);
  rmsnorm_row(out, rstd, static_cast<const T*>(r), weight, row, C, eps, lane);
}

// y = x r w with r = (mean(x^2) + eps)^(-1/2), so with xhat = x r and gw = g w:
//   dx = r (gw - xhat mean_c(gw xhat)),   dweight += sum_n g xhat.
// Block = one chunk of kRowsPerChunk rows; partial[chunk, C] gets the chunk's dweight sums.
// kVector: 16-byte packs (C a whole number of packs, every pointer aligned: the launcher
// checks), as in layernorm_backward. kAccumulate: dinp += dx (dinp != dout).
template <typename T, bool kVector, bool kAccumulate>
__global__ void rmsnorm_backward_kernel(T* dinp, float* __restrict__ partial, const T* dout,
                                        const T* __restrict__ inp, const T* __restrict__ weight,
                                        const float* __restrict__ rstd, int64_t N, int64_t C) {
  using V = detail::Cols<T, kVector>;
  constexpr int kStep = V::kStep;
  const int64_t r0 = blockIdx.x * int64_t(kRowsPerChunk);
  const int64_t r1 = min(N, r0 + kRowsPerChunk);
  // Column partials first (they read dout; dinp is written after the barrier, so dinp may
  // alias dout, as in layernorm_backward). Thread t owns columns [c, c + kStep).
  float* pw = partial + blockIdx.x * C;
  for (int64_t c = threadIdx.x * int64_t(kStep); c < C; c += int64_t(blockDim.x) * kStep) {
    float sw[kStep] = {};
    for (int64_t n = r0; n < r1; n++) {
      const float r = rstd[n];
      V g, x;
      g.load(dout + n * C + c);
      x.load(inp + n * C + c);
#pragma unroll
      for (int k = 0; k < kStep; k++) sw[k] += g.v[k] * (x.v[k] * r);
    }
#pragma unroll
    for (int k = 0; k < kStep; k++) pw[c + k] = sw[k];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t n = r0 + warp; n < r1; n += warps) {
    const T* xr = inp + n * C;
    const T* gr = dout + n * C;
    const float r = rstd[n];
    float sum_gx = 0.f;
    for (int64_t c = lane * int64_t(kStep); c < C; c += 32 * kStep) {
      V x, g, w;
      detail::load_norm_cols(x, g, w, xr, gr, weight, c);
#pragma unroll
      for (int k = 0; k < kStep; k++) sum_gx += w.v[k] * g.v[k] * (x.v[k] * r);
    }
    const float mean_gx = detail::warp_sum(sum_gx) / static_cast<float>(C);
    T* dx = dinp + n * C;
    for (int64_t c = lane * int64_t(kStep); c < C; c += 32 * kStep) {
      V x, g, w, out;
      detail::load_norm_cols(x, g, w, xr, gr, weight, c);
      if constexpr (kAccumulate) out.load(dx + c);
#pragma unroll
      for (int k = 0; k < kStep; k++) {
        const float d = r * (w.v[k] * g.v[k] - (x.v[k] * r) * mean_gx);
        out.v[k] = kAccumulate ? out.v[k] + d : d;
      }
      out.store(dx + c);
    }
  }
}

// dweight[c] += column c's total of the chunk partials.
struct AddWeightGrad {
  float* dweight;
  __device__ void operator()(int64_t c, float total) const { dweight[c] += total; }
};

// ---------------------------------------------------------------- SwiGLU
// silu(x) = x sig(x), sig(x) = 1 / (1 + exp(-x)), silu'(x) = sig (1 + x (1 - sig)). As in the
// CPU kernel (and gelu here), exp(-x) is capped at exp(80): sig stays a normal float instead of
// 1/inf for x < -88, and silu(x) ~ x exp(x) is 0 to float precision there anyway.
constexpr float kMaxExpArg = 80.f;
__device__ __forceinline__ float sigmoid_f(float x) {
  return 1.f / (1.f + expf(fminf(-x, kMaxExpArg)));
}

// V consecutive elements per thread: V = 16 / sizeof(T) (one 16-byte load per operand) when
// Fh is a multiple of V and the pointers are 16-byte aligned, else V = 1.
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// out[N,Fh] = silu(gate) * up, gate_up[N, 2*Fh] rows [gate | up].
template <typename T, int V>
__global__ void swiglu_forward_kernel(T* __restrict__ out, const T* __restrict__ gate_up,
                                      int64_t N, int64_t Fh) {
  using W = Vec<T, V>;
  const int64_t per_row = Fh / V, total = N * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_row, f = (i % per_row) * V;
    const T* row = gate_up + n * 2 * Fh;
    const W g = *reinterpret_cast<const W*>(row + f);
    const W u = *reinterpret_cast<const W*>(row + Fh + f);
    W o;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float x = detail::to_f32(g.v[k]);
      o.v[k] = detail::from_f32<T>(x * sigmoid_f(x) * detail::to_f32(u.v[k]));
    }
    *reinterpret_cast<W*>(out + n * Fh + f) = o;
  }
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate). dgate_up may alias gate_up: each
// thread reads its gate/up elements before writing the same positions (hence no __restrict__).
template <typename T, int V>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t N,
                                       int64_t Fh) {
  using W = Vec<T, V>;
  const int64_t per_row = Fh / V, total = N * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_row, f = (i % per_row) * V;
    const T* row = gate_up + n * 2 * Fh;
    const W g = *reinterpret_cast<const W*>(row + f);
    const W u = *reinterpret_cast<const W*>(row + Fh + f);
    const W d = *reinterpret_cast<const W*>(dout + n * Fh + f);
    W dg, du;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float x = detail::to_f32(g.v[k]), up = detail::to_f32(u.v[k]);
      const float go = detail::to_f32(d.v[k]);
      const float sig = sigmoid_f(x);
      dg.v[k] = detail::from_f32<T>(go * up * sig * (1.f + x * (1.f - sig)));
      du.v[k] = detail::from_f32<T>(go * (x * sig));
    }
    T* drow = dgate_up + n * 2 * Fh;
    *reinterpret_cast<W*>(drow + f) = dg;
    *reinterpret_cast<W*>(drow + Fh + f) = du;
  }
}

}  // namespace

// ---------------------------------------------------------------- entry points
template <typename T>
void rope_forward(T* qkv, int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS,
                  double theta, cudaStream_t stream) {
  launch_rope<T, false>(qkv, B, T_, NH, KVH, HS, theta, stream);
}

template <typename T>
void rope_backward(T* dqkv, int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS,
                   double theta, cudaStream_t stream) {
  launch_rope<T, true>(dqkv, B, T_, NH, KVH, HS, theta, stream);
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     float eps, cudaStream_t stream) {
  detail::check_dims(N >= 0 && C > 0, "rmsnorm_forward: N < 0 or C <= 0");
  if (N == 0) return;
  const int rows_per_block = kThreads / 32;
  rmsnorm_forward_kernel<T><<<detail::grid_for(N, rows_per_block, INT32_MAX), kThreads, 0,
                              stream>>>(out, rstd, inp, weight, N, C, eps);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void add_rmsnorm_forward(T* out, float* rstd, T* residual, const T* x, const T* weight,
                         int64_t N, int64_t C, float eps, cudaStream_t stream) {
  detail::check_dims(N >= 0 && C > 0, "add_rmsnorm_forward: N < 0 or C <= 0");
  if (N == 0) return;
  const int rows_per_block = kThreads / 32;
  add_rmsnorm_forward_kernel<T><<<detail::grid_for(N, rows_per_block, INT32_MAX), kThreads, 0,
                                  stream>>>(out, rstd, residual, x, weight, N, C, eps);
  CUDA_CHECK_LAUNCH();
}

size_t rmsnorm_backward_workspace_bytes(int64_t N, int64_t C) {
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  return static_cast<size_t>(chunks * C) * sizeof(float);
}

template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t N, int64_t C, cudaStream_t stream,
                      void* workspace, bool accumulate) {
  detail::check_dims(N >= 0 && C > 0, "rmsnorm_backward: N < 0 or C <= 0");
  detail::check_dims(!accumulate || dinp != dout,
                     "rmsnorm_backward: accumulating into dinp needs dinp != dout");
  if (N == 0) return;
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  detail::check_dims(chunks <= INT32_MAX, "rmsnorm_backward: N too large");
  detail::Scratch scratch(workspace, rmsnorm_backward_workspace_bytes(N, C), stream);
  float* partial = scratch.as<float>();
  const bool vector = detail::rows_aligned16<T>(C, dinp, dout, inp, weight);
  const auto kernel = vector ? (accumulate ? rmsnorm_backward_kernel<T, true, true>
                                           : rmsnorm_backward_kernel<T, true, false>)
                             : (accumulate ? rmsnorm_backward_kernel<T, false, true>
                                           : rmsnorm_backward_kernel<T, false, false>);
  kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(dinp, partial, dout, inp, weight,
                                                                 rstd, N, C);
  CUDA_CHECK_LAUNCH();
  detail::launch_column_sums(partial, chunks, C, AddWeightGrad{dweight}, stream);
}

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t Fh, cudaStream_t stream) {
  detail::check_dims(N >= 0 && Fh >= 0, "swiglu_forward: negative size");
  if (N == 0 || Fh == 0) return;
  constexpr int kPack = detail::Pack<T>::kSize;
  if (detail::rows_aligned16<T>(Fh, out, gate_up)) {  // (gate_up's rows of 2 Fh too)
    swiglu_forward_kernel<T, kPack><<<detail::grid_for(N * Fh / kPack, kThreads), kThreads, 0,
                                      stream>>>(out, gate_up, N, Fh);
  } else {
    swiglu_forward_kernel<T, 1><<<detail::grid_for(N * Fh, kThreads), kThreads, 0, stream>>>(
        out, gate_up, N, Fh);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t Fh,
                     cudaStream_t stream) {
  detail::check_dims(N >= 0 && Fh >= 0, "swiglu_backward: negative size");
  if (N == 0 || Fh == 0) return;
  constexpr int kPack = detail::Pack<T>::kSize;
  if (detail::rows_aligned16<T>(Fh, dgate_up, dout, gate_up)) {
    swiglu_backward_kernel<T, kPack><<<detail::grid_for(N * Fh / kPack, kThreads), kThreads, 0,
                                       stream>>>(dgate_up, dout, gate_up, N, Fh);
  } else {
    swiglu_backward_kernel<T, 1><<<detail::grid_for(N * Fh, kThreads), kThreads, 0, stream>>>(
        dgate_up, dout, gate_up, N, Fh);
  }
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                                  \
  template void rope_forward<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, double,       \
                                cudaStream_t);                                                 \
  template void rope_backward<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, double,      \
                                 cudaStream_t);                                                \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int64_t, int64_t, float,    \
                                   cudaStream_t);                                              \
  template void add_rmsnorm_forward<T>(T*, float*, T*, const T*, const T*, int64_t, int64_t,    \
                                       float, cudaStream_t);                                   \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*,    \
                                    int64_t, int64_t, cudaStream_t, void*, bool);              \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t, cudaStream_t);               \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

// GELU (tanh approximation) and the residual additions: memory-bound elementwise kernels with
// 16-byte vector loads when every pointer is 16-byte aligned, else a scalar loop.
#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;
constexpr float kMaxExpArg = 80.f;

// gelu(x) = x * sigma(2u), u = sqrt(2/pi) (x + 0.044715 x^3) (= 0.5 x (1 + tanh u)), with the
// CPU kernel's cap on exp(-2u).
__device__ __forceinline__ float gelu_f(float x) {
  const float u = kSqrt2OverPi * (x + kCoeff * x * x * x);
  const float sigma = 1.f / (1.f + expf(fminf(-2.f * u, kMaxExpArg)));
  return x * sigma;
}
__device__ __forceinline__ float gelu_grad_f(float x, float g) {
  const float x2 = x * x;
  const float u = kSqrt2OverPi * (x + kCoeff * x2 * x);
  const float du = kSqrt2OverPi * (1.f + 3.f * kCoeff * x2);
  const float sigma = 1.f / (1.f + expf(fminf(-2.f * u, kMaxExpArg)));
  return g * (sigma + x * 2.f * sigma * (1.f - sigma) * du);
}

struct GeluFwd {
  __device__ float operator()(float x, float) const { return gelu_f(x); }
};
struct GeluBwd {  // (inp, dout)
  __device__ float operator()(float x, float g) const { return gelu_grad_f(x, g); }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out[i] = op(a[i], b[i]) (b may be nullptr for unary ops; then op gets 0).
template <typename T, typename Op>
__global__ void binary_vec_kernel(T* out, const T* a, const T* b, int64_t packs, Op op) {
  using P = detail::Pack<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    P pb{};
    if (b != nullptr) pb = reinterpret_cast<const P*>(b)[i];
    P po;
#pragma unroll
    for (int k = 0; k < P::kSize; k++)
      po.v[k] = detail::from_f32<T>(
          op(detail::to_f32(pa.v[k]), b != nullptr ? detail::to_f32(pb.v[k]) : 0.f));
    reinterpret_cast<P*>(out)[i] = po;
  }
}

template <typename T, typename Op>
__global__ void binary_scalar_kernel(T* out, const T* a, const T* b, int64_t begin, int64_t n,
                                     Op op) {
  for (int64_t i = begin + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = detail::from_f32<T>(
        op(detail::to_f32(a[i]), b != nullptr ? detail::to_f32(b[i]) : 0.f));
}

// Elementwise kernels allow out to alias an input exactly (same index read then written by the
// same thread), so no __restrict__ on the scalar path, and the vector path reads a whole pack
// before writing it.
template <typename T, typename Op>
void launch_binary(T* out, const T* a, const T* b, int64_t n, Op op, cudaStream_t stream) {
  detail::check_dims(n >= 0, "elementwise: n < 0");
  if (n == 0) return;
  constexpr int kPack = detail::Pack<T>::kSize;
  int64_t begin = 0;
  if (detail::aligned16(out) && detail::aligned16(a) && (b == nullptr || detail::aligned16(b))) {
    const int64_t packs = n / kPack;
    if (packs > 0) {
      binary_vec_kernel<T, Op><<<detail::grid_for(packs, 256), 256, 0, stream>>>(out, a, b, packs,
                                                                                   op);
      CUDA_CHECK_LAUNCH();
    }
    begin = packs * kPack;
  }
  if (begin < n) {
    binary_scalar_kernel<T, Op><<<detail::grid_for(n - begin, 256), 256, 0, stream>>>(
        out, a, b, begin, n, op);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t N, cudaStream_t stream) {
  launch_binary<T>(out, inp, static_cast<const T*>(nullptr), N, GeluFwd{}, stream);
}
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t N, cudaStream_t stream) {
  launch_binary<T>(dinp, inp, dout, N, GeluBwd{}, stream);
}
template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t N, cudaStream_t stream) {
  launch_binary<T>(out, a, b, N, Add{}, stream);
}
template <typename T>
void add_inplace(T* acc, const T* x, int64_t N, cudaStream_t stream) {
  launch_binary<T>(acc, acc, x, N, Add{}, stream);
}

namespace {
__global__ void scale_kernel(float* __restrict__ x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}
__global__ void fill_kernel(float* __restrict__ x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}
// One block: each thread sums a fixed stride of x in double, then a tree in fixed order.
constexpr int kMeanThreads = 256;
__global__ void accumulate_mean_kernel(double* __restrict__ acc, const float* __restrict__ x,
                                       int64_t n) {
  __shared__ double part[kMeanThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kMeanThreads) s += static_cast<double>(x[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int width = kMeanThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) part[threadIdx.x] += part[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *acc += part[0] / static_cast<double>(n);
}
}  // namespace

void accumulate_mean(double* acc, const float* x, int64_t n, cudaStream_t stream) {
  detail::check_dims(n > 0, "accumulate_mean: n <= 0");
  accumulate_mean_kernel<<<1, kMeanThreads, 0, stream>>>(acc, x, n);
  CUDA_CHECK_LAUNCH();
}

void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream) {
  detail::check_dims(n >= 0, "scale_inplace: n < 0");
  if (n == 0) return;
  scale_kernel<<<detail::grid_for(n, 256), 256, 0, stream>>>(x, n, s);
  CUDA_CHECK_LAUNCH();
}

void fill(float* x, int64_t n, float value, cudaStream_t stream) {
  detail::check_dims(n >= 0, "fill: n < 0");
  if (n == 0) return;
  fill_kernel<<<detail::grid_for(n, 256), 256, 0, stream>>>(x, n, value);
  CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(T)                                                          \
  template void gelu_forward<T>(T*, const T*, int64_t, cudaStream_t);                   \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t, cudaStream_t);        \
  template void add_forward<T>(T*, const T*, const T*, int64_t, cudaStream_t);          \
  template void add_inplace<T>(T*, const T*, int64_t, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda

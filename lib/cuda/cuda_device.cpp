#include "cuda/cuda_device.hpp"

#include "util/error.hpp"

namespace trident {

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  CUDA_CHECK(cudaSetDevice(ordinal));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  blas_ = std::make_unique<cuda::CublasContext>();
  norm_result_ = allocate(sizeof(double));
  norm_workspace_ = allocate(static_cast<int64_t>(cuda::grad_square_sum_workspace_bytes()));
}

CudaDevice::~CudaDevice() {
  cudaStreamSynchronize(stream_);  // no throw from a destructor
  norm_result_.reset();
  norm_workspace_.reset();
  blas_.reset();
  cudaStreamDestroy(stream_);
}

std::string CudaDevice::describe() const {
  return "cuda:" + std::to_string(ordinal_) + " " + cuda::device_summary();
}

std::shared_ptr<void> CudaDevice::allocate(int64_t bytes) {
  void* p = nullptr;
  const size_t n = static_cast<size_t>(bytes > 0 ? bytes : 1);
  const cudaError_t err = cudaMalloc(&p, n);
  if (err != cudaSuccess) {
    size_t free_bytes = 0, total = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_bytes, &total);
    throw Error("cuda:" + std::to_string(ordinal_) + ": cannot allocate " +
                std::to_string(n >> 20) + " MiB (" + std::to_string(free_bytes >> 20) + " of " +
                std::to_string(total >> 20) + " MiB free): " + cudaGetErrorString(err) +
                "; use smaller micro-batches or more tensor/pipeline ranks");
  }
  CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream_));
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

void CudaDevice::to_host(void* host, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                             stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::from_host(void* dst, const void* host, int64_t bytes) {
  if (bytes <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                             stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may be pageable and reused
}

void CudaDevice::copy(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                             stream_));
}

void CudaDevice::fill_zero(void* dst, int64_t bytes) {
  if (bytes <= 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream_));
}

void CudaDevice::scale(float* x, int64_t n, float s) { cuda::scale_inplace(x, n, s, stream_); }

double CudaDevice::square_sum(const std::vector<Range>& ranges) {
  auto* result = static_cast<double*>(norm_result_.get());
  CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream_));
  for (const Range& r : ranges)  // queued back to back; the host waits once, below
    cuda::grad_square_sum(result, r.data, r.size, true, stream_, norm_workspace_.get());
  double host = 0.0;
  to_host(&host, result, sizeof(double));
  return host;
}

void CudaDevice::adamw(float* w, const float* grad, float* m, float* v, int64_t n,
                       const AdamWStep& s) {
  cuda::AdamWHyper h;
  h.lr = s.lr;
  h.beta1 = s.beta1;
  h.beta2 = s.beta2;
  h.eps = s.eps;
  h.weight_decay = s.weight_decay;
  h.grad_scale = s.grad_scale;
  h.bias1 = s.bias1;
  h.bias2 = s.bias2;
  cuda::adamw_update(w, grad, m, v, n, h, nullptr, nullptr, stream_);
}

void CudaDevice::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace trident

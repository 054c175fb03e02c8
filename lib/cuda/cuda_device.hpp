#pragma once
// One GPU as a Device: memory from cudaMalloc, every operation queued on one compute stream
// (the stream the model's kernels, the cuBLAS calls and NCCL use), so device-side ordering
// needs no host synchronisation; only the blocking copies and square_sum wait.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "kernels/cuda/ops.hpp"
#include "tensor/device.hpp"

namespace trident {

class CudaDevice final : public Device {
 public:
  // Makes `ordinal` the calling thread's current device and creates the stream and cuBLAS
  // handles on it.
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }
  cuda::CublasContext& blas() { return *blas_; }

  bool is_host() const override { return false; }
  std::string describe() const override;
  std::shared_ptr<void> allocate(int64_t bytes) override;
  void to_host(void* host, const void* src, int64_t bytes) override;
  void from_host(void* dst, const void* host, int64_t bytes) override;
  void copy(void* dst, const void* src, int64_t bytes) override;
  void fill_zero(void* dst, int64_t bytes) override;
  void scale(float* x, int64_t n, float s) override;
  double square_sum(const std::vector<Range>& ranges) override;
  void adamw(float* w, const float* grad, float* m, float* v, int64_t n,
             const AdamWStep& step) override;
  void synchronize() override;

 private:
  int ordinal_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CublasContext> blas_;
  std::shared_ptr<void> norm_result_, norm_workspace_;  // square_sum's double and partials
};

}  // namespace trident

#pragma once
// One GPU as a Device: memory from cudaMalloc, every operation queued on one compute stream
// (the stream the model's kernels, the cuBLAS calls and NCCL use), so device-side ordering
// needs no host synchronisation; only the blocking copies and square_sum wait.
//
// Waits. The compute stream carries the NCCL collectives (and waits for the point-to-point
// channels), so a host wait on it can hang on a dead peer. While the device's CommWatch
// (comm/comm_watch.hpp) has communicators, every host wait here (to_host, from_host,
// square_sum, synchronize, wait_event) polls the stream with cudaStreamQuery / cudaEventQuery
// and the communicators' asynchronous errors, bounded by the communication timeout; on failure
// the communicators are aborted and a trident::Error names the rank, the wait and the last
// operations. Without communicators (one GPU, or the MPI path) a wait is a plain
// cudaStreamSynchronize.
//
// Teardown. Device memory is freed by a deleter that first calls CommWatch::before_teardown()
// (while an exception unwinds: abort the communicators, then free); the destructor never
// synchronises the stream after an abort or while an exception unwinds, and otherwise waits for
// it bounded (no throw).
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "comm/comm_watch.hpp"
#include "kernels/cuda/ops.hpp"
#include "tensor/device.hpp"
#include "util/interval_timer.hpp"

namespace trident {

class CudaDevice final : public Device {
 public:
  // Makes `ordinal` the calling thread's current device and creates the stream and cuBLAS
  // handles on it. `watch`: the communicators whose work this device's stream carries (the GPU
  // backend's; nullptr: a watch of its own, rank 0, no communicators).
  explicit CudaDevice(int ordinal, std::shared_ptr<CommWatch> watch = nullptr);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }
  cuda::CublasContext& blas() { return *blas_; }
  CommWatch& watch() { return *watch_; }
  // Shown by describe() after the device summary, e.g. "GPU-1a2b..., own GPU".
  void set_identity(std::string text) { identity_ = std::move(text); }

  // "cuda:0 NVIDIA H200 (sm_90, ...), GPU-..., own GPU; NCCL communicators: 3 (tensor 1,
  // pipeline 2)"
  bool is_host() const override { return false; }
  std::string describe() const override;
  std::shared_ptr<void> allocate(int64_t bytes) override;
  std::shared_ptr<void> allocate_host(int64_t bytes) override;  // pinned (cudaHostAlloc)
  void to_host(void* host, const void* src, int64_t bytes) override;
  void from_host(void* dst, const void* host, int64_t bytes) override;
  void copy(void* dst, const void* src, int64_t bytes) override;
  void fill_zero(void* dst, int64_t bytes) override;
  void scale(float* x, int64_t n, float s) override;
  void add(float* y, const float* x, int64_t n) override;
  double square_sum(const std::vector<Range>& ranges) override;
  void adamw(float* w, const float* grad, float* m, float* v, int64_t n, const AdamWStep& step,
             uint16_t* w_bf16) override;
  void synchronize() override;

  // Waits (bounded, as above) until `event`, recorded on a stream of this device, has completed;
  // `what` names the wait in errors.
  void wait_event(cudaEvent_t event, const char* what);
  // Intervals on the compute stream, measured with CUDA events (pipeline waits).
  std::unique_ptr<IntervalTimer> make_interval_timer() override;

 private:
  // Waits until the compute stream has run everything queued so far.
  void wait_stream(const char* what);

  int ordinal_;
  std::shared_ptr<CommWatch> watch_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CublasContext> blas_;
  std::shared_ptr<void> norm_result_, norm_workspace_;  // square_sum's double and partials
  std::string identity_;
};

}  // namespace trident

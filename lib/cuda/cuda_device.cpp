#include "cuda/cuda_device.hpp"

#include <vector>

#include "util/error.hpp"

namespace trident {

namespace {

// cudaStreamQuery / cudaEventQuery as a poll: true when done, false when not yet, throws on
// a CUDA error.
bool finished(cudaError_t e) {
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) return false;
  CUDA_CHECK(e);
  return false;
}

// Intervals between pairs of CUDA events recorded on one stream; the events are reused.
class CudaIntervalTimer final : public IntervalTimer {
 public:
  explicit CudaIntervalTimer(CudaDevice& device) : device_(device) {}
  ~CudaIntervalTimer() override {
    for (auto& [a, b] : events_) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
  CudaIntervalTimer(const CudaIntervalTimer&) = delete;
  CudaIntervalTimer& operator=(const CudaIntervalTimer&) = delete;

  void begin() override {
    if (used_ == events_.size()) {
      cudaEvent_t a = nullptr, b = nullptr;
      CUDA_CHECK(cudaEventCreate(&a));
      const cudaError_t e = cudaEventCreate(&b);
      if (e != cudaSuccess) {
        cudaEventDestroy(a);
        CUDA_CHECK(e);
      }
      events_.emplace_back(a, b);
    }
    CUDA_CHECK(cudaEventRecord(events_[used_].first, device_.stream()));
    open_ = true;
  }
  void end() override {
    if (!open_) return;
    CUDA_CHECK(cudaEventRecord(events_[used_].second, device_.stream()));
    ++used_;
    open_ = false;
  }
  double take_seconds() override {
    if (open_) end();
    if (used_ == 0) return 0.0;
    device_.wait_event(events_[used_ - 1].second, "interval timer");
    double ms = 0;
    for (size_t i = 0; i < used_; ++i) {
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, events_[i].first, events_[i].second));
      ms += t;
    }
    used_ = 0;
    return ms / 1e3;
  }

 private:
  CudaDevice& device_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  size_t used_ = 0;
  bool open_ = false;
};

}  // namespace

CudaDevice::CudaDevice(int ordinal, std::shared_ptr<CommWatch> watch)
    : ordinal_(ordinal), watch_(watch ? std::move(watch) : std::make_shared<CommWatch>(0)) {
  CUDA_CHECK(cudaSetDevice(ordinal));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  blas_ = std::make_unique<cuda::CublasContext>();
  norm_result_ = allocate(sizeof(double));
  norm_workspace_ = allocate(static_cast<int64_t>(cuda::grad_square_sum_workspace_bytes()));
}

CudaDevice::~CudaDevice() {
  // After an abort (or while an exception unwinds with communicators live: before_teardown
  // aborts them) the stream is not waited for; otherwise bounded, no throw.
  if (!watch_->before_teardown()) {
    if (watch_->active() || watch_->aborted()) {
      watch_->wait_quietly([this] { return cudaStreamQuery(stream_) != cudaErrorNotReady; },
                           "cuda:" + std::to_string(ordinal_) + " teardown");
    } else {
      cudaStreamSynchronize(stream_);
    }
  }
  norm_result_.reset();
  norm_workspace_.reset();
  blas_.reset();
  cudaStreamDestroy(stream_);
}

std::string CudaDevice::describe() const {
  std::string s = "cuda:" + std::to_string(ordinal_) + " " + cuda::device_summary();
  if (!identity_.empty()) s += ", " + identity_;
  return s + "; NCCL communicators: " + watch_->summary();
}

void CudaDevice::wait_stream(const char* what) {
  if (!watch_->active() && !watch_->aborted()) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  watch_->wait([this] { return finished(cudaStreamQuery(stream_)); },
               std::string(what) + " on cuda:" + std::to_string(ordinal_));
}

void CudaDevice::wait_event(cudaEvent_t event, const char* what) {
  if (!watch_->active() && !watch_->aborted()) {
    CUDA_CHECK(cudaEventSynchronize(event));
    return;
  }
  watch_->wait([event] { return finished(cudaEventQuery(event)); },
               std::string(what) + " on cuda:" + std::to_string(ordinal_));
}

std::unique_ptr<IntervalTimer> CudaDevice::make_interval_timer() {
  return std::make_unique<CudaIntervalTimer>(*this);
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
  // An error unwinding with communicators live: abort them before cudaFree waits for the device.
  return counted(std::shared_ptr<void>(p,
                                       [watch = watch_](void* q) {
                                         watch->before_teardown();
                                         cudaFree(q);
                                       }),
                 bytes);
}

std::shared_ptr<void> CudaDevice::allocate_host(int64_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1), cudaHostAllocDefault) !=
      cudaSuccess) {
    cudaGetLastError();
    throw_host_allocation_failure(bytes);
  }
  return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
}

void CudaDevice::to_host(void* host, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                             stream_));
  wait_stream("to_host");
}

void CudaDevice::from_host(void* dst, const void* host, int64_t bytes) {
  if (bytes <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                             stream_));
  wait_stream("from_host");  // the host buffer may be pageable and reused
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
void CudaDevice::add(float* y, const float* x, int64_t n) { cuda::add_inplace(y, x, n, stream_); }

double CudaDevice::square_sum(const std::vector<Range>& ranges) {
  auto* result = static_cast<double*>(norm_result_.get());
  CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream_));
  // Ranges that lie back to back (a model's parameters in the flat buffer) are summed as one:
  // a launch pair per tensor (148 for GPT-2 124M) took 0.9 ms of kernels a step on an H200,
  // where one pass over the 0.5 GB of gradients needs about 0.15 ms. Queued back to back; the
  // host waits once, below.
  for_each_contiguous_run(ranges, [&](const float* data, int64_t size) {
    cuda::grad_square_sum(result, data, size, true, stream_, norm_workspace_.get());
  });
  double host = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  wait_stream("square_sum (gradient norm)");
  return host;
}

void CudaDevice::adamw(float* w, const float* grad, float* m, float* v, int64_t n,
                       const AdamWStep& s, uint16_t* w_bf16) {
  cuda::AdamWHyper h;
  h.lr = s.lr;
  h.beta1 = s.beta1;
  h.beta2 = s.beta2;
  h.eps = s.eps;
  h.weight_decay = s.weight_decay;
  h.grad_scale = s.grad_scale;
  h.bias1 = s.bias1;
  h.bias2 = s.bias2;
  cuda::adamw_update(w, grad, m, v, n, h, reinterpret_cast<cuda::bf16*>(w_bf16), stream_);
}

void CudaDevice::synchronize() { wait_stream("synchronize"); }

}  // namespace trident

#pragma once
// Where a rank's model state lives, and the few whole-buffer operations the trainer runs on it
// outside the model: gradient averaging, the gradient norm, AdamW, and copies to and from host
// memory (checkpoints, the MPI path that stages device buffers through the host).
//
// CpuDevice (host memory, kernels/cpu) and CudaDevice (one GPU, kernels/cuda) implement it.
// Operations on device memory are ordered on the device's one compute stream: copy, fill_zero,
// scale and adamw may return before they finish; to_host, from_host, square_sum and
// synchronize return once everything queued before them has finished.
#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "util/error.hpp"
#include "util/interval_timer.hpp"

namespace trident {

// One AdamW step's constants (the same for every element of a segment).
struct AdamWStep {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float bias1 = 1, bias2 = 1;  // 1 - beta^t, rounded to float (the CPU formula)
  float grad_scale = 1;        // gradients are multiplied by it first (clipping)
};

class Device {
 public:
  virtual ~Device() = default;
  // True when device memory is host memory (pointers may be dereferenced on the CPU).
  virtual bool is_host() const = 0;
  // "cpu" or "cuda:0 NVIDIA H200 (sm_90, ...)".
  virtual std::string describe() const = 0;

  // Zero-filled memory of `bytes`, freed when the last handle goes.
  virtual std::shared_ptr<void> allocate(int64_t bytes) = 0;
  // Host memory of `bytes` for copies out of device memory (an asynchronous checkpoint's
  // staging buffer, train/async_checkpoint.hpp): page-locked on a GPU, so that to_host is one
  // DMA transfer at the link's speed; plain memory elsewhere. Not counted in allocated_bytes()
  // (that counts device memory). Throws trident::Error naming the size when it cannot be had.
  virtual std::shared_ptr<void> allocate_host(int64_t bytes);
  // Blocking copies between device memory and host memory.
  virtual void to_host(void* host, const void* src, int64_t bytes) = 0;
  virtual void from_host(void* dst, const void* host, int64_t bytes) = 0;
  // Device-to-device copy and zero fill (stream-ordered).
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  virtual void fill_zero(void* dst, int64_t bytes) = 0;
  // x[i] *= s
  virtual void scale(float* x, int64_t n, float s) = 0;
  // y[i] += x[i] (ZeRO-2/3: a micro-batch's reduced gradient slice into the accumulated one)
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // Sum of x[i]^2 in double over every element of the ranges {x, n}, with a summation order
  // that depends on the ranges only (bitwise reproducible for any thread count or SM count of
  // the same device kind). One call per gradient norm: a GPU waits once.
  struct Range {
    const float* data;
    int64_t size;
  };
  virtual double square_sum(const std::vector<Range>& ranges) = 0;
  // One AdamW update of n elements:
  //   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  //   w -= lr * (m / bias1 / (sqrt(v / bias2) + eps) + weight_decay * w)
  // With w_bf16 (not nullptr), each updated w is also written there rounded to bf16 (to
  // nearest, ties to even; the bits of util/bf16.hpp): a bf16 model's compute copy, refreshed in
  // the same pass instead of a second one over the weights.
  virtual void adamw(float* w, const float* grad, float* m, float* v, int64_t n,
                     const AdamWStep& step, uint16_t* w_bf16) = 0;
  // Waits for everything queued on the device.
  virtual void synchronize() = 0;
  // A timer of the device's own stream, where the device runs ahead of the host (a GPU);
  // nullptr where host wall time is device time (the CPU).
  virtual std::unique_ptr<IntervalTimer> make_interval_timer() { return nullptr; }

  // Bytes of the allocate() calls not yet freed, and the most held at once since the device was
  // made: the memory a rank really allocated for its weights, gradients, optimizer state,
  // activations and scratch (the cost model's prediction is compared with it; docs/plan.md).
  // Devices that do not pass their allocations through counted() report 0.
  int64_t allocated_bytes() const { return meter_->live.load(); }
  int64_t peak_allocated_bytes() const { return meter_->peak.load(); }
  // How many allocate() calls were counted: a training step that allocates nothing once its
  // buffers exist leaves it unchanged (tests/mpi/test_step_allocations_np4.cpp).
  int64_t allocation_count() const { return meter_->calls.load(); }

 protected:
  // `memory` of `bytes`, counted until its last handle goes (the counters outlive the device).
  std::shared_ptr<void> counted(std::shared_ptr<void> memory, int64_t bytes);
  // allocate_host's error, naming the size.
  [[noreturn]] static void throw_host_allocation_failure(int64_t bytes) {
    throw Error("cannot allocate " + std::to_string(bytes / 1000000) +
                " MB of host memory for a copy of device memory (checkpoint staging)");
  }

 private:
  struct AllocationMeter {
    std::atomic<int64_t> live{0}, peak{0}, calls{0};
  };
  std::shared_ptr<AllocationMeter> meter_ = std::make_shared<AllocationMeter>();
};

// Calls f(data, size) once for each run of ranges that lie back to back in memory (each one
// starting where the one before it ends), in order. A model's parameters sit back to back in
// its flat buffer, so a device can sum their gradients' squares in one pass rather than one
// per tensor (CudaDevice::square_sum).
template <typename F>
void for_each_contiguous_run(const std::vector<Device::Range>& ranges, F&& f) {
  for (size_t i = 0; i < ranges.size();) {
    const float* begin = ranges[i].data;
    int64_t size = ranges[i].size;
    for (++i; i < ranges.size() && ranges[i].data == begin + size; ++i) size += ranges[i].size;
    f(begin, size);
  }
}

// Typed view of an allocation: memory of n elements of T on `device`.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Device& device, int64_t n)
      : memory_(device.allocate(n * static_cast<int64_t>(sizeof(T)))), size_(n) {}
  T* data() { return static_cast<T*>(memory_.get()); }
  const T* data() const { return static_cast<const T*>(memory_.get()); }
  int64_t size() const { return size_; }
  int64_t bytes() const { return size_ * static_cast<int64_t>(sizeof(T)); }

 private:
  std::shared_ptr<void> memory_;
  int64_t size_ = 0;
};

inline std::shared_ptr<void> Device::allocate_host(int64_t bytes) {
  // Uninitialised: every byte is copied into before it is read.
  void* p = ::operator new(static_cast<size_t>(bytes > 0 ? bytes : 1), std::nothrow);
  if (p == nullptr) throw_host_allocation_failure(bytes);
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q); });
}

inline std::shared_ptr<void> Device::counted(std::shared_ptr<void> memory, int64_t bytes) {
  meter_->calls.fetch_add(1);
  const int64_t live = meter_->live.fetch_add(bytes) + bytes;
  int64_t peak = meter_->peak.load();
  while (live > peak && !meter_->peak.compare_exchange_weak(peak, live)) {
  }
  void* p = memory.get();
  return std::shared_ptr<void>(p, [memory, meter = meter_, bytes](void*) mutable {
    meter->live.fetch_sub(bytes);
    memory.reset();
  });
}

// The optimizer pass over one flat fp32 buffer of n parameters, as a training step runs it on a
// rank's owned parameters (optim/): the gradient's square sum (the norm), the AdamW update, and
// the gradient zeroed for the next step; returns the square sum. `trident bench-hw` times it on
// either device for the plan's optimizer rate (plan/hardware.hpp, kOptimizerBytesPerParam).
inline double optimizer_pass(Device& device, float* w, float* grad, float* m, float* v,
                             int64_t n, const AdamWStep& step) {
  const double sum = device.square_sum({{grad, n}});
  device.adamw(w, grad, m, v, n, step, nullptr);
  device.fill_zero(grad, n * static_cast<int64_t>(sizeof(float)));
  return sum;
}

// The host: memory from the aligned allocator, loops from kernels/cpu (OpenMP).
std::unique_ptr<Device> make_cpu_device();

}  // namespace trident

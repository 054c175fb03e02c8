#pragma once
// A test double's base: a Device that forwards everything to a host (CPU) device. A test device
// derives from it and overrides only what it observes (allocations, copies to the host, ...).
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/device.hpp"

namespace trident::testing_support {

class HostForwardingDevice : public Device {
 public:
  bool is_host() const override { return true; }
  std::string describe() const override { return host_->describe(); }
  std::shared_ptr<void> allocate(int64_t bytes) override { return host_->allocate(bytes); }
  void to_host(void* h, const void* src, int64_t n) override { host_->to_host(h, src, n); }
  void from_host(void* dst, const void* h, int64_t n) override { host_->from_host(dst, h, n); }
  void copy(void* dst, const void* src, int64_t n) override { host_->copy(dst, src, n); }
  void fill_zero(void* dst, int64_t n) override { host_->fill_zero(dst, n); }
  void scale(float* x, int64_t n, float s) override { host_->scale(x, n, s); }
  void add(float* y, const float* x, int64_t n) override { host_->add(y, x, n); }
  double square_sum(const std::vector<Range>& r) override { return host_->square_sum(r); }
  void adamw(float* w, const float* g, float* m, float* v, int64_t n, const AdamWStep& step,
             uint16_t* w_bf16) override {
    host_->adamw(w, g, m, v, n, step, w_bf16);
  }
  void synchronize() override { host_->synchronize(); }

 protected:
  Device& host() { return *host_; }

 private:
  std::unique_ptr<Device> host_ = make_cpu_device();
};

// Host memory standing in for a GPU's: records what it allocates, so that a test can tell
// device memory from host memory (holds()). Strict, it also fails (gtest) every host copy whose
// device side is not its memory, and every device copy with a side outside it, as a GPU
// would refuse them (cudaMemcpy's cudaErrorInvalidValue for a host source, 2026-12-04).
class TrackingDevice final : public HostForwardingDevice {
 public:
  explicit TrackingDevice(bool strict = false) : strict_(strict) {}
  std::string describe() const override { return "tracking cpu"; }
  std::shared_ptr<void> allocate(int64_t bytes) override {
    std::shared_ptr<void> p = host().allocate(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(live_, [](const Block& b) { return b.owner.expired(); });
    live_.push_back({static_cast<const char*>(p.get()), bytes, p});
    return p;
  }
  void to_host(void* h, const void* src, int64_t n) override {
    expect_device(src, n, "to_host from");
    host().to_host(h, src, n);
  }
  void from_host(void* dst, const void* h, int64_t n) override {
    expect_device(dst, n, "from_host into");
    host().from_host(dst, h, n);
  }
  void copy(void* dst, const void* src, int64_t n) override {
    expect_device(src, n, "copy from");
    expect_device(dst, n, "copy into");
    host().copy(dst, src, n);
  }
  // True when [p, p + bytes) lies inside memory this device allocated and still holds.
  bool holds(const void* p, int64_t bytes) const {
    const char* a = static_cast<const char*>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Block& b : live_)
      if (!b.owner.expired() && a >= b.base && a + bytes <= b.base + b.bytes) return true;
    return false;
  }

 private:
  void expect_device(const void* p, int64_t bytes, const char* what) {
    if (!strict_ || bytes == 0 || holds(p, bytes)) return;
    ADD_FAILURE() << "device " << what << " memory that is not the device's (" << bytes
                  << " bytes)";
  }
  struct Block {
    const char* base;
    int64_t bytes;
    std::weak_ptr<void> owner;
  };
  bool strict_;
  mutable std::mutex mutex_;
  std::vector<Block> live_;
};

}  // namespace trident::testing_support

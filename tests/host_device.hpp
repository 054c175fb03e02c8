#pragma once
// A test double's base: a Device that forwards everything to a host (CPU) device. A test device
// derives from it and overrides only what it observes (allocations, copies to the host, ...).
#include <memory>
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
  double square_sum(const std::vector<Range>& r) override { return host_->square_sum(r); }
  void adamw(float* w, const float* g, float* m, float* v, int64_t n,
             const AdamWStep& step) override {
    host_->adamw(w, g, m, v, n, step);
  }
  void synchronize() override { host_->synchronize(); }

 protected:
  Device& host() { return *host_; }

 private:
  std::unique_ptr<Device> host_ = make_cpu_device();
};

}  // namespace trident::testing_support

#pragma once
// The staged communicator's test doubles (tests/mpi/test_staged_comm_np*.cpp):
//  * FakeDevice stores every byte XOR 0xA5 and records its allocations, so a result that did not
//    travel through Device::to_host / Device::from_host is garbage, and it fails any copy whose
//    device side is not inside one of its allocations or whose host side is;
//  * CheckingComm sits between the staged and the MPI communicator and fails any call that is
//    handed a pointer into device memory (the host communicator must only see staging memory).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "tensor/device.hpp"

namespace trident::staged_test {

constexpr unsigned char kKey = 0xA5;  // device bytes are stored XOR this

inline void xor_copy(void* dst, const void* src, int64_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < bytes; ++i) d[i] = s[i] ^ kKey;
}

class FakeDevice final : public Device {
 public:
  bool is_host() const override { return false; }
  std::string describe() const override { return "fake device (host memory, XOR-encoded)"; }

  std::shared_ptr<void> allocate(int64_t bytes) override {
    char* p = new char[bytes > 0 ? bytes : 1];
    std::memset(p, kKey, bytes > 0 ? bytes : 1);  // encoded zeros
    live_[p] = bytes > 0 ? bytes : 1;
    return std::shared_ptr<void>(p, [this](void* q) {
      live_.erase(static_cast<char*>(q));
      delete[] static_cast<char*>(q);
    });
  }
  void to_host(void* host, const void* src, int64_t bytes) override {
    EXPECT_TRUE(inside(src, bytes)) << "to_host from memory that is not device memory";
    EXPECT_FALSE(overlaps(host, bytes)) << "to_host into device memory";
    xor_copy(host, src, bytes);
    ++to_host_calls;
  }
  void from_host(void* dst, const void* host, int64_t bytes) override {
    EXPECT_TRUE(inside(dst, bytes)) << "from_host into memory that is not device memory";
    EXPECT_FALSE(overlaps(host, bytes)) << "from_host from device memory";
    xor_copy(dst, host, bytes);
    ++from_host_calls;
    ++from_host_into[dst];
  }
  void copy(void* dst, const void* src, int64_t bytes) override { std::memmove(dst, src, bytes); }
  void fill_zero(void* dst, int64_t bytes) override { std::memset(dst, kKey, bytes); }
  void scale(float*, int64_t, float) override { ADD_FAILURE() << "scale: not used"; }
  void add(float*, const float*, int64_t) override { ADD_FAILURE() << "add: not used"; }
  double square_sum(const std::vector<Range>&) override {
    ADD_FAILURE() << "square_sum: not used";
    return 0;
  }
  void adamw(float*, const float*, float*, float*, int64_t, const AdamWStep&,
             uint16_t*) override {
    ADD_FAILURE() << "adamw: not used";
  }
  void synchronize() override {}

  // True when [p, p + bytes) overlaps any live allocation.
  bool overlaps(const void* p, int64_t bytes) const {
    const char* a = static_cast<const char*>(p);
    for (const auto& [base, size] : live_) {
      if (a < base + size && base < a + (bytes > 0 ? bytes : 1)) return true;
    }
    return false;
  }
  // True when [p, p + bytes) lies inside one live allocation.
  bool inside(const void* p, int64_t bytes) const {
    const char* a = static_cast<const char*>(p);
    for (const auto& [base, size] : live_) {
      if (a >= base && a + bytes <= base + size) return true;
    }
    return false;
  }

  int64_t to_host_calls = 0, from_host_calls = 0;
  std::map<const void*, int> from_host_into;  // device destination -> from_host calls

 private:
  std::map<const char*, int64_t> live_;
};

// Forwards to the host communicator, failing every call handed device memory.
class CheckingComm final : public Communicator {
 public:
  CheckingComm(Communicator& inner, const FakeDevice& device)
      : Communicator("checking"), inner_(inner), device_(device) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }

  void all_reduce(void* data, int64_t count, DType type, ReduceOp op) override {
    check(data, count, type, "all_reduce");
    inner_.all_reduce(data, count, type, op);
  }
  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType type,
                                           ReduceOp op) override {
    check(data, count, type, "iall_reduce");
    return inner_.iall_reduce(data, count, type, op);
  }
  void all_gather(const void* send, void* recv, int64_t count, DType type) override {
    check(send, count, type, "all_gather send");
    check(recv, count * size(), type, "all_gather recv");
    inner_.all_gather(send, recv, count, type);
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType type) override {
    check(send, count * size(), type, "reduce_scatter send");
    check(recv, count, type, "reduce_scatter recv");
    inner_.reduce_scatter(send, recv, count, type);
  }
  void broadcast(void* data, int64_t count, DType type, int root) override {
    check(data, count, type, "broadcast");
    inner_.broadcast(data, count, type, root);
  }
  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType type, int peer,
                                     int tag) override {
    check(data, count, type, "isend");
    return inner_.isend(data, count, type, peer, tag);
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType type, int peer,
                                     int tag) override {
    check(data, count, type, "irecv");
    return inner_.irecv(data, count, type, peer, tag);
  }
  void barrier() override {
    ++calls;
    inner_.barrier();
  }
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType type) override {
    int64_t sent = 0, received = 0;
    for (int64_t c : send_counts) sent += c;
    for (int64_t c : recv_counts) received += c;
    check(send, sent, type, "all_to_all_v send");
    check(recv, received, type, "all_to_all_v recv");
    inner_.all_to_all_v(send, send_counts, recv, recv_counts, type);
  }

  int64_t calls = 0;

 private:
  void check(const void* p, int64_t count, DType type, const char* what) {
    ++calls;
    EXPECT_FALSE(device_.overlaps(p, count * static_cast<int64_t>(dtype_bytes(type))))
        << "the host communicator was handed device memory (" << what << ")";
  }
  Communicator& inner_;
  const FakeDevice& device_;
};

template <typename T>
DeviceArray<T> upload(Device& dev, const std::vector<T>& v) {
  DeviceArray<T> a(dev, static_cast<int64_t>(v.size()));
  dev.from_host(a.data(), v.data(), a.bytes());
  return a;
}

template <typename T>
std::vector<T> download(Device& dev, const DeviceArray<T>& a) {
  std::vector<T> v(a.size());
  dev.to_host(v.data(), a.data(), a.bytes());
  return v;
}

inline MPI_Comm dup_world() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}

}  // namespace trident::staged_test

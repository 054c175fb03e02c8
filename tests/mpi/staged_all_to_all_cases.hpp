#pragma once
// The staged communicator's all_to_all_v (comm/staged_comm.hpp) against MpiCommunicator's on
// any number of ranks (test_staged_comm_np2 and _np3 include these cases): uneven counts with
// zero blocks (this rank's own block included), I64 values beyond 32 bits and F32, the
// exchange's staging copies (one up, one down; none for an empty exchange), the counters
// (calls and bytes equal to the MPI communicator's) and the refused arguments (thrown before
// any copy, not counted).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "comm/staged_comm.hpp"
#include "mpi/staged_fake_device.hpp"
#include "util/error.hpp"

namespace trident::staged_test {

// Elements rank `from` sends to rank `to`: 0 to 3, uneven, with zeros (a rank's own block too).
inline int64_t a2a_count(int from, int to) { return (3 * from + 2 * to + 1) % 4; }

// The i-th element rank `from` sends to rank `to`.
template <typename T>
T a2a_value(int from, int to, int64_t i) {
  if constexpr (sizeof(T) == 8)
    return static_cast<T>((int64_t{from + 1} << 40) + to * 100 + i);  // needs 64 bits
  else
    return static_cast<T>(from * 1000 + to * 100 + i) + T(0.25);
}

// What this rank sends (packed in rank order), its counts, and what it must receive.
template <typename T>
struct A2aPlan {
  std::vector<T> send, want;
  std::vector<int64_t> send_counts, recv_counts;
};

template <typename T>
A2aPlan<T> a2a_plan(int rank, int size) {
  A2aPlan<T> p;
  for (int q = 0; q < size; ++q) {
    p.send_counts.push_back(a2a_count(rank, q));
    p.recv_counts.push_back(a2a_count(q, rank));
    for (int64_t i = 0; i < a2a_count(rank, q); ++i) p.send.push_back(a2a_value<T>(rank, q, i));
    for (int64_t i = 0; i < a2a_count(q, rank); ++i) p.want.push_back(a2a_value<T>(q, rank, i));
  }
  return p;
}

class StagedAllToAll : public ::testing::Test {
 protected:
  void SetUp() override {
    mpi = std::make_unique<MpiCommunicator>(dup_world(), "host");
    plain = std::make_unique<MpiCommunicator>(dup_world(), "plain");
    checking = std::make_unique<CheckingComm>(*mpi, dev);
    comm = make_staged_communicator(*checking, dev, "staged");
    r = comm->rank();
    n = comm->size();
  }

  // One exchange of `type` through the staged communicator (device buffers) and the plain MPI
  // one (host buffers): both must give the expected blocks.
  template <typename T>
  void exchange(DType type) {
    const A2aPlan<T> p = a2a_plan<T>(r, n);
    ASSERT_GT(p.want.size() + p.send.size(), 0u) << "the pattern must move something here";
    auto send = upload(dev, p.send.empty() ? std::vector<T>{T(0)} : p.send);
    DeviceArray<T> recv(dev, static_cast<int64_t>(p.want.size()) + 1);
    const int64_t up = dev.to_host_calls, down = dev.from_host_calls;
    comm->all_to_all_v(send.data(), p.send_counts, recv.data(), p.recv_counts, type);
    EXPECT_EQ(dev.to_host_calls - up, p.send.empty() ? 0 : 1);
    EXPECT_EQ(dev.from_host_calls - down, p.want.empty() ? 0 : 1);
    std::vector<T> got = download(dev, recv);
    got.resize(p.want.size());
    EXPECT_EQ(got, p.want) << "staged, rank " << r;

    std::vector<T> host_send = p.send, host_recv(p.want.size() + 1);
    host_send.push_back(T(0));  // never empty: data() is a valid pointer
    plain->all_to_all_v(host_send.data(), p.send_counts, host_recv.data(), p.recv_counts, type);
    host_recv.resize(p.want.size());
    EXPECT_EQ(host_recv, p.want) << "MPI, rank " << r;
    EXPECT_EQ(got, host_recv);
  }

  FakeDevice dev;  // declared first: outlives the communicators and every DeviceArray
  std::unique_ptr<MpiCommunicator> mpi, plain;
  std::unique_ptr<CheckingComm> checking;
  std::unique_ptr<Communicator> comm;
  int r = 0, n = 1;
};

TEST_F(StagedAllToAll, UnevenAndZeroCountsMatchMpi) {
  exchange<int64_t>(DType::I64);
  exchange<float>(DType::F32);
  // Counted like the MPI communicator: two calls of the elements this rank sends.
  const CommStats& a = plain->stats();
  const CommStats& b = comm->stats();
  EXPECT_EQ(b.calls("all_to_all"), 2);
  EXPECT_EQ(b.calls("all_to_all"), a.calls("all_to_all"));
  EXPECT_EQ(b.ops.at("all_to_all").bytes, a.ops.at("all_to_all").bytes);
  int64_t sent = 0;
  for (int q = 0; q < n; ++q) sent += a2a_count(r, q);
  EXPECT_EQ(b.ops.at("all_to_all").bytes, sent * 8 + sent * 4);
  EXPECT_EQ(mpi->stats().calls("all_to_all"), 2);  // it really went through the host comm
}

TEST_F(StagedAllToAll, EmptyExchangeCopiesNothingAndIsCounted) {
  const std::vector<int64_t> zeros(static_cast<size_t>(n), 0);
  DeviceArray<float> d(dev, 1);
  const int64_t up = dev.to_host_calls, down = dev.from_host_calls;
  comm->all_to_all_v(d.data(), zeros, d.data(), zeros, DType::F32);
  EXPECT_EQ(dev.to_host_calls, up);
  EXPECT_EQ(dev.from_host_calls, down);
  EXPECT_EQ(comm->stats().calls("all_to_all"), 1);
  EXPECT_EQ(comm->stats().ops.at("all_to_all").bytes, 0);
}

TEST_F(StagedAllToAll, RefusedArgumentsCopyNothing) {
  DeviceArray<float> d(dev, 4);
  const int64_t up = dev.to_host_calls, host_calls = checking->calls;
  const std::vector<int64_t> too_few(static_cast<size_t>(n - 1), 1);
  std::vector<int64_t> negative(static_cast<size_t>(n), 0);
  negative.back() = -1;
  const std::vector<int64_t> zeros(static_cast<size_t>(n), 0);
  try {
    comm->all_to_all_v(d.data(), too_few, d.data(), zeros, DType::F32);
    ADD_FAILURE() << "a short count vector was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("communicator 'staged': all_to_all_v needs"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm->all_to_all_v(d.data(), negative, d.data(), zeros, DType::F32), Error);
  EXPECT_EQ(dev.to_host_calls, up);
  EXPECT_EQ(checking->calls, host_calls);
  EXPECT_EQ(comm->stats().calls("all_to_all"), 0);
}

}  // namespace trident::staged_test

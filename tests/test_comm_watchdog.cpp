// The collective watchdog's bookkeeping without MPI (comm/comm_watchdog.hpp): per-group
// sequence numbers of posted and completed operations, the wait the watchdog sees, the line it
// gives once a wait has lasted the timeout (fake clock), its thread calling on_timeout, the
// test hook's parser.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <thread>

#include "comm/comm_watchdog.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

// A communicator that only numbers its operations: the watchdog needs its name, world ranks
// and completed number. post / WaitScope are what every implementation calls.
class NumberingComm final : public Communicator {
 public:
  NumberingComm(const std::string& name, std::vector<int> ranks) : Communicator(name) {
    world_ranks_ = std::move(ranks);
  }
  int rank() const override { return 0; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  std::unique_ptr<CommRequest> iall_reduce(void*, int64_t, DType, ReduceOp) override {
    return nullptr;
  }
  void all_gather(const void*, void*, int64_t, DType) override {}
  void reduce_scatter(const void*, void*, int64_t, DType) override {}
  void broadcast(void*, int64_t, DType, int) override {}
  std::unique_ptr<CommRequest> isend(const void*, int64_t, DType, int, int) override {
    return nullptr;
  }
  std::unique_ptr<CommRequest> irecv(void*, int64_t, DType, int, int) override {
    return nullptr;
  }
  void barrier() override {}
};

struct FakeClock {
  double t = 100;
  WaitClock clock() {
    WaitClock c;
    c.now = [this] { return t; };
    c.sleep = [this](double s) { t += s; };
    return c;
  }
};

}  // namespace

TEST(CommWatchdog, NumbersOperationsPerGroup) {
  NumberingComm data("data", {1, 3}), tensor("tensor", {2, 3});
  EXPECT_EQ(data.post(kAllReduce), 1);
  EXPECT_EQ(data.post(kAllReduce), 2);
  EXPECT_EQ(tensor.post(kAllGather), 1) << "each group counts its own operations";
  EXPECT_EQ(data.last_posted(), 2);
  EXPECT_EQ(data.last_completed(), 0);
  { Communicator::WaitScope w(data, kAllReduce, 2); }
  EXPECT_EQ(data.last_completed(), 2);
  data.completed(1);  // an older request completing later does not move it back
  EXPECT_EQ(data.last_completed(), 2);
  EXPECT_EQ(tensor.last_completed(), 0);
}

TEST(CommWatchdog, NamesTheStuckWaitAfterTheTimeout) {
  FakeClock fc;
  CommWatchdog dog(3, 2.0, nullptr, fc.clock());
  NumberingComm data("data", {1, 3});
  data.set_watchdog(&dog);
  for (int i = 0; i < 41; ++i) {
    const int64_t seq = data.post(kAllReduce);
    Communicator::WaitScope w(data, kAllReduce, seq);
    fc.t += 5;  // a long wait that ends is no timeout: the watchdog only sees it while it lasts
  }
  EXPECT_EQ(dog.check(), "");
  const int64_t seq = data.post(kRecv);
  ASSERT_EQ(seq, 42);
  {
    Communicator::WaitScope w(data, kRecv, seq);
    fc.t += 1.9;
    EXPECT_EQ(dog.check(), "") << "within the timeout";
    fc.t += 0.1;
    EXPECT_EQ(dog.check(),
              "rank 3: communication timeout: recv #42 of group 'data' (world ranks 1,3) has not "
              "completed after 2 s (last completed: #41); a peer failed or stalled; ending the "
              "job with exit code 76 (parallel.comm_timeout_s)");
  }
  EXPECT_EQ(dog.check(), "") << "the wait ended";
  EXPECT_EQ(data.last_completed(), 42);
  data.set_watchdog(nullptr);
  EXPECT_EQ(kCommTimeoutExitCode, 76);
}

// Issue 56 (cosmetic): a timeout that TRIDENT_COMM_TIMEOUT_S set was cited as
// parallel.comm_timeout_s; the line names what set it.
TEST(CommWatchdog, LineCitesTheEnvironmentVariableWhenItSetTheTimeout) {
  FakeClock fc;
  CommWatchdog dog(0, 2.0, nullptr, fc.clock());
  NumberingComm world("world", {0, 1});
  world.set_watchdog(&dog);
  {
    Communicator::WaitScope w(world, kBarrier, world.post(kBarrier));
    fc.t += 2;
    setenv(kCommTimeoutEnv, "2", 1);
    const std::string line = dog.check();
    unsetenv(kCommTimeoutEnv);
    EXPECT_EQ(line.substr(line.rfind(" (")), " (TRIDENT_COMM_TIMEOUT_S)") << line;
    EXPECT_EQ(line.find("parallel.comm_timeout_s"), std::string::npos) << line;
    const std::string configured = dog.check();
    EXPECT_EQ(configured.substr(configured.rfind(" (")), " (parallel.comm_timeout_s)");
  }
  world.set_watchdog(nullptr);
}

// Issue 56 item 7: checkpoint I/O (collective HDF5 over MPI-IO) waits outside the
// Communicators; an I/O scope is watched with its own, longer limit and named by its file.
TEST(CommWatchdog, NamesACheckpointIoThatOutlastsItsOwnTimeout) {
  FakeClock fc;
  CommWatchdog dog(1, 2.0, nullptr, fc.clock());
  {
    const CommWatchdog::IoScope unwatched(&dog, "writing checkpoint '/c/step_00000005.h5'");
    fc.t += 1e6;
    EXPECT_EQ(dog.check(), "") << "no I/O timeout set: I/O is not watched";
  }
  dog.set_io_timeout(30.0, "checkpoint.io_timeout_s");
  EXPECT_DOUBLE_EQ(dog.poll_seconds(), 0.1) << "the shorter limit sets the poll period";
  NumberingComm world("world", {0, 1});
  world.set_watchdog(&dog);
  {
    const CommWatchdog::IoScope io(&dog, "writing checkpoint '/c/step_00000005.h5'");
    fc.t += 29.9;
    EXPECT_EQ(dog.check(), "") << "past the communication timeout, within the I/O one";
    fc.t += 0.1;
    EXPECT_EQ(dog.check(),
              "rank 1: checkpoint I/O timeout: writing checkpoint '/c/step_00000005.h5' has not "
              "finished after 30 s; another rank stalled in it (MPI-IO does not say which) or "
              "the file system does not answer; ending the job with exit code 76 "
              "(checkpoint.io_timeout_s)");
  }
  EXPECT_EQ(dog.check(), "") << "the I/O ended";
  {
    // A collective wait keeps its own, shorter limit.
    Communicator::WaitScope w(world, kBarrier, world.post(kBarrier));
    fc.t += 2;
    EXPECT_NE(dog.check().find("communication timeout: barrier #1"), std::string::npos);
  }
  world.set_watchdog(nullptr);
  EXPECT_THROW(dog.set_io_timeout(0, "checkpoint.io_timeout_s"), Error);
  { const CommWatchdog::IoScope none(nullptr, "reading checkpoint 'x'"); }  // watches nothing
}

TEST(CommWatchdog, ThreadCallsOnTimeoutOnce) {
  std::atomic<int> calls{0};
  std::string line;
  CommWatchdog dog(0, 0.2, [&](const std::string& l) {
    line = l;
    ++calls;
  });
  EXPECT_DOUBLE_EQ(dog.poll_seconds(), 0.01);
  NumberingComm world("world", {0, 1});
  world.set_watchdog(&dog);
  dog.start();
  {
    // Read before the scope starts the watchdog's clock: the timeout comes 0.2 s after it at
    // the earliest, whatever stalls the thread between the two.
    const auto t0 = std::chrono::steady_clock::now();
    Communicator::WaitScope w(world, kBarrier, world.post(kBarrier));
    while (calls == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, 0.2);
    EXPECT_LT(waited, 5.0);
  }
  dog.stop();
  EXPECT_EQ(calls, 1);
  EXPECT_NE(line.find("barrier #1 of group 'world' (world ranks 0,1)"), std::string::npos)
      << line;
  world.set_watchdog(nullptr);
}

TEST(CommWatchdog, SkipHookParsing) {
  const SkipHook h = parse_skip_hook("1:data:5");
  EXPECT_EQ(h.rank, 1);
  EXPECT_EQ(h.group, "data");
  EXPECT_EQ(h.seq, 5);
  for (const char* bad : {"", "1", "1:data", "x:data:5", "1::5", "1:data:0", "1:data:5x",
                          "-1:data:5"}) {
    try {
      parse_skip_hook(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("TRIDENT_TEST_SKIP_COLLECTIVE='") + bad +
                    "' is not rank:group:seq (a world rank, a group name, an operation number "
                    ">= 1)");
    }
  }
}

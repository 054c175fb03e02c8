// Bounded waits and the abort order (comm/comm_watch.hpp), without a GPU: the GPU code plugs
// cudaStreamQuery and ncclCommGetAsyncError into these same functions; here fakes stand in.
//  * a "stream" that never completes ends in the timeout error (a fake clock runs the default
//    600 s in no time; the real clock with a short timeout finishes within seconds), after the
//    communicators were aborted, with a message naming the rank, the wait, the communicators
//    and their last operations;
//  * an asynchronous error ends the wait at once, aborts every communicator and is reported;
//  * a stream that completes after a while returns normally and aborts nothing;
//  * teardown: a Backend (runtime/backend.hpp) with a fake GPU device (its memory freed through
//    the watch, as CudaDevice's is) and fake NCCL communicators: while an exception unwinds,
//    every communicator is aborted BEFORE the first device memory is freed (also memory
//    destroyed before the backend, as the trainer's optimizer state is) and the device never
//    waits for its stream; without an exception nothing is aborted, communicators are
//    destroyed after the model and before the device.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_watch.hpp"
#include "tensor/device.hpp"
#include "runtime/backend.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

// A clock that only moves when the wait sleeps (a sleep of 0, a yield, moves it by 1 us).
struct FakeClock {
  double t = 1000.0;
  int sleeps = 0;
  WaitClock clock() {
    WaitClock c;
    c.now = [this] { return t; };
    c.sleep = [this](double s) {
      ++sleeps;
      t += s > 0 ? s : 1e-6;
    };
    return c;
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(comm_wait, FinishedWaitReturnsAtOnce) {
  FakeClock fc;
  int polls = 0;
  const WaitResult r = poll_until([&] { return ++polls > 0; }, nullptr, 1.0, fc.clock());
  EXPECT_EQ(r.end, WaitEnd::Done);
  EXPECT_EQ(polls, 1);
  EXPECT_EQ(fc.sleeps, 0);
}

TEST(comm_wait, StreamThatNeverCompletesTimesOut) {
  FakeClock fc;
  int aborts = 0;
  const std::string e = error_of([&] {
    bounded_wait([] { return false; }, [] { return std::string(); }, 600.0,
                 [](const WaitResult& r) {
                   return "timed out after " + std::to_string(static_cast<int>(r.seconds)) + " s";
                 },
                 [&] { ++aborts; }, fc.clock());
  });
  EXPECT_EQ(e, "timed out after 600 s");
  EXPECT_EQ(aborts, 1);
  EXPECT_GE(fc.t - 1000.0, 600.0);
  EXPECT_LT(fc.t - 1000.0, 600.01);  // sleeps are at most 1 ms: it stops right at the limit
}

TEST(comm_wait, RealClockTimeoutEndsWithinSeconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const WaitResult r = poll_until([] { return false; }, [] { return std::string(); }, 0.2);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.end, WaitEnd::TimedOut);
  EXPECT_GE(s, 0.2);
  EXPECT_LT(s, 5.0);
  std::printf("a stream that never completes: timeout of 0.2 s reported after %.3f s\n", s);
}

TEST(comm_wait, CompletesAfterSomePollsWithoutAbort) {
  FakeClock fc;
  int polls = 0, aborts = 0;
  bounded_wait([&] { return ++polls == 500; }, [] { return std::string(); }, 600.0,
               [](const WaitResult&) { return std::string("unexpected"); }, [&] { ++aborts; },
               fc.clock());
  EXPECT_EQ(polls, 500);
  EXPECT_EQ(aborts, 0);
  EXPECT_LT(fc.t - 1000.0, 1.0);  // backs off to 1 ms sleeps, no more
}

TEST(comm_wait, AsyncErrorEndsTheWaitAndAborts) {
  FakeClock fc;
  int polls = 0, aborts = 0;
  std::string seen;
  const std::string e = error_of([&] {
    bounded_wait([&] { return ++polls < 0; },
                 [&] { return polls >= 10 ? std::string("remote process exited") : ""; }, 600.0,
                 [&](const WaitResult& r) {
                   seen = r.error;
                   return std::string(r.end == WaitEnd::AsyncError ? "async: " : "other: ") +
                          r.error;
                 },
                 [&] { ++aborts; }, fc.clock());
  });
  EXPECT_EQ(e, "async: remote process exited");
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(polls, 10);
  EXPECT_LT(fc.t - 1000.0, 1.0);  // at once, not after the timeout
}

TEST(comm_wait, FailingQueryAbortsThenPropagates) {
  int aborts = 0;
  EXPECT_THROW(bounded_wait([]() -> bool { throw Error("cudaErrorLaunchFailure"); },
                            nullptr, 1.0, [](const WaitResult&) { return std::string(); },
                            [&] { ++aborts; }),
               Error);
  EXPECT_EQ(aborts, 1);
}

TEST(comm_wait, TimeoutFromTheEnvironment) {
  unsetenv(kCommTimeoutEnv);
  EXPECT_EQ(comm_timeout_from_env(), kDefaultCommTimeoutSeconds);
  EXPECT_EQ(kDefaultCommTimeoutSeconds, 600.0);
  setenv(kCommTimeoutEnv, "2.5", 1);
  EXPECT_EQ(comm_timeout_from_env(), 2.5);
  EXPECT_EQ(CommWatch(0).timeout_s(), 2.5);
  EXPECT_EQ(CommWatch(0, 7).timeout_s(), 7);  // an explicit timeout wins
  for (const char* bad : {"abc", "0", "-3", "5s"}) {
    setenv(kCommTimeoutEnv, bad, 1);
    EXPECT_EQ(error_of([] { comm_timeout_from_env(); }),
              std::string("TRIDENT_COMM_TIMEOUT_S='") + bad +
                  "' is not a number of seconds > 0 (the communication timeout)");
  }
  unsetenv(kCommTimeoutEnv);
}

// A fake NCCL communicator as CommWatch sees it: an async-error query and an abort, recorded.
struct FakeMember {
  std::string async;
  int aborts = 0;
  int id = -1;
  void join(CommWatch& w, const std::string& name, int handles, std::vector<std::string>* log) {
    id = w.add(name, handles, [this] { return async; },
               [this, log, name] {
                 ++aborts;
                 if (log) log->push_back("abort " + name);
               });
  }
};

TEST(comm_wait, ConfiguredTimeoutUnlessTheEnvironmentOverridesIt) {
  unsetenv(kCommTimeoutEnv);
  EXPECT_EQ(comm_timeout_seconds(42), 42) << "parallel.comm_timeout_s";
  setenv(kCommTimeoutEnv, "2.5", 1);
  EXPECT_EQ(comm_timeout_seconds(42), 2.5);
  setenv(kCommTimeoutEnv, "abc", 1);
  EXPECT_EQ(error_of([] { comm_timeout_seconds(42); }),
            "TRIDENT_COMM_TIMEOUT_S='abc' is not a number of seconds > 0 (the communication "
            "timeout)");
  unsetenv(kCommTimeoutEnv);
}

TEST(comm_wait, TimeoutIsACommTimeoutErrorAndAnAsyncErrorIsNot) {
  // main() ends the job with the watchdog's exit code 76 on a CommTimeoutError, 1 otherwise.
  FakeClock fc;
  auto describe = [](const WaitResult&) { return std::string("failed"); };
  EXPECT_THROW(bounded_wait([] { return false; }, nullptr, 5.0, describe, nullptr, fc.clock()),
               CommTimeoutError);
  bool timeout_type = false, thrown = false;
  try {
    bounded_wait([] { return false; }, [] { return std::string("link down"); }, 5.0, describe,
                 nullptr, fc.clock());
  } catch (const CommTimeoutError&) {
    timeout_type = true;
  } catch (const Error&) {
    thrown = true;
  }
  EXPECT_TRUE(thrown);
  EXPECT_FALSE(timeout_type);
}

TEST(comm_wait, WatchTimeoutAbortsEveryCommunicatorAndNamesThem) {
  FakeClock fc;
  CommWatch watch(3, 600.0, fc.clock());
  FakeMember data, pipe;
  data.join(watch, "data", 1, nullptr);
  pipe.join(watch, "pipeline", 2, nullptr);
  EXPECT_TRUE(watch.active());
  EXPECT_EQ(watch.handle_count(), 3);
  EXPECT_EQ(watch.summary(), "3 (data 1, pipeline 2)");
  for (int i = 0; i < 42; ++i) watch.posted(data.id, "all_reduce");
  watch.posted(pipe.id, "send to 2");
  watch.posted(pipe.id, "recv from 2");
  const std::string e = error_of([&] { watch.wait([] { return false; }, "to_host on cuda:0"); });
  EXPECT_EQ(e,
            "rank 3: communication timeout: to_host on cuda:0 did not finish within 600 s; last "
            "operations posted: communicator 'data' all_reduce (call 42), communicator "
            "'pipeline' recv from 2 (call 2); all communicators of this rank aborted (a peer "
            "failed or stalled; parallel.comm_timeout_s sets the limit)");
  EXPECT_EQ(data.aborts, 1);
  EXPECT_EQ(pipe.aborts, 1);
  EXPECT_TRUE(watch.aborted());
  EXPECT_FALSE(watch.active());
  watch.abort_all("again");  // once only
  EXPECT_EQ(data.aborts, 1);
  FakeMember late;
  late.join(watch, "late", 1, nullptr);  // joining a watch that gave up: aborted at once
  EXPECT_EQ(late.aborts, 1);
  std::printf("%s\n", e.c_str());
}

TEST(comm_wait, WatchAsyncErrorAbortsAndReports) {
  FakeClock fc;
  CommWatch watch(1, 600.0, fc.clock());
  FakeMember tensor, pipe;
  tensor.join(watch, "tensor", 1, nullptr);
  pipe.join(watch, "pipeline", 2, nullptr);
  watch.posted(pipe.id, "recv from 0");
  int polls = 0;
  const std::string e = error_of([&] {
    watch.wait(
        [&] {
          if (++polls == 3) pipe.async = "point-to-point channel: remote process exited";
          return false;
        },
        "synchronize on cuda:0");
  });
  EXPECT_EQ(e.rfind("rank 1: communicator 'pipeline' reported an asynchronous error: "
                    "point-to-point channel: remote process exited (during synchronize on "
                    "cuda:0",
                    0),
            0u)
      << e;
  EXPECT_TRUE(contains(e, "last operations posted: communicator 'pipeline' recv from 0 (call 1); "
                          "all communicators of this rank aborted"))
      << e;
  EXPECT_EQ(tensor.aborts, 1);
  EXPECT_EQ(pipe.aborts, 1);
  EXPECT_LT(fc.t - 1000.0, 1.0);
  // check(): the non-blocking form (a request's test()).
  CommWatch w2(0, 600.0, fc.clock());
  FakeMember m;
  m.join(w2, "data", 1, nullptr);
  EXPECT_NO_THROW(w2.check("test of all_reduce"));
  m.async = "unhandled system error";
  EXPECT_TRUE(contains(error_of([&] { w2.check("test of all_reduce"); }),
                       "communicator 'data' reported an asynchronous error: unhandled system "
                       "error (during test of all_reduce)"));
  EXPECT_EQ(m.aborts, 1);
}

TEST(comm_wait, RemovedCommunicatorIsNeverCalled) {
  CommWatch watch(0, 1.0);
  FakeMember a;
  a.join(watch, "a", 1, nullptr);
  watch.remove(a.id);
  EXPECT_FALSE(watch.active());
  EXPECT_EQ(watch.summary(), "0");
  watch.abort_all("test");
  EXPECT_EQ(a.aborts, 0);
}

// ---- teardown order, through the real Backend and fakes that free/wait as CudaDevice does ----

// Device memory freed through the watch (CudaDevice::allocate's deleter), and a destructor that
// waits for its stream unless the watch says an error is being handled (~CudaDevice).
class FakeGpu final : public Device {
 public:
  FakeGpu(std::shared_ptr<CommWatch> watch, std::vector<std::string>& log)
      : watch_(std::move(watch)), log_(log) {}
  ~FakeGpu() override {
    if (!watch_->before_teardown()) log_.push_back("device waits for its stream");
    log_.push_back("device destroyed");
  }
  bool is_host() const override { return false; }
  std::string describe() const override { return "fake gpu"; }
  std::shared_ptr<void> allocate(int64_t bytes) override {
    auto* p = new char[bytes > 0 ? bytes : 1];
    return std::shared_ptr<void>(p, [watch = watch_, log = &log_](void* q) {
      watch->before_teardown();
      log->push_back("free");
      delete[] static_cast<char*>(q);
    });
  }
  void to_host(void*, const void*, int64_t) override {}
  void from_host(void*, const void*, int64_t) override {}
  void copy(void*, const void*, int64_t) override {}
  void fill_zero(void*, int64_t) override {}
  void scale(float*, int64_t, float) override {}
  void add(float*, const float*, int64_t) override {}
  double square_sum(const std::vector<Range>&) override { return 0; }
  void adamw(float*, const float*, float*, float*, int64_t, const AdamWStep&,
             uint16_t*) override {}
  void synchronize() override {}

 private:
  std::shared_ptr<CommWatch> watch_;
  std::vector<std::string>& log_;
};

// A communicator that joins the watch as NcclCommunicator does.
class FakeNccl final : public Communicator {
 public:
  FakeNccl(const std::string& name, std::shared_ptr<CommWatch> watch,
           std::vector<std::string>& log)
      : Communicator(name), watch_(std::move(watch)), log_(log) {
    id_ = watch_->add(name, 1, [] { return std::string(); }, [this] {
      aborted_ = true;
      log_.push_back("abort " + name_);
    });
  }
  ~FakeNccl() override {
    if (watch_->before_teardown()) aborted_ = true;
    watch_->remove(id_);
    log_.push_back(aborted_ ? "release aborted " + name_ : "destroy " + name_);
  }
  int rank() const override { return 0; }
  int size() const override { return 2; }
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
  std::unique_ptr<CommRequest> irecv(void*, int64_t, DType, int, int) override { return nullptr; }
  void barrier() override {}

 private:
  std::shared_ptr<CommWatch> watch_;
  std::vector<std::string>& log_;
  int id_ = -1;
  bool aborted_ = false;
};

// The trainer's layout: the backend first, then state in device memory (optimizer moments,
// gradient buckets), so that state is destroyed BEFORE the backend.
struct TrainerLike {
  Backend backend;
  DeviceArray<float> moments;
  explicit TrainerLike(std::vector<std::string>& log,
                       std::shared_ptr<CommWatch> watch = std::make_shared<CommWatch>(0, 600.0)) {
    backend.watch = std::move(watch);
    backend.device = std::make_unique<FakeGpu>(backend.watch, log);
    for (const char* g : {"tensor", "data"}) {
      backend.owned.push_back(std::make_unique<FakeNccl>(g, backend.watch, log));
    }
    backend.comms[dim_index(Dim::Tensor)] = backend.owned[0].get();
    backend.comms[dim_index(Dim::Data)] = backend.owned[1].get();
    moments = DeviceArray<float>(*backend.device, 16);
  }
};

TEST(comm_teardown, ErrorAbortsBeforeTheFirstFreeAndNeverWaits) {
  std::vector<std::string> log;
  try {
    TrainerLike t(log);
    DeviceArray<float> scratch(*t.backend.device, 4);  // a buffer in the failing scope
    throw Error("a peer failed");
  } catch (const Error&) {
  }
  const std::vector<std::string> expect{
      "abort tensor", "abort data",                                // first
      "free", "free",                                              // scratch, moments
      "release aborted tensor", "release aborted data", "device destroyed"};
  EXPECT_EQ(log, expect);
  for (const std::string& l : log) std::printf("  %s\n", l.c_str());
}

TEST(comm_teardown, NormalEndAbortsNothing) {
  std::vector<std::string> log;
  {
    TrainerLike t(log);
  }
  const std::vector<std::string> expect{"free", "destroy tensor", "destroy data",
                                        "device waits for its stream", "device destroyed"};
  EXPECT_EQ(log, expect);
}

TEST(comm_teardown, AfterAFailedWaitNothingWaits) {
  std::vector<std::string> log;
  std::string e;
  FakeClock fc;
  {
    TrainerLike t(log, std::make_shared<CommWatch>(0, 600.0, fc.clock()));
    e = error_of([&] { t.backend.watch->wait([] { return false; }, "to_host"); });
  }  // destroyed normally (the error was handled), but the communicators are already aborted
  EXPECT_TRUE(contains(e, "rank 0: communication timeout: to_host did not finish within 600 s"))
      << e;
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log[0], "abort tensor");
  EXPECT_EQ(log[1], "abort data");
  for (const std::string& l : log) EXPECT_NE(l, "device waits for its stream");
}

}  // namespace
}  // namespace trident

// The collective watchdog (see comm_watchdog.hpp) and the communicators' sequence numbers.
#include "comm/comm_watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "util/error.hpp"
#include "util/test_hooks.hpp"

namespace trident {

// ----------------------------------------------------------------------------- SkipHook

SkipHook parse_skip_hook(const std::string& text) {
  auto bad = [&] {
    return Error(std::string(test_hook_variable(TestHook::SkipCollective)) + "='" + text +
                 "' is not rank:group:seq (a world rank, a group name, an operation number >= 1)");
  };
  const auto a = text.find(':');
  const auto b = a == std::string::npos ? a : text.find(':', a + 1);
  if (b == std::string::npos) throw bad();
  SkipHook h;
  h.group = text.substr(a + 1, b - a - 1);
  try {
    size_t used = 0;
    h.rank = std::stoi(text.substr(0, a), &used);
    if (used != a) throw bad();
    const std::string seq = text.substr(b + 1);
    h.seq = std::stoll(seq, &used);
    if (used != seq.size()) throw bad();
  } catch (const std::logic_error&) {  // stoi/stoll: not a number, out of range
    throw bad();
  }
  if (h.rank < 0 || h.group.empty() || h.seq < 1) throw bad();
  return h;
}

// -------------------------------------------------------------------------- CommWatchdog

CommWatchdog::CommWatchdog(int world_rank, double timeout_s, OnTimeout on_timeout,
                           WaitClock clock)
    : world_rank_(world_rank),
      timeout_s_(timeout_s),
      on_timeout_(std::move(on_timeout)),
      clock_(std::move(clock)) {
  if (!(timeout_s_ > 0)) throw Error("the communication timeout must be > 0 seconds");
}

CommWatchdog::~CommWatchdog() { stop(); }

void CommWatchdog::set_io_timeout(double seconds, std::string key) {
  if (!(seconds > 0)) throw Error(key + ": the checkpoint I/O timeout must be > 0 seconds");
  std::lock_guard<std::mutex> lock(mutex_);
  io_timeout_s_ = seconds;
  io_key_ = std::move(key);
}

double CommWatchdog::poll_seconds() const {
  const double shortest = io_timeout_s_ > 0 ? std::min(timeout_s_, io_timeout_s_) : timeout_s_;
  return std::clamp(shortest / 20, 0.01, 1.0);
}

void CommWatchdog::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void CommWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CommWatchdog::run() {
  const auto period = std::chrono::duration<double>(poll_seconds());
  std::unique_lock<std::mutex> lock(stop_mutex_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    const std::string line = check();
    if (line.empty()) continue;
    // on_timeout ends the process (MPI_Abort); should it return, the watchdog has done its part.
    lock.unlock();
    if (on_timeout_) on_timeout_(line);
    return;
  }
}

void CommWatchdog::wait_begin(const Communicator& comm, const std::string& op, int64_t seq) {
  const double now = clock_.now();
  std::lock_guard<std::mutex> lock(mutex_);
  comm_ = &comm;
  op_ = &op;
  seq_ = seq;
  completed_before_ = comm.last_completed();
  since_ = now;
}

void CommWatchdog::wait_end() {
  std::lock_guard<std::mutex> lock(mutex_);
  comm_ = nullptr;
}

void CommWatchdog::io_begin(const std::string& what) {
  const double now = clock_.now();
  std::lock_guard<std::mutex> lock(mutex_);
  io_what_ = what;
  io_since_ = now;
}

void CommWatchdog::io_end() {
  std::lock_guard<std::mutex> lock(mutex_);
  io_what_.clear();
}

CommWatchdog::IoScope::IoScope(CommWatchdog* watchdog, const std::string& what)
    : watchdog_(watchdog) {
  if (watchdog_) watchdog_->io_begin(what);
}

CommWatchdog::IoScope::~IoScope() {
  if (watchdog_) watchdog_->io_end();
}

std::string CommWatchdog::check() const {
  const double now = clock_.now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (io_timeout_s_ > 0 && !io_what_.empty() && now - io_since_ >= io_timeout_s_) {
    std::ostringstream m;
    m << "rank " << world_rank_ << ": checkpoint I/O timeout: " << io_what_
      << " has not finished after " << io_timeout_s_
      << " s; another rank stalled in it (MPI-IO does not say which) or the file system does "
         "not answer; ending the job with exit code "
      << kCommTimeoutExitCode << " (" << io_key_ << ")";
    return m.str();
  }
  if (comm_ == nullptr || now - since_ < timeout_s_) return "";
  std::ostringstream m;
  m << "rank " << world_rank_ << ": communication timeout: " << *op_ << " #" << seq_
    << " of group '" << comm_->name() << "' (world ranks ";
  const std::vector<int>& ranks = comm_->world_ranks();
  if (ranks.empty()) m << "unknown";
  for (size_t i = 0; i < ranks.size(); ++i) m << (i ? "," : "") << ranks[i];
  m << ") has not completed after " << timeout_s_ << " s (last completed: #" << completed_before_
    << "); a peer failed or stalled; ending the job with exit code " << kCommTimeoutExitCode
    << " (" << comm_timeout_key() << ")";
  return m.str();
}

void CommWatchdog::maybe_stall(const Communicator& comm, const std::string& op,
                               int64_t seq) const {
  if (skip_.rank != world_rank_ || skip_.seq != seq || skip_.group != comm.name()) return;
  std::fprintf(stderr, "trident: test hook %s: rank %d never joins %s #%lld of group '%s'\n",
               test_hook_variable(TestHook::SkipCollective), world_rank_, op.c_str(),
               static_cast<long long>(seq), comm.name().c_str());
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace trident

// Bounded waits and the communicators' abort (see comm_watch.hpp).
#include "comm/comm_watch.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <thread>

#include "util/error.hpp"

namespace trident {

double comm_timeout_from_env() {
  const char* v = std::getenv(kCommTimeoutEnv);
  if (v == nullptr || *v == '\0') return kDefaultCommTimeoutSeconds;
  errno = 0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !std::isfinite(s) || s <= 0) {
    throw Error(std::string(kCommTimeoutEnv) + "='" + v +
                "' is not a number of seconds > 0 (the communication timeout)");
  }
  return s;
}

namespace {
// Whether TRIDENT_COMM_TIMEOUT_S sets the limit (set and not empty), over the config key.
bool timeout_from_environment() {
  const char* v = std::getenv(kCommTimeoutEnv);
  return v != nullptr && *v != '\0';
}
}  // namespace

double comm_timeout_seconds(double configured) {
  return timeout_from_environment() ? comm_timeout_from_env() : configured;
}

std::string comm_timeout_key() {
  return timeout_from_environment() ? kCommTimeoutEnv : "parallel.comm_timeout_s";
}

WaitClock WaitClock::steady() {
  WaitClock c;
  c.now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  c.sleep = [](double seconds) {
    if (seconds <= 0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    }
  };
  return c;
}

WaitResult poll_until(const std::function<bool()>& is_done,
                      const std::function<std::string()>& async_error, double timeout_s,
                      const WaitClock& clock) {
  WaitResult r;
  if (is_done()) return r;
  const double t0 = clock.now();
  constexpr int kSpins = 64;            // polls without sleeping (short waits stay cheap)
  constexpr double kFirstSleep = 1e-5;  // then 10 us, doubling ...
  constexpr double kMaxSleep = 1e-3;    // ... up to 1 ms
  double pause = kFirstSleep;
  for (int poll = 1;; ++poll) {
    std::string error = async_error ? async_error() : std::string();
    if (!error.empty()) {
      r.end = WaitEnd::AsyncError;
      r.error = std::move(error);
      r.seconds = clock.now() - t0;
      return r;
    }
    const double waited = clock.now() - t0;
    if (waited >= timeout_s) {
      r.end = WaitEnd::TimedOut;
      r.seconds = waited;
      return r;
    }
    if (poll < kSpins) {
      clock.sleep(0);
    } else {
      clock.sleep(pause);
      pause = std::min(2 * pause, kMaxSleep);
    }
    if (is_done()) {
      r.seconds = clock.now() - t0;
      return r;
    }
  }
}

void bounded_wait(const std::function<bool()>& is_done,
                  const std::function<std::string()>& async_error, double timeout_s,
                  const std::function<std::string(const WaitResult&)>& describe,
                  const std::function<void()>& on_failure, const WaitClock& clock) {
  WaitResult r;
  try {
    r = poll_until(is_done, async_error, timeout_s, clock);
  } catch (...) {
    if (on_failure) on_failure();
    throw;
  }
  if (r.end == WaitEnd::Done) return;
  if (on_failure) on_failure();
  if (r.end == WaitEnd::TimedOut) throw CommTimeoutError(describe(r));
  throw Error(describe(r));
}

// ------------------------------------------------------------------------------- CommWatch

CommWatch::CommWatch(int rank, double timeout_s, WaitClock clock)
    : rank_(rank),
      timeout_s_(timeout_s > 0 ? timeout_s : comm_timeout_from_env()),
      clock_(std::move(clock)) {}

int CommWatch::add(const std::string& name, int handles, std::function<std::string()> async_error,
                   std::function<void()> abort) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Member m{next_id_++, name, handles, std::move(async_error), std::move(abort), "", 0, true};
  if (aborted_) {  // joining a watch that already gave up: abort at once
    if (m.abort) m.abort();
    m.live = false;
  }
  members_.push_back(std::move(m));
  return members_.back().id;
}

void CommWatch::remove(int id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  members_.erase(std::remove_if(members_.begin(), members_.end(),
                                [id](const Member& m) { return m.id == id; }),
                 members_.end());
}

void CommWatch::posted(int id, const std::string& op) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (Member& m : members_) {
    if (m.id == id) {
      if (m.last_op != op) m.last_op = op;
      ++m.calls;
      return;
    }
  }
}

bool CommWatch::active() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return std::any_of(members_.begin(), members_.end(), [](const Member& m) { return m.live; });
}

int CommWatch::handle_count() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  int n = 0;
  for (const Member& m : members_) n += m.live ? m.handles : 0;
  return n;
}

std::string CommWatch::summary() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::ostringstream s;
  s << handle_count();
  bool first = true;
  for (const Member& m : members_) {
    if (!m.live) continue;
    s << (first ? " (" : ", ") << m.name << " " << m.handles;
    first = false;
  }
  if (!first) s << ")";
  return s.str();
}

bool CommWatch::aborted() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return aborted_;
}

std::string CommWatch::async_error() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (const Member& m : members_) {
    if (!m.live || !m.async_error) continue;
    std::string e = m.async_error();
    if (!e.empty()) return "communicator '" + m.name + "' reported an asynchronous error: " + e;
  }
  return "";
}

void CommWatch::abort_all(const std::string& reason) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  for (Member& m : members_) {
    if (!m.live) continue;
    m.live = false;
    if (m.abort) m.abort();
  }
}

std::string CommWatch::last_operations() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::ostringstream s;
  bool any = false;
  for (const Member& m : members_) {
    if (m.calls == 0) continue;
    s << (any ? ", " : "") << "communicator '" << m.name << "' " << m.last_op << " (call "
      << m.calls << ")";
    any = true;
  }
  return any ? s.str() : "none";
}

std::string CommWatch::describe_failure(const WaitResult& r, const std::string& what) const {
  std::ostringstream m;
  m << "rank " << rank_ << ": ";
  if (r.end == WaitEnd::TimedOut) {
    m << "communication timeout: " << what << " did not finish within " << timeout_s_
      << " s; last operations posted: " << last_operations()
      << "; all communicators of this rank aborted (a peer failed or stalled; "
      << comm_timeout_key() << " sets the limit)";
  } else {
    m << r.error << " (during " << what;
    if (r.seconds > 0) m << ", after " << r.seconds << " s";
    m << "); last operations posted: " << last_operations()
      << "; all communicators of this rank aborted";
  }
  return m.str();
}

void CommWatch::check(const std::string& what) {
  WaitResult r;
  r.error = async_error();
  if (r.error.empty()) return;
  r.end = WaitEnd::AsyncError;
  abort_all("asynchronous error: " + what);
  throw Error(describe_failure(r, what));
}

void CommWatch::wait(const std::function<bool()>& is_done, const std::string& what) {
  bounded_wait(
      is_done, [this] { return async_error(); }, timeout_s_,
      [this, &what](const WaitResult& r) { return describe_failure(r, what); },
      [this, &what] { abort_all("failed wait: " + what); }, clock_);
}

bool CommWatch::wait_quietly(const std::function<bool()>& is_done,
                             const std::string& what) noexcept {
  try {
    wait(is_done, what);
    return true;
  } catch (...) {
    abort_all("failed wait: " + what);
    return false;
  }
}

bool CommWatch::before_teardown() noexcept {
  try {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (aborted_) return true;
    if (std::uncaught_exceptions() == 0) return false;
    if (!active()) return false;
    abort_all("an exception is unwinding");
    return true;
  } catch (...) {
    return true;
  }
}

}  // namespace trident

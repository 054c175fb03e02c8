// The stop signals' own thread (stop_signals.hpp). The state is process-wide because signals
// are; it lives here only.
#include "stop_signals.hpp"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace trident {

namespace {

std::atomic<bool> g_catching{false};
std::atomic<int> g_stop_signal{0};

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}

// Ends the process as `signal`'s default action does: unblocked on this thread only, with the
// default disposition, raised on this thread.
[[noreturn]] void die_of(int signal) {
  std::signal(signal, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signal);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(signal);
  std::_Exit(128 + signal);  // not reached: SIGUSR1's and SIGTERM's default is to terminate
}

void wait_for_stop_signals() {
  const sigset_t set = stop_set();
  for (;;) {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) continue;
    if (!g_catching.load()) die_of(signal);
    g_stop_signal.store(signal);
  }
}

}  // namespace

void start_stop_signal_thread() {
  const sigset_t set = stop_set();
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) {
    std::fprintf(stderr, "trident: error: cannot block SIGUSR1/SIGTERM for the stop thread\n");
    std::exit(1);
  }
  // Detached: it waits in sigwait until the process ends.
  std::thread(wait_for_stop_signals).detach();
}

void catch_stop_signals() { g_catching.store(true); }

int stop_signal() { return g_stop_signal.load(); }

}  // namespace trident

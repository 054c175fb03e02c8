#pragma once
// Wall-clock seconds since a steady_clock time point (host time: the CPU's own work, waits,
// file I/O; a GPU stream's time is util/interval_timer.hpp's).
#include <chrono>

namespace trident {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace trident

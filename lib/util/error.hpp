#pragma once
// One exception type for every user-facing failure (bad config, bad data, bad layout).
// main() catches it, prints "trident: error: <what>" once and exits non-zero on all ranks.
#include <stdexcept>
#include <string>

namespace trident {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A communication operation did not complete within the communication timeout (a device
// stream's bounded wait, comm/comm_watch.hpp): main() ends the job with kCommTimeoutExitCode
// (comm/comm_watchdog.hpp) instead of 1.
class CommTimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace trident

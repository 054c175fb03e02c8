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

}  // namespace trident

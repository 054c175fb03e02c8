#pragma once
// "[first, first + count)" for the error of a refused token read, whatever the caller passed:
// a read is refused precisely when the range is odd, and first + count may then overflow.
#include <cstdint>
#include <string>

namespace trident {

inline std::string token_range_text(int64_t first, int64_t count) {
  int64_t end = 0;
  const std::string end_text = __builtin_add_overflow(first, count, &end)
                                   ? std::to_string(first) + " + " + std::to_string(count)
                                   : std::to_string(end);
  return "[" + std::to_string(first) + ", " + end_text + ")";
}

}  // namespace trident

#pragma once
// One exception type for every user-facing failure (bad config, bad data, bad layout).
// main() catches it, prints "trident: error: <what>" once and exits non-zero on all ranks.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

namespace trident {

// `text` with its control characters escaped as a TOML string escapes them (\n, \t, \u001B):
// an error that quotes a file name or a value holding a newline stays one line.
inline std::string printable_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (u >= 0x20 && u != 0x7F) {
      out += ch;
      continue;
    }
    switch (ch) {
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default: {
        char code[8];
        std::snprintf(code, sizeof code, "\\u%04X", static_cast<unsigned>(u));
        out += code;
      }
    }
  }
  return out;
}

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

#pragma once
// The run's lines on standard output, written by one rank (the logging rank: world rank 0) so
// that an N-rank job prints each line once. Every print is flushed at once: a job killed (or a
// rank that hangs) leaves its log complete up to that point, and the lines keep their order
// against what other processes write to the same terminal or file.
#include <cstdarg>
#include <cstdio>
#include <string>

namespace trident {

class RankLog {
 public:
  // `logging_rank`: whether this process prints; on every other rank the calls do nothing.
  explicit RankLog(bool logging_rank) : on_(logging_rank) {}
  bool on() const { return on_; }

  // printf's format and arguments; the text carries its own newlines.
  [[gnu::format(printf, 2, 3)]] void print(const char* format, ...) const {
    if (!on_) return;
    va_list args;
    va_start(args, format);
    std::vprintf(format, args);
    va_end(args);
    std::fflush(stdout);
  }
  // Text as it is (a report of several lines, each ending in '\n').
  void text(const std::string& s) const {
    if (!on_ || s.empty()) return;
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
  }

 private:
  bool on_;
};

}  // namespace trident

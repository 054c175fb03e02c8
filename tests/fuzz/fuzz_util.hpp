#pragma once
// Helpers shared by the libFuzzer targets (tests/fuzz/fuzz_*.cpp, docs/fuzzing.md).
//
// A target feeds its input to a reader and accepts exactly one outcome besides success: a
// trident::Error of one line that names the file it was given. Anything else (another
// exception type, a crash, a sanitizer report, a hang, a leak) is a finding: the harness
// aborts (expect) or lets the exception escape, and libFuzzer saves the input.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "util/error.hpp"

namespace trident::fuzz {

// Aborts with `what` when `condition` is false: a broken invariant of the reader under test.
inline void expect(bool condition, const std::string& what) {
  if (condition) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

// The reader's error must be one line naming `file` (what users and main() rely on).
inline void expect_one_line_naming(const trident::Error& e, const std::string& file) {
  const std::string what = e.what();
  expect(what.find('\n') == std::string::npos, "error of several lines: " + what);
  expect(what.find(file) != std::string::npos, "error does not name '" + file + "': " + what);
}

// A private directory under $TMPDIR (or /tmp) for the files a target writes, one per process
// (libFuzzer's -jobs/-workers run several processes), removed at exit (libFuzzer ends a run
// with exit(); after a crash it stays, with the files of the crashing input).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/trident_fuzz_XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    return templ;
  }();
  static const bool cleanup_registered = [] {
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    });
    return true;
  }();
  (void)cleanup_registered;
  return dir;
}

// Writes `bytes` to `path` (replacing it); aborts on I/O failure (a harness problem).
inline void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  expect(f != nullptr, "cannot create " + path);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  expect(std::fclose(f) == 0 && ok, "cannot write " + path);
}

// Reads little-endian integers from the front of the input, zeros once it runs out.
class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size) : rest_(reinterpret_cast<const char*>(data), size) {}
  uint8_t u8() {
    if (rest_.empty()) return 0;
    const uint8_t v = static_cast<uint8_t>(rest_.front());
    rest_.remove_prefix(1);
    return v;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }
  // The next `n` bytes (fewer at the end).
  std::string_view bytes(size_t n) {
    const std::string_view out = rest_.substr(0, n);
    rest_.remove_prefix(out.size());
    return out;
  }
  std::string_view rest() const { return rest_; }

 private:
  std::string_view rest_;
};

}  // namespace trident::fuzz

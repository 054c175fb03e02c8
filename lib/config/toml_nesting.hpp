#pragma once
// A bound on how deep a TOML text nests, checked before toml++ parses it. toml++ builds a key's
// dotted parts and nested arrays and inline tables by recursion, one call per level: a table
// header of 50,000 dotted parts (a 100 KB config) overflowed its stack, a segfault rather than
// an error line. Real configs nest a few levels; kMaxTomlNesting leaves room for any of them.
#include <cstdint>
#include <string>
#include <string_view>

namespace trident {

constexpr int kMaxTomlNesting = 128;

struct TomlNesting {
  int64_t line = 0;  // 1-based line of the first excess; 0: within the bound
  std::string what;  // what went past it and why that matters, for the error line
};

// Scans `text` outside its strings and comments: on each line the dotted parts of keys (a dot
// that is not the decimal point of a number: `a.b`, `"a"."b"`, `1.2.3` as a key) and, across
// lines, the open brackets and braces. The first line where either passes `limit`, or line 0.
TomlNesting toml_nesting_past(std::string_view text, int limit = kMaxTomlNesting);

}  // namespace trident

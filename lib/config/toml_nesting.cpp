#include "config/toml_nesting.hpp"

#include <algorithm>
#include <cctype>

namespace trident {

namespace {

bool digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Dots of a run of bare characters that make key parts: all of them, unless the run is a
// number's one decimal point (TOML puts a digit on both sides of it; dates' fractions too).
int key_dots(std::string_view run) {
  const auto dots = static_cast<int>(std::count(run.begin(), run.end(), '.'));
  if (dots != 1) return dots;
  const size_t at = run.find('.');
  const bool decimal = at > 0 && at + 1 < run.size() && digit(run[at - 1]) && digit(run[at + 1]);
  return decimal ? 0 : 1;
}

bool ends_run(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',' || c == '=' || c == '[' ||
         c == ']' || c == '{' || c == '}' || c == '#' || c == '"' || c == '\'';
}

}  // namespace

TomlNesting toml_nesting_past(std::string_view text, int limit) {
  enum class In { Code, Basic, Literal, MultiBasic, MultiLiteral, Comment };
  In in = In::Code;
  int64_t line = 1;
  int depth = 0, dots = 0;  // open brackets and braces; key dots on this line
  size_t run = std::string_view::npos;  // where the current run of bare characters began
  auto past = [&](const std::string& what) {
    return TomlNesting{line, what + " (the parser recurses once per level)"};
  };
  auto triple = [&](size_t i, char q) {
    return i + 2 < text.size() && text[i + 1] == q && text[i + 2] == q;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in == In::Code) {
      if (!ends_run(c)) {
        if (run == std::string_view::npos) run = i;
        continue;
      }
      if (run != std::string_view::npos) {
        dots += key_dots(text.substr(run, i - run));
        run = std::string_view::npos;
        if (dots > limit)
          return past("a key of more than " + std::to_string(limit) + " dotted parts");
      }
      if (c == '[' || c == '{') {
        if (++depth > limit)
          return past("arrays and tables nested more than " + std::to_string(limit) + " deep");
      } else if (c == ']' || c == '}') {
        depth = std::max(0, depth - 1);
      } else if (c == '#') {
        in = In::Comment;
      } else if (c == '"') {
        in = triple(i, '"') ? In::MultiBasic : In::Basic;
        if (in == In::MultiBasic) i += 2;
      } else if (c == '\'') {
        in = triple(i, '\'') ? In::MultiLiteral : In::Literal;
        if (in == In::MultiLiteral) i += 2;
      }
    } else if (in == In::Basic || in == In::MultiBasic) {
      if (c == '\\') {
        if (i + 1 < text.size() && text[i + 1] == '\n') ++line;
        ++i;  // the escaped character
      } else if (c == '"' && (in == In::Basic || triple(i, '"'))) {
        // A multi-line string's closing quotes take up to two quotes before them with them.
        if (in == In::MultiBasic)
          while (i + 3 < text.size() && text[i + 3] == '"') ++i;
        i += in == In::MultiBasic ? 2 : 0;
        in = In::Code;
      } else if (c == '\n' && in == In::Basic) {
        in = In::Code;  // not TOML; the parser says so
      }
    } else if (in == In::Literal || in == In::MultiLiteral) {
      if (c == '\'' && (in == In::Literal || triple(i, '\''))) {
        if (in == In::MultiLiteral)
          while (i + 3 < text.size() && text[i + 3] == '\'') ++i;
        i += in == In::MultiLiteral ? 2 : 0;
        in = In::Code;
      } else if (c == '\n' && in == In::Literal) {
        in = In::Code;
      }
    } else if (c == '\n') {  // a comment's end
      in = In::Code;
    }
    if (c == '\n') {
      ++line;
      dots = 0;
    }
  }
  if (in == In::Code && run != std::string_view::npos &&
      dots + key_dots(text.substr(run)) > limit)
    return past("a key of more than " + std::to_string(limit) + " dotted parts");
  return {};
}

}  // namespace trident

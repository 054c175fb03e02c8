#include "tokenizer/unicode_classes.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <map>
#include <vector>

#include "util/error.hpp"

namespace trident {

namespace {

struct CategoryRun {
  char32_t first;
  const char* category;  // two letters: "Lu", "Nd", ...
};
struct CodePointRange {
  char32_t first, last;
};
#include "tokenizer/unicode_tables.inc"

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;
using Ranges = std::vector<CodePointRange>;

// Ranges of the code points whose category is one of `categories` (space-separated; a
// one-letter entry stands for its group), surrogates left out: they are not text, and PCRE2
// refuses them in a UTF pattern.
Ranges category_ranges(std::string_view categories) {
  std::vector<std::string_view> wanted;
  for (size_t pos = 0; pos < categories.size();) {
    const size_t end = std::min(categories.find(' ', pos), categories.size());
    wanted.push_back(categories.substr(pos, end - pos));
    pos = end + 1;
  }
  Ranges out;
  const size_t n = std::size(kCategoryRuns);
  for (size_t i = 0; i < n; ++i) {
    const std::string_view category = kCategoryRuns[i].category;
    const bool in = std::any_of(wanted.begin(), wanted.end(), [&](std::string_view w) {
      return w == "Any" || category.substr(0, w.size()) == w;
    });
    if (!in || category == "Cs") continue;
    const char32_t first = kCategoryRuns[i].first;
    const char32_t last = i + 1 < n ? kCategoryRuns[i + 1].first - 1 : kMaxCodePoint;
    if (!out.empty() && out.back().last + 1 == first) out.back().last = last;
    else out.push_back({first, last});
  }
  return out;
}

// The code points (surrogates left out) not in `ranges` (sorted, disjoint).
Ranges complement(const Ranges& ranges) {
  Ranges out;
  const auto add = [&](char32_t first, char32_t last) {
    if (first > last) return;
    if (last < kSurrogateFirst || first > kSurrogateLast) { out.push_back({first, last}); return; }
    if (first < kSurrogateFirst) out.push_back({first, kSurrogateFirst - 1});
    if (last > kSurrogateLast) out.push_back({kSurrogateLast + 1, last});
  };
  char32_t next = 0;
  for (const auto& r : ranges) {
    if (r.first > 0) add(next, r.first - 1);
    next = r.last + 1;
  }
  if (next <= kMaxCodePoint) add(next, kMaxCodePoint);
  return out;
}

// The general categories a \p{name} names, space-separated ("" if none). Names compare as
// Oniguruma and PCRE2 do: case, spaces, '_' and '-' ignored.
std::string categories_of(std::string_view name) {
  std::string key;
  for (const char c : name)
    if (c != ' ' && c != '_' && c != '-') key.push_back(static_cast<char>(std::tolower(c)));
  static const std::map<std::string, std::string> kNames = {
      {"any", "Any"}, {"l&", "Lu Ll Lt"}, {"lc", "Lu Ll Lt"}, {"casedletter", "Lu Ll Lt"},
      {"letter", "L"}, {"uppercaseletter", "Lu"}, {"lowercaseletter", "Ll"},
      {"titlecaseletter", "Lt"}, {"modifierletter", "Lm"}, {"otherletter", "Lo"},
      {"mark", "M"}, {"combiningmark", "M"}, {"nonspacingmark", "Mn"}, {"spacingmark", "Mc"},
      {"enclosingmark", "Me"}, {"number", "N"}, {"decimalnumber", "Nd"},
      {"letternumber", "Nl"}, {"othernumber", "No"}, {"punctuation", "P"},
      {"connectorpunctuation", "Pc"}, {"dashpunctuation", "Pd"}, {"openpunctuation", "Ps"},
      {"closepunctuation", "Pe"}, {"initialpunctuation", "Pi"}, {"finalpunctuation", "Pf"},
      {"otherpunctuation", "Po"}, {"symbol", "S"}, {"mathsymbol", "Sm"},
      {"currencysymbol", "Sc"}, {"modifiersymbol", "Sk"}, {"othersymbol", "So"},
      {"separator", "Z"}, {"spaceseparator", "Zs"}, {"lineseparator", "Zl"},
      {"paragraphseparator", "Zp"}, {"other", "C"}, {"control", "Cc"}, {"format", "Cf"},
      {"privateuse", "Co"}, {"unassigned", "Cn"}};
  if (const auto it = kNames.find(key); it != kNames.end()) return it->second;
  // A category's own short name: "L", "Lu", ... (not "Cs": surrogates are not text).
  if (key.size() == 1 && std::string_view("lmnpszc").find(key[0]) != std::string_view::npos)
    return std::string(1, static_cast<char>(std::toupper(key[0])));
  if (key.size() == 2) {
    for (const auto& run : kCategoryRuns) {
      const std::string_view c = run.category;
      if (c == "Cs") continue;
      if (std::tolower(c[0]) == key[0] && std::tolower(c[1]) == key[1]) return std::string(c);
    }
  }
  return "";
}

std::string hex_escape(char32_t c) {
  char text[16];
  std::snprintf(text, sizeof text, "\\x{%X}", static_cast<unsigned>(c));
  return text;
}

// The ranges as the inside of a PCRE2 class: \x{41}-\x{5A}\x{61}...
std::string class_body(const Ranges& ranges) {
  std::string out;
  for (const auto& r : ranges) {
    out += hex_escape(r.first);
    if (r.last == r.first) continue;
    out += '-';
    out += hex_escape(r.last);
  }
  return out;
}

Ranges table_ranges(const CodePointRange* begin, const CodePointRange* end) {
  return Ranges(begin, end);
}

// Rewrites one pattern; a small scanner that knows escapes, classes and groups, which is all
// that decides where a class name stands and whether case-insensitive matching applies.
class Pinner {
 public:
  Pinner(std::string_view pattern, const std::string& source)
      : p_(pattern), source_(source) {}

  std::string run() {
    caseless_.push_back(false);
    while (pos_ < p_.size()) {
      const char c = p_[pos_];
      if (c == '\\') escape(false);
      else if (c == '[') char_class();
      else if (c == '(') open_group();
      else if (c == ')') {
        if (caseless_.size() > 1) caseless_.pop_back();
        out_ += c;
        ++pos_;
      } else {
        out_ += c;
        ++pos_;
      }
    }
    return out_;
  }

 private:
  [[noreturn]] void refuse(const std::string& what) const {
    throw Error(source_ + ": pre_tokenizer regex: " + what + " (at offset " +
                std::to_string(pos_) + ") is not supported: it would match by the installed " +
                "PCRE2's Unicode tables or differently from Hugging Face tokenizers' Oniguruma");
  }

  // The escape at pos_ ('\'), inside a class or not: a Unicode class becomes its ranges.
  void escape(bool in_class) {
    if (pos_ + 1 >= p_.size()) {  // a trailing '\': PCRE2 reports it
      out_ += p_.substr(pos_);
      pos_ = p_.size();
      return;
    }
    const char e = p_[pos_ + 1];
    const size_t start = pos_;
    if (e == 'Q') {  // \Q...\E: literal text, copied as it is
      const size_t end = p_.find("\\E", pos_ + 2);
      const size_t stop = end == std::string_view::npos ? p_.size() : end + 2;
      out_ += p_.substr(pos_, stop - pos_);
      pos_ = stop;
      return;
    }
    if (std::string_view("hHvVbBX").find(e) != std::string_view::npos)
      refuse(std::string("\\") + e);
    Ranges ranges;
    bool negated = false, unicode_class = true;
    pos_ += 2;
    switch (e) {
      case 's': case 'S':
        ranges = table_ranges(std::begin(kSpaceRanges), std::end(kSpaceRanges));
        negated = e == 'S';
        break;
      case 'w': case 'W':
        ranges = table_ranges(std::begin(kWordRanges), std::end(kWordRanges));
        negated = e == 'W';
        break;
      case 'd': case 'D':
        ranges = category_ranges("Nd");
        negated = e == 'D';
        break;
      case 'p': case 'P':
        ranges = property(negated);
        negated = negated != (e == 'P');
        break;
      case 'c':  // \cX: a control character, X is any character (also ']' or '\')
        unicode_class = false;
        if (pos_ < p_.size()) ++pos_;
        break;
      default:
        unicode_class = false;
    }
    if (!unicode_class) {
      out_ += p_.substr(start, pos_ - start);
      return;
    }
    if (caseless_.back()) {
      pos_ = start;
      refuse("the class " + std::string(p_.substr(start, 2)) +
             " inside a case-insensitive group");
    }
    if (negated) ranges = complement(ranges);
    if (ranges.empty()) {
      pos_ = start;
      refuse("a class that matches no character");
    }
    const std::string body = class_body(ranges);
    out_ += in_class ? body : "[" + body + "]";
  }

  // After \p or \P: {name}, {^name} or a one-letter name; its ranges, `negated` set by '^'.
  Ranges property(bool& negated) {
    std::string_view name;
    if (pos_ < p_.size() && p_[pos_] == '{') {
      const size_t end = p_.find('}', pos_);
      if (end == std::string_view::npos) refuse("an unclosed \\p{");
      name = p_.substr(pos_ + 1, end - pos_ - 1);
      pos_ = end + 1;
    } else if (pos_ < p_.size()) {
      name = p_.substr(pos_, 1);
      ++pos_;
    }
    if (!name.empty() && name[0] == '^') {
      negated = true;
      name.remove_prefix(1);
    }
    const std::string categories = categories_of(name);
    if (categories.empty())
      refuse("\\p{" + std::string(name) + "} (Trident pins the general categories only)");
    return category_ranges(categories);
  }

  // A [...] class from pos_: copied, with its Unicode escapes expanded in place.
  void char_class() {
    out_ += '[';
    ++pos_;
    if (pos_ < p_.size() && p_[pos_] == '^') out_ += p_[pos_++];
    if (pos_ < p_.size() && p_[pos_] == ']') out_ += p_[pos_++];  // a leading ']' is literal
    while (pos_ < p_.size()) {
      const char c = p_[pos_];
      if (c == ']') {
        out_ += c;
        ++pos_;
        return;
      }
      if (c == '\\') {
        escape(true);
      } else if (c == '[' && pos_ + 1 < p_.size() &&
                 std::string_view(":=.").find(p_[pos_ + 1]) != std::string_view::npos) {
        refuse("the POSIX class " + std::string(p_.substr(pos_, 2)) + "...");
      } else {
        out_ += c;
        ++pos_;
      }
    }
  }

  // A '(' at pos_: a comment, an option setting (?i) / (?-i) / (?i: ... ), or another group,
  // each group scope starting with its parent's case-insensitivity.
  void open_group() {
    const size_t start = pos_;
    if (p_.substr(pos_, 3) == "(?#") {
      const size_t end = p_.find(')', pos_);
      const size_t stop = end == std::string_view::npos ? p_.size() : end + 1;
      out_ += p_.substr(pos_, stop - pos_);
      pos_ = stop;
      return;
    }
    bool caseless = caseless_.back();
    if (p_.substr(pos_, 2) == "(?") {
      size_t i = pos_ + 2;
      bool on = true, caseless_flags = caseless;
      for (; i < p_.size(); ++i) {
        const char f = p_[i];
        if (f == '-') on = false;
        else if (f == '^') caseless_flags = false;
        else if (f == 'i') caseless_flags = on;
        else if (f == 'x' && on) { pos_ = i; refuse("the extended flag (?x)"); }
        else if (!std::isalpha(static_cast<unsigned char>(f))) break;
      }
      if (i < p_.size() && (p_[i] == ')' || p_[i] == ':') && i > pos_ + 2) {
        out_ += p_.substr(pos_, i + 1 - pos_);
        pos_ = i + 1;
        if (p_[i] == ')') caseless_.back() = caseless_flags;  // to the end of this group
        else caseless_.push_back(caseless_flags);
        return;
      }
    }
    caseless_.push_back(caseless);
    out_ += p_[start];
    pos_ = start + 1;
  }

  std::string_view p_;
  const std::string& source_;
  size_t pos_ = 0;
  std::string out_;
  std::vector<bool> caseless_;  // per open group: whether (?i) applies
};

}  // namespace

const char* pinned_unicode_version() { return kUnicodeVersion; }

std::string pin_unicode_classes(std::string_view pattern, const std::string& source) {
  return Pinner(pattern, source).run();
}

}  // namespace trident

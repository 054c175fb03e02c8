#include "tokenizer/bpe_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>

#include "tokenizer/unicode_classes.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace trident {

namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer pattern: what HF's ByteLevel pre-tokenizer splits with (use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the other 68
// bytes for code points 256, 257, ... in byte order, so that every token is printable text.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> codepoint_of_byte{};
  std::unordered_map<char32_t, uint8_t> byte_of_codepoint;
  ByteLevelAlphabet() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      codepoint_of_byte[b] = printable ? static_cast<char32_t>(b) : next++;
      byte_of_codepoint[codepoint_of_byte[b]] = static_cast<uint8_t>(b);
    }
  }
};

// Length of the valid UTF-8 sequence at text[pos], 0 if it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid, as in Rust's and Python's decoders).
size_t utf8_sequence_length(std::string_view text, size_t pos, char32_t* codepoint = nullptr) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  const uint8_t b0 = byte(0);
  size_t len = 0;
  char32_t cp = 0, min = 0;
  if (b0 < 0x80) { len = 1; cp = b0; }
  else if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min = 0x10000; }
  else return 0;
  if (pos + len > text.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  if (codepoint) *codepoint = cp;
  return len;
}

// The raw bytes a vocabulary entry stands for; false if it holds a character outside the
// byte-level alphabet.
bool byte_level_to_bytes(const std::string& token, std::string& out) {
  static const ByteLevelAlphabet alphabet;
  out.clear();
  for (size_t pos = 0; pos < token.size();) {
    char32_t cp = 0;
    const size_t len = utf8_sequence_length(token, pos, &cp);
    if (len == 0) return false;
    const auto it = alphabet.byte_of_codepoint.find(cp);
    if (it == alphabet.byte_of_codepoint.end()) return false;
    out.push_back(static_cast<char>(it->second));
    pos += len;
  }
  return true;
}

// A tokenizer.json: a regular file; the largest published ones are tens of MiB.
std::string read_whole(const std::string& path) {
  return read_input_file(path, {path, "tokenizer", int64_t{512} << 20,
                                "--tokenizer needs a tokenizer.json file"});
}

// A string from the file, as a JSON string literal: quoted, with newlines and other control
// characters escaped, so that an error naming it stays on one line.
std::string json_quoted(const std::string& value) {
  return json(value).dump(-1, ' ', false, json::error_handler_t::replace);
}

// The field's string value, "" when it is absent or null.
std::string string_field(const json& object, const char* key) {
  if (!object.contains(key) || object[key].is_null()) return "";
  return object[key].get<std::string>();
}

// Ids index the decode table: an integer in [0, kMaxTokenId) (2^24, far above any real
// vocabulary), else refused before anything that large is allocated.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;
// `kind` and `name` (e.g. "vocab entry", the entry) name it in the error: quoted only then, as
// this runs for every entry of a vocabulary.
int32_t token_id_value(const json& value, const std::string& source, const char* kind,
                       const std::string& name) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() >= kMaxTokenId)
    throw Error(source + ": " + kind + " " + json_quoted(name) + " has id " + value.dump() +
                " (ids are integers in [0, 2^24))");
  return static_cast<int32_t>(value.get<int64_t>());
}

bool bool_field(const json& object, const char* key, bool fallback) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  return object[key].get<bool>();
}

}  // namespace

// The pre-tokenizer regex, compiled once (JIT where PCRE2 has it); split() yields the matches
// and the text between them in order, as HF's Split with behaviour "Isolated" does.
class PieceSplitter {
 public:
  // The file's pattern is compiled as written first, so that a syntax error's offset is one
  // in the file; then with its Unicode classes as explicit ranges (unicode_classes.hpp), which
  // is what runs: the pieces do not depend on the Unicode tables of the PCRE2 installed.
  PieceSplitter(const std::string& pattern, const std::string& source) : source_(source) {
    pcre2_code_free(compile(pattern, source));
    const std::string pinned = pin_unicode_classes(pattern, source);
    code_ = compile(pinned, source + " (its Unicode classes as explicit ranges)");
    // Without JIT (a PCRE2 built without it) the interpreter gives the same matches, slower.
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~PieceSplitter() { pcre2_code_free(code_); }
  static pcre2_code* compile(const std::string& pattern, const std::string& source) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                                     pattern.size(), PCRE2_UTF | PCRE2_UCP, &error, &offset,
                                     nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw Error(source + ": pre_tokenizer regex does not compile at offset " +
                  std::to_string(offset) + ": " + reinterpret_cast<const char*>(message));
    }
    return code;
  }
  PieceSplitter(const PieceSplitter&) = delete;
  PieceSplitter& operator=(const PieceSplitter&) = delete;

  template <class Emit>
  void split(std::string_view text, const Emit& emit) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code_, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    // A long run of letters is one match: give the JIT more stack than its 32 KiB default.
    pcre2_jit_stack* stack = jit_ ? pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr)
                                  : nullptr;
    if (stack) pcre2_jit_stack_assign(context, nullptr, stack);
    const auto release = [&] {
      if (stack) pcre2_jit_stack_free(stack);
      pcre2_match_context_free(context);
      pcre2_match_data_free(match);
    };
    size_t pos = 0, gap_begin = 0;
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (pos <= text.size()) {
      // The text was checked to be UTF-8 already.
      const int rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match,
                                 context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        release();
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        throw Error(source_ + ": pre_tokenizer regex failed on the text: " +
                    reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t begin = ovector[0], end = ovector[1];
      if (end == begin) {  // an empty match cuts nothing: step over one character
        if (begin >= text.size()) break;
        const size_t len = utf8_sequence_length(text, begin);
        pos = begin + std::max<size_t>(len, 1);
        continue;
      }
      if (begin > gap_begin) emit(text.substr(gap_begin, begin - gap_begin));
      emit(text.substr(begin, end - begin));
      gap_begin = pos = end;
    }
    if (gap_begin < text.size()) emit(text.substr(gap_begin));
    release();
  }

 private:
  std::string source_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::bytes() {
  BpeTokenizer t;
  t.source_ = "byte-level vocabulary";
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    t.bytes_to_id_[one] = b;
    t.id_to_bytes_.push_back(one);
    t.id_used_.push_back(true);
  }
  return t;
}

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
  return from_json(read_whole(path), path);
}

namespace {

// The pre-tokenizer's settings: the regex pieces are cut with ("" for none) and ByteLevel's
// add_prefix_space.
struct PreTokenizer {
  std::string pattern;
  bool add_prefix_space = false;
  bool byte_level = false;
};

void read_pre_tokenizer(const json& p, const std::string& source, PreTokenizer& out) {
  const std::string type = string_field(p, "type");
  if (type == "ByteLevel") {
    if (out.byte_level)
      throw Error(source + ": pre_tokenizer has two ByteLevel steps (not supported)");
    out.byte_level = true;
    out.add_prefix_space = bool_field(p, "add_prefix_space", false);
    if (bool_field(p, "use_regex", true)) {
      if (!out.pattern.empty())
        throw Error(source + ": pre_tokenizer has a Split and a ByteLevel with use_regex = "
                    "true (two regexes: not supported)");
      out.pattern = kGpt2Pattern;
    }
  } else if (type == "Split") {
    if (out.byte_level || !out.pattern.empty())
      throw Error(source + ": pre_tokenizer: a Split must come first and only once (supported: "
                  "Sequence [Split, ByteLevel])");
    const json& pattern = p.at("pattern");
    if (!pattern.contains("Regex"))
      throw Error(source + ": pre_tokenizer Split pattern " + pattern.dump() +
                  ": only a Regex pattern is supported");
    const std::string behavior = string_field(p, "behavior");
    if (behavior != "Isolated" || bool_field(p, "invert", false))
      throw Error(source + ": pre_tokenizer Split behavior " + json_quoted(behavior) +
                  " (invert " + (bool_field(p, "invert", false) ? "true" : "false") +
                  "): only Isolated without invert is supported");
    out.pattern = pattern["Regex"].get<std::string>();
  } else if (type == "Sequence") {
    for (const json& step : p.at("pretokenizers")) read_pre_tokenizer(step, source, out);
  } else {
    throw Error(source + ": pre_tokenizer type " + json_quoted(type) +
                " is not supported (ByteLevel, or Sequence [Split (Regex), ByteLevel])");
  }
}

// Ids the post-processor's "single" template puts before and after the sequence.
void read_post_processor(const json& p, const std::string& source, std::vector<int32_t>& prefix,
                         std::vector<int32_t>& suffix) {
  const std::string type = string_field(p, "type");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const json& step : p.at("processors")) read_post_processor(step, source, prefix, suffix);
    return;
  }
  if (type != "TemplateProcessing")
    throw Error(source + ": post_processor type " + json_quoted(type) +
                " is not supported (ByteLevel, TemplateProcessing, Sequence of them)");
  if (!prefix.empty() || !suffix.empty())
    throw Error(source + ": post_processor has two TemplateProcessing steps (not supported)");
  bool seen_sequence = false;
  for (const json& item : p.at("single")) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].value("id", "") != "A")
        throw Error(source + ": post_processor single template names sequence " +
                    item["Sequence"].dump() + " (only A exists for one text)");
      seen_sequence = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    const json& special = p.at("special_tokens");
    if (!special.contains(name))
      throw Error(source + ": post_processor template token " + json_quoted(name) +
                  " is not in its special_tokens");
    for (const json& id : special[name].at("ids"))
      (seen_sequence ? suffix : prefix)
          .push_back(token_id_value(id, source, "post_processor token", name));
  }
  if (!seen_sequence)
    throw Error(source + ": post_processor single template has no Sequence A");
}

}  // namespace

BpeTokenizer BpeTokenizer::from_json(const std::string& json_text, const std::string& source) {
  BpeTokenizer t;
  t.source_ = source;
  try {
    const json root = json::parse(json_text);
    if (root.contains("normalizer") && !root["normalizer"].is_null())
      throw Error(source + ": normalizer " + json_quoted(root["normalizer"].value("type", "?")) +
                  " is not supported (byte-level BPE tokenizers have none)");
    const json& model = root.at("model");
    if (string_field(model, "type") != "BPE")
      throw Error(source + ": model type " + json_quoted(string_field(model, "type")) +
                  " is not supported (only BPE)");
    if (model.contains("dropout") && !model["dropout"].is_null())
      throw Error(source + ": model.dropout is set (not supported: encoding would be random)");
    if (!string_field(model, "continuing_subword_prefix").empty() ||
        !string_field(model, "end_of_word_suffix").empty() ||
        bool_field(model, "byte_fallback", false))
      throw Error(source + ": model.continuing_subword_prefix, end_of_word_suffix and "
                  "byte_fallback are not supported (not a byte-level BPE)");
    t.ignore_merges_ = bool_field(model, "ignore_merges", false);

    // Added tokens first: their contents may also be vocabulary entries that are not
    // byte-level text.
    std::unordered_map<std::string, int32_t> added_ids;
    if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
      for (const json& a : root["added_tokens"]) {
        const std::string content = a.at("content").get<std::string>();
        AddedToken token{content, token_id_value(a.at("id"), source, "added token", content)};
        for (const char* flag : {"single_word", "lstrip", "rstrip"})
          if (bool_field(a, flag, false))
            throw Error(source + ": added token " + json_quoted(token.content) + " has " + flag +
                        " = true (not supported)");
        if (token.content.empty()) throw Error(source + ": added token with empty content");
        added_ids[token.content] = token.id;
        t.added_.push_back(token);
      }
    }
    std::stable_sort(t.added_.begin(), t.added_.end(),
                     [](const AddedToken& a, const AddedToken& b) {
                       return a.content.size() > b.content.size();
                     });

    // An id stands for one string, or decoding could not give the text back.
    const auto set_id = [&](int32_t id, const std::string& bytes, const char* kind,
                            const std::string& name) {
      if (id >= t.vocab_size()) {
        t.id_to_bytes_.resize(id + 1);
        t.id_used_.resize(id + 1, false);
      }
      if (t.id_used_[id] && t.id_to_bytes_[id] != bytes)
        throw Error(source + ": " + kind + " " + json_quoted(name) + " has id " +
                    std::to_string(id) +
                    ", which already stands for another token");
      t.id_to_bytes_[id] = bytes;
      t.id_used_[id] = true;
    };
    std::string bytes;
    for (const auto& [token, value] : model.at("vocab").items()) {
      const int32_t id = token_id_value(value, source, "vocab entry", token);
      if (!byte_level_to_bytes(token, bytes)) {
        if (added_ids.count(token)) continue;  // e.g. "<|endoftext|>" in the vocab
        throw Error(source + ": vocab entry " + json_quoted(token) + " (id " + std::to_string(id) +
                    ") is not byte-level text (characters outside GPT-2's byte alphabet)");
      }
      t.bytes_to_id_[bytes] = id;
      set_id(id, bytes, "vocab entry", token);
    }
    for (const AddedToken& a : t.added_) set_id(a.id, a.content, "added token", a.content);
    for (int b = 0; b < 256; ++b)
      if (!t.bytes_to_id_.count(std::string(1, static_cast<char>(b))))
        throw Error(source + ": the vocabulary has no token for byte " + std::to_string(b) +
                    " (a byte-level BPE has all 256)");

    int32_t rank = 0;
    for (const json& m : model.at("merges")) {
      std::string left, right;
      if (m.is_string()) {  // "a b" (older files)
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          throw Error(source + ": merge " + json_quoted(s) +
                      " is not two tokens separated by a space");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {  // ["a", "b"]
        if (!m.is_array() || m.size() != 2)
          throw Error(source + ": merge " + m.dump() + " is not a pair of tokens");
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      }
      std::string lb, rb;
      if (!byte_level_to_bytes(left, lb) || !byte_level_to_bytes(right, rb) ||
          !t.bytes_to_id_.count(lb) || !t.bytes_to_id_.count(rb) ||
          !t.bytes_to_id_.count(lb + rb))
        throw Error(source + ": merge " + std::to_string(rank) + " (" + json_quoted(left) + ", " +
                    json_quoted(right) + ") names a token that is not in the vocabulary");
      t.merges_.emplace(std::make_pair(t.bytes_to_id_[lb], t.bytes_to_id_[rb]),
                        Merge{rank, t.bytes_to_id_[lb + rb]});
      ++rank;
    }

    if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
      throw Error(source + ": no pre_tokenizer (a byte-level BPE needs ByteLevel)");
    PreTokenizer pre;
    read_pre_tokenizer(root["pre_tokenizer"], source, pre);
    if (!pre.byte_level)
      throw Error(source + ": pre_tokenizer has no ByteLevel step (not a byte-level BPE)");
    t.add_prefix_space_ = pre.add_prefix_space;
    if (!pre.pattern.empty()) t.splitter_ = std::make_unique<PieceSplitter>(pre.pattern, source);

    const json decoder = root.value("decoder", json());
    if (decoder.is_null() || string_field(decoder, "type") != "ByteLevel")
      throw Error(source + ": decoder " + (decoder.is_null() ? "null" : decoder.dump()) +
                  " is not supported (only ByteLevel)");
    if (root.contains("post_processor") && !root["post_processor"].is_null())
      read_post_processor(root["post_processor"], source, t.prefix_ids_, t.suffix_ids_);
    for (const int32_t id : t.prefix_ids_)
      if (id >= t.vocab_size() || !t.id_used_[id])
        throw Error(source + ": post_processor id " + std::to_string(id) + " is not a token");
    for (const int32_t id : t.suffix_ids_)
      if (id >= t.vocab_size() || !t.id_used_[id])
        throw Error(source + ": post_processor id " + std::to_string(id) + " is not a token");
  } catch (const json::exception& e) {
    throw Error(source + ": not a usable tokenizer.json: " + e.what());
  }
  return t;
}

int32_t BpeTokenizer::token_id(std::string_view token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  const auto it = bytes_to_id_.find(std::string(token));
  return it == bytes_to_id_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const auto whole = bytes_to_id_.find(std::string(piece));
    if (whole != bytes_to_id_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::vector<int32_t> word;
  word.reserve(piece.size());
  for (const char c : piece) word.push_back(bytes_to_id_.at(std::string(1, c)));
  // Merge the pair of lowest rank, the leftmost among equals, until no pair has a merge: the
  // order HF's priority queue applies them in (a merge's result always ranks after its parts).
  while (word.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    int32_t result = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = merges_.find({word[i], word[i + 1]});
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best = i;
        result = it->second.result;
      }
    }
    if (result < 0) break;
    word[best] = result;
    word.erase(word.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  out.insert(out.end(), word.begin(), word.end());
}

void BpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string prefixed;
  if (add_prefix_space_ && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  if (!splitter_) {
    encode_piece(text, out);
    return;
  }
  splitter_->split(text, [&](std::string_view piece) { encode_piece(piece, out); });
}

const BpeTokenizer::AddedToken* BpeTokenizer::added_token_at(std::string_view text,
                                                             size_t pos) const {
  for (const AddedToken& a : added_)  // longest first
    if (text.compare(pos, a.content.size(), a.content) == 0) return &a;
  return nullptr;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out(prefix_ids_);
  if (splitter_ == nullptr && merges_.empty() && added_.empty()) {  // the byte vocabulary
    for (const char c : text) out.push_back(static_cast<uint8_t>(c));  // any bytes
    return out;
  }
  // HF tokenizers take text (Python str, Rust &str): there is no encoding of other bytes to
  // agree with.
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8_sequence_length(text, pos);
    if (len == 0)
      throw Error(source_ + ": the text to encode is not valid UTF-8 (at byte " +
                  std::to_string(pos) + ")");
    pos += len;
  }
  // Added tokens are cut out first (leftmost, then longest); the text between them is
  // pre-tokenized and merged.
  std::array<bool, 256> starts_added{};
  for (const AddedToken& a : added_) starts_added[static_cast<uint8_t>(a.content[0])] = true;
  size_t plain_begin = 0;
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* a =
        starts_added[static_cast<uint8_t>(text[pos])] ? added_token_at(text, pos) : nullptr;
    if (a == nullptr) {
      ++pos;
      continue;
    }
    encode_plain(text.substr(plain_begin, pos - plain_begin), out);
    out.push_back(a->id);
    pos += a->content.size();
    plain_begin = pos;
  }
  encode_plain(text.substr(plain_begin), out);
  out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_used_[id])
      throw Error(source_ + ": token id " + std::to_string(id) + " is not in the vocabulary (" +
                  std::to_string(vocab_size()) + " ids)");
    out += id_to_bytes_[id];
  }
  return out;
}

}  // namespace trident

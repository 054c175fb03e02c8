// The BPE tokenizer on tiny hand-made tokenizer.json files: merge order (lowest rank first,
// leftmost among equals), both merge forms, pieces never merged across, added tokens cut out
// first (longest wins), the post-processor's template, decoding, and refused files; the
// pre-tokenizer's Unicode classes as tokenizers has them (Unicode 16.0), not as PCRE2 has.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_tokenizer.hpp"
#include "tokenizer/unicode_classes.hpp"
#include "util/error.hpp"

using namespace trident;
using json = nlohmann::json;

namespace {

// GPT-2's byte -> character table, written out independently of the library's.
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// All 256 byte tokens (id = byte value) plus `extra` tokens from id 256 on, `merges` as given.
json tiny_tokenizer(const std::vector<std::string>& extra, const json& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  int id = 256;
  for (const auto& t : extra) vocab[t] = id++;
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model",
               {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", merges}}}};
}

BpeTokenizer load(const json& j) { return BpeTokenizer::from_json(j.dump(), "tiny.json"); }

std::vector<int32_t> ids(std::initializer_list<int32_t> list) { return list; }

}  // namespace

TEST(Bpe, LowestRankMergesFirst) {
  // "abc": (b, c) ranks before (a, b), so b+c merges first and then a+bc.
  const auto t = load(tiny_tokenizer({"bc", "ab", "abc"}, {"b c", "a b", "a bc"}));
  EXPECT_EQ(t.encode("abc"), ids({258}));
  // Ranks swapped: a+b first, and no merge (ab, c) exists.
  const auto u = load(tiny_tokenizer({"bc", "ab", "abc"}, {"a b", "b c", "a bc"}));
  EXPECT_EQ(u.encode("abc"), ids({257, 'c'}));
}

TEST(Bpe, LeftmostAmongEqualRanks) {
  const auto t = load(tiny_tokenizer({"aa"}, {"a a"}));
  EXPECT_EQ(t.encode("aaa"), ids({256, 'a'}));
  EXPECT_EQ(t.encode("aaaa"), ids({256, 256}));
  EXPECT_EQ(t.encode("aaaaa"), ids({256, 256, 'a'}));
}

TEST(Bpe, ArrayAndStringMergesAgree) {
  const std::vector<std::string> extra = {"Ġw", "or", "Ġwor", "ld", "Ġworld"};
  const auto strings = load(tiny_tokenizer(extra, {"Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"}));
  const auto arrays = load(tiny_tokenizer(
      extra, json::array({json::array({"Ġ", "w"}), json::array({"o", "r"}),
                          json::array({"Ġw", "or"}), json::array({"l", "d"}),
                          json::array({"Ġwor", "ld"})})));
  const auto expected = ids({'h', 'i', 260, '!'});
  EXPECT_EQ(strings.encode("hi world!"), expected);
  EXPECT_EQ(arrays.encode("hi world!"), expected);
}

TEST(Bpe, NoMergeAcrossPreTokenizerPieces) {
  // "b Ġ" would merge "b" with the following space, but GPT-2's regex puts the space at the
  // start of the next piece.
  const auto t = load(tiny_tokenizer({"bĠ", "Ġb"}, {"b Ġ", "Ġ b"}));
  EXPECT_EQ(t.encode("b b"), ids({'b', 257}));
  // Trailing spaces before a word: "\s+(?!\S)" leaves the last space to the word.
  EXPECT_EQ(t.encode("b   b"), ids({'b', ' ', ' ', 257}));
}

TEST(Bpe, AddedTokensSplitFirstLongestWins) {
  json j = tiny_tokenizer({"ab"}, {"a b"});
  j["added_tokens"] = json::array(
      {{{"id", 257}, {"content", "<|e"}, {"special", true}, {"single_word", false},
        {"lstrip", false}, {"rstrip", false}, {"normalized", false}},
       {{"id", 258}, {"content", "<|eot|>"}, {"special", true}, {"single_word", false},
        {"lstrip", false}, {"rstrip", false}, {"normalized", false}}});
  const auto t = load(j);
  // a<|eot|>b: "ab" is not merged across the added token.
  EXPECT_EQ(t.encode("a<|eot|>b"), ids({'a', 258, 'b'}));
  EXPECT_EQ(t.encode("ab<|eoab"), ids({256, 257, 'o', 256}));
  EXPECT_EQ(t.decode(t.encode("ab<|eot|><|e")), "ab<|eot|><|e");
  EXPECT_EQ(t.token_id("<|eot|>"), 258);
}

TEST(Bpe, TemplateAddsSpecialTokens) {
  json j = tiny_tokenizer({"<s>", "</s>"}, json::array());
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array(
           {{{"type", "ByteLevel"}, {"trim_offsets", false}},
            {{"type", "TemplateProcessing"},
             {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                     {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
             {"pair", json::array()},
             {"special_tokens",
              {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}},
               {"</s>", {{"id", "</s>"}, {"ids", {257}}, {"tokens", {"</s>"}}}}}}}})}};
  const auto t = load(j);
  EXPECT_EQ(t.encode("hi"), ids({256, 'h', 'i', 257}));
}

TEST(Bpe, SplitRegexAndPrefixSpace) {
  json j = tiny_tokenizer({}, json::array());
  // Digits one at a time, everything else one piece: Llama 3's \p{N}{1,3} style.
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}|[^\\p{N}]+"}}},
                     {"behavior", "Isolated"}, {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                     {"use_regex", false}}})}};
  const auto t = load(j);
  EXPECT_EQ(t.encode("x12"), ids({' ', 'x', '1', '2'}));
  EXPECT_EQ(t.decode(t.encode("x12")), " x12");
}

TEST(Bpe, DecodeInvertsEncodeOnUnicode) {
  const auto t = load(tiny_tokenizer({"Ġw", "or"}, {"Ġ w", "o r"}));
  const std::string text = "h\xC3\xA9llo w\xE4\xB8\x96 world \xF0\x9F\x8E\x89\n\t  x";
  const auto encoded = t.encode(text);
  EXPECT_GT(encoded.size(), 0u);
  EXPECT_EQ(t.decode(encoded), text);
  EXPECT_THROW(t.encode("bad \xC3 utf8"), Error);
  EXPECT_THROW(t.decode(ids({259})), Error);
}

TEST(Bpe, ByteVocabulary) {
  const auto t = BpeTokenizer::bytes();
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.encode("A\xFF"), ids({'A', 255}));  // any bytes, UTF-8 or not
  EXPECT_EQ(t.decode(ids({'h', 'i', 0xC3, 0xA9})), "hi\xC3\xA9");
}

TEST(Bpe, RefusesWhatItCannotRun) {
  const auto message = [](const json& j) {
    try {
      load(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  json missing_byte = tiny_tokenizer({}, json::array());
  missing_byte["model"]["vocab"].erase(byte_char('q'));
  EXPECT_NE(message(missing_byte).find("tiny.json: the vocabulary has no token for byte 113"),
            std::string::npos);
  EXPECT_NE(message(tiny_tokenizer({}, {"a b"})).find("merge 0 (\"a\", \"b\")"), std::string::npos);
  json normalized = tiny_tokenizer({}, json::array());
  normalized["normalizer"] = {{"type", "NFC"}};
  EXPECT_NE(message(normalized).find("normalizer \"NFC\" is not supported"), std::string::npos);
  json wordpiece = tiny_tokenizer({}, json::array());
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_NE(message(wordpiece).find("model type \"WordPiece\""), std::string::npos);
  json clash = tiny_tokenizer({}, json::array());
  clash["added_tokens"] = json::array(
      {{{"id", 97}, {"content", "<x>"}, {"special", true}, {"single_word", false},
        {"lstrip", false}, {"rstrip", false}, {"normalized", false}}});
  EXPECT_NE(message(clash).find("added token \"<x>\" has id 97, which already stands for"),
            std::string::npos);
  // Found by fuzz_tokenizer (corpus float_id, duplicate_id).
  json float_id = tiny_tokenizer({}, json::array());
  float_id["model"]["vocab"]["a"] = 3.3e128;
  EXPECT_NE(message(float_id).find("vocab entry \"a\" has id 3.3e+128 (ids are integers"),
            std::string::npos) << message(float_id);
  json duplicate_id = tiny_tokenizer({}, json::array());
  duplicate_id["model"]["vocab"][byte_char(0xDE)] = 'o';
  EXPECT_NE(message(duplicate_id).find("has id 111, which already stands for another token"),
            std::string::npos) << message(duplicate_id);
  json bad_regex = tiny_tokenizer({}, json::array());
  bad_regex["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                     {"behavior", "Isolated"}, {"invert", false}},
                    {{"type", "ByteLevel"}, {"use_regex", false}}})}};
  EXPECT_NE(message(bad_regex).find("regex does not compile"), std::string::npos);
  // Found by fuzz_tokenizer (corpus newline_in_vocab_entry): a string from the file is quoted
  // with its control characters escaped, so that the error stays on one line.
  json newline_entry = tiny_tokenizer({}, json::array());
  newline_entry["model"]["vocab"]["a\nb"] = 300;
  EXPECT_NE(message(newline_entry).find("vocab entry \"a\\nb\" (id 300) is not byte-level text"),
            std::string::npos) << message(newline_entry);
  json newline_type = tiny_tokenizer({}, json::array());
  newline_type["post_processor"] = {{"type", "Template\nProcessing"}};
  EXPECT_NE(message(newline_type).find("post_processor type \"Template\\nProcessing\" is not"),
            std::string::npos) << message(newline_type);
  for (const json& file : {newline_entry, newline_type})
    EXPECT_EQ(message(file).find('\n'), std::string::npos) << message(file);
  const json no_vocab = {{"model", {{"type", "BPE"}}}};
  EXPECT_NE(message(no_vocab).find("tiny.json: not a usable tokenizer.json"), std::string::npos);
  try {
    BpeTokenizer::from_file("/nonexistent/tokenizer.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

namespace {

// The byte-level form of raw bytes, as vocabulary entries are written.
std::string byte_level(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += byte_char(static_cast<uint8_t>(c));
  return out;
}

}  // namespace

// The pre-tokenizer's Unicode classes are the ones Hugging Face tokenizers matches (Unicode
// 16.0, Oniguruma's \s), whatever the installed PCRE2's tables say (Debian's 10.42: Unicode 14,
// U+180E in \s). Each text's expected pieces are whole vocabulary entries (ignore_merges), so
// a piece cut elsewhere falls apart into byte ids. Ids as tokenizers 0.23 gives them.
TEST(Bpe, UnicodeClassesAreTokenizersNotPcre2) {
  const std::string mvs = "\xE1\xA0\x8E";          // U+180E: Cf, not \s, since Unicode 6.3
  const std::string ext_h = "\xF0\xB1\x8D\x90";    // U+31350: CJK Extension H (Unicode 15.0)
  const std::string kawi = "\xF0\x91\xBD\x90";     // U+11F50: KAWI DIGIT ZERO (15.0, Nd)
  const std::string nel = "\xC2\x85";              // U+0085: \s in both
  json j = tiny_tokenizer({byte_level("!" + mvs), byte_level("a" + ext_h + "b"),
                           byte_level("1" + kawi + "2"), byte_level(nel + nel)},
                          json::array());
  j["model"]["ignore_merges"] = true;
  const auto t = load(j);
  EXPECT_EQ(t.encode("!" + mvs), ids({256}));               // ' ?[^\s\p{L}\p{N}]+'
  EXPECT_EQ(t.encode("a" + ext_h + "b"), ids({257}));       // ' ?\p{L}+'
  EXPECT_EQ(t.encode("1" + kawi + "2"), ids({258}));         // ' ?\p{N}+'
  EXPECT_EQ(t.encode("x" + nel + nel), ids({'x', 259}));     // '\s+(?!\S)'
}

TEST(Bpe, UnicodeClassesAsExplicitRanges) {
  EXPECT_STREQ(pinned_unicode_version(), "16.0");
  // Outside a class a bracketed set; inside one its ranges; negations as the complement.
  const std::string space = "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                            "\\x{2028}-\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  EXPECT_EQ(pin_unicode_classes("\\s+", "t"), "[" + space + "]+");
  EXPECT_EQ(pin_unicode_classes("[^\\s]", "t"), "[^" + space + "]");
  EXPECT_EQ(pin_unicode_classes("\\S", "t").substr(0, 18), "[\\x{0}-\\x{8}\\x{E}-");
  EXPECT_EQ(pin_unicode_classes("\\p{Nd}", "t").substr(0, 29), "[\\x{30}-\\x{39}\\x{660}-\\x{669}");
  EXPECT_EQ(pin_unicode_classes("\\pN", "t"), pin_unicode_classes("\\p{Number}", "t"));
  EXPECT_EQ(pin_unicode_classes("\\P{L}", "t"), pin_unicode_classes("\\p{^letter}", "t"));
  // What is not a Unicode class is left as it is (escapes, \Q..\E, groups, options).
  const std::string plain = "(?i:'s|'t)|\\x{41}\\Q\\p{L}\\E[\\]\\n]|(?-i)a{1,3}(?#\\p{Han})";
  EXPECT_EQ(pin_unicode_classes(plain, "t"), plain);
  // (?i) ends with its group: the class after it is outside.
  EXPECT_NO_THROW(pin_unicode_classes("(?i:'s)|(a(?i)b)\\p{L}", "t"));
  const auto message = [](const std::string& pattern) {
    try {
      pin_unicode_classes(pattern, "t.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("\\p{Han}").find("t.json: pre_tokenizer regex: \\p{Han} (Trident pins"),
            std::string::npos) << message("\\p{Han}");
  EXPECT_NE(message("(?i:\\p{Lu})").find("inside a case-insensitive group (at offset 4)"),
            std::string::npos) << message("(?i:\\p{Lu})");
  EXPECT_NE(message("(?i)x|\\s").find("case-insensitive"), std::string::npos);
  EXPECT_NE(message("[[:alpha:]]").find("POSIX class"), std::string::npos);
  EXPECT_NE(message("a\\b").find("\\b (at offset 1)"), std::string::npos);
  EXPECT_NE(message("\\h").find("\\h"), std::string::npos);
  EXPECT_NE(message("(?x) a").find("(?x)"), std::string::npos);
  EXPECT_NE(message("\\p{Cs}").find("\\p{Cs}"), std::string::npos);
}

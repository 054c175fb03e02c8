// Fuzz target: the tokenizer.json reader and the BPE tokenizer (lib/tokenizer). Input: the
// tokenizer.json text, a NUL byte, then the text to encode. A tokenizer that loads must encode
// valid UTF-8 text to ids it has and decode them back to the text (with the post-processor's
// special tokens around it, and with ByteLevel's add_prefix_space the spaces it puts before
// stretches of text); invalid UTF-8 is refused with one line.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.hpp"
#include "tokenizer/bpe_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using trident::fuzz::expect;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string json(input.substr(0, nul));
  const std::string text(nul == std::string_view::npos ? "" : input.substr(nul + 1));
  const std::string source = "fuzz_tokenizer.json";
  std::vector<int32_t> ids;
  try {
    const trident::BpeTokenizer tokenizer = trident::BpeTokenizer::from_json(json, source);
    const std::vector<int32_t> empty = tokenizer.encode("");  // the template's tokens alone
    const std::string around = tokenizer.decode(empty);
    ids = tokenizer.encode(text);
    for (const int32_t id : ids)
      expect(id >= 0 && id < tokenizer.vocab_size(), "id " + std::to_string(id) + " out of range");
    const std::string decoded = tokenizer.decode(ids);
    if (tokenizer.adds_prefix_space()) {
      // A space may come before each stretch of text between added tokens (at most one
      // stretch more than there are added-token ids); apart from spaces nothing changes.
      expect(decoded.size() >= around.size() + text.size() &&
                 decoded.size() - around.size() - text.size() <= ids.size() - empty.size() + 1,
             "decode(encode(text)) has another size");
      const auto without_spaces = [](std::string s) {
        s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
        return s;
      };
      const std::string bare = without_spaces(decoded), bare_text = without_spaces(text);
      expect(bare.size() == without_spaces(around).size() + bare_text.size(),
             "decode(encode(text)) has another size, spaces aside");
      expect(bare.find(bare_text) != std::string::npos, "decode(encode(text)) lost the text");
      return 0;
    }
    // The template's tokens come first and last; the text lies between them.
    expect(decoded.size() == around.size() + text.size(), "decode(encode(text)) has another size");
    expect(decoded.find(text) != std::string::npos, "decode(encode(text)) lost the text");
  } catch (const trident::Error& e) {
    trident::fuzz::expect_one_line_naming(e, source);
  }
  return 0;
}

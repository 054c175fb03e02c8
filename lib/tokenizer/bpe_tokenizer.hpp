#pragma once
// Byte-level BPE as Hugging Face `tokenizers` runs it, read from a tokenizer.json: added
// (special) tokens split off first, then the pre-tokenizer's regex (PCRE2, its Unicode classes
// as tokenizers has them: unicode_classes.hpp) cuts the text into pieces, each piece's bytes are merged by the BPE merge ranks, and the
// post-processor's template adds its special tokens. Decoding maps ids back to bytes. Also the
// byte-level vocabulary of data_tools/prepare_text.py's default (token = byte value, 256 ids).
// docs/tokenizer.md lists what of tokenizer.json is supported; anything else is refused with
// one line naming the file and the field.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trident {

class PieceSplitter;  // the pre-tokenizer's compiled regex (bpe_tokenizer.cpp)

class BpeTokenizer {
 public:
  // Reads and checks a Hugging Face tokenizer.json; throws trident::Error naming `path` and
  // the field it cannot use.
  static BpeTokenizer from_file(const std::string& path);
  // Same from the file's text; `source` names it in errors.
  static BpeTokenizer from_json(const std::string& json_text, const std::string& source);
  // Token = byte value, 256 ids, no merges (prepare_text.py's byte-level default).
  static BpeTokenizer bytes();

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Ids of `text` (UTF-8; invalid UTF-8 is refused with the byte offset, except by bytes(),
  // which takes any bytes), with the
  // post-processor's special tokens as HF's encode(text, add_special_tokens=True).
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of `ids`, special tokens included (HF's decode(ids, skip_special_tokens=False)
  // when the result is valid UTF-8). Throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  // One past the largest id.
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_bytes_.size()); }
  // Whether encoding puts a space before each stretch of text between added tokens that does
  // not start with one (the ByteLevel pre-tokenizer's add_prefix_space); decoding keeps it.
  bool adds_prefix_space() const { return add_prefix_space_; }
  // The id of an added token's content or a vocabulary entry (raw bytes); -1 if none.
  int32_t token_id(std::string_view token) const;

 private:
  BpeTokenizer();
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  // Ids of one pre-token (raw bytes) after the merges.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // Pre-tokenizes and merges text holding no added token.
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  // Longest added token starting at text[pos]; nullptr if none does.
  const AddedToken* added_token_at(std::string_view text, size_t pos) const;

  std::string source_;
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // vocabulary, keys as raw bytes
  std::vector<std::string> id_to_bytes_;                  // decode table ("" for unused ids)
  std::vector<bool> id_used_;
  // Merge ranks by the pair of ids merged, and the id of the merge's result.
  struct PairHash {
    size_t operator()(const std::pair<int32_t, int32_t>& p) const {
      return std::hash<uint64_t>()((static_cast<uint64_t>(static_cast<uint32_t>(p.first)) << 32) |
                                   static_cast<uint32_t>(p.second));
    }
  };
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<std::pair<int32_t, int32_t>, Merge, PairHash> merges_;
  std::vector<AddedToken> added_;  // longest content first
  std::unique_ptr<PieceSplitter> splitter_;  // nullptr: the text is one piece
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;  // a piece that is a vocabulary entry is one token (Llama 3)
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // the post-processor's single template
};

}  // namespace trident

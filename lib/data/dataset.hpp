#pragma once
// Token shards in llm.c's .bin layout and the global, layout-independent sampling order.
// docs/data.md specifies both so the order can be reproduced outside Trident.
//
// Shard: 256 x int32 header (magic, version, token count, rest 0), then the tokens: llm.c's
// GPT-2 layout (magic 20240520, version 1, uint16 tokens) or its Llama 3 layout (magic
// 20240801, version 7, uint32 tokens), exactly as llm.c's dev/data/data_common.py writes them.
// Dataset: the shards matching a path or glob, sorted by name. Window w of a shard covers tokens
// [w*T, w*T + T + 1) (inputs = first T, targets = last T); a shard of n tokens has (n-1)/T
// windows; windows never cross shards; global window ids run through the shards in order.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.hpp"

namespace trident {

inline constexpr int32_t kShardMagic = 20240520;  // uint16 tokens (llm.c "gpt-2")
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;  // uint32 tokens (llm.c "llama-3")
inline constexpr int32_t kShardVersionU32 = 7;
inline constexpr int64_t kShardHeaderInts = 256;
// uint16 token ids: the largest vocabulary a uint16 shard (or uint16 indexed dataset) can feed.
inline constexpr int64_t kShardMaxVocab = 65536;

// A read-only shard, read with pread(2) (never memory-mapped: a shard truncated or rewritten
// while a run reads it must give an error, not SIGBUS). Throws trident::Error naming the file
// on: missing file, not a regular file (checked before opening, so a FIFO cannot block), wrong
// magic/version (a magic must come with its own version), truncated (size != header +
// token_bytes*count bytes).
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  // 2 (uint16 tokens, version 1) or 4 (uint32 tokens, version 7).
  int64_t token_bytes() const { return token_bytes_; }
  // Copies tokens [first, first + count) into out, widened to uint32. Throws naming the file if
  // the range is outside [0, num_tokens()) or the file no longer holds it (truncated since it
  // was opened).
  void read(int64_t first, int64_t count, uint32_t* out) const;
  // The same into uint16 (a uint16 shard only; a uint32 shard throws naming the file).
  void read(int64_t first, int64_t count, uint16_t* out) const;

 private:
  // Throws naming the file unless [first, first + count) lies in [0, num_tokens()).
  void check_range(int64_t first, int64_t count) const;
  void read_bytes(int64_t first, int64_t count, void* out) const;
  std::string path_;
  int fd_ = -1;
  int64_t num_tokens_ = 0;
  int64_t token_bytes_ = 2;
};

// Writes a shard (used by tests and tools): uint16 tokens, magic 20240520, version 1; or
// uint32 tokens, magic 20240801, version 7. Throws trident::Error on I/O failure.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);
void write_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens);

class TokenDataset {
 public:
  // pattern: a path or a glob of shards, or the prefix of a Megatron indexed dataset (used
  // when PATTERN.idx exists and the pattern itself matches no file); then windows are cut
  // from the concatenated token stream of all its documents (docs/data.md). seq_len: T.
  // vocab_size: every token must be in [0, vocab_size) (checked lazily per window; a token
  // out of range throws naming the shard or the indexed dataset's .bin).
  // Throws if nothing matches, if vocab_size > kShardMaxVocab and the data hold uint16 ids
  // (they cannot represent it; names model.vocab_size and the first uint16 shard, or the
  // indexed dataset's .bin) or if no shard has a single window (names pattern and T). Shards
  // of both widths may be mixed in one glob.
  TokenDataset(const std::string& pattern, int64_t seq_len, int64_t vocab_size);
  int64_t num_windows() const { return total_windows_; }
  int64_t seq_len() const { return seq_len_; }
  // inputs[T] = tokens of the window, targets[T] = the same shifted by one.
  void window(int64_t window_id, int32_t* inputs, int32_t* targets) const;
  const std::vector<std::unique_ptr<TokenShard>>& shards() const { return shards_; }
  // The indexed dataset, or nullptr when the dataset is made of shards.
  const IndexedDataset* indexed() const { return indexed_.get(); }

 private:
  void window_indexed(int64_t window_id, int32_t* inputs, int32_t* targets) const;
  std::unique_ptr<IndexedDataset> indexed_;
  std::vector<std::unique_ptr<TokenShard>> shards_;
  std::vector<int64_t> first_window_;  // prefix sums of windows per shard
  int64_t total_windows_ = 0;
  int64_t seq_len_ = 0;
  int64_t vocab_size_ = 0;
};

// Which windows each step trains on: a pure function of (step, position in the global batch).
// Sample i of step s is stream position p = s*G + i; epoch e = p / W, k = p % W.
// shuffle=false: window k.  shuffle=true: perm_e[k], perm_e a Fisher-Yates permutation drawn
// from SplitMix64 seeded with (seed, e) as documented in docs/data.md.
class BatchSampler {
 public:
  BatchSampler(int64_t num_windows, int64_t global_batch, bool shuffle, uint64_t seed);
  int64_t window_id(int64_t step, int64_t sample) const;
  // The window at stream position p (window_id(s, i) = window_at(s*G + i)).
  int64_t window_at(int64_t position) const;
  // p = step * global_batch + sample, after checking the range and for overflow.
  static int64_t position(int64_t step, int64_t sample, int64_t global_batch);
  // Samples of the global batch that data-parallel rank `dp_rank` of `dp_size` runs as its
  // micro-batch `micro` of size `micro_batch`: the replica's contiguous block, then in order.
  // Returns the first sample index (the micro-batch is [first, first + micro_batch)).
  static int64_t first_sample(int64_t global_batch, int64_t dp_rank, int64_t dp_size,
                              int64_t micro, int64_t micro_batch);

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const;
  int64_t num_windows_, global_batch_;
  bool shuffle_;
  uint64_t seed_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_perm_;
};

}  // namespace trident

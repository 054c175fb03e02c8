// Fuzz target: llm.c token shards (lib/data/dataset.hpp TokenShard, TokenDataset).
// Input: the shard file itself (uint16 version 1 or uint32 version 7 layout; the seeds hold
// both). Every token range and window the reader reports is read back; reads outside them
// must be refused with an error naming the file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.hpp"
#include "fuzz_util.hpp"

namespace {

// Reads at most this many tokens per call: the input bounds the file, this bounds the work.
constexpr int64_t kMaxTokens = 1 << 14;

void read_shard(const std::string& path) {
  using trident::fuzz::expect;
  const trident::TokenShard shard(path);
  const int64_t n = shard.num_tokens();
  expect(n >= 0, "negative token count");
  expect(shard.token_bytes() == 2 || shard.token_bytes() == 4, "odd token width");
  std::vector<uint32_t> wide(std::min(n, kMaxTokens) + 1);
  shard.read(0, std::min(n, kMaxTokens), wide.data());
  if (n > 0) shard.read(n - 1, 1, wide.data());
  if (shard.token_bytes() == 2) {
    std::vector<uint16_t> narrow(std::min(n, kMaxTokens) + 1);
    shard.read(0, std::min(n, kMaxTokens), narrow.data());
  }
  // Out of range: refused, naming the file.
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{n, 1}, {-1, 1}, {0, n + 1},
                                     {INT64_MAX, 2}, {1, INT64_MAX}, {0, -1}}) {
    try {
      shard.read(first, count, wide.data());
      expect(false, "read(" + std::to_string(first) + ", " + std::to_string(count) +
                        ") outside " + std::to_string(n) + " tokens was not refused");
    } catch (const trident::Error& e) {
      trident::fuzz::expect_one_line_naming(e, path);
    }
  }
}

void read_dataset(const std::string& path, int64_t seq_len, int64_t vocab_size) {
  const trident::TokenDataset dataset(path, seq_len, vocab_size);
  std::vector<int32_t> inputs(seq_len), targets(seq_len);
  const int64_t windows = dataset.num_windows();
  trident::fuzz::expect(windows > 0, "a dataset without windows was accepted");
  for (int64_t w = 0; w < std::min<int64_t>(windows, 64); ++w) {
    dataset.window(w, inputs.data(), targets.data());
    for (int64_t t = 0; t < seq_len; ++t)
      trident::fuzz::expect(inputs[t] >= 0 && inputs[t] < vocab_size && targets[t] >= 0 &&
                                targets[t] < vocab_size,
                            "a token outside [0, vocab_size) was returned");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trident::fuzz::scratch_dir() + "/shard.bin";
  trident::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    read_shard(path);
  } catch (const trident::Error& e) {
    trident::fuzz::expect_one_line_naming(e, path);
  }
  // A small vocabulary (tokens out of range), one only uint32 shards can feed, and two
  // window lengths (one window of the whole file, many short ones).
  for (const auto& [seq_len, vocab] : {std::pair<int64_t, int64_t>{3, 300}, {1, 70000}, {64, 65536}}) {
    try {
      read_dataset(path, seq_len, vocab);
    } catch (const trident::Error& e) {
      trident::fuzz::expect_one_line_naming(e, path);
    }
  }
  return 0;
}

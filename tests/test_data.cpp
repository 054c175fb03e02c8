// Token shards, the dataset over a glob, and the sampling order (docs/data.md).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "run_util.hpp"
#include "temp_dir.hpp"
#include "data/dataset.hpp"
#include "util/error.hpp"

namespace fs = std::filesystem;
using trident::test::error_of;
using trident::test::expect_one_line_with;
using trident::BatchSampler;
using trident::Error;
using trident::TokenDataset;
using trident::TokenShard;
using trident::write_shard;

namespace {

// Each test directory: "trident_data_XXXXXX".
struct TempDir : trident::test::TempDir {
  TempDir() : trident::test::TempDir("trident_data") {}
};

std::vector<uint16_t> iota_tokens(size_t n, uint16_t start = 0) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(start + i);
  return t;
}

std::vector<int32_t> read_ints(const std::string& path, size_t n) {
  std::vector<int32_t> v(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  return v;
}

void write_raw(const std::string& path, const std::vector<int32_t>& header,
               const std::vector<uint16_t>& tokens) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()),
          static_cast<std::streamsize>(header.size() * 4));
  f.write(reinterpret_cast<const char*>(tokens.data()),
          static_cast<std::streamsize>(tokens.size() * 2));
}

std::vector<int32_t> good_header(int32_t count) {
  std::vector<int32_t> h(256, 0);
  h[0] = 20240520;
  h[1] = 1;
  h[2] = count;
  return h;
}

// ---- an independent re-implementation of docs/data.md's order (not sharing any code) ----
uint64_t ref_splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<int64_t> ref_perm(int64_t W, uint64_t seed, int64_t epoch) {
  uint64_t s = seed ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1));
  std::vector<int64_t> p(static_cast<size_t>(W));
  for (int64_t i = 0; i < W; ++i) p[static_cast<size_t>(i)] = i;
  for (int64_t i = W - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(ref_splitmix(s) % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

int64_t ref_window(int64_t W, int64_t G, bool shuffle, uint64_t seed, int64_t step,
                   int64_t i) {
  int64_t pos = step * G + i;
  if (!shuffle) return pos % W;
  return ref_perm(W, seed, pos / W)[static_cast<size_t>(pos % W)];
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shards

TEST(TokenShard, RoundTrip) {
  TempDir dir;
  const auto path = dir.file("a.bin");
  std::vector<uint16_t> tokens = {0, 1, 255, 256, 65535, 42, 7};
  write_shard(path, tokens);

  // The exact llm.c layout on disk.
  EXPECT_EQ(fs::file_size(path), 1024u + 2u * tokens.size());
  auto header = read_ints(path, 256);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], static_cast<int32_t>(tokens.size()));
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[static_cast<size_t>(i)], 0) << i;

  TokenShard shard(path);
  EXPECT_EQ(shard.path(), path);
  ASSERT_EQ(shard.num_tokens(), static_cast<int64_t>(tokens.size()));
  std::vector<uint16_t> back(tokens.size());
  shard.read(0, static_cast<int64_t>(tokens.size()), back.data());
  EXPECT_EQ(back, tokens);
  uint16_t two[2] = {0, 0};
  shard.read(3, 2, two);
  EXPECT_EQ(two[0], 256);
  EXPECT_EQ(two[1], 65535);
  // Outside the shard: an error naming it, never a read past the end.
  expect_one_line_with(error_of([&] { shard.read(6, 2, two); }), {path, "out of range"});
  expect_one_line_with(error_of([&] { shard.read(-1, 1, two); }), {path, "out of range"});
}

// Found by tests/fuzz/fuzz_token_shard (on every seed, e.g. u16_v1: the target reads out-of-range
// spans): a range whose end overflows
// int64 (undefined behaviour in the message), and a count the uint32 read of a uint16 shard
// sized its buffer by before checking it (an allocation of 2^64 bytes), are refused naming
// the file, before anything is allocated.
TEST(TokenShard, RangesPastInt64AreRefusedBeforeAnyAllocation) {
  TempDir dir;
  const std::string narrow = dir.file("narrow.bin"), wide = dir.file("wide.bin");
  write_shard(narrow, {1, 2, 3});
  trident::write_shard_u32(wide, {1, 2, 3});
  uint32_t out32[4] = {};
  uint16_t out16[4] = {};
  for (const std::string& path : {narrow, wide}) {
    TokenShard shard(path);
    const std::string msg = error_of([&] { shard.read(INT64_MAX, 2, out32); });
    expect_one_line_with(msg, {path, "tokens [9223372036854775807, 9223372036854775807 + 2)",
                               "out of range [0, 3)"});
    expect_one_line_with(error_of([&] { shard.read(1, INT64_MAX, out32); }), {path, "out of range"});
    expect_one_line_with(error_of([&] { shard.read(0, -1, out32); }), {path, "out of range"});
  }
  TokenShard shard(narrow);
  expect_one_line_with(error_of([&] { shard.read(1, INT64_MAX, out16); }), {narrow, "out of range"});
}

TEST(TokenShard, EmptyShardRoundTrip) {
  TempDir dir;
  write_shard(dir.file("e.bin"), {});
  TokenShard shard(dir.file("e.bin"));
  EXPECT_EQ(shard.num_tokens(), 0);
}

TEST(TokenShard, ReadsAHandWrittenShard) {
  TempDir dir;
  const auto path = dir.file("raw.bin");
  write_raw(path, good_header(3), {10, 20, 30});
  TokenShard shard(path);
  ASSERT_EQ(shard.num_tokens(), 3);
  uint16_t t[3] = {0, 0, 0};
  shard.read(0, 3, t);
  EXPECT_EQ(t[0], 10);
  EXPECT_EQ(t[2], 30);
}

TEST(TokenShard, MissingFile) {
  TempDir dir;
  const auto path = dir.file("nope.bin");
  auto msg = error_of([&] { TokenShard s(path); });
  expect_one_line_with(msg, {path, "cannot open", std::strerror(ENOENT)});
}

TEST(TokenShard, Directory) {
  TempDir dir;
  auto msg = error_of([&] { TokenShard s(dir.path()); });
  expect_one_line_with(msg, {dir.path(), "not a regular file"});
}

// Issue 22 item 3: a FIFO (or a device) as a shard is refused before it is opened: opening a
// FIFO for reading would block until a writer comes, ignoring SIGTERM. The test runs in a
// child with an alarm so that the old behaviour (blocking) fails it instead of hanging.
TEST(TokenShard, FifoAndDeviceAreRefusedWithoutBlocking) {
  TempDir dir;
  const auto fifo = dir.file("train_000.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_EXIT(
      {
        ::alarm(5);
        try {
          TokenDataset ds(dir.file("train_*.bin"), 4, 256);
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(0);
        }
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "train_000.bin': not a regular file \\(a FIFO\\)");
  expect_one_line_with(error_of([] { TokenShard s("/dev/zero"); }),
                       {"/dev/zero", "not a regular file (a character device)"});
}

// Issue 22 item 10: a shard truncated while a run reads it (another job rewriting the data)
// is an error naming the file. Shards used to be memory-mapped, and touching the lost pages
// raised SIGBUS (exit 135, no message); the check runs in a child so that a signal fails the
// test rather than the whole binary.
TEST(TokenShard, TruncatedWhileInUseIsAnErrorNotSigbus) {
  TempDir dir;
  const auto path = dir.file("live.bin");
  write_shard(path, iota_tokens(40000));
  const auto truncate_while_reading = [&] {
    TokenDataset ds(path, 64, 65536);
    std::vector<int32_t> in(64), out(64);
    ds.window(600, in.data(), out.data());  // fine while the file is whole
    fs::resize_file(path, 1024 + 2 * 1000);  // keeps 1000 tokens
    ds.window(0, in.data(), out.data());     // still inside what is left
    try {
      ds.window(600, in.data(), out.data());
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::exit(0);
    }
    std::exit(1);
  };
  EXPECT_EXIT(truncate_while_reading(),
      ::testing::ExitedWithCode(0),
      "token shard '.*live.bin': truncated while in use: tokens \\[38400, 38465\\) lie in "
      "bytes \\[77824, 77954\\), but the file now has 3024 bytes \\(it had 81024 when "
      "opened\\)");
}

TEST(TokenShard, SmallerThanHeader) {
  TempDir dir;
  const auto path = dir.file("tiny.bin");
  std::ofstream(path) << "hello";
  auto msg = error_of([&] { TokenShard s(path); });
  expect_one_line_with(msg, {path, "5 bytes", "1024-byte header"});
  std::ofstream(path, std::ios::trunc).close();  // empty file
  msg = error_of([&] { TokenShard s(path); });
  expect_one_line_with(msg, {path, "0 bytes", "header"});
}

TEST(TokenShard, WrongMagic) {
  TempDir dir;
  const auto path = dir.file("magic.bin");
  auto h = good_header(2);
  h[0] = 20240802;
  write_raw(path, h, {1, 2});
  auto msg = error_of([&] { TokenShard s(path); });
  expect_one_line_with(msg, {path, "magic", "20240802", "expected 20240520 or 20240801"});
}

TEST(TokenShard, WrongVersion) {
  TempDir dir;
  const auto path = dir.file("version.bin");
  auto h = good_header(2);
  h[1] = 2;
  write_raw(path, h, {1, 2});
  auto msg = error_of([&] { TokenShard s(path); });
  expect_one_line_with(msg, {path, "version 2", "expected 1"});
  // Each magic has its own version: llm.c's uint32 magic with the uint16 version is refused,
  // and so is the uint16 magic with version 7.
  h[0] = 20240801;
  h[1] = 1;
  write_raw(path, h, {1, 2, 3, 4});
  expect_one_line_with(error_of([&] { TokenShard s(path); }),
                       {path, "version 1 for magic 20240801", "expected 7", "uint32"});
  h[0] = 20240520;
  h[1] = 7;
  write_raw(path, h, {1, 2});
  expect_one_line_with(error_of([&] { TokenShard s(path); }),
                       {path, "version 7 for magic 20240520", "expected 1", "uint16"});
}

// llm.c's uint32 layout (dev/data/data_common.py, "llama-3"): 256 x int32 header with magic
// 20240801, version 7, the count; then uint32 tokens.
TEST(TokenShard, Uint32RoundTripInLlmCsLayout) {
  TempDir dir;
  const auto path = dir.file("wide.bin");
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 4000000000u, 7};
  trident::write_shard_u32(path, tokens);
  EXPECT_EQ(fs::file_size(path), 1024u + 4 * tokens.size());
  const auto h = read_ints(path, 256);
  EXPECT_EQ(h[0], 20240801);
  EXPECT_EQ(h[1], 7);
  EXPECT_EQ(h[2], static_cast<int32_t>(tokens.size()));
  EXPECT_EQ(std::count(h.begin() + 3, h.end(), 0), 253);
  TokenShard shard(path);
  EXPECT_EQ(shard.token_bytes(), 4);
  EXPECT_EQ(shard.num_tokens(), static_cast<int64_t>(tokens.size()));
  std::vector<uint32_t> back(tokens.size());
  shard.read(0, static_cast<int64_t>(tokens.size()), back.data());
  EXPECT_EQ(back, tokens);
  uint16_t narrow[1];
  expect_one_line_with(error_of([&] { shard.read(0, 1, narrow); }), {path, "uint32"});
  // A uint16 shard widens into uint32.
  write_shard(dir.file("narrow.bin"), {3, 65535});
  TokenShard small(dir.file("narrow.bin"));
  EXPECT_EQ(small.token_bytes(), 2);
  uint32_t two[2];
  small.read(0, 2, two);
  EXPECT_EQ(two[0], 3u);
  EXPECT_EQ(two[1], 65535u);
  // Truncated: the size is checked with 4 bytes per token.
  auto h2 = good_header(3);
  h2[0] = 20240801;
  h2[1] = 7;
  write_raw(dir.file("cut.bin"), h2, {1, 0, 2, 0, 3});  // 10 bytes, 12 needed
  expect_one_line_with(error_of([&] { TokenShard s(dir.file("cut.bin")); }),
                       {dir.file("cut.bin"), "truncated", "1036 bytes", "1034 bytes"});
}

// uint32 shards feed vocabularies beyond 65536; every token is checked against vocab_size.
TEST(TokenDataset, Uint32ShardsFeedLargeVocabulariesAndCheckEveryToken) {
  TempDir dir;
  std::vector<uint32_t> tokens(41);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(100000 + i);
  tokens[21] = 128256;  // window 2 for T = 8: tokens [16, 25)
  trident::write_shard_u32(dir.file("w_0.bin"), tokens);
  TokenDataset ds(dir.file("w_0.bin"), 8, 128256);
  std::vector<int32_t> in(8), tg(8);
  ds.window(1, in.data(), tg.data());
  EXPECT_EQ(in[0], 100008);
  EXPECT_EQ(tg[7], 100016);
  expect_one_line_with(error_of([&] { ds.window(2, in.data(), tg.data()); }),
                       {dir.file("w_0.bin"), "token 128256", "position 21", "vocab_size 128256"});
  // An id beyond int32 (uint32 can hold it) is out of range for any vocab_size.
  tokens[21] = 4000000000u;
  trident::write_shard_u32(dir.file("w_0.bin"), tokens);
  TokenDataset huge(dir.file("w_0.bin"), 8, 2147483647);
  expect_one_line_with(error_of([&] { huge.window(2, in.data(), tg.data()); }),
                       {dir.file("w_0.bin"), "token 4000000000", "position 21"});
  // A glob mixing widths: the uint16 shard cannot express vocab_size > 65536 and is named.
  write_shard(dir.file("w_1.bin"), iota_tokens(50));
  expect_one_line_with(error_of([&] { TokenDataset d(dir.file("w_*.bin"), 8, 128256); }),
                       {dir.file("w_1.bin"), "uint16", "model.vocab_size = 128256"});
  // With vocab_size <= 65536 both widths mix: windows are numbered through both shards.
  std::vector<uint32_t> small(17);
  std::iota(small.begin(), small.end(), 10u);
  trident::write_shard_u32(dir.file("w_0.bin"), small);
  TokenDataset mixed(dir.file("w_*.bin"), 8, 65536);
  EXPECT_EQ(mixed.num_windows(), 2 + 6);
  mixed.window(2, in.data(), tg.data());  // the uint16 shard's window 0
  EXPECT_EQ(in[0], 0);
  EXPECT_EQ(tg[7], 8);
}

TEST(TokenShard, TruncatedAndOversized) {
  TempDir dir;
  const auto path = dir.file("trunc.bin");
  write_raw(path, good_header(10), iota_tokens(9));  // one token short
  auto msg = error_of([&] { TokenShard s(path); });
  expect_one_line_with(msg, {path, "truncated", "10 tokens", "1044 bytes", "1042 bytes"});

  const auto path2 = dir.file("over.bin");
  write_raw(path2, good_header(10), iota_tokens(12));
  msg = error_of([&] { TokenShard s(path2); });
  expect_one_line_with(msg, {path2, "oversized", "1044 bytes", "1048 bytes"});

  const auto path3 = dir.file("neg.bin");
  write_raw(path3, good_header(-5), {});
  msg = error_of([&] { TokenShard s(path3); });
  expect_one_line_with(msg, {path3, "-5"});
}

TEST(TokenShard, WriteFailureNamesThePath) {
  TempDir dir;
  const auto path = dir.file("no/such/dir/x.bin");
  auto msg = error_of([&] { write_shard(path, {1, 2, 3}); });
  expect_one_line_with(msg, {path, std::strerror(ENOENT)});
}

// ---------------------------------------------------------------------------------------------
// Dataset

TEST(TokenDataset, SingleShardWindows) {
  TempDir dir;
  const auto path = dir.file("one.bin");
  write_shard(path, iota_tokens(100));
  TokenDataset ds(path, 8, 1000);
  EXPECT_EQ(ds.seq_len(), 8);
  EXPECT_EQ(ds.num_windows(), (100 - 1) / 8);  // 12
  ASSERT_EQ(ds.shards().size(), 1u);
  std::vector<int32_t> in(8), tg(8);
  for (int64_t w = 0; w < ds.num_windows(); ++w) {
    ds.window(w, in.data(), tg.data());
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(in[static_cast<size_t>(t)], w * 8 + t);
      EXPECT_EQ(tg[static_cast<size_t>(t)], w * 8 + t + 1);
    }
  }
  // Exactly T+1 tokens make one window; T tokens make none.
  write_shard(dir.file("exact.bin"), iota_tokens(9));
  EXPECT_EQ(TokenDataset(dir.file("exact.bin"), 8, 1000).num_windows(), 1);
  auto msg = error_of([&] { ds.window(12, in.data(), tg.data()); });
  expect_one_line_with(msg, {"window 12", "[0, 12)"});
  msg = error_of([&] { ds.window(-1, in.data(), tg.data()); });
  expect_one_line_with(msg, {"window -1"});
}

TEST(TokenDataset, GlobSortedByNameAndWindowsNeverCrossShards) {
  TempDir dir;
  // Created out of order; token = 1000 * (rank of the name) + position in the shard.
  const std::vector<std::pair<std::string, int>> shards = {
      {"part_c.bin", 50}, {"part_a.bin", 33}, {"part_b.bin", 5}, {"part_d.bin", 17}};
  const std::map<std::string, int> rank = {
      {"part_a.bin", 0}, {"part_b.bin", 1}, {"part_c.bin", 2}, {"part_d.bin", 3}};
  for (const auto& [name, n] : shards) {
    write_shard(dir.file(name), iota_tokens(static_cast<size_t>(n),
                                            static_cast<uint16_t>(1000 * rank.at(name))));
  }
  write_shard(dir.file("other.bin"), iota_tokens(500));  // does not match the glob
  const int64_t T = 8;
  TokenDataset ds(dir.file("part_*.bin"), T, 4000);
  ASSERT_EQ(ds.shards().size(), 4u);
  EXPECT_EQ(ds.shards()[0]->path(), dir.file("part_a.bin"));
  EXPECT_EQ(ds.shards()[1]->path(), dir.file("part_b.bin"));
  EXPECT_EQ(ds.shards()[2]->path(), dir.file("part_c.bin"));
  EXPECT_EQ(ds.shards()[3]->path(), dir.file("part_d.bin"));
  // a: 32/8 = 4, b: 4/8 = 0 (too short, skipped), c: 49/8 = 6, d: 16/8 = 2.
  ASSERT_EQ(ds.num_windows(), 12);
  const std::vector<std::pair<int, int>> expect = {  // (shard rank, local window)
      {0, 0}, {0, 1}, {0, 2}, {0, 3}, {2, 0}, {2, 1}, {2, 2}, {2, 3}, {2, 4}, {2, 5},
      {3, 0}, {3, 1}};
  std::vector<int32_t> in(T), tg(T);
  for (int64_t w = 0; w < ds.num_windows(); ++w) {
    ds.window(w, in.data(), tg.data());
    const auto [r, local] = expect[static_cast<size_t>(w)];
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(in[static_cast<size_t>(t)], 1000 * r + local * T + t) << "window " << w;
      EXPECT_EQ(tg[static_cast<size_t>(t)], 1000 * r + local * T + t + 1) << "window " << w;
    }
  }
}

TEST(TokenDataset, PlainPathMissing) {
  TempDir dir;
  const auto path = dir.file("missing.bin");
  auto msg = error_of([&] { TokenDataset ds(path, 8, 256); });
  expect_one_line_with(msg, {path, "cannot open", std::strerror(ENOENT)});
}

TEST(TokenDataset, GlobWithNoMatch) {
  TempDir dir;
  write_shard(dir.file("train_000.bin"), iota_tokens(100));
  const auto pattern = dir.file("val_*.bin");
  auto msg = error_of([&] { TokenDataset ds(pattern, 8, 256); });
  expect_one_line_with(msg, {pattern, "no file matches"});
}

TEST(TokenDataset, BadShardInGlobNamesThatShard) {
  TempDir dir;
  write_shard(dir.file("s_0.bin"), iota_tokens(100));
  auto h = good_header(4);
  h[0] = 7;
  write_raw(dir.file("s_1.bin"), h, {1, 2, 3, 4});
  auto msg = error_of([&] { TokenDataset ds(dir.file("s_*.bin"), 8, 256); });
  expect_one_line_with(msg, {dir.file("s_1.bin"), "magic"});
}

TEST(TokenDataset, ShorterThanOneWindow) {
  TempDir dir;
  const auto path = dir.file("short.bin");
  write_shard(path, iota_tokens(64));  // needs 65 for T = 64
  auto msg = error_of([&] { TokenDataset ds(path, 64, 256); });
  expect_one_line_with(msg, {path, "shorter than one window", "T+1 = 65", "64"});

  write_shard(dir.file("short2.bin"), iota_tokens(10));
  const auto pattern = dir.file("short*.bin");
  msg = error_of([&] { TokenDataset ds(pattern, 64, 256); });
  expect_one_line_with(msg, {pattern, "short.bin", "short2.bin", "T+1 = 65"});
}

TEST(TokenDataset, TokenOutOfVocabulary) {
  TempDir dir;
  const auto path = dir.file("oov.bin");
  auto tokens = iota_tokens(40);
  for (auto& t : tokens) t = static_cast<uint16_t>(t % 50);
  tokens[21] = 300;  // in window 2 for T = 8: tokens [16, 25)
  write_shard(path, tokens);
  TokenDataset ds(path, 8, 256);  // checked lazily: construction succeeds
  std::vector<int32_t> in(8), tg(8);
  ds.window(0, in.data(), tg.data());
  ds.window(3, in.data(), tg.data());
  auto msg = error_of([&] { ds.window(2, in.data(), tg.data()); });
  expect_one_line_with(msg, {path, "300", "position 21", "256"});
  // The last token of a window is a target: window 1 covers [8, 17), so token 16 counts.
  tokens[21] = 5;
  tokens[16] = 256;
  write_shard(path, tokens);
  TokenDataset ds2(path, 8, 256);
  msg = error_of([&] { ds2.window(1, in.data(), tg.data()); });
  expect_one_line_with(msg, {path, "256", "position 16"});
}

// The configuration allows vocabularies beyond uint16 (Llama 3: 128256); the shards do not.
TEST(TokenDataset, VocabularyLargerThanUint16IsRefusedNamingTheShard) {
  TempDir dir;
  write_shard(dir.file("a.bin"), iota_tokens(100));
  write_shard(dir.file("b.bin"), iota_tokens(100));
  const auto msg = error_of([&] { TokenDataset ds(dir.file("*.bin"), 8, 128256); });
  expect_one_line_with(msg, {dir.file("a.bin"), "model.vocab_size = 128256", "uint16", "65536"});
  EXPECT_EQ(trident::kShardMaxVocab, 65536);
  EXPECT_NO_THROW(TokenDataset(dir.file("a.bin"), 8, 65536));
  EXPECT_THROW(TokenDataset(dir.file("a.bin"), 8, 65537), Error);
}

TEST(TokenDataset, InvalidArguments) {
  TempDir dir;
  write_shard(dir.file("x.bin"), iota_tokens(100));
  error_of([&] { TokenDataset ds(dir.file("x.bin"), 0, 256); });
  error_of([&] { TokenDataset ds(dir.file("x.bin"), 8, 0); });
  error_of([&] { TokenDataset ds("", 8, 256); });
}

// ---------------------------------------------------------------------------------------------
// Sampler

TEST(BatchSampler, NoShuffleIsConsecutiveWindowsFromTheStart) {
  BatchSampler s(100, 8, false, 1234);
  for (int64_t step = 0; step < 12; ++step) {
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(s.window_id(step, i), step * 8 + i);
    }
  }
  // Position 100 is window 0 again.
  EXPECT_EQ(s.window_id(12, 3), (12 * 8 + 3) % 100);
  EXPECT_EQ(s.window_id(12, 4), 0);
}

TEST(BatchSampler, WrapAroundAcrossEpochs) {
  // W = 10, G = 4: step 2 takes stream positions 8, 9 | 10, 11 = epoch 0 k 8, 9, epoch 1 k 0, 1.
  BatchSampler plain(10, 4, false, 7);
  EXPECT_EQ(plain.window_id(2, 0), 8);
  EXPECT_EQ(plain.window_id(2, 1), 9);
  EXPECT_EQ(plain.window_id(2, 2), 0);
  EXPECT_EQ(plain.window_id(2, 3), 1);
  BatchSampler sh(10, 4, true, 7);
  const auto p0 = ref_perm(10, 7, 0), p1 = ref_perm(10, 7, 1);
  EXPECT_EQ(sh.window_id(2, 0), p0[8]);
  EXPECT_EQ(sh.window_id(2, 1), p0[9]);
  EXPECT_EQ(sh.window_id(2, 2), p1[0]);
  EXPECT_EQ(sh.window_id(2, 3), p1[1]);
  // G larger than W: one step spans several epochs.
  BatchSampler big(3, 7, false, 0);
  std::vector<int64_t> got;
  for (int64_t i = 0; i < 7; ++i) got.push_back(big.window_id(0, i));
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0}));
  // A single window.
  BatchSampler one(1, 4, true, 99);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(one.window_id(5, i), 0);
}

namespace {
std::vector<int64_t> epoch_ids(const BatchSampler& s, int64_t W, int64_t G, int64_t epoch) {
  std::vector<int64_t> ids;
  for (int64_t p = epoch * W; p < (epoch + 1) * W; ++p) ids.push_back(s.window_id(p / G, p % G));
  return ids;
}
}  // namespace

TEST(BatchSampler, ShuffleIsAPermutationPerEpoch) {
  const int64_t W = 37, G = 5;  // G does not divide W: epochs begin mid-step
  BatchSampler s(W, G, true, 1234);
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 4; ++e) {
    auto ids = epoch_ids(s, W, G, e);
    auto sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(W);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "epoch " << e;
    EXPECT_NE(ids, all) << "epoch " << e << " is not shuffled";
    epochs.push_back(ids);
  }
  for (size_t a = 0; a < epochs.size(); ++a)
    for (size_t b = a + 1; b < epochs.size(); ++b) EXPECT_NE(epochs[a], epochs[b]);
}

TEST(BatchSampler, ShuffleDependsOnlyOnSeed) {
  const int64_t W = 50, G = 8;
  BatchSampler a(W, G, true, 1), b(W, G, true, 1), c(W, G, true, 2);
  EXPECT_EQ(epoch_ids(a, W, G, 0), epoch_ids(b, W, G, 0));
  EXPECT_EQ(epoch_ids(a, W, G, 3), epoch_ids(b, W, G, 3));
  EXPECT_NE(epoch_ids(a, W, G, 0), epoch_ids(c, W, G, 0));
  EXPECT_NE(epoch_ids(a, W, G, 1), epoch_ids(c, W, G, 1));
  // Random access (jumping between epochs, as a resumed run does) gives the same ids as a
  // sequential pass: the cached permutation is only an optimisation.
  BatchSampler fresh(W, G, true, 1);
  for (int64_t step : {40, 0, 7, 6, 39, 13, 0, 100}) {
    for (int64_t i = 0; i < G; ++i) {
      EXPECT_EQ(fresh.window_id(step, i), ref_window(W, G, true, 1, step, i));
    }
  }
}

TEST(BatchSampler, MatchesIndependentReimplementation) {
  for (int64_t W : {1, 2, 3, 10, 37, 256, 1000}) {
    for (int64_t G : {1, 4, 7, 64}) {
      for (uint64_t seed : {0ULL, 1ULL, 1234ULL, 0xFFFFFFFFFFFFFFFFULL, 0x9E3779B97F4A7C15ULL}) {
        BatchSampler s(W, G, true, seed), p(W, G, false, seed);
        const int64_t steps = std::max<int64_t>(3, (3 * W) / G + 2);  // > 2 epochs
        for (int64_t step = 0; step < steps; ++step) {
          for (int64_t i = 0; i < G; ++i) {
            ASSERT_EQ(s.window_id(step, i), ref_window(W, G, true, seed, step, i))
                << "W " << W << " G " << G << " seed " << seed << " step " << step;
            ASSERT_EQ(p.window_id(step, i), ref_window(W, G, false, seed, step, i));
          }
        }
      }
    }
  }
}

TEST(BatchSampler, KnownAnswers) {
  // SplitMix64's published first output for state 0, via the reference implementation above.
  uint64_t st = 0;
  EXPECT_EQ(ref_splitmix(st), 0xE220A8397B1DCDAFULL);
  // Computed from docs/data.md by data_tools/inspect_shard.py:
  //   inspect_shard.py --order -W 10 -G 4 --steps 5 --shuffle --seed 1234
  const std::vector<std::vector<int64_t>> want = {
      {4, 6, 5, 2}, {7, 0, 1, 8}, {9, 3, 4, 5}, {6, 9, 2, 0}, {7, 8, 1, 3}};
  BatchSampler s(10, 4, true, 1234);
  for (int64_t step = 0; step < 5; ++step)
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_EQ(s.window_id(step, i), want[static_cast<size_t>(step)][static_cast<size_t>(i)])
          << "step " << step << " sample " << i;
  //   inspect_shard.py --order -W 1000 -G 8 --steps 2 --start-step 124 --shuffle --seed 42
  const std::vector<std::vector<int64_t>> want2 = {
      {394, 636, 500, 66, 782, 540, 261, 291}, {88, 388, 31, 209, 331, 926, 0, 669}};
  BatchSampler s2(1000, 8, true, 42);
  for (int64_t step = 124; step < 126; ++step)
    for (int64_t i = 0; i < 8; ++i)
      EXPECT_EQ(s2.window_id(step, i),
                want2[static_cast<size_t>(step - 124)][static_cast<size_t>(i)]);
}

namespace {
const char* kPython = "/usr/bin/python3";

std::string inspect_tool() {
#ifdef TRIDENT_SOURCE_DIR
  return std::string(TRIDENT_SOURCE_DIR) + "/data_tools/inspect_shard.py";
#else
  return "";
#endif
}

// Parses "step s: id id ..." lines.
std::map<int64_t, std::vector<int64_t>> parse_order(const std::string& out) {
  std::map<int64_t, std::vector<int64_t>> steps;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word, colon;
    int64_t step;
    if (!(ls >> word) || word != "step") continue;
    ls >> step >> colon;  // "s:" reads as s then ":"
    int64_t id;
    while (ls >> id) steps[step].push_back(id);
  }
  return steps;
}
}  // namespace

TEST(BatchSampler, MatchesPythonInspectShard) {
  const auto tool = inspect_tool();
  if (::access(kPython, X_OK) != 0 || tool.empty() || ::access(tool.c_str(), R_OK) != 0) {
    GTEST_SKIP() << "needs " << kPython << " and data_tools/inspect_shard.py";
  }
  struct Case {
    int64_t W, G, start, steps;
    bool shuffle;
    uint64_t seed;
    std::string seed_arg;
  };
  const std::vector<Case> cases = {
      {10, 4, 0, 6, true, 1234, "1234"},
      {97, 16, 3, 20, true, 7, "7"},
      {1000, 32, 60, 10, true, 0xFFFFFFFFFFFFFFFFULL, "-1"},  // int64 seed -1 as uint64
      {5, 8, 0, 4, true, 99, "99"},
      {50, 8, 0, 10, false, 1, "1"},
  };
  for (const auto& c : cases) {
    std::string cmd = std::string(kPython) + " " + tool + " --order --num-windows " +
                      std::to_string(c.W) + " --global-batch " + std::to_string(c.G) +
                      " --start-step " + std::to_string(c.start) + " --steps " +
                      std::to_string(c.steps) + " --seed " + c.seed_arg +
                      (c.shuffle ? " --shuffle" : "");
    auto [status, out] = trident::test::run_command(cmd, 120, /*merge_stderr=*/false);
    ASSERT_EQ(status, 0) << cmd << "\n" << out;
    auto got = parse_order(out);
    ASSERT_EQ(static_cast<int64_t>(got.size()), c.steps) << cmd << "\n" << out;
    BatchSampler s(c.W, c.G, c.shuffle, c.seed);
    for (int64_t step = c.start; step < c.start + c.steps; ++step) {
      std::vector<int64_t> want;
      for (int64_t i = 0; i < c.G; ++i) want.push_back(s.window_id(step, i));
      EXPECT_EQ(got[step], want) << cmd << " step " << step;
    }
  }

  // W taken from shards by the tool agrees with TokenDataset's count.
  TempDir dir;
  write_shard(dir.file("t_000.bin"), iota_tokens(1000));
  write_shard(dir.file("t_001.bin"), iota_tokens(333));
  write_shard(dir.file("t_002.bin"), iota_tokens(20));
  TokenDataset ds(dir.file("t_*.bin"), 16, 65536);
  auto [status, out] = trident::test::run_command(std::string(kPython) + " " + tool + " '" +
                                   dir.file("t_*.bin") +
                                   "' --seq-len 16 --order --global-batch " +
                                   std::to_string(ds.num_windows()) + " --steps 1");
  ASSERT_EQ(status, 0) << out;
  auto got = parse_order(out);
  ASSERT_EQ(got[0].size(), static_cast<size_t>(ds.num_windows())) << out;
}

TEST(InspectShard, ReadsUint16AndUint32Shards) {
  const auto tool = inspect_tool();
  if (::access(kPython, X_OK) != 0 || tool.empty() || ::access(tool.c_str(), R_OK) != 0) {
    GTEST_SKIP() << "needs " << kPython << " and data_tools/inspect_shard.py";
  }
  TempDir dir;
  trident::write_shard_u32(dir.file("s_0.bin"), {72, 105, 128255, 33, 10});
  write_shard(dir.file("s_1.bin"), {72, 105, 33, 10, 0});
  auto [status, out] = trident::test::run_command(std::string(kPython) + " " + tool + " '" +
                                   dir.file("s_*.bin") + "' --seq-len 2 --window 0 --windows 4");
  ASSERT_EQ(status, 0) << out;
  for (const char* want : {"magic      20240801", "version    7 (uint32 tokens)",
                           "4 x 5)", "magic      20240520", "version    1 (uint16 tokens)",
                           "2 x 5)", "windows    4 of T+1 = 3", "ids: 72 105 128255",
                           "ids: 128255 33 10", "Hi!"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "'" << want << "' not in:\n" << out;
  }
  // A uint32 shard with the uint16 version is reported inconsistent (exit 1).
  auto h = good_header(1);
  h[0] = 20240801;
  write_raw(dir.file("bad.bin"), h, {1, 0});
  auto [bad_status, bad_out] =
      trident::test::run_command(std::string(kPython) + " " + tool + " " + dir.file("bad.bin") + " 2>&1");
  EXPECT_NE(bad_status, 0) << bad_out;
  EXPECT_NE(bad_out.find("wrong version 1 for magic 20240801 (expected 7)"), std::string::npos)
      << bad_out;
}

TEST(BatchSampler, FirstSamplePartitionsTheGlobalBatch) {
  const int64_t G = 24;
  for (int64_t dp : {1, 2, 3, 4, 6, 8, 12, 24}) {
    const int64_t per = G / dp;
    for (int64_t mb = 1; mb <= per; ++mb) {
      if (per % mb != 0) continue;
      std::vector<int> seen(G, 0);
      for (int64_t r = 0; r < dp; ++r) {
        int64_t expected_next = r * per;  // a replica's block is contiguous, micro in order
        for (int64_t m = 0; m < per / mb; ++m) {
          const int64_t first = BatchSampler::first_sample(G, r, dp, m, mb);
          EXPECT_EQ(first, expected_next);
          for (int64_t i = first; i < first + mb; ++i) {
            ASSERT_GE(i, 0);
            ASSERT_LT(i, G);
            ++seen[static_cast<size_t>(i)];
          }
          expected_next = first + mb;
        }
        EXPECT_EQ(expected_next, (r + 1) * per);
      }
      for (int64_t i = 0; i < G; ++i)
        EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << "dp " << dp << " mb " << mb << " i " << i;
    }
  }
}

TEST(BatchSampler, EveryLayoutTrainsOnTheSameWindows) {
  // The multiset of windows a step trains on, and which sample each window is, do not
  // depend on (dp, micro_batch): gather them the way ranks do and compare with the global list.
  const int64_t W = 123, G = 16;
  BatchSampler s(W, G, true, 555);
  for (int64_t step : {0, 7, 8, 30}) {
    std::vector<int64_t> global;
    for (int64_t i = 0; i < G; ++i) global.push_back(s.window_id(step, i));
    for (auto [dp, mb] : std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {1, 2}, {2, 4},
                                                                  {4, 1}, {8, 2}, {16, 1}}) {
      std::vector<int64_t> gathered;
      for (int64_t r = 0; r < dp; ++r)
        for (int64_t m = 0; m < G / dp / mb; ++m) {
          const int64_t first = BatchSampler::first_sample(G, r, dp, m, mb);
          for (int64_t i = first; i < first + mb; ++i) gathered.push_back(s.window_id(step, i));
        }
      EXPECT_EQ(gathered, global) << "dp " << dp << " mb " << mb;
    }
  }
}

TEST(BatchSampler, InvalidArguments) {
  error_of([] { BatchSampler s(0, 4, false, 0); });
  error_of([] { BatchSampler s(10, 0, false, 0); });
  BatchSampler s(10, 4, true, 0);
  error_of([&] { s.window_id(-1, 0); });
  error_of([&] { s.window_id(0, 4); });
  error_of([&] { s.window_id(0, -1); });
  error_of([] { BatchSampler::first_sample(10, 0, 3, 0, 1); });  // 10 % 3 != 0
  error_of([] { BatchSampler::first_sample(12, 3, 3, 0, 1); });  // rank out of range
  error_of([] { BatchSampler::first_sample(12, 0, 3, 2, 2); });  // micro beyond the block
  error_of([] { BatchSampler::first_sample(12, 0, 3, 0, 0); });  // empty micro-batch
  EXPECT_EQ(BatchSampler::first_sample(12, 2, 3, 1, 2), 10);
}

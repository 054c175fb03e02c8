// Megatron-LM indexed datasets (MMIDIDX v1) as a TokenDataset source (docs/data.md).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "temp_dir.hpp"
#include "data/dataset.hpp"
#include "data/indexed_dataset.hpp"
#include "util/error.hpp"

namespace fs = std::filesystem;
using trident::test::error_of;
using trident::test::expect_one_line_with;
using trident::BatchSampler;
using trident::Error;
using trident::IndexedDataset;
using trident::kIndexDTypeInt32;
using trident::kIndexDTypeUInt16;
using trident::TokenDataset;
using trident::write_indexed_dataset;
using trident::write_shard;

namespace {

// Each test directory: "trident_idx_XXXXXX".
struct TempDir : trident::test::TempDir {
  TempDir() : trident::test::TempDir("trident_idx") {}
};

// Documents of varied lengths (one empty), tokens 0..bound-1, deterministic.
std::vector<std::vector<int32_t>> make_documents(int32_t bound, uint64_t salt = 1) {
  const std::vector<int> lengths = {7, 1, 30, 0, 12, 25, 3, 19, 40, 5};
  std::vector<std::vector<int32_t>> docs;
  uint64_t x = 0x9E3779B97F4A7C15ULL ^ salt;
  for (int len : lengths) {
    std::vector<int32_t> d(static_cast<size_t>(len));
    for (auto& t : d) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      t = static_cast<int32_t>(x % static_cast<uint64_t>(bound));
    }
    docs.push_back(std::move(d));
  }
  return docs;
}

std::vector<int32_t> concat(const std::vector<std::vector<int32_t>>& docs) {
  std::vector<int32_t> all;
  for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
  return all;
}

// Overwrites bytes of a file in place.
void patch(const std::string& path, int64_t offset, const void* data, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  ASSERT_TRUE(f.good());
}

// Header field offsets of the .idx (Megatron's _IndexWriter layout).
constexpr int64_t kVersionAt = 9, kDTypeAt = 17, kSeqCountAt = 18, kDocCountAt = 26,
                  kLengthsAt = 34;

}  // namespace

TEST(IndexedDataset, ReaderGivesTheKnownDocumentsForBothDtypes) {
  for (uint8_t code : {kIndexDTypeUInt16, kIndexDTypeInt32}) {
    TempDir dir;
    const int32_t bound = code == kIndexDTypeInt32 ? 2000000000 : 65536;
    const auto docs = make_documents(bound, code);
    write_indexed_dataset(dir.file("corpus"), docs, code);
    const int64_t item = code == kIndexDTypeInt32 ? 4 : 2;
    const auto all = concat(docs);
    // The files have exactly Megatron's sizes.
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir.file("corpus.bin"))),
              static_cast<int64_t>(all.size()) * item);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir.file("corpus.idx"))),
              34 + 12 * 10 + 8 * 11);

    IndexedDataset ds(dir.file("corpus"));
    EXPECT_EQ(ds.dtype_code(), code);
    EXPECT_EQ(ds.item_size(), item);
    EXPECT_EQ(ds.num_sequences(), 10);
    EXPECT_EQ(ds.num_documents(), 10);
    EXPECT_EQ(ds.num_tokens(), static_cast<int64_t>(all.size()));
    for (int64_t d = 0; d < 10; ++d) EXPECT_EQ(ds.document(d), docs[static_cast<size_t>(d)]);
    std::vector<int32_t> got(all.size());
    ds.read(0, static_cast<int64_t>(all.size()), got.data());
    EXPECT_EQ(got, all);
    expect_one_line_with(error_of([&] { ds.read(static_cast<int64_t>(all.size()) - 1, 2,
                                                got.data()); }),
                         {dir.file("corpus.bin"), "out of range"});
    // Found by tests/fuzz/fuzz_indexed_dataset (on every valid seed, e.g. uint16): a range whose end
    // overflows int64 is refused, the message computed without overflowing.
    expect_one_line_with(error_of([&] { ds.read(INT64_MAX, 2, got.data()); }),
                         {dir.file("corpus.bin"), "[9223372036854775807, 9223372036854775807 + 2)"});
    expect_one_line_with(error_of([&] { ds.read(1, INT64_MAX, got.data()); }),
                         {dir.file("corpus.bin"), "out of range"});
  }
}

TEST(IndexedDataset, WindowsAreCutFromTheConcatenatedDocuments) {
  for (uint8_t code : {kIndexDTypeUInt16, kIndexDTypeInt32}) {
    TempDir dir;
    const auto docs = make_documents(1000, 7);
    write_indexed_dataset(dir.file("c"), docs, code);
    const auto all = concat(docs);  // 142 tokens
    const int64_t T = 8;
    TokenDataset ds(dir.file("c"), T, 1000);
    ASSERT_NE(ds.indexed(), nullptr);
    EXPECT_TRUE(ds.shards().empty());
    EXPECT_EQ(ds.num_windows(), (static_cast<int64_t>(all.size()) - 1) / T);
    std::vector<int32_t> in(T), tg(T);
    for (int64_t w = 0; w < ds.num_windows(); ++w) {
      ds.window(w, in.data(), tg.data());
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(in[t], all[static_cast<size_t>(w * T + t)]) << w << " " << t;
        ASSERT_EQ(tg[t], all[static_cast<size_t>(w * T + t + 1)]) << w << " " << t;
      }
    }
    EXPECT_THROW(ds.window(ds.num_windows(), in.data(), tg.data()), Error);
  }
}

TEST(IndexedDataset, SameTokensAsAShardGiveTheSameWindowsAndOrder) {
  TempDir dir;
  const auto docs = make_documents(65536, 3);
  const auto all = concat(docs);
  write_indexed_dataset(dir.file("same"), docs, kIndexDTypeUInt16);
  write_indexed_dataset(dir.file("same32"), docs, kIndexDTypeInt32);
  write_shard(dir.file("same.bin.shard"), std::vector<uint16_t>(all.begin(), all.end()));
  for (int64_t T : {1, 4, 16, 141}) {
    TokenDataset shard(dir.file("same.bin.shard"), T, 65536);
    for (const char* prefix : {"same", "same32"}) {
      TokenDataset idx(dir.file(prefix), T, 65536);
      ASSERT_EQ(idx.num_windows(), shard.num_windows()) << T;
      std::vector<int32_t> a(T), b(T), c(T), d(T);
      for (int64_t w = 0; w < shard.num_windows(); ++w) {
        shard.window(w, a.data(), b.data());
        idx.window(w, c.data(), d.data());
        ASSERT_EQ(a, c) << T << " " << w;
        ASSERT_EQ(b, d) << T << " " << w;
      }
      BatchSampler s1(shard.num_windows(), 3, true, 99), s2(idx.num_windows(), 3, true, 99);
      for (int64_t step = 0; step < 20; ++step)
        for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(s1.window_id(step, i), s2.window_id(step, i));
    }
  }
}

TEST(IndexedDataset, Int32TokensAllowVocabulariesBeyondUint16) {
  TempDir dir;
  std::vector<std::vector<int32_t>> docs = {{70000, 1, 128255, 5}, {65536, 99999, 3}};
  write_indexed_dataset(dir.file("big"), docs, kIndexDTypeInt32);
  TokenDataset ds(dir.file("big"), 2, 128256);
  std::vector<int32_t> in(2), tg(2);
  ds.window(0, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{70000, 1}));
  EXPECT_EQ(tg, (std::vector<int32_t>{1, 128255}));
  // Ids >= vocab_size: one line naming the dataset, checked when the window is read.
  TokenDataset small(dir.file("big"), 2, 100000);
  expect_one_line_with(error_of([&] { small.window(0, in.data(), tg.data()); }),
                       {dir.file("big.bin"), "token 128255", "vocab_size 100000"});
  // Negative int32 ids are out of range too.
  write_indexed_dataset(dir.file("neg"), {{1, 2, -3, 4}}, kIndexDTypeInt32);
  TokenDataset neg(dir.file("neg"), 3, 10);
  expect_one_line_with(error_of([&] { neg.window(0, in.data(), tg.data()); }),
                       {dir.file("neg.bin"), "token -3"});
  // uint16 indexed data: ids are checked against vocab_size as well.
  write_indexed_dataset(dir.file("u16"), {{1, 2}, {300, 4}}, kIndexDTypeUInt16);
  TokenDataset u16(dir.file("u16"), 3, 256);
  expect_one_line_with(error_of([&] { u16.window(0, in.data(), tg.data()); }),
                       {dir.file("u16.bin"), "token 300", "position 2", "vocab_size 256"});
  // uint16 indexed data keeps the uint16 refusal.
  write_indexed_dataset(dir.file("small16"), {{1, 2, 3, 4}}, kIndexDTypeUInt16);
  EXPECT_NO_THROW(TokenDataset(dir.file("small16"), 2, 65536));
  expect_one_line_with(error_of([&] { TokenDataset d(dir.file("small16"), 2, 65537); }),
                       {dir.file("small16.bin"), "uint16", "model.vocab_size"});
}

TEST(IndexedDataset, PrefixSelectionAndShortDataset) {
  TempDir dir;
  write_indexed_dataset(dir.file("tiny"), {{1, 2}, {3}}, kIndexDTypeUInt16);
  expect_one_line_with(error_of([&] { TokenDataset d(dir.file("tiny"), 8, 256); }),
                       {dir.file("tiny.bin"), "no training window", "3 tokens"});
  // A glob over shards stays a glob even next to indexed data.
  write_shard(dir.file("s_0.bin"), std::vector<uint16_t>(20, 1));
  TokenDataset shards(dir.file("s_*.bin"), 4, 256);
  EXPECT_EQ(shards.indexed(), nullptr);
  EXPECT_EQ(shards.num_windows(), 4);
  // A missing prefix: the shard path's "cannot open" error, naming it.
  expect_one_line_with(error_of([&] { TokenDataset d(dir.file("absent"), 8, 256); }),
                       {dir.file("absent"), "cannot open"});
  // .idx present, .bin missing.
  fs::remove(dir.file("tiny.bin"));
  expect_one_line_with(error_of([&] { IndexedDataset d(dir.file("tiny")); }),
                       {dir.file("tiny.bin"), "cannot open"});
}

class BadIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    docs_ = make_documents(256, 5);
    write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
    ASSERT_NO_THROW(IndexedDataset d(prefix()));
  }
  std::string prefix() const { return dir_.file("bad"); }
  std::string idx() const { return prefix() + ".idx"; }
  std::string bin() const { return prefix() + ".bin"; }
  // The open error, checked to be one line naming `file` and holding `needle`, through
  // IndexedDataset and through TokenDataset (what data.train runs).
  void expect_open_error(const std::string& file, const std::string& needle) {
    expect_one_line_with(error_of([&] { IndexedDataset d(prefix()); }), {file, needle});
    expect_one_line_with(error_of([&] { TokenDataset d(prefix(), 4, 256); }), {file, needle});
  }
  TempDir dir_;
  std::vector<std::vector<int32_t>> docs_;
  static constexpr int64_t S = 10, D = 11;
  static constexpr int64_t kPointersAt = kLengthsAt + 4 * S, kDocsAt = kPointersAt + 8 * S;
};

TEST_F(BadIndex, WrongMagic) {
  patch(idx(), 0, "MMIDIDY", 7);
  expect_open_error(idx(), "wrong magic");
}

TEST_F(BadIndex, WrongVersion) {
  const uint64_t v = 2;
  patch(idx(), kVersionAt, &v, 8);
  expect_open_error(idx(), "unsupported version 2");
}

TEST_F(BadIndex, UnsupportedDtypes) {
  for (int c : {1, 2, 3, 5, 6, 7, 0, 9}) {
    const auto code = static_cast<uint8_t>(c);
    patch(idx(), kDTypeAt, &code, 1);
    expect_open_error(idx(), "unsupported token dtype code " + std::to_string(code));
  }
}

TEST_F(BadIndex, TruncatedAndOversizedBin) {
  fs::resize_file(bin(), fs::file_size(bin()) - 2);
  expect_open_error(bin(), "truncated");
  fs::resize_file(bin(), fs::file_size(bin()) + 4);
  expect_open_error(bin(), "oversized");
}

TEST_F(BadIndex, IndexSizeDisagreesWithCounts) {
  fs::resize_file(idx(), fs::file_size(idx()) - 8);
  expect_open_error(idx(), "size disagrees with the counts");
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const uint64_t huge = uint64_t{1} << 62;
  patch(idx(), kSeqCountAt, &huge, 8);
  expect_open_error(idx(), "size disagrees with the counts");
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  fs::resize_file(idx(), 20);
  expect_open_error(idx(), "smaller than the 34-byte header");
}

TEST_F(BadIndex, PointersThatDisagreeWithLengths) {
  const int64_t p = 12345;
  patch(idx(), kPointersAt + 8 * 4, &p, 8);
  expect_open_error(idx(), "pointer[4] = 12345");
  // First pointer not 0.
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const int64_t two = 2;
  patch(idx(), kPointersAt, &two, 8);
  expect_open_error(idx(), "pointer[0] = 2");
  // A length changed (the pointers after it no longer follow).
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const int32_t len = 8;
  patch(idx(), kLengthsAt, &len, 4);
  expect_open_error(idx(), "sequence pointers disagree with the lengths");
  // A negative length.
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const int32_t negative = -1;
  patch(idx(), kLengthsAt + 4 * 9, &negative, 4);
  expect_open_error(idx(), "sequence 9 has negative length -1");
}

TEST_F(BadIndex, DocumentIndexOutOfRange) {
  const int64_t big = S + 1;
  patch(idx(), kDocsAt + 8 * 5, &big, 8);
  expect_open_error(idx(), "document index out of range: document_indices[5] = 11");
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const int64_t neg = -1;
  patch(idx(), kDocsAt + 8 * 3, &neg, 8);
  expect_open_error(idx(), "document index out of range");
  // Decreasing, first not 0, last not S.
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const int64_t one = 1;
  patch(idx(), kDocsAt + 8 * 6, &one, 8);
  expect_open_error(idx(), "document indices decrease");
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  patch(idx(), kDocsAt, &one, 8);
  expect_open_error(idx(), "document_indices[0] = 1, expected 0");
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const int64_t nine = 9;
  patch(idx(), kDocsAt + 8 * (D - 1), &nine, 8);
  expect_open_error(idx(), "last document index is 9");
  // No document index at all (D = 0, file shortened to match).
  write_indexed_dataset(prefix(), docs_, kIndexDTypeUInt16);
  const uint64_t zero = 0;
  patch(idx(), kDocCountAt, &zero, 8);
  fs::resize_file(idx(), kDocsAt);
  expect_open_error(idx(), "no document index");
}

TEST_F(BadIndex, NotARegularFile) {
  fs::remove(idx());
  fs::create_directory(idx());
  expect_open_error(idx(), "not a regular file");
}

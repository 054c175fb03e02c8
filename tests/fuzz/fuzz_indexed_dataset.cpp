// Fuzz target: Megatron indexed datasets (lib/data/indexed_dataset.hpp IndexedDataset, and
// TokenDataset over one). Input: a 2-byte little-endian length L, then L bytes of PREFIX.idx,
// then the rest as PREFIX.bin. Every document and token range the index reports is read back.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.hpp"
#include "data/indexed_dataset.hpp"
#include "fuzz_util.hpp"

namespace {

constexpr int64_t kMaxTokens = 1 << 14;  // per read: bounds the work of one input

void read_indexed(const std::string& prefix) {
  using trident::fuzz::expect;
  const trident::IndexedDataset ds(prefix);
  expect(ds.item_size() == 2 || ds.item_size() == 4, "odd item size");
  expect(ds.num_tokens() >= 0 && ds.num_documents() >= 0 && ds.num_sequences() >= 0,
         "negative counts");
  int64_t document_tokens = 0;
  for (int64_t d = 0; d < std::min<int64_t>(ds.num_documents(), 256); ++d)
    document_tokens += static_cast<int64_t>(ds.document(d).size());
  if (ds.num_documents() <= 256)
    expect(document_tokens == ds.num_tokens(), "documents do not add up to the tokens");
  std::vector<int32_t> out(std::min(ds.num_tokens(), kMaxTokens) + 1);
  ds.read(0, std::min(ds.num_tokens(), kMaxTokens), out.data());
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{ds.num_tokens(), 1}, {-1, 1},
                                     {INT64_MAX, 2}, {1, INT64_MAX}, {0, -1}}) {
    try {
      ds.read(first, count, out.data());
      expect(false, "an out-of-range read was not refused");
    } catch (const trident::Error& e) {
      trident::fuzz::expect_one_line_naming(e, ds.bin_path());
    }
  }
  for (const int64_t d : {int64_t{-1}, ds.num_documents()}) {
    try {
      (void)ds.document(d);
      expect(false, "document " + std::to_string(d) + " was not refused");
    } catch (const trident::Error& e) {
      trident::fuzz::expect(std::string(e.what()).find(prefix) != std::string::npos,
                            "error does not name the dataset: " + std::string(e.what()));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trident::fuzz::InputReader in(data, size);
  const size_t idx_bytes = in.u8() | (size_t{in.u8()} << 8);
  const std::string prefix = trident::fuzz::scratch_dir() + "/indexed";
  trident::fuzz::write_file(prefix + ".idx", in.bytes(idx_bytes));
  trident::fuzz::write_file(prefix + ".bin", in.rest());
  try {
    read_indexed(prefix);
  } catch (const trident::Error& e) {
    trident::fuzz::expect(std::string(e.what()).find(prefix) != std::string::npos,
                          "error does not name the dataset: " + std::string(e.what()));
    trident::fuzz::expect(std::string(e.what()).find('\n') == std::string::npos,
                          "error of several lines");
  }
  for (const auto& [seq_len, vocab] : {std::pair<int64_t, int64_t>{3, 300}, {2, 70000}}) {
    try {
      const trident::TokenDataset dataset(prefix, seq_len, vocab);
      std::vector<int32_t> inputs(seq_len), targets(seq_len);
      for (int64_t w = 0; w < std::min<int64_t>(dataset.num_windows(), 64); ++w)
        dataset.window(w, inputs.data(), targets.data());
    } catch (const trident::Error& e) {
      trident::fuzz::expect(std::string(e.what()).find(prefix) != std::string::npos,
                            "error does not name the dataset: " + std::string(e.what()));
    }
  }
  return 0;
}

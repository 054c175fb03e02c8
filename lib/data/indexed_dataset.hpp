#pragma once
// Megatron-LM's indexed dataset (the `MMIDIDX` index, version 1): PREFIX.idx + PREFIX.bin.
// docs/data.md specifies the layout, the checks made on opening and how TokenDataset cuts
// training windows from it.
//
// PREFIX.idx, little-endian:
//   magic "MMIDIDX\0\0" (9 bytes), uint64 version (1), uint8 dtype code, uint64 sequence
//   count S, uint64 document count D, int32 sequence_lengths[S], int64 sequence_pointers[S]
//   (byte offsets into .bin), int64 document_indices[D] (0, then the sequence index that ends
//   each document; the last is S).
// PREFIX.bin: the tokens of all sequences, back to back, in the dtype of the index.
#include <cstdint>
#include <string>
#include <vector>

namespace trident {

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr int64_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;  // 34
// Megatron's DType codes (megatron/core/datasets/indexed_dataset.py); only these two are read.
inline constexpr uint8_t kIndexDTypeInt32 = 4;
inline constexpr uint8_t kIndexDTypeUInt16 = 8;

// A read-only indexed dataset. The index is checked on opening by one streaming pass over it
// (nothing of it is kept in memory); the tokens are read with pread(2), never memory-mapped,
// so a file truncated while in use gives an error naming it, not SIGBUS. Throws trident::Error
// of one line naming the file on: missing or non-regular file, wrong magic, version, dtype
// (anything but uint16 and int32), index size that disagrees with the counts, a negative
// sequence length, pointers that disagree with the lengths (pointer[0] = 0, pointer[i+1] =
// pointer[i] + length[i] * itemsize), document indices that are not non-decreasing within
// [0, S] with first 0 and last S, and a .bin whose size is not sum(lengths) * itemsize.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  std::string idx_path() const { return prefix_ + ".idx"; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  uint8_t dtype_code() const { return dtype_code_; }
  int64_t item_size() const { return item_size_; }
  int64_t num_sequences() const { return num_sequences_; }
  // Documents: D - 1 (document_indices holds a leading 0).
  int64_t num_documents() const { return num_documents_; }
  // Tokens of all sequences in order (the concatenated stream).
  int64_t num_tokens() const { return num_tokens_; }

  // Copies stream tokens [first, first + count) into out (uint16 widened to int32). Throws
  // naming the .bin if the range is outside [0, num_tokens()) or the file no longer holds it.
  void read(int64_t first, int64_t count, int32_t* out) const;
  // The tokens of document d (its sequences in order), read through the index.
  std::vector<int32_t> document(int64_t d) const;

 private:
  void read_index(int64_t offset, int64_t bytes, void* out) const;
  std::string prefix_;
  int idx_fd_ = -1, bin_fd_ = -1;
  uint8_t dtype_code_ = 0;
  int64_t item_size_ = 0, num_sequences_ = 0, num_documents_ = 0, num_tokens_ = 0;
};

// Writes PREFIX.bin and PREFIX.idx exactly as Megatron-LM's IndexedDatasetBuilder does with
// one sequence per document (document_indices = 0, 1, ..., n). dtype_code: kIndexDTypeUInt16
// or kIndexDTypeInt32; every token must fit it. Throws trident::Error on I/O failure.
void write_indexed_dataset(const std::string& prefix,
                           const std::vector<std::vector<int32_t>>& documents,
                           uint8_t dtype_code);

}  // namespace trident

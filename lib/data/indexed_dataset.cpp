// Megatron-LM indexed datasets (MMIDIDX v1), read with pread; see indexed_dataset.hpp and
// docs/data.md.
#include "data/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "data/token_range.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

std::string idx_error(const std::string& path, const std::string& cause) {
  return "indexed dataset '" + path + "': " + cause;
}

std::string errno_text(int err) { return std::strerror(err); }

struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// Opens a regular file for reading (stat first: a FIFO would block the open); returns the fd
// and its size.
std::pair<int, int64_t> open_regular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(idx_error(path, "cannot open: " + errno_text(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw Error(idx_error(path, "not a regular file"));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(idx_error(path, "cannot open: " + errno_text(errno)));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(idx_error(path, "not a regular file"));
  }
  return {fd, static_cast<int64_t>(st.st_size)};
}

// Reads exactly `bytes` at `offset`; a short read is a truncation error naming the file.
void pread_exact(int fd, const std::string& path, int64_t offset, int64_t bytes, void* out) {
  auto* dst = static_cast<char*>(out);
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd, dst + done, static_cast<size_t>(bytes - done),
                                static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw Error(idx_error(path, "cannot read bytes [" + std::to_string(offset + done) + ", " +
                                      std::to_string(offset + bytes) + "): " + errno_text(errno)));
    }
    if (got == 0) {
      struct stat st {};
      const std::string now =
          ::fstat(fd, &st) == 0 ? std::to_string(st.st_size) + " bytes" : "fewer bytes";
      throw Error(idx_error(path, "truncated while in use: bytes [" + std::to_string(offset) +
                                      ", " + std::to_string(offset + bytes) +
                                      ") are needed but the file now has " + now));
    }
    done += got;
  }
}

int64_t item_size_of(uint8_t code) {
  switch (code) {
    case kIndexDTypeUInt16: return 2;
    case kIndexDTypeInt32: return 4;
    default: return 0;
  }
}

std::string dtype_name(uint8_t code) {
  static const char* const names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                      "int64", "float64", "float32", "uint16"};
  return code <= 8 ? names[code] : "unknown";
}

}  // namespace

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ipath = idx_path(), bpath = bin_path();
  auto [ifd, idx_bytes] = open_regular(ipath);
  FdGuard idx{ifd};

  if (idx_bytes < kIndexHeaderBytes) {
    throw Error(idx_error(ipath, "file is " + std::to_string(idx_bytes) +
                                     " bytes, smaller than the " +
                                     std::to_string(kIndexHeaderBytes) + "-byte header"));
  }
  unsigned char header[kIndexHeaderBytes];
  pread_exact(idx.fd, ipath, 0, kIndexHeaderBytes, header);
  if (std::memcmp(header, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    throw Error(idx_error(ipath, "wrong magic (expected \"MMIDIDX\\0\\0\"); not a Megatron index"));
  }
  uint64_t version = 0, seqs = 0, docs = 0;
  std::memcpy(&version, header + 9, 8);
  dtype_code_ = header[17];
  std::memcpy(&seqs, header + 18, 8);
  std::memcpy(&docs, header + 26, 8);
  if (version != kIndexVersion) {
    throw Error(idx_error(ipath, "unsupported version " + std::to_string(version) +
                                     " (expected 1)"));
  }
  item_size_ = item_size_of(dtype_code_);
  if (item_size_ == 0) {
    throw Error(idx_error(ipath, "unsupported token dtype code " +
                                     std::to_string(dtype_code_) + " (" +
                                     dtype_name(dtype_code_) +
                                     "); only 8 (uint16) and 4 (int32) are read"));
  }
  // 12 bytes per sequence and 8 per document: counts too large for the file are refused
  // before any product can overflow.
  const auto max_entries = static_cast<uint64_t>(idx_bytes);
  if (seqs > max_entries / 12 || docs > max_entries / 8 ||
      kIndexHeaderBytes + 12 * static_cast<int64_t>(seqs) + 8 * static_cast<int64_t>(docs) !=
          idx_bytes) {
    const std::string expected =
        seqs > max_entries / 12 || docs > max_entries / 8
            ? "more"
            : std::to_string(kIndexHeaderBytes + 12 * static_cast<int64_t>(seqs) +
                             8 * static_cast<int64_t>(docs));
    throw Error(idx_error(ipath, "size disagrees with the counts: " + std::to_string(seqs) +
                                     " sequences and " + std::to_string(docs) +
                                     " document indices need " + expected +
                                     " bytes, but the file has " + std::to_string(idx_bytes)));
  }
  num_sequences_ = static_cast<int64_t>(seqs);
  const auto D = static_cast<int64_t>(docs);
  const int64_t S = num_sequences_;
  const int64_t lengths_at = kIndexHeaderBytes, pointers_at = lengths_at + 4 * S,
                docs_at = pointers_at + 8 * S;

  // One streaming pass: lengths against pointers, in chunks.
  constexpr int64_t kChunk = 1 << 16;
  std::vector<int32_t> lengths;
  std::vector<int64_t> values;
  int64_t total = 0;  // tokens so far
  const int64_t max_tokens = std::numeric_limits<int64_t>::max() / item_size_;
  for (int64_t i0 = 0; i0 < S; i0 += kChunk) {
    const int64_t n = std::min(kChunk, S - i0);
    lengths.resize(static_cast<size_t>(n));
    values.resize(static_cast<size_t>(n));
    pread_exact(idx.fd, ipath, lengths_at + 4 * i0, 4 * n, lengths.data());
    pread_exact(idx.fd, ipath, pointers_at + 8 * i0, 8 * n, values.data());
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = i0 + k;
      const int32_t len = lengths[static_cast<size_t>(k)];
      if (len < 0) {
        throw Error(idx_error(ipath, "sequence " + std::to_string(i) + " has negative length " +
                                         std::to_string(len)));
      }
      if (values[static_cast<size_t>(k)] != total * item_size_) {
        throw Error(idx_error(
            ipath, "sequence pointers disagree with the lengths: pointer[" + std::to_string(i) +
                       "] = " + std::to_string(values[static_cast<size_t>(k)]) +
                       ", but the lengths before it give byte " +
                       std::to_string(total * item_size_)));
      }
      if (len > max_tokens - total) throw Error(idx_error(ipath, "token count overflows"));
      total += len;
    }
  }
  num_tokens_ = total;

  // Document indices: 0, non-decreasing, within [0, S], last S.
  if (D < 1) {
    throw Error(idx_error(ipath, "no document index (expected at least the leading 0)"));
  }
  int64_t previous = 0;
  for (int64_t i0 = 0; i0 < D; i0 += kChunk) {
    const int64_t n = std::min(kChunk, D - i0);
    values.resize(static_cast<size_t>(n));
    pread_exact(idx.fd, ipath, docs_at + 8 * i0, 8 * n, values.data());
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = i0 + k, v = values[static_cast<size_t>(k)];
      if (i == 0 && v != 0) {
        throw Error(idx_error(ipath, "document_indices[0] = " + std::to_string(v) +
                                         ", expected 0"));
      }
      if (v < 0 || v > S) {
        throw Error(idx_error(ipath, "document index out of range: document_indices[" +
                                         std::to_string(i) + "] = " + std::to_string(v) +
                                         " is outside [0, " + std::to_string(S) + "]"));
      }
      if (v < previous) {
        throw Error(idx_error(ipath, "document indices decrease: document_indices[" +
                                         std::to_string(i) + "] = " + std::to_string(v) +
                                         " < " + std::to_string(previous)));
      }
      previous = v;
    }
  }
  if (previous != S) {
    throw Error(idx_error(ipath, "last document index is " + std::to_string(previous) +
                                     ", expected the sequence count " + std::to_string(S)));
  }
  num_documents_ = D - 1;

  auto [bfd, bin_bytes] = open_regular(bpath);
  FdGuard bin{bfd};
  const int64_t expected = num_tokens_ * item_size_;
  if (bin_bytes != expected) {
    throw Error(idx_error(
        bpath, std::string(bin_bytes < expected ? "truncated" : "oversized") + ": the index '" +
                   ipath + "' gives " + std::to_string(num_tokens_) + " " +
                   dtype_name(dtype_code_) + " tokens, i.e. " + std::to_string(expected) +
                   " bytes, but the file has " + std::to_string(bin_bytes) + " bytes"));
  }
  idx_fd_ = idx.release();
  bin_fd_ = bin.release();
}

IndexedDataset::~IndexedDataset() {
  if (idx_fd_ >= 0) ::close(idx_fd_);
  if (bin_fd_ >= 0) ::close(bin_fd_);
}

void IndexedDataset::read_index(int64_t offset, int64_t bytes, void* out) const {
  pread_exact(idx_fd_, idx_path(), offset, bytes, out);
}

void IndexedDataset::read(int64_t first, int64_t count, int32_t* out) const {
  if (first < 0 || count < 0 || first > num_tokens_ - count) {
    throw Error(idx_error(bin_path(), "tokens " + token_range_text(first, count) +
                                          " out of range [0, " + std::to_string(num_tokens_) +
                                          ")"));
  }
  // Sequences lie back to back from byte 0 (checked on opening): stream token i is at byte
  // i * itemsize.
  if (item_size_ == 4) {
    pread_exact(bin_fd_, bin_path(), first * 4, count * 4, out);
    return;
  }
  thread_local std::vector<uint16_t> buf;
  buf.resize(static_cast<size_t>(count));
  pread_exact(bin_fd_, bin_path(), first * 2, count * 2, buf.data());
  for (int64_t i = 0; i < count; ++i) out[i] = buf[static_cast<size_t>(i)];
}

std::vector<int32_t> IndexedDataset::document(int64_t d) const {
  if (d < 0 || d >= num_documents_) {
    throw Error(idx_error(idx_path(), "document " + std::to_string(d) + " out of range [0, " +
                                          std::to_string(num_documents_) + ")"));
  }
  const int64_t S = num_sequences_, docs_at = kIndexHeaderBytes + 12 * S;
  int64_t seq[2];
  read_index(docs_at + 8 * d, 16, seq);
  if (seq[0] == seq[1]) return {};
  int64_t begin_byte = 0, end_byte = 0;
  int32_t last_len = 0;
  read_index(kIndexHeaderBytes + 4 * S + 8 * seq[0], 8, &begin_byte);
  read_index(kIndexHeaderBytes + 4 * S + 8 * (seq[1] - 1), 8, &end_byte);
  read_index(kIndexHeaderBytes + 4 * (seq[1] - 1), 4, &last_len);
  end_byte += static_cast<int64_t>(last_len) * item_size_;
  std::vector<int32_t> out(static_cast<size_t>((end_byte - begin_byte) / item_size_));
  read(begin_byte / item_size_, static_cast<int64_t>(out.size()), out.data());
  return out;
}

void write_indexed_dataset(const std::string& prefix,
                           const std::vector<std::vector<int32_t>>& documents,
                           uint8_t dtype_code) {
  const int64_t item = item_size_of(dtype_code);
  if (item == 0) {
    throw Error(idx_error(prefix + ".idx", "cannot write dtype code " +
                                               std::to_string(dtype_code)));
  }
  auto fail = [](const std::string& path) {
    throw Error(idx_error(path, "write failed: " + errno_text(errno)));
  };
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_indices{0};
  {
    const std::string bpath = prefix + ".bin";
    std::FILE* f = std::fopen(bpath.c_str(), "wb");
    if (f == nullptr) fail(bpath);
    int64_t at = 0;
    bool ok = true;
    for (const auto& doc : documents) {
      lengths.push_back(static_cast<int32_t>(doc.size()));
      pointers.push_back(at);
      at += static_cast<int64_t>(doc.size()) * item;
      doc_indices.push_back(static_cast<int64_t>(lengths.size()));
      if (doc.empty()) continue;
      if (item == 4) {
        ok = ok && std::fwrite(doc.data(), 4, doc.size(), f) == doc.size();
      } else {
        std::vector<uint16_t> narrow(doc.size());
        for (size_t i = 0; i < doc.size(); ++i) {
          if (doc[i] < 0 || doc[i] > 65535) {
            std::fclose(f);
            throw Error(idx_error(bpath, "token " + std::to_string(doc[i]) +
                                             " does not fit uint16"));
          }
          narrow[i] = static_cast<uint16_t>(doc[i]);
        }
        ok = ok && std::fwrite(narrow.data(), 2, narrow.size(), f) == narrow.size();
      }
    }
    if (std::fclose(f) != 0 || !ok) fail(bpath);
  }
  const std::string ipath = prefix + ".idx";
  std::FILE* f = std::fopen(ipath.c_str(), "wb");
  if (f == nullptr) fail(ipath);
  const uint64_t version = kIndexVersion, seqs = lengths.size(), docs = doc_indices.size();
  bool ok = std::fwrite(kIndexMagic, 1, 9, f) == 9 && std::fwrite(&version, 8, 1, f) == 1 &&
            std::fwrite(&dtype_code, 1, 1, f) == 1 && std::fwrite(&seqs, 8, 1, f) == 1 &&
            std::fwrite(&docs, 8, 1, f) == 1;
  ok = ok && std::fwrite(lengths.data(), 4, lengths.size(), f) == lengths.size();
  ok = ok && std::fwrite(pointers.data(), 8, pointers.size(), f) == pointers.size();
  ok = ok && std::fwrite(doc_indices.data(), 8, doc_indices.size(), f) == doc_indices.size();
  if (std::fclose(f) != 0 || !ok) fail(ipath);
}

}  // namespace trident

// Token shards (llm.c .bin layout), the dataset over a path or glob, and the sampling order.
// The format and the order are specified in docs/data.md; data_tools/inspect_shard.py
// re-implements the order and tests/test_data.cpp checks that both agree.
#include "data/dataset.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "data/token_range.hpp"
#include "util/error.hpp"

namespace trident {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and are read as they are");

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string shard_error(const std::string& path, const std::string& cause) {
  return "token shard '" + path + "': " + cause;
}

// Closes a file descriptor on every path out of the constructor unless released.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// What a file that is not a regular file is, for the error message.
std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

constexpr int64_t kHeaderBytes = kShardHeaderInts * static_cast<int64_t>(sizeof(int32_t));

bool has_glob_chars(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

// Bytes per token of a shard with this header; each magic has its one version (llm.c's
// HEADERS_INFO: "gpt-2" 20240520/1 uint16, "llama-3" 20240801/7 uint32).
int64_t token_bytes_of(const std::string& path, int32_t magic, int32_t version) {
  if (magic != kShardMagic && magic != kShardMagicU32) {
    throw Error(shard_error(path, "wrong magic number " + std::to_string(magic) + " (expected " +
                                      std::to_string(kShardMagic) + " or " +
                                      std::to_string(kShardMagicU32) + "); not a token shard"));
  }
  const bool wide = magic == kShardMagicU32;
  const int32_t expected = wide ? kShardVersionU32 : kShardVersion;
  if (version != expected) {
    throw Error(shard_error(path, "unsupported version " + std::to_string(version) +
                                      " for magic " + std::to_string(magic) + " (expected " +
                                      std::to_string(expected) +
                                      (wide ? ", uint32 tokens)" : ", uint16 tokens)")));
  }
  return wide ? 4 : 2;
}

// SplitMix64 (Steele, Lea, Flood 2014), exactly as in docs/data.md.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenShard

TokenShard::TokenShard(const std::string& path) : path_(path) {
  // stat before open: opening a FIFO for reading blocks until a writer appears (and ignores
  // SIGTERM meanwhile); O_NONBLOCK covers a FIFO put in the file's place in between.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(shard_error(path, "cannot open: " + errno_text(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(shard_error(path, "not a regular file (" + file_kind(st.st_mode) + ")"));
  }
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (fd.fd < 0) {
    throw Error(shard_error(path, "cannot open: " + errno_text(errno)));
  }
  if (::fstat(fd.fd, &st) != 0) {
    throw Error(shard_error(path, "cannot stat: " + errno_text(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(shard_error(path, "not a regular file (" + file_kind(st.st_mode) + ")"));
  }
  const auto file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kHeaderBytes) {
    throw Error(shard_error(path, "file is " + std::to_string(file_bytes) +
                                      " bytes, smaller than the " +
                                      std::to_string(kHeaderBytes) + "-byte header"));
  }
  int32_t header[3] = {0, 0, 0};
  ssize_t got = ::pread(fd.fd, header, sizeof(header), 0);
  if (got != static_cast<ssize_t>(sizeof(header))) {
    throw Error(shard_error(
        path, "cannot read header: " + (got < 0 ? errno_text(errno) : "short read")));
  }
  token_bytes_ = token_bytes_of(path, header[0], header[1]);
  if (header[2] < 0) {
    throw Error(shard_error(path, "negative token count " + std::to_string(header[2])));
  }
  num_tokens_ = header[2];
  const int64_t expected = kHeaderBytes + token_bytes_ * num_tokens_;
  if (file_bytes != expected) {
    throw Error(shard_error(
        path, std::string(file_bytes < expected ? "truncated" : "oversized") + ": header says " +
                  std::to_string(num_tokens_) + " tokens, i.e. " + std::to_string(expected) +
                  " bytes, but the file has " + std::to_string(file_bytes) + " bytes"));
  }
  fd_ = fd.release();
}

TokenShard::~TokenShard() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenShard::read(int64_t first, int64_t count, uint32_t* out) const {
  check_range(first, count);  // before the buffer is sized by count
  if (token_bytes_ == 4) {
    read_bytes(first, count, out);
    return;
  }
  thread_local std::vector<uint16_t> narrow;
  narrow.resize(static_cast<size_t>(std::max<int64_t>(count, 0)));
  read_bytes(first, count, narrow.data());
  std::copy(narrow.begin(), narrow.end(), out);
}

void TokenShard::read(int64_t first, int64_t count, uint16_t* out) const {
  if (token_bytes_ != 2) {
    throw Error(shard_error(path_, "holds uint32 tokens; read them as uint32"));
  }
  read_bytes(first, count, out);
}

void TokenShard::check_range(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first > num_tokens_ - count) {
    throw Error(shard_error(path_, "tokens " + token_range_text(first, count) +
                                       " out of range [0, " + std::to_string(num_tokens_) + ")"));
  }
}

void TokenShard::read_bytes(int64_t first, int64_t count, void* out) const {
  check_range(first, count);
  // pread, not a memory map: a shard truncated while the run reads it is a short read here
  // (an error naming the file), where a mapping would raise SIGBUS.
  auto* dst = static_cast<char*>(out);
  const int64_t begin = kHeaderBytes + token_bytes_ * first, bytes = token_bytes_ * count;
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd_, dst + done, static_cast<size_t>(bytes - done),
                                static_cast<off_t>(begin + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw Error(shard_error(path_, "cannot read bytes [" + std::to_string(begin + done) +
                                         ", " + std::to_string(begin + bytes) +
                                         "): " + errno_text(errno)));
    }
    if (got == 0) {
      struct stat st {};
      const std::string now =
          ::fstat(fd_, &st) == 0 ? std::to_string(st.st_size) + " bytes" : "fewer bytes";
      throw Error(shard_error(
          path_, "truncated while in use: tokens [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + ") lie in bytes [" + std::to_string(begin) +
                     ", " + std::to_string(begin + bytes) + "), but the file now has " + now +
                     " (it had " + std::to_string(kHeaderBytes + token_bytes_ * num_tokens_) +
                     " when opened)"));
    }
    done += got;
  }
}

namespace {

// The header and the tokens of a shard, written in one go; `version` fixes the token width.
template <typename Token>
void write_shard_file(const std::string& path, int32_t magic, int32_t version,
                      const std::vector<Token>& tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error(shard_error(path, "cannot write " + std::to_string(tokens.size()) +
                                      " tokens: the header's count is an int32"));
  }
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw Error(shard_error(path, "cannot create: " + errno_text(errno)));
  }
  bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size();
  if (ok && !tokens.empty()) {
    ok = std::fwrite(tokens.data(), sizeof(Token), tokens.size(), f) == tokens.size();
  }
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    throw Error(shard_error(path, "write failed: " + errno_text(ok ? errno : write_errno)));
  }
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_shard_file(path, kShardMagic, kShardVersion, tokens);
}

void write_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens) {
  write_shard_file(path, kShardMagicU32, kShardVersionU32, tokens);
}

// ---------------------------------------------------------------------------------------------
// TokenDataset

TokenDataset::TokenDataset(const std::string& pattern, int64_t seq_len, int64_t vocab_size)
    : seq_len_(seq_len), vocab_size_(vocab_size) {
  if (pattern.empty()) throw Error("token dataset: empty path or pattern");
  if (seq_len <= 0) {
    throw Error("token dataset '" + pattern + "': seq_len must be positive, got " +
                std::to_string(seq_len));
  }
  if (vocab_size <= 0) {
    throw Error("token dataset '" + pattern + "': vocab_size must be positive, got " +
                std::to_string(vocab_size));
  }

  std::vector<std::string> paths;
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  struct stat idx_st {};
  if (rc == GLOB_NOMATCH && ::stat((pattern + ".idx").c_str(), &idx_st) == 0) {
    // A Megatron indexed dataset's prefix: the pattern names no file, PATTERN.idx exists.
    indexed_ = std::make_unique<IndexedDataset>(pattern);
    const int64_t n = indexed_->num_tokens();
    total_windows_ = n > 0 ? (n - 1) / seq_len_ : 0;
    first_window_ = {0, total_windows_};
    if (indexed_->dtype_code() == kIndexDTypeUInt16 && vocab_size_ > kShardMaxVocab) {
      throw Error("indexed dataset '" + indexed_->bin_path() +
                  "': stores uint16 token ids (at most " + std::to_string(kShardMaxVocab) +
                  " distinct tokens), which cannot represent model.vocab_size = " +
                  std::to_string(vocab_size_) + "; set model.vocab_size <= " +
                  std::to_string(kShardMaxVocab) + " or write the dataset with int32 tokens");
    }
    if (total_windows_ == 0) {
      throw Error("token dataset '" + pattern + "': no training window: the indexed dataset '" +
                  indexed_->bin_path() + "' (" + std::to_string(n) +
                  " tokens) is shorter than one window of T+1 = " +
                  std::to_string(seq_len_ + 1) + " tokens (T = seq_len = " +
                  std::to_string(seq_len_) + ")");
    }
    return;
  }
  if (rc == GLOB_NOMATCH) {
    if (!has_glob_chars(pattern)) {
      // A plain path: let the shard say why it cannot be opened (strerror).
      paths.push_back(pattern);
    } else {
      throw Error("token dataset: no file matches '" + pattern + "'");
    }
  } else if (rc != 0) {
    throw Error("token dataset: cannot expand '" + pattern + "' (" +
                (rc == GLOB_NOSPACE ? "out of memory" : "read error") + ")");
  }
  // Byte-wise order, independent of the locale (glob sorts with strcoll).
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());

  first_window_.reserve(paths.size() + 1);
  for (const auto& p : paths) {
    auto shard = std::make_unique<TokenShard>(p);
    const int64_t n = shard->num_tokens();
    const int64_t windows = n > 0 ? (n - 1) / seq_len_ : 0;
    first_window_.push_back(total_windows_);
    total_windows_ += windows;
    shards_.push_back(std::move(shard));
  }
  first_window_.push_back(total_windows_);

  // uint16 shards cannot express the ids of a larger vocabulary (which the configuration
  // allows, e.g. Llama 3's 128256), so a model of it cannot train on them; uint32 shards can.
  const auto narrow = std::find_if(shards_.begin(), shards_.end(),
                                   [](const auto& shard) { return shard->token_bytes() == 2; });
  if (vocab_size_ > kShardMaxVocab && narrow != shards_.end()) {
    throw Error(shard_error((*narrow)->path(),
                            "stores uint16 token ids (at most " +
                                std::to_string(kShardMaxVocab) +
                                " distinct tokens), which cannot represent model.vocab_size = " +
                                std::to_string(vocab_size_) +
                                "; set model.vocab_size <= " + std::to_string(kShardMaxVocab) +
                                " or write uint32 shards (magic 20240801, version 7)"));
  }

  if (total_windows_ == 0) {
    std::string files;
    constexpr size_t kListed = 4;
    for (size_t i = 0; i < shards_.size() && i < kListed; ++i) {
      if (i > 0) files += ", ";
      files += "'" + shards_[i]->path() + "' (" + std::to_string(shards_[i]->num_tokens()) +
               " tokens)";
    }
    if (shards_.size() > kListed) {
      files += " and " + std::to_string(shards_.size() - kListed) + " more";
    }
    throw Error("token dataset '" + pattern + "': no training window: " +
                (shards_.size() == 1 ? "the shard " : "every shard ") + files +
                " is shorter than one window of T+1 = " + std::to_string(seq_len_ + 1) +
                " tokens (T = seq_len = " + std::to_string(seq_len_) + ")");
  }
}

void TokenDataset::window(int64_t window_id, int32_t* inputs, int32_t* targets) const {
  if (window_id < 0 || window_id >= total_windows_) {
    throw Error("token dataset: window " + std::to_string(window_id) + " out of range [0, " +
                std::to_string(total_windows_) + ")");
  }
  if (indexed_) {
    window_indexed(window_id, inputs, targets);
    return;
  }
  // The last shard whose first window is <= window_id (zero-window shards are skipped since
  // the next shard starts at the same id).
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), window_id);
  const auto shard_index = static_cast<size_t>(it - first_window_.begin() - 1);
  const TokenShard& shard = *shards_[shard_index];
  const int64_t start = (window_id - first_window_[shard_index]) * seq_len_;
  // One read per window (a few KB): the page cache serves all ranks of a node.
  thread_local std::vector<uint32_t> tok;
  tok.resize(static_cast<size_t>(seq_len_ + 1));
  shard.read(start, seq_len_ + 1, tok.data());
  for (int64_t t = 0; t <= seq_len_; ++t) {
    // vocab_size <= 2^31 - 1, so every id that passes fits the int32 inputs.
    if (static_cast<int64_t>(tok[t]) >= vocab_size_) {
      throw Error(shard_error(shard.path(), "token " + std::to_string(tok[t]) +
                                                " at position " + std::to_string(start + t) +
                                                " is out of range for vocab_size " +
                                                std::to_string(vocab_size_)));
    }
  }
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = static_cast<int32_t>(tok[t]);
    targets[t] = static_cast<int32_t>(tok[t + 1]);
  }
}

void TokenDataset::window_indexed(int64_t window_id, int32_t* inputs, int32_t* targets) const {
  // Window w covers stream tokens [w*T, w*T + T + 1) of the concatenated documents.
  const int64_t start = window_id * seq_len_;
  thread_local std::vector<int32_t> tok;
  tok.resize(static_cast<size_t>(seq_len_ + 1));
  indexed_->read(start, seq_len_ + 1, tok.data());
  for (int64_t t = 0; t <= seq_len_; ++t) {
    const int32_t v = tok[static_cast<size_t>(t)];
    if (v < 0 || static_cast<int64_t>(v) >= vocab_size_) {
      throw Error("indexed dataset '" + indexed_->bin_path() + "': token " + std::to_string(v) +
                  " at position " + std::to_string(start + t) +
                  " is out of range for vocab_size " + std::to_string(vocab_size_));
    }
  }
  std::copy(tok.begin(), tok.begin() + seq_len_, inputs);
  std::copy(tok.begin() + 1, tok.end(), targets);
}

// ---------------------------------------------------------------------------------------------
// BatchSampler

BatchSampler::BatchSampler(int64_t num_windows, int64_t global_batch, bool shuffle,
                           uint64_t seed)
    : num_windows_(num_windows), global_batch_(global_batch), shuffle_(shuffle), seed_(seed) {
  if (num_windows <= 0) {
    throw Error("batch sampler: the dataset has no window (num_windows = " +
                std::to_string(num_windows) + ")");
  }
  if (global_batch <= 0) {
    throw Error("batch sampler: global_batch must be positive, got " +
                std::to_string(global_batch));
  }
}

int64_t BatchSampler::window_id(int64_t step, int64_t sample) const {
  return window_at(position(step, sample, global_batch_));
}

int64_t BatchSampler::position(int64_t step, int64_t sample, int64_t global_batch) {
  if (step < 0 || sample < 0 || sample >= global_batch) {
    throw Error("batch sampler: (step " + std::to_string(step) + ", sample " +
                std::to_string(sample) + ") out of range (global_batch " +
                std::to_string(global_batch) + ")");
  }
  if (step > (std::numeric_limits<int64_t>::max() - sample) / global_batch) {
    throw Error("batch sampler: step " + std::to_string(step) + " overflows the sample stream");
  }
  return step * global_batch + sample;
}

int64_t BatchSampler::window_at(int64_t p) const {
  if (p < 0) throw Error("batch sampler: negative stream position " + std::to_string(p));
  const int64_t epoch = p / num_windows_;
  const int64_t k = p % num_windows_;
  if (!shuffle_) return k;
  return permutation(epoch)[static_cast<size_t>(k)];
}

const std::vector<int64_t>& BatchSampler::permutation(int64_t epoch) const {
  if (epoch == cached_epoch_) return cached_perm_;
  cached_perm_.resize(static_cast<size_t>(num_windows_));
  std::iota(cached_perm_.begin(), cached_perm_.end(), int64_t{0});
  SplitMix64 rng{seed_ ^ (0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(epoch) + 1))};
  for (int64_t i = num_windows_ - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1));
    std::swap(cached_perm_[static_cast<size_t>(i)], cached_perm_[static_cast<size_t>(j)]);
  }
  cached_epoch_ = epoch;
  return cached_perm_;
}

int64_t BatchSampler::first_sample(int64_t global_batch, int64_t dp_rank, int64_t dp_size,
                                   int64_t micro, int64_t micro_batch) {
  if (dp_size <= 0 || global_batch <= 0 || global_batch % dp_size != 0) {
    throw Error("batch sampler: global_batch " + std::to_string(global_batch) +
                " is not a positive multiple of the data-parallel size " +
                std::to_string(dp_size));
  }
  const int64_t per_replica = global_batch / dp_size;
  if (dp_rank < 0 || dp_rank >= dp_size || micro < 0 || micro_batch <= 0 ||
      (micro + 1) * micro_batch > per_replica) {
    throw Error("batch sampler: micro-batch " + std::to_string(micro) + " of size " +
                std::to_string(micro_batch) + " on data-parallel rank " +
                std::to_string(dp_rank) + " of " + std::to_string(dp_size) +
                " lies outside the replica's " + std::to_string(per_replica) + " samples");
  }
  return dp_rank * per_replica + micro * micro_batch;
}

}  // namespace trident

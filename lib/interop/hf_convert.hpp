#pragma once
// Hugging Face checkpoints in and out: `trident export --format hf` and `trident import
// --format hf` (docs/interop.md). Both are collective over `comm` and work in bounded chunks
// of rows spread over the ranks: no rank ever holds a whole tensor when several run, and none
// more than one chunk per tensor. Every failure is one trident::Error naming the file, thrown
// on every rank.
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

#include "interop/safetensors.hpp"

namespace trident {

// Elements (float32) a rank handles at a time: 16 MiB.
inline constexpr int64_t kDefaultInteropChunkElements = int64_t{1} << 22;

struct HfExportOptions {
  TensorDType dtype = TensorDType::F32;            // F32 or BF16
  int64_t max_shard_bytes = 5'000'000'000;         // transformers' default "5GB"
  int64_t chunk_elements = kDefaultInteropChunkElements;
};

// Writes config.json and model.safetensors (or model-0000i-of-0000N.safetensors and
// model.safetensors.index.json past max_shard_bytes) into `out_dir` (created if needed; the
// files are replaced) from the model checkpoint `checkpoint`, which is verified first as
// `trident ckpt info --verify` does. Returns the number of bytes of tensor data written.
int64_t export_hf(const std::string& checkpoint, const std::string& out_dir,
                  const HfExportOptions& options, MPI_Comm comm);

struct HfImportOptions {
  std::optional<int64_t> seq_len;  // llama: model.seq_len (default max_position_embeddings)
  int64_t chunk_elements = kDefaultInteropChunkElements;
};

// Writes the Trident checkpoint `out_file` (must not exist) at step 0 with zero optimizer
// state from the Hugging Face model directory `in_dir` (config.json, model.safetensors or a
// sharded model.safetensors.index.json; F32, F16 or BF16 tensors). Its config is Trident's
// defaults with the model keys config.json gives. Returns that config as TOML.
std::string import_hf(const std::string& in_dir, const std::string& out_file,
                      const HfImportOptions& options, MPI_Comm comm);

// "5GB" (10^9, as transformers reads it), "500MB", "2GiB", "100KB", "1234" (bytes).
int64_t parse_byte_size(const std::string& text);

}  // namespace trident

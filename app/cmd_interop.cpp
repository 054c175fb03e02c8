// trident export --format hf CKPT OUT_DIR and trident import --format hf IN_DIR OUT.h5: a
// model checkpoint to and from a Hugging Face transformers directory (docs/interop.md).
#include <mpi.h>

#include <cstdio>

#include "cli_numbers.hpp"
#include "commands.hpp"
#include "interop/hf_convert.hpp"

namespace trident {

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

void add_export_command(CLI::App& app, ExportOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "export", "Write a checkpoint's model as a Hugging Face transformers directory");
  cmd->add_option("--format", options.format, "hf: config.json + model.safetensors")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  cmd->add_option("checkpoint", options.checkpoint, "Trident checkpoint (.h5)")->required();
  cmd->add_option("out_dir", options.out_dir, "output directory (created if needed)")->required();
  cmd->add_option("--dtype", options.dtype, "tensor type in the files: f32 (default) or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--max-shard-size", options.max_shard_size,
                  "largest safetensors file before sharding, as transformers: 5GB (default), "
                  "500MB, 2GiB, bytes");
  cmd->add_option("--chunk-elements", options.chunk_elements,
                  "elements a rank converts at a time (memory bound; default 4194304)")
      ->check(whole_number(1));
}

void run_export(const ExportOptions& options) {
  HfExportOptions hf;
  hf.dtype = options.dtype == "bf16" ? TensorDType::BF16 : TensorDType::F32;
  hf.max_shard_bytes = parse_byte_size(options.max_shard_size);
  hf.chunk_elements = options.chunk_elements;
  const int64_t bytes = export_hf(options.checkpoint, options.out_dir, hf, MPI_COMM_WORLD);
  if (world_rank() == 0)
    std::printf("exported %s to %s (Hugging Face, %s): %.1f MB of tensors\n",
                options.checkpoint.c_str(), options.out_dir.c_str(), options.dtype.c_str(),
                bytes / 1e6);
}

void add_import_command(CLI::App& app, ImportOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "import", "Turn a Hugging Face transformers directory into a Trident checkpoint (step 0)");
  cmd->add_option("--format", options.format, "hf: config.json + safetensors")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  cmd->add_option("in_dir", options.in_dir, "Hugging Face model directory")->required();
  cmd->add_option("out_file", options.out_file, "checkpoint to write (.h5; must not exist)")
      ->required();
  cmd->add_option("--seq-len", options.seq_len,
                  "llama: model.seq_len of the stored config (default max_position_embeddings)")
      ->check(whole_number(1));
  cmd->add_option("--chunk-elements", options.chunk_elements,
                  "elements a rank converts at a time (memory bound; default 4194304)")
      ->check(whole_number(1));
}

void run_import(const ImportOptions& options) {
  HfImportOptions hf;
  if (options.seq_len > 0) hf.seq_len = options.seq_len;
  hf.chunk_elements = options.chunk_elements;
  const std::string config = import_hf(options.in_dir, options.out_file, hf, MPI_COMM_WORLD);
  if (world_rank() == 0)
    std::printf("imported %s into %s (step 0, zero optimizer state); stored config:\n%s\n",
                options.in_dir.c_str(), options.out_file.c_str(), config.c_str());
}

}  // namespace trident

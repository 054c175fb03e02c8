// trident ckpt info FILE: what a checkpoint holds (step, layout, config, datasets), read with
// the same code that resumes from it; --verify also runs the checks a resume runs
// (check_checkpoint: attributes, their seal, the stored config, the complete schema) and reads
// every dataset (checksum, finite values).
#include <mpi.h>

#include <cstdio>

#include "checkpoint/h5_file.hpp"
#include "commands.hpp"
#include "train/checkpointing.hpp"

namespace trident {

void add_ckpt_command(CLI::App& app, CkptOptions& options) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect checkpoints");
  ckpt->require_subcommand(1);
  CLI::App* info = ckpt->add_subcommand("info", "Print a checkpoint's metadata and datasets");
  info->add_option("file", options.file, "checkpoint file (.h5)")->required();
  info->add_flag("--verify", options.verify,
                 "check it as a resume does: attributes, schema, every dataset's checksum and "
                 "values");
}

void run_ckpt_info(const CkptOptions& options) {
  CheckpointReader reader(options.file, MPI_COMM_WORLD, checkpoint_reader_options());
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (options.verify) verify_checkpoint(reader);
  if (rank == 0) {
    std::printf("checkpoint %s\n", options.file.c_str());
    for (const std::string& key : reader.attributes("/")) {
      if (key == "config") continue;
      const AttributeValue& a = reader.attribute("/", key);
      switch (a.kind) {
        case AttributeValue::Kind::Int: std::printf("  %s = %lld\n", key.c_str(), static_cast<long long>(a.i)); break;
        case AttributeValue::Kind::Uint: std::printf("  %s = %llu\n", key.c_str(), static_cast<unsigned long long>(a.u)); break;
        case AttributeValue::Kind::Double: std::printf("  %s = %.9g\n", key.c_str(), a.d); break;
        case AttributeValue::Kind::String: std::printf("  %s = %s\n", key.c_str(), a.text.c_str()); break;
        case AttributeValue::Kind::Other: std::printf("  %s: %s\n", key.c_str(), a.text.c_str()); break;
      }
    }
    const auto names = reader.datasets();
    std::printf("datasets (%zu):\n", names.size());
    for (const std::string& name : names) {
      const auto shape = reader.shape(name);
      std::string dims;
      for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
      std::printf("  %-48s [%s]\n", name.c_str(), dims.c_str());
    }
    if (reader.has_attribute("/", "config"))
      std::printf("config:\n%s\n", reader.attribute_string("/", "config").c_str());
    if (options.verify)
      std::printf("all %zu datasets verified (checksums, finite values), attributes and schema "
                  "checked\n", names.size());
  }
  reader.close();
}

}  // namespace trident

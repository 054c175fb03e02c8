// Fuzz target: the checkpoint reader (lib/checkpoint/h5_file.hpp CheckpointReader) and the
// model-checkpoint checks of lib/train/checkpointing.hpp (check_checkpoint, verify_checkpoint)
// on crafted HDF5 files, on one MPI rank.
//
// HDF5 parses the file's own structure (superblock, object headers, B-trees, heaps) and is
// known to crash, not fail, on some hostile bytes there (its many CVEs); Trident cannot guard
// that parsing. So by default the input does not become the file's bytes: it drives what a
// valid HDF5 file holds, i.e. everything Trident itself reads and checks: the root
// attributes (present, missing, of another type or value; the stored config's TOML text; the
// seal), the datasets (present, missing, extra, of another shape or type), their values
// (NaN, infinities, negative second moments) and their data bytes after the checksums were
// written (a corrupt tensor). TRIDENT_FUZZ_RAW_HDF5=1 makes the input the file itself
// instead, to look for HDF5's own crashes (docs/fuzzing.md); not run by CTest.
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/h5_file.hpp"
#include "config/config.hpp"
#include "fuzz_util.hpp"
#include "model/architecture.hpp"
#include "train/checkpointing.hpp"

namespace {

using trident::fuzz::InputReader;

bool raw_mode = false;

// The stored model: small, so a whole valid file is a few KB.
const char* const kBaseConfig = R"(
[model]
layers = 1
heads = 2
width = 4
vocab_size = 8
seq_len = 4
[train]
steps = 10
micro_batch = 1
global_batch = 2
[data]
train = "shards/train_*.bin"
)";

// The stored model's config and its parameters (global_parameters' order: the token embedding
// first, the position embedding second), parsed once.
const trident::Config& base_config() {
  static const trident::Config config = [] {
    try {
      return trident::parse_config(kBaseConfig, "base.toml");
    } catch (const trident::Error& e) {
      trident::fuzz::expect(false, std::string("the base config does not load: ") + e.what());
      throw;
    }
  }();
  return config;
}

const std::vector<trident::ParamInfo>& base_parameters() {
  static const std::vector<trident::ParamInfo> params =
      trident::global_parameters(base_config().model);
  return params;
}

// A dataset of the stored model that tamper() changes: its parameter `index` under `root`
// (named from the model, so that a renamed tensor cannot make the tampering a silent no-op).
std::string stored_dataset(const char* root, size_t index) {
  trident::fuzz::expect(index < base_parameters().size(), "the base model has too few tensors");
  return trident::dataset_path(root, base_parameters()[index].name);
}

// The root attributes write_checkpoint_attributes writes, in its order.
const char* const kRootKeys[] = {
    "format_version", "step", "consumed_samples", "consumed_tokens", "sampler_position",
    "seed", "optimizer_updates", "skipped_steps", "learning_rate_next", "layout", "config",
    "model_layers", "model_heads", "model_width", "model_vocab_size", "model_seq_len",
    "model_arch", "model_kv_heads", "model_ffn_width", "model_tie_embeddings",
    "skipped_batches", "rollbacks", "guard_losses", "guard_bad_streak", "rollback_save"};

// An integer near the interesting values: small, negative, or the extremes.
int64_t fuzzed_int(InputReader& in) {
  const uint32_t v = in.u32();
  switch (v % 4) {
    case 0: return static_cast<int64_t>(v >> 2) % 64;
    case 1: return -static_cast<int64_t>(v >> 2) % 64;
    case 2: return (v & 4) ? INT64_MAX - (v >> 3) % 4 : INT64_MIN + (v >> 3) % 4;
    default: return static_cast<int32_t>(v);
  }
}

// Writes the file the input describes (see the file comment); returns false when the writer
// refused it (which the harness does not examine further: it is not the reader under test).
bool write_checkpoint(const std::string& path, InputReader& in) {
  const uint8_t config_op = in.u8();
  std::string config_text = kBaseConfig;
  if (config_op % 8 == 1) config_text = std::string(in.bytes(in.u8()));  // a foreign config
  if (config_op % 8 == 2) config_text += "\n" + std::string(in.bytes(in.u8()));
  const trident::Config& config = base_config();
  const int64_t step = in.u8() % 12;
  try {
    trident::CheckpointWriter w(path, MPI_COMM_SELF, trident::WriterOptions{.overwrite = true});
    for (const char* key : kRootKeys) {
      const uint8_t op = in.u8();
      const std::string k = key;
      if (op % 16 == 1) continue;  // missing
      if (op % 16 == 2) { w.set_attribute("/", k, fuzzed_int(in)); continue; }
      if (op % 16 == 3) { w.set_attribute("/", k, std::ldexp(double(fuzzed_int(in)), -8)); continue; }
      if (op % 16 == 4) { w.set_attribute("/", k, std::string(in.bytes(in.u8() % 32))); continue; }
      // The value a real checkpoint has.
      if (k == "format_version") w.set_attribute("/", k, trident::kCheckpointFormatVersion);
      else if (k == "step" || k == "sampler_position" || k == "optimizer_updates")
        w.set_attribute("/", k, step);
      else if (k == "consumed_samples") w.set_attribute("/", k, step * config.train.global_batch);
      else if (k == "consumed_tokens") w.set_attribute("/", k, step * config.tokens_per_step());
      else if (k == "seed") w.set_attribute("/", k, config.train.seed);
      else if (k == "skipped_steps") w.set_attribute("/", k, int64_t{0});
      else if (k == "learning_rate_next") w.set_attribute("/", k, 1e-3);
      else if (k == "layout") w.set_attribute("/", k, "tensor=1 pipeline=1 data=1 zero_stage=0");
      else if (k == "config") w.set_attribute("/", k, config_op % 8 ? config_text : config.to_toml());
      else if (k == "model_layers") w.set_attribute("/", k, config.model.layers);
      else if (k == "model_heads") w.set_attribute("/", k, config.model.heads);
      else if (k == "model_width") w.set_attribute("/", k, config.model.width);
      else if (k == "model_vocab_size") w.set_attribute("/", k, config.model.vocab_size);
      else if (k == "model_seq_len") w.set_attribute("/", k, config.model.seq_len);
      else if (k == "model_arch") w.set_attribute("/", k, config.model.arch);
      else if (k == "model_kv_heads") w.set_attribute("/", k, config.model.kv_head_count());
      else if (k == "model_ffn_width") w.set_attribute("/", k, config.model.ffn_size());
      else if (k == "model_tie_embeddings")
        w.set_attribute("/", k, static_cast<int64_t>(config.model.tie_embeddings));
      else if (k == "skipped_batches") w.set_attribute("/", k, "[]");
      else if (k == "rollbacks") w.set_attribute("/", k, int64_t{0});
      else if (k == "guard_losses") w.set_attribute("/", k, "[3.5,4.25]");
      else if (k == "guard_bad_streak" || k == "rollback_save")
        w.set_attribute("/", k, int64_t{0});
    }
    if (in.u8() % 8 != 1) w.seal_attributes("/");
    // The datasets of the stored model, each as it should be or not.
    for (const trident::ParamInfo& p : base_parameters()) {
      for (const char* root : {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"}) {
        const uint8_t op = in.u8();
        if (op % 16 == 1) continue;  // missing
        std::vector<int64_t> shape = p.global_shape;
        if (op % 16 == 2) shape.push_back(1 + in.u8() % 3);
        if (op % 16 == 3) shape[0] = in.u8() % 5;
        int64_t numel = 1;
        for (const int64_t d : shape) numel *= d;
        std::vector<float> values(numel, 0.5f);
        if (op % 16 == 4)  // values from the input: NaN, infinities, negative moments
          for (float& v : values) {
            const uint32_t bits = in.u32();
            std::memcpy(&v, &bits, 4);
          }
        const std::vector<trident::Run> runs{{0, 0, numel}};
        w.write_tensor(trident::dataset_path(root, p.name), shape, numel ? runs : std::vector<trident::Run>{},
                       values);
      }
    }
    if (in.u8() % 8 == 1) w.write_tensor("/model/extra", {2}, {{0, 0, 2}}, std::vector<float>{1, 2});
    w.close();
  } catch (const trident::Error&) {
    return false;
  }
  return true;
}

// After the checksums were written: corrupts what Trident checks and HDF5 does not parse
// (tensor bytes, the seal's inputs), or adds a dataset of another type, with plain HDF5.
void tamper(const std::string& path, InputReader& in) {
  const uint8_t op = in.u8() % 8;
  if (op == 0) return;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  trident::fuzz::expect(file >= 0, "cannot reopen " + path);
  if (op == 1 || op == 2) {  // flip a byte of a tensor's stored data
    const std::string name = stored_dataset(op == 1 ? "/model" : "/optim/exp_avg_sq", 0);
    const hid_t d = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    if (d >= 0) {
      const haddr_t offset = H5Dget_offset(d);
      const hsize_t bytes = H5Dget_storage_size(d);
      H5Dclose(d);
      if (offset != HADDR_UNDEF && bytes > 0) {
        H5Fflush(file, H5F_SCOPE_GLOBAL);
        std::FILE* f = std::fopen(path.c_str(), "r+b");
        trident::fuzz::expect(f != nullptr, "cannot patch " + path);
        const long at = static_cast<long>(offset + in.u32() % bytes);
        const unsigned char byte = in.u8() | 1;
        std::fseek(f, at, SEEK_SET);
        const int old = std::fgetc(f);
        std::fseek(f, at, SEEK_SET);
        std::fputc(old ^ byte, f);
        std::fclose(f);
      }
    }
  } else if (op == 3) {  // a sealed attribute changed afterwards
    const hid_t a = H5Aopen_by_name(file, "/", "step", H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
      const int64_t v = fuzzed_int(in);
      H5Awrite(a, H5T_NATIVE_INT64, &v);
      H5Aclose(a);
    }
  } else if (op == 4) {  // a dataset of another type, with or without a checksum
    const hsize_t dims[1] = {4};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    const hid_t d = H5Dcreate2(file, "/model/odd", in.u8() % 2 ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE,
                               space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (d >= 0) H5Dclose(d);
    H5Pclose(lcpl);
    H5Sclose(space);
  } else if (op == 5) {  // a tensor's checksum attribute replaced by one of another type
    const std::string name = stored_dataset("/model", 1);
    if (H5Adelete_by_name(file, name.c_str(), "checksum", H5P_DEFAULT) >= 0) {
      const hid_t space = H5Screate(H5S_SCALAR);
      const hid_t a = H5Acreate_by_name(file, name.c_str(), "checksum", H5T_NATIVE_DOUBLE,
                                        space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (a >= 0) {
        const double v = 1.0;
        H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
        H5Aclose(a);
      }
      H5Sclose(space);
    }
  }
  H5Fclose(file);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One rank: the reader is collective, on MPI_COMM_SELF here.
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  std::atexit([] { MPI_Finalize(); });
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // HDF5's error stacks: Trident reports them
  // One write and read before fuzzing: MPI-IO's transport (UCX under MPICH) allocates its
  // state on the first file opened and keeps it unreachable until MPI_Finalize, which
  // LeakSanitizer would otherwise blame on the first input.
  {
    const std::string warm = trident::fuzz::scratch_dir() + "/warm_up.h5";
    trident::CheckpointWriter w(warm, MPI_COMM_SELF);
    w.write_tensor("/x", {2}, {{0, 0, 2}}, std::vector<float>{1, 2});
    w.close();
    trident::CheckpointReader r(warm, MPI_COMM_SELF);
    std::vector<float> back(2);
    r.read_tensor("/x", {2}, {{0, 0, 2}}, back);
    r.close();
    ::unlink(warm.c_str());
  }
  const char* raw = std::getenv("TRIDENT_FUZZ_RAW_HDF5");
  raw_mode = raw && std::string(raw) == "1";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = trident::fuzz::scratch_dir() + "/checkpoint.h5";
  InputReader in(data, size);
  if (raw_mode) {
    trident::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  } else {
    ::unlink(path.c_str());
    if (!write_checkpoint(path, in)) return 0;
    tamper(path, in);
  }
  try {
    trident::CheckpointReader reader(path, MPI_COMM_SELF, trident::checkpoint_reader_options());
    (void)trident::verify_checkpoint(reader);
    reader.close();
  } catch (const trident::Error& e) {
    trident::fuzz::expect_one_line_naming(e, path);
  }
  return 0;
}

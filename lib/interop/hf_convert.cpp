#include "interop/hf_convert.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "checkpoint/ckpt_mpi.hpp"
#include "checkpoint/ckpt_runs.hpp"
#include "checkpoint/h5_file.hpp"
#include "config/schema.hpp"
#include "interop/hf_model.hpp"
#include "model/architecture.hpp"
#include "train/checkpointing.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace fs = std::filesystem;

namespace trident {
namespace {

int rank_of(MPI_Comm comm) { return ckpt::comm_rank(comm); }
int size_of(MPI_Comm comm) { return ckpt::comm_size(comm); }

// A block of Hugging Face rows of one tensor: the unit of work of one rank in one round.
struct RowChunk {
  int64_t begin = 0, end = 0;
};

std::vector<RowChunk> row_chunks(const HfTensor& t, int64_t chunk_elements) {
  const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_elements / t.cols());
  std::vector<RowChunk> chunks;
  for (int64_t r = 0; r < t.rows(); r += rows_per_chunk)
    chunks.push_back({r, std::min(t.rows(), r + rows_per_chunk)});
  return chunks;
}

// Rounds in which `size` ranks handle `count` chunks, one each per round.
int64_t rounds_for(size_t count, int size) {
  return (static_cast<int64_t>(count) + size - 1) / size;
}

std::string errno_text() { return std::strerror(errno); }

// "" or what failed, naming the file.
std::string pwrite_all(int fd, const std::byte* data, int64_t bytes, int64_t offset,
                       const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "'" + path + "': write failed: " + (n < 0 ? errno_text() : "no progress");
    data += n;
    bytes -= n;
    offset += n;
  }
  return "";
}

std::string pread_all(int fd, std::byte* data, int64_t bytes, int64_t offset,
                      const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "'" + path + "': read failed: " + (n < 0 ? errno_text() : "unexpected end of file");
    data += n;
    bytes -= n;
    offset += n;
  }
  return "";
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error("'" + path.string() + "': cannot write: " + errno_text());
}

// ------------------------------------------------------------------------------------------
// export

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into hf_tensors()
  SafetensorsLayout layout;
};

// huggingface_hub's split_state_dict_into_shards as transformers 5's save_pretrained calls it:
// tensors in name order; one bigger than the limit gets a shard of its own; otherwise a new
// shard starts when the tensor would tip the current one over. File names as transformers
// gives them. (Checked: the same files, byte for byte, as save_pretrained of transformers
// 5.24 with the same max_shard_size.)
std::vector<Shard> plan_shards(const std::vector<HfTensor>& tensors, TensorDType dtype,
                               int64_t max_bytes) {
  std::vector<size_t> by_name(tensors.size());
  for (size_t i = 0; i < by_name.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(),
            [&](size_t a, size_t b) { return tensors[a].hf_name < tensors[b].hf_name; });
  std::vector<Shard> shards;
  Shard current;
  int64_t current_bytes = 0;
  for (size_t i : by_name) {
    const int64_t bytes = tensors[i].numel() * dtype_bytes(dtype);
    if (bytes > max_bytes) {
      shards.push_back({"", {i}, {}});
      continue;
    }
    if (current_bytes + bytes > max_bytes) {
      shards.push_back(std::move(current));
      current = {};
      current_bytes = 0;
    }
    current.tensors.push_back(i);
    current_bytes += bytes;
  }
  if (!current.tensors.empty()) shards.push_back(std::move(current));
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    shards[s].file = shards.size() == 1 ? "model.safetensors" : name;
    std::vector<TensorSpec> specs;
    for (size_t i : shards[s].tensors) specs.push_back({tensors[i].hf_name, tensors[i].hf_shape});
    shards[s].layout = plan_safetensors(specs, dtype);
  }
  return shards;
}

// Rank 0: the shard files under temporary names, each with its header and its full size.
void create_shard_files(const fs::path& dir, const std::vector<Shard>& shards,
                        const std::string& suffix) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error("'" + dir.string() + "': cannot create the output directory" +
                (ec ? ": " + ec.message() : ""));
  for (const Shard& s : shards) {
    const std::string path = (dir / (s.file + suffix)).string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("'" + path + "': cannot create: " + errno_text());
    std::string err = pwrite_all(fd, reinterpret_cast<const std::byte*>(s.layout.header.data()),
                                 static_cast<int64_t>(s.layout.header.size()), 0, path);
    if (err.empty() && ::ftruncate(fd, s.layout.file_size) != 0)
      err = "'" + path + "': cannot size: " + errno_text();
    ::close(fd);
    if (!err.empty()) throw Error(err);
  }
}

// Rank 0, after every rank wrote: the files under their names, the index (sharded) or no
// stale one, config.json.
void finish_export_files(const fs::path& dir, const std::vector<Shard>& shards,
                         const std::vector<HfTensor>& tensors, const ModelConfig& model,
                         TensorDType dtype, const std::string& suffix) {
  const std::regex shard_name(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::set<std::string> ours;
  for (const Shard& s : shards) ours.insert(s.file);
  // Files of an earlier export into the same directory that this one does not replace would
  // make transformers load a mixture.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool stale_shard = std::regex_match(name, shard_name) && !ours.count(name);
    const bool stale_single = name == "model.safetensors" && !ours.count(name);
    const bool stale_index = name == "model.safetensors.index.json" && shards.size() == 1;
    if (stale_shard || stale_single || stale_index) fs::remove(entry.path(), ec);
  }
  for (const Shard& s : shards) {
    fs::rename(dir / (s.file + suffix), dir / s.file, ec);
    if (ec) throw Error("'" + (dir / s.file).string() + "': cannot rename into place: " + ec.message());
  }
  if (shards.size() > 1) {
    // As transformers writes it: json.dumps(index, indent=2, sort_keys=True) + "\n".
    nlohmann::json index;
    int64_t total_bytes = 0, total_parameters = 0;
    for (const Shard& s : shards)
      for (size_t i : s.tensors) {
        index["weight_map"][tensors[i].hf_name] = s.file;
        total_bytes += tensors[i].numel() * dtype_bytes(dtype);
        total_parameters += tensors[i].numel();
      }
    index["metadata"]["total_size"] = total_bytes;
    index["metadata"]["total_parameters"] = total_parameters;  // transformers 5 adds it
    write_text_file(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  const nlohmann::json config = hf_config(model, dtype == TensorDType::BF16 ? "bfloat16" : "float32");
  write_text_file(dir / "config.json", config.dump(2) + "\n");  // sorted keys, like transformers
}

}  // namespace

int64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, int64_t> units = {
      {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000'000}, {"GB", 1000'000'000},
      {"KIB", 1024}, {"MIB", 1 << 20}, {"GIB", int64_t{1} << 30}};
  const auto it = units.find(unit);
  if (digits == 0 || digits > 15 || it == units.end())
    throw Error("--max-shard-size '" + text + "': expected bytes, or a number with KB, MB, GB, "
                "KiB, MiB or GiB (5GB = 5 * 10^9 bytes, as transformers reads it)");
  const int64_t value = std::stoll(text.substr(0, digits)) * it->second;
  if (value <= 0) throw Error("--max-shard-size '" + text + "' must be positive");
  return value;
}

int64_t export_hf(const std::string& checkpoint, const std::string& out_dir,
                  const HfExportOptions& options, MPI_Comm comm) {
  const int rank = rank_of(comm), size = size_of(comm);
  CheckpointReader reader(checkpoint, comm, checkpoint_reader_options());
  // The checks of `trident ckpt info --verify` (every checksum, finite values): the chunks
  // below are read without a checksum of their own (a checksum covers a whole dataset).
  const CheckpointMeta meta = verify_checkpoint(reader);
  const ModelConfig& model = meta.config.model;
  const std::vector<HfTensor> tensors = hf_tensors(model);
  const std::vector<Shard> shards = plan_shards(tensors, options.dtype, options.max_shard_bytes);
  const fs::path dir(out_dir);
  // A temporary suffix unique to this job: a failed export leaves the old files alone.
  const std::string suffix = ckpt::bcast_string(
      comm, ".tmp-" + std::to_string(::getpid()), 0);

  std::string error;
  if (rank == 0) {
    try {
      create_shard_files(dir, shards, suffix);
    } catch (const std::exception& e) {  // rank 0 alone: anything it throws must be agreed on
      error = e.what();
    }
  }
  ckpt::agree_or_throw(comm, error);
  auto remove_temp_files = [&] {
    if (rank != 0) return;
    std::error_code ec;
    for (const Shard& s : shards) fs::remove(dir / (s.file + suffix), ec);
  };

  try {
    std::vector<int> fds;
    for (const Shard& s : shards) {
      const std::string path = (dir / (s.file + suffix)).string();
      const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0 && error.empty()) error = "'" + path + "': cannot open: " + errno_text();
      fds.push_back(fd);
    }
    struct Closer {
      std::vector<int>& fds;
      ~Closer() {
        for (int fd : fds)
          if (fd >= 0) ::close(fd);
      }
    } closer{fds};
    ckpt::agree_or_throw(comm, error);

    std::vector<float> dataset_order, hf_order;
    std::vector<std::byte> bytes;
    const int64_t element_bytes = dtype_bytes(options.dtype);
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string path = (dir / shards[s].file).string();
      for (size_t i : shards[s].tensors) {
        const HfTensor& t = tensors[i];
        const SafetensorsEntry& entry = shards[s].layout.entry(t.hf_name);
        const std::vector<RowChunk> chunks = row_chunks(t, options.chunk_elements);
        // read_tensor is collective: every rank makes every call, an idle one with no runs.
        for (int64_t round = 0; round < rounds_for(chunks.size(), size); ++round) {
          const size_t c = static_cast<size_t>(round * size + rank);
          const bool busy = c < chunks.size();
          std::vector<Run> runs;
          int64_t n = 0;
          if (busy) {
            runs = t.dataset_runs(chunks[c].begin, chunks[c].end);
            n = (chunks[c].end - chunks[c].begin) * t.cols();
          }
          dataset_order.resize(static_cast<size_t>(n));
          reader.read_tensor(t.dataset, t.dataset_shape, runs, dataset_order,
                             ChecksumShare::none());
          if (!busy || !error.empty()) continue;
          hf_order.resize(static_cast<size_t>(n));
          t.to_hf_order(dataset_order.data(), chunks[c].begin, chunks[c].end, hf_order.data());
          bytes.resize(static_cast<size_t>(n * element_bytes));
          convert_from_float32(options.dtype, hf_order.data(), n, bytes.data());
          error = pwrite_all(fds[s], bytes.data(), n * element_bytes,
                             shards[s].layout.data_start + entry.begin +
                                 chunks[c].begin * t.cols() * element_bytes,
                             path);
        }
      }
    }
    reader.close();  // agrees on every read (I/O errors, values)
    for (size_t s = 0; s < shards.size(); ++s)
      if (error.empty() && ::fsync(fds[s]) != 0)
        error = "'" + (dir / shards[s].file).string() + "': fsync failed: " + errno_text();
    ckpt::agree_or_throw(comm, error);
    if (rank == 0) {
      try {
        finish_export_files(dir, shards, tensors, model, options.dtype, suffix);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    ckpt::agree_or_throw(comm, error);
  } catch (...) {
    remove_temp_files();
    throw;
  }
  int64_t total = 0;
  for (const HfTensor& t : tensors) total += t.numel() * dtype_bytes(options.dtype);
  return total;
}

// ------------------------------------------------------------------------------------------
// import

namespace {

struct SourceTensor {
  std::string file;
  TensorDType dtype = TensorDType::F32;
  int64_t offset = 0;
};

// The import's plan, made by rank 0 and broadcast (as JSON) so that every rank works from the
// same, already validated, description.
struct ImportPlan {
  std::string config_toml;
  std::map<std::string, SourceTensor> tensors;  // by Hugging Face name
};

nlohmann::json read_json_file(const fs::path& path) {
  const std::string text = read_input_file(
      path, {"'" + path.string() + "'", "JSON", int64_t{64} << 20, "import needs a JSON file"});
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error("'" + path.string() + "': not JSON (" + std::string(e.what()) + ")");
  }
}

std::string model_toml(const ModelConfig& m) {
  using config::toml_float;
  std::string t = "[model]\n";
  t += "arch = \"" + m.arch + "\"\n";
  t += "layers = " + std::to_string(m.layers) + "\n";
  t += "heads = " + std::to_string(m.heads) + "\n";
  t += "kv_heads = " + std::to_string(m.kv_heads) + "\n";
  t += "width = " + std::to_string(m.width) + "\n";
  t += "ffn_width = " + std::to_string(m.ffn_width) + "\n";
  t += "vocab_size = " + std::to_string(m.vocab_size) + "\n";
  t += "seq_len = " + std::to_string(m.seq_len) + "\n";
  t += std::string("tie_embeddings = ") + (m.tie_embeddings ? "true" : "false") + "\n";
  t += "norm_eps = " + toml_float(m.norm_eps) + "\n";
  t += "rope_theta = " + toml_float(m.rope_theta) + "\n";
  if (m.moe_experts > 0) {  // Mixtral; moe_aux_loss_coeff keeps Trident's default
    t += "moe_experts = " + std::to_string(m.moe_experts) + "\n";
    t += "moe_top_k = " + std::to_string(m.moe_top_k) + "\n";
    t += "moe_layer_interval = " + std::to_string(m.moe_layer_interval) + "\n";
    t += "moe_capacity_factor = " + toml_float(m.moe_capacity_factor) + "\n";
    t += "moe_z_loss_coeff = " + toml_float(m.moe_z_loss_coeff) + "\n";
  }
  // An imported model has no data; the key must not be empty in a valid config. A run that
  // starts from the checkpoint (train.init_from) uses its own config's data.
  t += "[data]\ntrain = \"(imported from Hugging Face: no data)\"\n";
  return t;
}

// Buffers Hugging Face models hold that are no weights (GPT-2's causal masks in old files,
// Llama's rotary frequencies).
bool is_buffer(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
         ends_with(".rotary_emb.inv_freq");
}

ImportPlan plan_import(const fs::path& dir, const HfImportOptions& options) {
  const fs::path config_path = dir / "config.json";
  const nlohmann::json hf = read_json_file(config_path);
  const ModelConfig model = model_from_hf_config(hf, config_path.string(), options.seq_len);
  ImportPlan plan;
  plan.config_toml = model_toml(model);
  const Config config = parse_config(plan.config_toml, config_path.string());

  // Where each tensor is: one file, or the files an index maps.
  std::map<std::string, std::string> file_of;  // tensor -> file (absolute)
  std::string listing;                          // the file that says where tensors are
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";
  std::map<std::string, std::map<std::string, SafetensorsTensor>> headers;
  if (fs::exists(single_path)) {
    listing = single_path.string();
    headers[listing] = read_safetensors_header(listing);
    for (const auto& [name, t] : headers[listing]) file_of[name] = listing;
  } else if (fs::exists(index_path)) {
    listing = index_path.string();
    const nlohmann::json index = read_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error("'" + listing + "': no \"weight_map\" object");
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw Error("'" + listing + "': weight_map[\"" + name + "\"] = " + file.dump() +
                    " is not a file name");
      const std::string path = (dir / file.get<std::string>()).string();
      if (!headers.count(path)) headers[path] = read_safetensors_header(path);
      if (!headers[path].count(name))
        throw Error("'" + path + "': no tensor '" + name + "' (" + listing + " maps it there)");
      file_of[name] = path;
    }
  } else {
    throw Error("'" + dir.string() + "': no model.safetensors or model.safetensors.index.json");
  }
  // GPT-2 files saved from GPT2Model (the hub's "gpt2") lack the "transformer." prefix.
  if (!model.is_llama() && !file_of.count("transformer.wte.weight") && file_of.count("wte.weight")) {
    std::map<std::string, std::string> prefixed;
    for (const auto& [name, file] : file_of)
      prefixed[name.rfind("lm_head.", 0) == 0 ? name : "transformer." + name] = file;
    file_of = std::move(prefixed);
  }
  auto header_entry = [&](const std::string& name) -> const SafetensorsTensor& {
    const std::string& file = file_of.at(name);
    const std::string stored =
        headers[file].count(name) ? name : name.substr(std::string("transformer.").size());
    return headers[file].at(stored);
  };

  const std::vector<HfTensor> wanted = hf_tensors(config.model);
  std::set<std::string> used;
  for (const HfTensor& t : wanted) {
    if (!file_of.count(t.hf_name))
      throw Error("'" + listing + "': no tensor '" + t.hf_name + "' (the model " +
                  config_path.string() + " describes has it)");
    const std::string& file = file_of.at(t.hf_name);
    const SafetensorsTensor& h = header_entry(t.hf_name);
    if (!h.supported)
      throw Error("'" + file + "': tensor '" + t.hf_name + "' has dtype " + h.dtype_text +
                  " (import reads F32, F16 and BF16)");
    if (h.shape != t.hf_shape)
      throw Error("'" + file + "': tensor '" + t.hf_name + "' has shape " +
                  shape_string(h.shape) + ", the model " + config_path.string() +
                  " describes needs " + shape_string(t.hf_shape));
    plan.tensors[t.hf_name] = {file, h.dtype, h.offset};
    used.insert(t.hf_name);
  }
  for (const auto& [name, file] : file_of) {
    if (used.count(name) || is_buffer(name)) continue;
    // A tied head saved anyway is the embedding itself.
    if (name == "lm_head.weight" && config.model.tie_embeddings) continue;
    throw Error("'" + file + "': tensor '" + name + "' has no place in Trident's " +
                config.model.arch + " model (" + config_path.string() + ")");
  }
  return plan;
}

std::string plan_to_text(const ImportPlan& plan) {
  nlohmann::json j;
  j["config"] = plan.config_toml;
  for (const auto& [name, t] : plan.tensors)
    j["tensors"][name] = {{"file", t.file}, {"dtype", dtype_name(t.dtype)}, {"offset", t.offset}};
  return j.dump();
}

ImportPlan plan_from_text(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  ImportPlan plan;
  plan.config_toml = j["config"].get<std::string>();
  for (const auto& [name, t] : j["tensors"].items()) {
    SourceTensor s;
    s.file = t["file"].get<std::string>();
    parse_dtype_name(t["dtype"].get<std::string>(), s.dtype);
    s.offset = t["offset"].get<int64_t>();
    plan.tensors[name] = s;
  }
  return plan;
}

// Read-only descriptors of the source files, opened once per rank.
class SourceFiles {
 public:
  ~SourceFiles() {
    for (const auto& [path, fd] : fds_) ::close(fd);
  }
  // -1 and `error` set when the file cannot be opened.
  int fd(const std::string& path, std::string& error) {
    if (auto it = fds_.find(path); it != fds_.end()) return it->second;
    // O_NONBLOCK: a FIFO put in a checked file's place is refused, not waited on.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      if (error.empty()) error = "'" + path + "': cannot open: " + errno_text();
      return -1;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      if (error.empty()) error = "'" + path + "': not a regular file";
      return -1;
    }
    fds_[path] = fd;
    return fd;
  }

 private:
  std::map<std::string, int> fds_;
};

}  // namespace

std::string import_hf(const std::string& in_dir, const std::string& out_file,
                      const HfImportOptions& options, MPI_Comm comm) {
  const int rank = rank_of(comm), size = size_of(comm);
  std::string error, plan_text;
  if (rank == 0) {
    try {
      plan_text = plan_to_text(plan_import(fs::path(in_dir), options));
    } catch (const Error& e) {
      error = e.what();
    } catch (const std::exception& e) {  // rank 0 alone: never leave the others waiting
      error = "'" + in_dir + "': " + e.what();
    }
  }
  ckpt::agree_or_throw(comm, error);
  const ImportPlan plan = plan_from_text(ckpt::bcast_string(comm, plan_text, 0));
  const Config config = parse_config(plan.config_toml, in_dir + "/config.json");
  const std::vector<HfTensor> tensors = hf_tensors(config.model);

  SourceFiles sources;
  std::vector<float> hf_order, dataset_order;
  std::vector<std::byte> bytes;
  CheckpointWriter writer(out_file, comm);
  try {
    // The checkpoint's tensors in the walk's order (every rank makes every write), none of
    // them held by a rank: each tensor is written in chunks spread over the ranks.
    for_each_checkpoint_tensor(config.model, {}, [&](const CheckpointTensor& t) {
      const ParamInfo& p = t.global;
      const std::string dataset = t.dataset(kWeightsRoot);
      // The Hugging Face tensors this dataset is made of, cut into chunks of rows.
      std::vector<std::pair<const HfTensor*, RowChunk>> chunks;
      for (const HfTensor& t : tensors)
        if (t.dataset == dataset)
          for (const RowChunk& c : row_chunks(t, options.chunk_elements)) chunks.push_back({&t, c});
      writer.write_tensor_in_passes(
          dataset, p.global_shape, rounds_for(chunks.size(), size),
          [&](int64_t round) -> CheckpointWriter::TensorPiece {
            const size_t c = static_cast<size_t>(round * size + rank);
            if (c >= chunks.size() || !error.empty()) return {};
            const HfTensor& t = *chunks[c].first;
            const RowChunk rows = chunks[c].second;
            const SourceTensor& src = plan.tensors.at(t.hf_name);
            const int64_t n = (rows.end - rows.begin) * t.cols();
            const int64_t element_bytes = dtype_bytes(src.dtype);
            bytes.resize(static_cast<size_t>(n * element_bytes));
            const int fd = sources.fd(src.file, error);
            if (fd < 0) return {};
            error = pread_all(fd, bytes.data(), n * element_bytes,
                              src.offset + rows.begin * t.cols() * element_bytes, src.file);
            if (!error.empty()) return {};
            hf_order.resize(static_cast<size_t>(n));
            convert_to_float32(src.dtype, bytes.data(), n, hf_order.data());
            // A NaN or infinity would be written, then refused by every reader (ckpt info
            // --verify, --resume): refused here, naming the tensor and the element.
            if (const std::string bad = check_values(hf_order.data(), rows.begin * t.cols(), n,
                                                     ValueCheck::Finite);
                !bad.empty()) {
              error = "'" + src.file + "': tensor '" + t.hf_name + "' " + bad +
                      " (a checkpoint's weights are finite)";
              return {};
            }
            dataset_order.resize(static_cast<size_t>(n));
            t.to_dataset_order(hf_order.data(), rows.begin, rows.end, dataset_order.data());
            return {t.dataset_runs(rows.begin, rows.end), dataset_order};
          });
      // A source file that failed on some rank: every rank stops here, naming it (the writer
      // would only see missing elements).
      ckpt::agree_or_throw(comm, error);
      // Fresh AdamW moments: zeros, in flat chunks over the ranks.
      const int64_t numel = p.numel();
      const int64_t chunk = std::max<int64_t>(1, options.chunk_elements);
      const int64_t count = (numel + chunk - 1) / chunk;
      const std::vector<float> zeros(static_cast<size_t>(std::min(chunk, numel)), 0.0f);
      for (const char* root : {kExpAvgRoot, kExpAvgSqRoot})
        writer.write_tensor_in_passes(
            t.dataset(root), p.global_shape, (count + size - 1) / size,
            [&](int64_t round) -> CheckpointWriter::TensorPiece {
              const int64_t c = round * size + rank;
              if (c >= count) return {};
              const int64_t begin = c * chunk, length = std::min(chunk, numel - begin);
              return {{Run{0, begin, length}}, std::span<const float>(zeros.data(), length)};
            });
    });
    CheckpointProgress progress;
    progress.layout = "imported from Hugging Face (" + in_dir + ")";
    write_checkpoint_attributes(writer, config, progress);
    writer.close();
  } catch (...) {
    // The writer abandoned (emptied) the file; nothing half-written stays behind.
    if (rank == 0) {
      std::error_code ec;
      fs::remove(out_file, ec);
    }
    throw;
  }
  return config.to_toml();
}

}  // namespace trident

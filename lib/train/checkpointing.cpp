#include "train/checkpointing.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "config/schema.hpp"
#include "data/blend.hpp"
#include "model/architecture.hpp"
#include "model/stage_model.hpp"
#include "optim/lr_schedule.hpp"
#include "train/divergence_guard.hpp"
#include "util/error.hpp"

namespace trident {

std::string dataset_path(const std::string& root, const std::string& param_name) {
  std::string path = root;
  std::stringstream parts(param_name);
  std::string part;
  bool after_layers = false;
  while (std::getline(parts, part, '.')) {
    if (after_layers && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%03d", std::stoi(part));
      part = buf;
    }
    after_layers = part == "layers";
    path += "/" + part;
  }
  return path;
}

std::vector<Run> param_runs(const ParamInfo& p, int64_t begin, int64_t end, int64_t local_base) {
  // Candidate runs from the shard map, one per block (row split, replicated) or per row and
  // block (column split), clipped to [begin, end); adjacent ones merged.
  std::vector<Run> runs;
  auto add = [&](int64_t local, int64_t global, int64_t length) {
    const int64_t lo = std::max(local, begin), hi = std::min(local + length, end);
    if (lo >= hi) return;
    const Run run{local_base + (lo - begin), global + (lo - local), hi - lo};
    if (!runs.empty()) {
      Run& last = runs.back();
      if (last.local_offset + last.length == run.local_offset &&
          last.global_offset + last.length == run.global_offset) {
        last.length += run.length;
        return;
      }
    }
    runs.push_back(run);
  };
  const int64_t cols = p.local_shape.size() == 2 ? p.local_shape[1] : 1;
  const int64_t global_cols = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
  // Expert parallelism: the rank's rows start at global row p.row_begin (0 otherwise).
  const int64_t base = p.row_begin * global_cols;
  if (p.split_dim < 0) {
    add(0, base, p.numel());
  } else if (p.split_dim == 0) {
    for (const ShardBlock& b : p.blocks)
      add(b.local_begin * cols, base + b.global_begin * cols, b.length * cols);
  } else {
    const int64_t rows = p.local_shape[0];
    for (int64_t r = 0; r < rows; ++r)
      for (const ShardBlock& b : p.blocks)
        add(r * cols + b.local_begin, base + r * global_cols + b.global_begin, b.length);
  }
  return runs;
}

std::vector<Run> state_runs(const ParamInfo& p, const std::vector<FlatRange>& owned) {
  std::vector<Run> runs;
  int64_t state_offset = 0;
  for (const FlatRange& r : owned) {
    const int64_t lo = std::max(p.offset, r.begin), hi = std::min(p.offset + p.numel(), r.end);
    if (lo < hi) {
      auto part = param_runs(p, lo - p.offset, hi - p.offset, state_offset + (lo - r.begin));
      runs.insert(runs.end(), part.begin(), part.end());
    }
    state_offset += r.size();
  }
  return runs;
}

}  // namespace trident

namespace trident {

namespace {

const char* kRoots[] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

}  // namespace

ValueCheck checkpoint_value_check(const std::string& dataset) {
  return dataset.rfind("/optim/exp_avg_sq/", 0) == 0 ? ValueCheck::FiniteNonNegative
                                                      : ValueCheck::Finite;
}

ReaderOptions checkpoint_reader_options() {
  ReaderOptions options;
  options.value_check = checkpoint_value_check;
  return options;
}

CheckpointMeta check_checkpoint(const CheckpointReader& r) {
  const std::string file = "checkpoint '" + r.path() + "'";
  auto fail = [&](const std::string& what) { throw Error(file + ": " + what); };
  CheckpointMeta meta;
  meta.format_version = r.attribute_int("/", "format_version");
  if (meta.format_version < kCheckpointOldestFormatVersion ||
      meta.format_version > kCheckpointFormatVersion)
    fail("format version " + std::to_string(meta.format_version) + " (this build reads " +
         std::to_string(kCheckpointOldestFormatVersion) + " to " +
         std::to_string(kCheckpointFormatVersion) + ")");
  // Version 1 predates the seal: a file saying 1 that carries one was changed after writing.
  if (meta.format_version < 2 && r.has_attribute("/", kAttributesChecksumKey))
    fail("format_version = 1, but the root carries version 2's '" +
         std::string(kAttributesChecksumKey) + "' (the attributes were changed after writing)");
  auto count = [&](const char* key) {
    const int64_t v = r.attribute_int("/", key);
    if (v < 0) fail(std::string(key) + " = " + std::to_string(v) + " is negative");
    return v;
  };
  meta.step = count("step");
  meta.optimizer_updates = count("optimizer_updates");
  meta.skipped_steps = count("skipped_steps");
  const int64_t consumed_samples = count("consumed_samples");
  const int64_t consumed_tokens = count("consumed_tokens");
  meta.sampler_position = count("sampler_position");
  // Written since rollbacks exist; absent: a run that skipped nothing.
  if (r.has_attribute("/", "skipped_batches"))
    meta.skipped_batches = parse_skip_list(r.attribute_string("/", "skipped_batches"),
                                           file + ": skipped_batches");
  if (r.has_attribute("/", "rollbacks")) meta.rollbacks = count("rollbacks");
  const int64_t seed = r.attribute_int("/", "seed");
  (void)r.attribute_double("/", "learning_rate_next");
  (void)r.attribute_string("/", "layout");
  meta.config = parse_config(r.attribute_string("/", "config"), file + " attribute 'config'");
  const Config& c = meta.config;

  // The counters against each other and against the stored config.
  auto mismatch = [&](const std::string& what, __int128 found, __int128 expected,
                      const std::string& how) {
    if (found == expected) return;
    fail(what + " = " + std::to_string(static_cast<long long>(found)) + ", but " + how +
         " = " + std::to_string(static_cast<long long>(expected)));
  };
  mismatch("optimizer_updates + skipped_steps",
           static_cast<__int128>(meta.optimizer_updates) + meta.skipped_steps, meta.step,
           "step");
  mismatch("consumed_samples", consumed_samples,
           static_cast<__int128>(meta.step) * c.train.global_batch,
           "step * train.global_batch (" + std::to_string(meta.step) + " * " +
               std::to_string(c.train.global_batch) + ")");
  mismatch("consumed_tokens", consumed_tokens,
           static_cast<__int128>(meta.step) * c.train.global_batch * c.model.seq_len,
           "step * train.global_batch * model.seq_len");
  mismatch("sampler_position", meta.sampler_position,
           batch_of_step(meta.step, meta.skipped_batches),
           "the batch index of step " + std::to_string(meta.step) + " after skipped_batches " +
               skip_list_text(meta.skipped_batches));
  mismatch("seed", seed, c.train.seed, "the stored config's train.seed");
  if (meta.step > c.train.steps)
    fail("step = " + std::to_string(meta.step) + " is past the stored config's train.steps = " +
         std::to_string(c.train.steps));
  const std::pair<const char*, int64_t> dims[] = {
      {"model_layers", c.model.layers},        {"model_heads", c.model.heads},
      {"model_width", c.model.width},          {"model_vocab_size", c.model.vocab_size},
      {"model_seq_len", c.model.seq_len},      {"model_kv_heads", c.model.kv_head_count()},
      {"model_ffn_width", c.model.ffn_size()},
      {"model_tie_embeddings", c.model.tie_embeddings ? 1 : 0}};
  for (const auto& [key, value] : dims) {
    // model_kv_heads, model_ffn_width, model_tie_embeddings, model_arch: absent in files
    // written before the architectures existed.
    if (meta.format_version < 2 && !r.has_attribute("/", key)) continue;
    mismatch(key, r.attribute_int("/", key), value, "the stored config's model." +
                                                         std::string(key + 6));
  }
  if (meta.format_version >= 2 || r.has_attribute("/", "model_arch")) {
    const std::string arch = r.attribute_string("/", "model_arch");
    // The attribute is the file's text: quoted with its control characters escaped, so the
    // message stays one line whatever the file holds.
    if (arch != c.model.arch)
      fail("model_arch = " + config::toml_string(arch) +
           ", but the stored config's model.arch = " + config::toml_string(c.model.arch));
  }
  if (meta.format_version >= 2) r.verify_attributes("/");

  // The complete schema of the stored model. A stored config may describe a model far larger
  // than the file (10^8 layers: building its parameter list took minutes and gigabytes before
  // the first missing dataset showed); every layer has tensors under each of the three roots,
  // so a model with more layers than a third of the file's datasets cannot be in it.
  const auto datasets_in_file = static_cast<int64_t>(r.datasets().size());
  if (c.model.layers > datasets_in_file / 3)
    fail("the stored config's model has " + std::to_string(c.model.layers) +
         " layers, more than the file's " + std::to_string(datasets_in_file) +
         " datasets can hold");
  std::map<std::string, std::vector<int64_t>> expected;
  for (const ParamInfo& p : global_parameters(c.model))
    for (const char* root : kRoots) expected[dataset_path(root, p.name)] = p.global_shape;
  for (const auto& [name, shape] : expected) {
    if (!r.has_dataset(name))
      fail("no dataset '" + name + "' (the stored config's model has it)");
    if (r.shape(name) != shape)
      fail("dataset '" + name + "' has shape " + shape_string(r.shape(name)) +
           ", the stored config's model needs " + shape_string(shape));
    if (r.dtype(name) != "float32")
      fail("dataset '" + name + "' has type " + r.dtype(name) + ", expected float32");
    (void)r.checksum(name);
  }
  for (const std::string& name : r.datasets())
    if (!expected.count(name))
      // The name comes from the file: quoted with its control characters escaped.
      fail("unexpected dataset " + config::toml_string(name) +
           " (not in the stored config's model)");
  return meta;
}

void write_checkpoint_attributes(CheckpointWriter& w, const Config& c,
                                 const CheckpointProgress& progress) {
  const int64_t step = progress.step;
  w.set_attribute("/", "format_version", kCheckpointFormatVersion);
  w.set_attribute("/", "step", step);
  w.set_attribute("/", "consumed_samples", step * c.train.global_batch);
  w.set_attribute("/", "consumed_tokens", step * c.tokens_per_step());
  // The next step's global batch, past the skipped ones.
  w.set_attribute("/", "sampler_position", batch_of_step(step, progress.skipped_batches));
  w.set_attribute("/", "skipped_batches", skip_list_text(progress.skipped_batches));
  w.set_attribute("/", "rollbacks", progress.rollbacks);
  w.set_attribute("/", "seed", c.train.seed);
  w.set_attribute("/", "optimizer_updates", progress.optimizer_updates);
  w.set_attribute("/", "skipped_steps", progress.skipped_steps);
  w.set_attribute("/", "learning_rate_next",
                  learning_rate(c.optim, c.train.steps, step) * progress.lr_scale);
  w.set_attribute("/", "layout", progress.layout);
  w.set_attribute("/", "config", c.to_toml());
  w.set_attribute("/", "model_layers", c.model.layers);
  w.set_attribute("/", "model_heads", c.model.heads);
  w.set_attribute("/", "model_width", c.model.width);
  w.set_attribute("/", "model_vocab_size", c.model.vocab_size);
  w.set_attribute("/", "model_seq_len", c.model.seq_len);
  w.set_attribute("/", "model_arch", c.model.arch);
  w.set_attribute("/", "model_kv_heads", c.model.kv_head_count());
  w.set_attribute("/", "model_ffn_width", c.model.ffn_size());
  w.set_attribute("/", "model_tie_embeddings", static_cast<int64_t>(c.model.tie_embeddings));
  w.seal_attributes("/");  // attributes_checksum over all of the above
}

std::string model_config_difference(const ModelConfig& checkpoint, const ModelConfig& run,
                                    const std::string& run_source) {
  auto text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  // In schema order (config.hpp), each resolved as the model uses it.
  const std::pair<const char*, std::pair<std::string, std::string>> keys[] = {
      {"arch", {quoted(checkpoint.arch), quoted(run.arch)}},
      {"layers", {std::to_string(checkpoint.layers), std::to_string(run.layers)}},
      {"heads", {std::to_string(checkpoint.heads), std::to_string(run.heads)}},
      {"kv_heads",
       {std::to_string(checkpoint.kv_head_count()), std::to_string(run.kv_head_count())}},
      {"width", {std::to_string(checkpoint.width), std::to_string(run.width)}},
      {"ffn_width", {std::to_string(checkpoint.ffn_size()), std::to_string(run.ffn_size())}},
      {"vocab_size", {std::to_string(checkpoint.vocab_size), std::to_string(run.vocab_size)}},
      {"seq_len", {std::to_string(checkpoint.seq_len), std::to_string(run.seq_len)}},
      {"tie_embeddings", {flag(checkpoint.tie_embeddings), flag(run.tie_embeddings)}},
      {"norm_eps", {text(checkpoint.norm_eps), text(run.norm_eps)}},
      {"rope_theta", {text(checkpoint.rope_theta), text(run.rope_theta)}},
      // The experts and which layers hold them shape the parameters; the router's other
      // keys (top_k, losses, capacity) may change on resume.
      {"moe_experts", {std::to_string(checkpoint.moe_experts), std::to_string(run.moe_experts)}},
      {"moe_layer_interval",
       {std::to_string(checkpoint.moe_experts > 0 ? checkpoint.moe_layer_interval : 1),
        std::to_string(run.moe_experts > 0 ? run.moe_layer_interval : 1)}}};
  const bool rope_model = checkpoint.is_llama() || run.is_llama();
  for (const auto& [key, values] : keys) {
    // gpt2 has neither RMSNorm nor rotary embeddings: their keys mean nothing to it.
    const bool llama_only = std::string(key) == "norm_eps" || std::string(key) == "rope_theta";
    if (llama_only && !rope_model) continue;
    if (values.first != values.second)
      return "model." + std::string(key) + " = " + values.first + " in the checkpoint but " +
             values.second + " in " + run_source;
  }
  return "";
}

CheckpointMeta verify_checkpoint(CheckpointReader& reader) {
  CheckpointMeta meta = check_checkpoint(reader);
  reader.verify_all();
  return meta;
}

namespace {

// "[0.7, 0.3]": the normalised weights of a data.train blend ("[1]" for one dataset, however
// written); "" for an unreadable one.
std::string blend_weights_text(const std::vector<std::string>& entries) {
  try {
    std::string out = "[";
    for (double w : normalised_weights(parse_blend(entries, "data.train"))) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.17g", out.size() > 1 ? ", " : "", w);
      out += buf;
    }
    return out + "]";
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

std::string data_order_changes(const Config& written, const Config& now) {
  std::string out;
  auto add = [&](const char* key, const std::string& before, const std::string& after) {
    if (before == after) return;
    out += (out.empty() ? "" : ", ") + std::string(key) + " " + before + " -> " + after;
  };
  add("train.global_batch", std::to_string(written.train.global_batch),
      std::to_string(now.train.global_batch));
  add("train.seed", std::to_string(written.train.seed), std::to_string(now.train.seed));
  add("data.shuffle", written.data.shuffle ? "true" : "false", now.data.shuffle ? "true" : "false");
  // A blend's weights decide which dataset each position draws from (its sources may move).
  add("data.train weights", blend_weights_text(written.data.train),
      blend_weights_text(now.data.train));
  return out;
}

void read_model_weights(CheckpointReader& reader, StageModel& model,
                        const std::function<bool(const ParamInfo&)>& counts_checksum) {
  const int64_t n = model.flat_size();
  Device& device = model.device();
  std::vector<float> staging;
  if (!device.is_host()) staging.resize(static_cast<size_t>(n));
  float* weights = device.is_host() ? model.weights() : staging.data();
  std::map<std::string, const ParamInfo*> mine;
  for (const ParamInfo& p : model.params()) mine[p.name] = &p;
  for (const ParamInfo& g : global_parameters(model.config())) {
    const auto it = mine.find(g.name);
    const ParamInfo* p = it == mine.end() ? nullptr : it->second;
    const auto runs = p ? param_runs(*p, 0, p->numel(), p->offset) : std::vector<Run>{};
    const bool owner = p && p->counted_in_norm && counts_checksum(*p);
    reader.read_tensor(dataset_path("/model", g.name), g.global_shape, runs,
                       {weights, static_cast<size_t>(n)},
                       owner ? ChecksumShare::all() : ChecksumShare::none());
  }
  if (!device.is_host())
    device.from_host(model.weights(), weights, n * static_cast<int64_t>(sizeof(float)));
  model.weights_changed();
}

}  // namespace trident

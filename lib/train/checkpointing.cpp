#include "train/checkpointing.hpp"

#include <cstdio>
#include <map>

#include "config/schema.hpp"
#include "data/blend.hpp"
#include "model/architecture.hpp"
#include "optim/lr_schedule.hpp"
#include "train/divergence_guard.hpp"
#include "util/error.hpp"

namespace trident {

ValueCheck checkpoint_value_check(const std::string& dataset) {
  auto under = [&](const char* root) { return dataset.rfind(std::string(root) + "/", 0) == 0; };
  // Second moments, and the FP8 scales, step counts and amaxes.
  return under(kExpAvgSqRoot) || under(kFp8Root) ? ValueCheck::FiniteNonNegative
                                                  : ValueCheck::Finite;
}

ReaderOptions checkpoint_reader_options() {
  ReaderOptions options;
  options.value_check = checkpoint_value_check;
  return options;
}

namespace {

// Throws "checkpoint 'F': <what>".
struct Failure {
  std::string file;  // "checkpoint 'F'"
  [[noreturn]] void operator()(const std::string& what) const { throw Error(file + ": " + what); }
};

// Throws unless found == expected: "<what> = <found>, but <how> = <expected>".
void expect_equal(const Failure& fail, const std::string& what, __int128 found,
                  __int128 expected, const std::string& how) {
  if (found == expected) return;
  fail(what + " = " + std::to_string(static_cast<long long>(found)) + ", but " + how + " = " +
       std::to_string(static_cast<long long>(expected)));
}

// The root's counters that CheckpointMeta does not keep.
struct StoredTotals {
  int64_t consumed_samples = 0, consumed_tokens = 0, seed = 0;
};

// The root attributes, in order: the format version, the counters (each >= 0), the stored
// config.
CheckpointMeta read_root_attributes(const CheckpointReader& r, const Failure& fail,
                                    StoredTotals& totals) {
  CheckpointMeta meta;
  meta.format_version = r.attribute_int("/", "format_version");
  if (meta.format_version < kCheckpointOldestFormatVersion ||
      meta.format_version > kCheckpointFormatVersion)
    fail("format version " + std::to_string(meta.format_version) + " (this build reads " +
         std::to_string(kCheckpointOldestFormatVersion) + " to " +
         std::to_string(kCheckpointFormatVersion) + ")");
  // Version 1 predates the seal and the divergence guard's attributes: a file saying 1 that
  // carries one of them was changed after writing (and would skip the seal check).
  for (const char* key : {kAttributesChecksumKey, "guard_losses", "guard_bad_streak",
                          "rollback_save"})
    if (meta.format_version < 2 && r.has_attribute("/", key))
      fail("format_version = 1, but the root carries version 2's '" + std::string(key) +
           "' (the attributes were changed after writing)");
  auto count = [&](const char* key) {
    const int64_t v = r.attribute_int("/", key);
    if (v < 0) fail(std::string(key) + " = " + std::to_string(v) + " is negative");
    return v;
  };
  meta.step = count("step");
  meta.optimizer_updates = count("optimizer_updates");
  meta.skipped_steps = count("skipped_steps");
  totals.consumed_samples = count("consumed_samples");
  totals.consumed_tokens = count("consumed_tokens");
  meta.sampler_position = count("sampler_position");
  // Written since rollbacks exist; absent: a run that skipped nothing.
  if (r.has_attribute("/", "skipped_batches"))
    meta.skipped_batches = parse_skip_list(r.attribute_string("/", "skipped_batches"),
                                           fail.file + ": skipped_batches");
  if (r.has_attribute("/", "rollbacks")) meta.rollbacks = count("rollbacks");
  // Written since the guard's state is carried over resumes; absent: an empty window.
  if (r.has_attribute("/", "guard_losses"))
    meta.guard_losses = parse_loss_list(r.attribute_string("/", "guard_losses"),
                                        fail.file + ": guard_losses");
  if (r.has_attribute("/", "guard_bad_streak")) meta.guard_bad_streak = count("guard_bad_streak");
  if (r.has_attribute("/", "rollback_save")) {
    const int64_t v = r.attribute_int("/", "rollback_save");
    if (v != 0 && v != 1) fail("rollback_save = " + std::to_string(v) + " is not 0 or 1");
    meta.rollback_save = v == 1;
  }
  totals.seed = r.attribute_int("/", "seed");
  (void)r.attribute_double("/", "learning_rate_next");
  (void)r.attribute_string("/", "layout");
  meta.config =
      parse_config(r.attribute_string("/", "config"), fail.file + " attribute 'config'");
  return meta;
}

// The counters against each other and against the stored config.
void check_counters(const CheckpointMeta& meta, const StoredTotals& totals,
                    const Failure& fail) {
  const Config& c = meta.config;
  expect_equal(fail, "optimizer_updates + skipped_steps",
               static_cast<__int128>(meta.optimizer_updates) + meta.skipped_steps, meta.step,
               "step");
  expect_equal(fail, "consumed_samples", totals.consumed_samples,
               static_cast<__int128>(meta.step) * c.train.global_batch,
               "step * train.global_batch (" + std::to_string(meta.step) + " * " +
                   std::to_string(c.train.global_batch) + ")");
  expect_equal(fail, "consumed_tokens", totals.consumed_tokens,
               static_cast<__int128>(meta.step) * c.train.global_batch * c.model.seq_len,
               "step * train.global_batch * model.seq_len");
  expect_equal(fail, "sampler_position", meta.sampler_position,
               batch_of_step(meta.step, meta.skipped_batches),
               "the batch index of step " + std::to_string(meta.step) +
                   " after skipped_batches " + skip_list_text(meta.skipped_batches));
  expect_equal(fail, "seed", totals.seed, c.train.seed, "the stored config's train.seed");
  // Every bad step of the streak was a skipped step.
  if (meta.guard_bad_streak > meta.skipped_steps)
    fail("guard_bad_streak = " + std::to_string(meta.guard_bad_streak) +
         " is more than skipped_steps = " + std::to_string(meta.skipped_steps));
  if (meta.step > c.train.steps)
    fail("step = " + std::to_string(meta.step) + " is past the stored config's train.steps = " +
         std::to_string(c.train.steps));
}

// The model_* attributes against the stored config's model, then the attributes' seal.
void check_model_attributes(const CheckpointReader& r, const CheckpointMeta& meta,
                            const Failure& fail) {
  const ModelConfig& m = meta.config.model;
  const std::pair<const char*, int64_t> dims[] = {
      {"model_layers", m.layers},        {"model_heads", m.heads},
      {"model_width", m.width},          {"model_vocab_size", m.vocab_size},
      {"model_seq_len", m.seq_len},      {"model_kv_heads", m.kv_head_count()},
      {"model_ffn_width", m.ffn_size()}, {"model_tie_embeddings", m.tie_embeddings ? 1 : 0}};
  for (const auto& [key, value] : dims) {
    // model_kv_heads, model_ffn_width, model_tie_embeddings, model_arch: absent in files
    // written before the architectures existed.
    if (meta.format_version < 2 && !r.has_attribute("/", key)) continue;
    expect_equal(fail, key, r.attribute_int("/", key), value,
                 "the stored config's model." + std::string(key + 6));
  }
  if (meta.format_version >= 2 || r.has_attribute("/", "model_arch")) {
    const std::string arch = r.attribute_string("/", "model_arch");
    // The attribute is the file's text: quoted with its control characters escaped, so the
    // message stays one line whatever the file holds.
    if (arch != m.arch)
      fail("model_arch = " + config::toml_string(arch) +
           ", but the stored config's model.arch = " + config::toml_string(m.arch));
  }
  if (meta.format_version >= 2) r.verify_attributes("/");
}

// The complete schema of the stored model: every dataset of the walk with its shape, float32
// and a checksum, and no other; the FP8 scaling state of the stored config's run all or none.
void check_schema(const CheckpointReader& r, const Config& c, const Failure& fail) {
  const ModelConfig& m = c.model;
  // A stored config may describe a model far larger than the file (10^8 layers: building its
  // parameter list took minutes and gigabytes before the first missing dataset showed); every
  // layer has tensors under each of the three roots, so a model with more layers than a third
  // of the file's datasets cannot be in it.
  const auto datasets_in_file = static_cast<int64_t>(r.datasets().size());
  if (m.layers > datasets_in_file / 3)
    fail("the stored config's model has " + std::to_string(m.layers) +
         " layers, more than the file's " + std::to_string(datasets_in_file) +
         " datasets can hold");
  std::map<std::string, std::vector<int64_t>> expected;
  for_each_checkpoint_tensor(m, {}, [&](const CheckpointTensor& t) {
    for (const char* root : kCheckpointRoots) expected[t.dataset(root)] = t.global.global_shape;
  });
  const std::vector<Fp8StateDataset> fp8 = fp8_state_datasets(c);
  if (!fp8.empty() && r.has_dataset(fp8.front().name))
    for (const Fp8StateDataset& d : fp8) expected[d.name] = d.shape;
  for (const auto& [name, shape] : expected) {
    if (!r.has_dataset(name))
      fail("no dataset '" + name + "' (the stored config's " +
           (name.rfind(std::string(kFp8Root) + "/", 0) == 0 ? "FP8 scaling state" : "model") +
           " has it)");
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
}

}  // namespace

CheckpointMeta check_checkpoint(const CheckpointReader& r) {
  const Failure fail{"checkpoint '" + r.path() + "'"};
  StoredTotals totals;
  CheckpointMeta meta = read_root_attributes(r, fail, totals);
  check_counters(meta, totals, fail);
  check_model_attributes(r, meta, fail);
  check_schema(r, meta.config, fail);
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
  w.set_attribute("/", "guard_losses", loss_list_text(progress.guard_losses));
  w.set_attribute("/", "guard_bad_streak", progress.guard_bad_streak);
  w.set_attribute("/", "rollback_save", static_cast<int64_t>(progress.rollback_save));
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
  // Quoted with control characters escaped: the message stays one line (docs/fuzzing.md).
  auto quoted = [](const std::string& s) { return config::toml_string(s); };
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

std::string checkpoint_tensor_difference(const CheckpointReader& reader, const ModelConfig& run) {
  std::string difference;
  for_each_checkpoint_tensor(run, {}, [&](const CheckpointTensor& t) {
    for (const char* root : kCheckpointRoots) {
      const std::string name = t.dataset(root);
      if (!difference.empty()) return;
      if (!reader.has_dataset(name))
        difference = "no dataset '" + name + "' (the run's model has it)";
      else if (reader.shape(name) != t.global.global_shape)
        difference = "dataset '" + name + "': shape mismatch: expected " +
                     shape_string(t.global.global_shape) + ", found " +
                     shape_string(reader.shape(name));
    }
  });
  return difference;
}

void check_checkpoint_compatible(const CheckpointReader& reader, const CheckpointMeta& meta,
                                 const ModelConfig& run, const std::string& run_source,
                                 const std::string& subject) {
  // The key says what differs; the dataset, what it changes in the file (none for norm_eps,
  // say). Equal keys describe the stored model's tensors, which check_checkpoint verified.
  const std::string keys = model_config_difference(meta.config.model, run, run_source);
  const std::string tensors = checkpoint_tensor_difference(reader, run);
  if (keys.empty() && tensors.empty()) return;
  if (keys.empty()) throw Error(subject + ": " + tensors);
  throw Error(subject + ": " + keys + (tensors.empty() ? "" : " (" + tensors + ")"));
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

}  // namespace trident

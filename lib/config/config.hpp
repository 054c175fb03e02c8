#pragma once
// The resolved run configuration: TOML files (each with the bases it names in `include`) +
// `--set section.key=value` overrides, validated. Every key that exists is listed in
// docs/config.md; unknown keys, wrong types and impossible values are rejected with a
// trident::Error that names the key and the file.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trident {

struct ModelConfig {
  std::string arch = "gpt2";   // "gpt2" | "llama" (model/architecture.hpp)
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 0;        // key/value heads (grouped-query attention); 0: = heads
  int64_t width = 64;
  int64_t ffn_width = 0;       // MLP hidden size; 0: the architecture's default (ffn_size())
  int64_t vocab_size = 256;
  int64_t seq_len = 64;
  int64_t vocab_multiple = 1;  // the vocabulary is padded to a multiple of vocab_multiple * TP
  // Output head shares the token embedding. The loader sets it from the architecture (gpt2:
  // true, llama: false) when the file does not give it.
  bool tie_embeddings = true;
  double norm_eps = 1e-5;      // RMSNorm epsilon (llama); gpt2's LayerNorm uses 1e-5
  double rope_theta = 10000.0; // rotary embedding base (llama)
  // Packed documents (data.document_mask): positions restart at 0 after each end-of-document
  // token (the learned table's rows, or RoPE's angles).
  bool position_reset = false;
  // Mixture of experts (model/moe.hpp, docs/moe.md): the MLP of every moe_layer_interval-th
  // layer (layers l with l % interval == 0) is moe_experts copies of the architecture's MLP
  // behind a top-k softmax router. 0 experts: dense.
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  double moe_aux_loss_coeff = 0.01;  // Switch load-balancing loss, per sequence
  double moe_z_loss_coeff = 0.0;     // router z-loss (ST-MoE); 0: off
  double moe_capacity_factor = 0.0;  // tokens per sequence and expert; 0: dropless
  int64_t moe_layer_interval = 1;

  bool is_llama() const { return arch == "llama"; }
  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  // gpt2: 4 * width; llama: 8/3 * width rounded up to a multiple of 256 (Meta's rule).
  int64_t ffn_size() const {
    if (ffn_width > 0) return ffn_width;
    if (!is_llama()) return 4 * width;
    return (8 * width / 3 + 255) / 256 * 256;
  }
  int64_t head_size() const { return width / heads; }
  bool is_moe_layer(int64_t layer) const {
    return moe_experts > 0 && layer % moe_layer_interval == 0;
  }
};

struct ParallelConfig {
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t data = 1;
  // Context parallelism (CP): each sequence split over CP ranks (model/context_parallel.hpp,
  // docs/parallelism.md); a factor of the world size, between tensor and pipeline in the grid.
  int64_t context = 1;
  // Expert parallelism (EP): the experts of a MoE layer split over EP ranks taken from inside
  // the data-parallel dimension (docs/moe.md); not a factor of the world size.
  int64_t expert = 1;
  int64_t ranks_per_node = 0;          // 0: detect with MPI_COMM_TYPE_SHARED
  std::string schedule = "1f1b";       // "1f1b" | "gpipe" | "interleaved" | "zb-h1" | "zb-h2"
  int64_t virtual_stages = 1;          // model chunks per stage (interleaved: >= 2)
  std::string comm = "nccl";           // device buffers (train.device = "cuda"): "nccl" | "mpi"
  bool sequence_parallel = false;
  bool tp_overlap = false;             // column-parallel input-gradient all-reduce during dW
  std::vector<int64_t> pipeline_layers;  // empty: parallel.pipeline_balance
  std::string pipeline_balance = "even"; // "even" | "flops" (pipeline/schedule.hpp)
  double dp_bucket_mb = 25.0;
  double comm_timeout_s = 600.0;       // collective watchdog (comm/comm_watchdog.hpp)
  int64_t world_size() const { return tensor * context * pipeline * data; }
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t seed = 1234;
  int64_t micro_batch = 4;
  int64_t global_batch = 8;
  int64_t threads = 0;              // 0: cores available to this rank
  std::string device = "cpu";       // "cpu" | "cuda"
  std::string precision = "fp32";   // "fp32" | "bf16" | "fp8"
  // Activations and the weights' compute copy in bf16: precision "bf16", and "fp8" on the GPU
  // (its base precision; the CPU reference's is fp32).
  bool bf16_activations() const {
    return precision == "bf16" || (precision == "fp8" && device == "cuda");
  }
  std::string cpu_bf16_gemm = "auto";  // "auto" | "fma" | "onednn": the CPU's bf16 products
  std::string recompute = "none";   // "none" | "selective" | "full" (model/architecture.hpp)
  bool deterministic = true;  // false: the GPU's bf16 attention backward accumulates dQ atomically
  std::string attention_kernel = "auto";  // "auto" | "mma_sync" | "wgmma": the GPU's bf16 kernels
  bool fused_bias_gelu = true;  // GPT-2's MLP: the GELU in the up projection's GEMM epilogue
  // train.precision = "fp8" (model/fp8_linear.hpp): the gradients' format, the scales' margin
  // (powers of two of headroom) and the layers at each end kept in high precision.
  std::string fp8_grad_format = "e5m2";  // "e5m2" | "e4m3"
  std::string fp8_recipe = "current";    // "current" | "delayed"
  int64_t fp8_amax_history = 1024;       // delayed: the steps whose amaxes set the scale
  int64_t fp8_margin = 0;
  int64_t fp8_skip_first_layers = 1;
  int64_t fp8_skip_last_layers = 1;
  int64_t lm_head_chunk_rows = 0;   // rows per LM head + loss chunk; 0: the device's default
  double exit_after_minutes = 0.0;  // 0: no limit
  int64_t exit_interval = 0;        // stop after steps that are multiples of it; 0: never
  int64_t max_consecutive_skips = 10;  // end the run after this many skipped steps in a row; 0: never
  std::string init_from;  // checkpoint whose weights a fresh run starts from; empty: init
  // Divergence guard and rollback (train/divergence_guard.hpp, docs/reliability.md).
  double spike_factor = 0.0;       // loss > factor x median of the last good steps: bad; 0: off
  int64_t spike_window = 20;       // good steps in the median
  int64_t max_bad_steps = 0;       // bad steps in a row that roll back to the last checkpoint; 0: never
  int64_t max_rollbacks = 3;       // rollbacks a run may take before it exits 77
  double rollback_lr_scale = 1.0;  // learning rate factor per rollback taken
  std::vector<int64_t> skip_batches;  // global batch indices left out of the data order
};

struct OptimConfig {
  double lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;                // 0: no clipping
  int64_t zero_stage = 0;                // 0 to 3
  bool decay_position_embedding = false; // weight decay on the position table
};

struct DataConfig {
  // One entry: a shard path or glob, or an indexed dataset's prefix (a plain TOML string).
  // Several: a blend, each entry "WEIGHT:SOURCE" (data/blend.hpp, docs/data.md).
  std::vector<std::string> train;
  std::vector<std::string> val;  // empty: no validation
  bool shuffle = false;
  // Packed documents: attention never crosses an end-of-document token `eod_id` inside a
  // sequence (data/documents.hpp, docs/data.md); -1 with document_mask false.
  bool document_mask = false;
  int64_t eod_id = -1;
};

struct EvalConfig {
  int64_t interval = 0;  // 0: never
  int64_t steps = 1;     // global batches per evaluation
  // Samples from the live weights (train/generation.hpp) printed by rank 0.
  int64_t sample_interval = 0;     // 0: never
  std::string sample_prompt = "\n";
  int64_t sample_tokens = 32;
  double sample_temperature = 0.0;  // 0: greedy
  std::string sample_tokenizer;     // empty: byte-level
};

struct CheckpointConfig {
  std::string dir;        // empty: no checkpoints
  int64_t interval = 0;   // 0: only at the end / on signal
  int64_t keep = 2;
  bool allow_data_change = false;  // resume despite another global_batch / seed / shuffle
  double io_timeout_s = 1800.0;    // checkpoint I/O watchdog (comm/comm_watchdog.hpp)
  bool async = false;  // write in a thread while training goes on (train/async_checkpoint.hpp)
  // Periodic saves are asynchronous: checkpoint.async, with somewhere to save to.
  bool saves_async() const { return async && !dir.empty(); }
};

struct LogConfig {
  std::string dir = "runs/default";
  int64_t interval = 1;
  bool tensorboard = false;  // also TensorBoard event files in dir (train/tensorboard.hpp)
  bool trace = false;  // a timeline of trace_steps in dir/trace.json (train/timeline_trace.hpp)
  std::vector<int64_t> trace_steps = {2, 3};  // [first, last] step traced, 1-based, inclusive
  int64_t straggler_interval = 100;  // straggler report every this many steps; 0: off
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  OptimConfig optim;
  DataConfig data;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LogConfig log;

  std::string source;  // the file it came from ("<defaults>" if none; several: "a.toml, b.toml")
  // Which file or override set each key the resolved config was given: "section.key" -> the
  // file's path (as opened: relative to the including file's directory for an include) or
  // "--set". Keys not in it have their default (or one derived from other keys).
  std::map<std::string, std::string> provenance;

  // Micro-batches each data-parallel replica runs per step:
  // global_batch = micro_batch * num_microbatches * parallel.data
  int64_t num_microbatches() const {
    return train.global_batch / (train.micro_batch * parallel.data);
  }
  int64_t tokens_per_step() const { return train.global_batch * model.seq_len; }

  // The whole resolved configuration as TOML text (every key, defaults included).
  std::string to_toml() const;
  // to_toml() with where each value came from: a trailing "# from FILE" or "# --set" on every
  // key a file or override set, "# derived from other keys" on a default that depends on other
  // keys and differs from the plain default. Still a config file that reads back the same.
  std::string to_toml_with_provenance() const;
};

// Reads `path`, applies overrides ("section.key=value"; value parsed as a TOML value, or taken
// as a string when it is not one), validates. Throws trident::Error naming key and file; a
// `path` that is not a regular file (a FIFO, /dev/zero) or is over 16 MiB is refused unread.
//
// A file may name bases in a top-level `include = ["../base/gpt2_small.toml", ...]` (or one
// string), resolved relative to the including file's directory, themselves including others;
// each base applies before the file (in the order listed), so the including file wins. An
// include cycle or an include that cannot be read is refused with the chain of files
// ("exp.toml -> ../base/a.toml -> ../base/b.toml: ...").
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Several files layered in order (a later file's values win over an earlier one's), each with
// its includes, then the overrides: base < including file < later file < --set.
Config load_configs(const std::vector<std::string>& paths,
                    const std::vector<std::string>& overrides = {});
// Same from TOML text (tests, checkpoints); `source` names it in errors. Text has no directory
// to resolve includes against: `include` in it is refused.
Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {});

}  // namespace trident

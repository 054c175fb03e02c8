#pragma once
// The subcommands of the trident executable.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace trident {

// Exit code of a run that stopped early on a signal or time limit after writing a checkpoint:
// "checkpointed, please requeue" (EX_TEMPFAIL). Job scripts requeue on it.
inline constexpr int kExitRequeue = 75;
// Exit code of a run the divergence guard ended: bad steps asked for a rollback and none could be
// taken (no committed checkpoint, or train.max_rollbacks used up). Not to be requeued as is: the
// run would diverge again (docs/reliability.md).
inline constexpr int kExitDiverged = 77;

// --config FILE (repeatable) and --set section.key=value (repeatable), as every command that
// reads a config takes them.
void add_config_options(CLI::App& cmd, std::vector<std::string>& configs,
                        std::vector<std::string>& overrides);

struct Config;
struct CoreShare;
class ProcessGrid;
// A rank's CPU threads and what decided them.
struct RankThreads {
  int threads = 1;
  std::string source;  // "train.threads", "OMP_NUM_THREADS", or "" (the rank's share of cores)
  // What rank 0 prints in brackets after its thread count: "[source; ]rank 0: <share>".
  std::string explain(const CoreShare& share) const;
};
// train.threads > 0: that many. Else OMP_NUM_THREADS where it is set (its first value, as
// OpenMP reads a list of nesting levels; the count job scripts and launchers such as torchrun
// set); a value that is not a count in [1, 1024] throws trident::Error naming it. Else the
// rank's share of its machine's cores (grid/core_share.hpp: the physical cores of its affinity
// mask over the ranks whose masks hold them too), so ranks never oversubscribe them and bound
// ranks keep their own.
RankThreads rank_threads(int64_t configured, const CoreShare& share);
// rank_threads for this rank of `grid`; sets the CPU kernels' thread count.
RankThreads set_rank_threads(const Config& config, const ProcessGrid& grid);

struct TrainOptions {
  std::vector<std::string> configs;  // layered in order: a later file's values win
  std::vector<std::string> overrides;
  std::string resume;    // "", "auto" or a checkpoint path
  std::string plan;      // "" or "auto": the layout chosen by the cost model (plan_layout_for_ranks)
  std::string hardware;  // the hardware description --plan auto plans for
};
void add_train_command(CLI::App& app, TrainOptions& options);
// Returns the process exit code: 0; kExitRequeue after a stop with checkpoint.dir; 128 + the
// signal after a stop on a signal without checkpoint.dir (nothing saved); kExitDiverged when the
// divergence guard could not roll back; 1 if log writes failed.
int run_train(const TrainOptions& options);

struct ModelOptions {
  std::vector<std::string> configs;
  std::vector<std::string> overrides;
};
void add_model_command(CLI::App& app, ModelOptions& options);
// Prints the config's architecture, parameter count and training FLOPs (rank 0).
void run_model(const ModelOptions& options);

struct ConfigOptions {
  std::vector<std::string> configs;
  std::vector<std::string> overrides;
};
void add_config_command(CLI::App& app, ConfigOptions& options);
// Prints the resolved config with the provenance of each value (rank 0); throws
// trident::Error on invalid input.
void run_config(const ConfigOptions& options);

struct CkptOptions {
  std::string file;
  bool verify = false;
};
void add_ckpt_command(CLI::App& app, CkptOptions& options);
void run_ckpt_info(const CkptOptions& options);

struct ExportOptions {
  std::string format;
  std::string checkpoint;
  std::string out_dir;
  std::string dtype = "f32";
  std::string max_shard_size = "5GB";
  int64_t chunk_elements = int64_t{1} << 22;
};
void add_export_command(CLI::App& app, ExportOptions& options);
// Collective: writes the Hugging Face directory (interop/hf_convert.hpp).
void run_export(const ExportOptions& options);

struct ImportOptions {
  std::string format;
  std::string in_dir;
  std::string out_file;
  int64_t seq_len = 0;  // 0: config.json's
  int64_t chunk_elements = int64_t{1} << 22;
};
void add_import_command(CLI::App& app, ImportOptions& options);
// Collective: writes the checkpoint (interop/hf_convert.hpp).
void run_import(const ImportOptions& options);

struct PlanOptions {
  std::vector<std::string> configs;
  std::vector<std::string> overrides;
  std::string hardware;
  int64_t nodes = 0;
  int64_t global_batch = 0;  // 0: the config's train.global_batch
  int64_t top = 10;
  bool json = false;
  bool wide = false;         // every column of the table (default: what fits 120 columns)
  std::string layout;        // "" or a partial layout (plan/cost_model.hpp LayoutFilter)
  std::string attention;     // "" | "materialized" | "fused" (PlanProblem::attention)
  bool no_dp_overlap = false;
  bool attention_dropout = false;  // PlanProblem::attention_dropout
  std::string precision;     // "" (train.precision) | "fp32" | "bf16": the precision modelled
};
void add_plan_command(CLI::App& app, PlanOptions& options);
// Prints the best layouts (rank 0); throws trident::Error on bad input or when nothing fits.
void run_plan(const PlanOptions& options);

// trident train --plan auto: the fastest layout of `ranks` ranks that fits (plan/cost_model.hpp)
// for config `c` on the hardware file, as config overrides (every layout key), and why (the
// chosen and the next two layouts with their predicted step time and memory). The ranks are
// whole nodes of the file's devices_per_node, or one node partly used. Pure: every rank gets
// the same answer. trident::Error (one line) when the ranks or the model fit no layout.
struct AutoLayout {
  std::vector<std::string> overrides;
  std::string why;
};
AutoLayout plan_layout_for_ranks(const Config& c, const std::string& hardware, int ranks);

struct BenchHwOptions {
  std::string out;
  int64_t ranks = 0;  // devices per node written; 0: the ranks launched
  std::string device = "cpu";
  std::string name;
  std::string storage_dir;  // "": the storage's write rate is not measured
};
void add_bench_hw_command(CLI::App& app, BenchHwOptions& options);
// Collective: every rank measures; rank 0 writes options.out.
void run_bench_hw(const BenchHwOptions& options);

struct EvalOptions {
  std::string checkpoint;
  std::vector<std::string> data;  // one source, or several "WEIGHT:SOURCE" (a blend)
  int64_t steps = 0;               // 0: the checkpoint's eval.steps
  bool json = false;
  std::vector<std::string> overrides;
};
void add_eval_command(CLI::App& app, EvalOptions& options);
// Collective: loss and perplexity of a checkpoint on a dataset, through the trainer's
// evaluation (Trainer::evaluate); rank 0 prints them.
void run_eval(const EvalOptions& options);

struct GenerateOptions {
  std::string checkpoint;
  std::string tokenizer;  // "": the byte-level vocabulary
  std::string prompt, prompt_file;
  std::string prompts_file;  // --prompts: one prompt per line, one batch
  std::vector<std::string> overrides;  // --set key=value on the stored config
  std::string stop;                    // --stop: a token that ends a sequence
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;
  uint64_t seed = 1234;
  bool prompt_loss = false;
};
void add_generate_command(CLI::App& app, GenerateOptions& options);
// Prompt, then sampled tokens streamed to standard output (rank 0); tensor parallel over the
// launched ranks.
void run_generate(const GenerateOptions& options);

struct TokenizeOptions {
  std::string tokenizer;  // tokenizer.json; "": the byte-level vocabulary
  bool decode = false;
  bool lines = false;  // each line a text of its own
};
void add_tokenize_command(CLI::App& app, TokenizeOptions& options);
// Rank 0: stdin -> stdout (tokenizer/bpe_tokenizer.hpp).
void run_tokenize(const TokenizeOptions& options);

}  // namespace trident

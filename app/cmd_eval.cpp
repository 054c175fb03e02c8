// trident eval --ckpt FILE --data SOURCE [--data ...] [--steps N] [--json] [--set key=value]:
// the loss and perplexity of a checkpoint's weights on a dataset, through the trainer's own
// evaluation (Trainer::evaluate: the same batches, the same forward on any layout).
//
// The config is the one stored in the checkpoint, with data.val (and data.train, which is never
// read) = the --data sources, eval.steps = --steps, no checkpoint.dir, no log and the layout
// set for this job: parallel.tensor = parallel.context = parallel.pipeline = 1 and
// parallel.data = the world size over them, unless --set gives parallel.* (a checkpoint reads
// into any layout). --set applies last and may change any key but the model's.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "checkpoint/h5_file.hpp"
#include "cli_numbers.hpp"
#include "commands.hpp"
#include "config/config.hpp"
#include "grid/process_grid.hpp"
#include "runtime/backend.hpp"
#include "train/checkpointing.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace trident {

void add_eval_command(CLI::App& app, EvalOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "eval", "Loss and perplexity of a checkpoint on a dataset (the trainer's evaluation)");
  cmd->add_option("--ckpt", options.checkpoint, "checkpoint file (any layout wrote it)")
      ->required();
  cmd->add_option("--data", options.data,
                  "token shards (path or glob), indexed-dataset prefix, or with several: a "
                  "blend of WEIGHT:SOURCE entries (as data.val)")
      ->required()
      ->take_all();
  cmd->add_option("--steps", options.steps,
                  "global batches to evaluate (eval.steps); default: the checkpoint's eval.steps")
      ->check(whole_number(1));
  cmd->add_flag("--json", options.json,
                "print {\"loss\": ..., \"perplexity\": ..., \"tokens\": ...} as the last line");
  cmd->add_option("--set", options.overrides,
                  "Override a key of the stored config: section.key=value (repeatable; e.g. "
                  "parallel.tensor=2, train.micro_batch=2)")
      ->take_all();
}

namespace {

// A TOML array of strings.
std::string toml_strings(const std::vector<std::string>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i)
    out += (i ? ", " : "") + nlohmann::json(values[i]).dump();  // JSON escapes are TOML's
  return out + "]";
}

bool sets_key(const std::vector<std::string>& overrides, const std::string& key) {
  for (const std::string& o : overrides)
    if (o.rfind(key + "=", 0) == 0) return true;
  return false;
}

// The stored config with the evaluation's keys, the job's layout and the user's overrides.
Config eval_config(const EvalOptions& options, const std::string& stored_toml, int world_size) {
  const std::string source = options.checkpoint + " (stored config)";
  std::vector<std::string> overrides = {
      "data.val=" + toml_strings(options.data),
      "data.train=" + toml_strings(options.data),
      "checkpoint.dir=\"\"",
      "train.init_from=\"\"",
      "train.exit_interval=0",
      "train.exit_after_minutes=0",
      "log.dir=\"\"",
      "log.tensorboard=false",
      "parallel.tensor=1",
      "parallel.context=1",
      "parallel.pipeline=1",
      "parallel.pipeline_layers=[]",
      "parallel.sequence_parallel=false",
      "parallel.data=1",
  };
  if (options.steps > 0) overrides.push_back("eval.steps=" + std::to_string(options.steps));
  overrides.insert(overrides.end(), options.overrides.begin(), options.overrides.end());
  Config config = parse_config(stored_toml, source, overrides);
  if (!sets_key(options.overrides, "parallel.data")) {
    // Data parallelism takes the ranks that tensor, context and pipeline parallelism leave.
    const int64_t model_ranks =
        config.parallel.tensor * config.parallel.context * config.parallel.pipeline;
    if (world_size % model_ranks != 0)
      throw Error("eval: " + std::to_string(world_size) + " ranks are not a multiple of "
                  "parallel.tensor * parallel.context * parallel.pipeline (" +
                  std::to_string(model_ranks) + ")");
    overrides.push_back("parallel.data=" + std::to_string(world_size / model_ranks));
    config = parse_config(stored_toml, source, overrides);
  }
  return config;
}

}  // namespace

void run_eval(const EvalOptions& options) {
  int world_size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string stored_toml;
  {
    CheckpointReader reader(options.checkpoint, MPI_COMM_WORLD, checkpoint_reader_options());
    stored_toml = check_checkpoint(reader).config.to_toml();
  }
  const Config stored = eval_config(options, stored_toml, world_size);
  ProcessGrid grid(MPI_COMM_WORLD, stored);
  set_rank_threads(stored, grid);
  const Config config = agree_cpu_bf16_gemm(stored, MPI_COMM_WORLD, nullptr);
  Trainer trainer(config, grid.dims());
  const int64_t written_at = trainer.init_weights_from(options.checkpoint);
  const std::optional<double> loss = trainer.evaluate();
  if (!loss) throw Error("eval: the evaluation was stopped");
  if (rank != 0) return;
  // Every target of every evaluated sequence is predicted once.
  const int64_t tokens = config.eval.steps * config.tokens_per_step();
  const double perplexity = std::exp(*loss);
  if (options.json) {
    const nlohmann::json out = {{"loss", *loss}, {"perplexity", perplexity}, {"tokens", tokens}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("eval %s (step %lld): loss %.6f | perplexity %.4f | %lld tokens (%lld batches "
                "of %lld x %lld) on %s\n",
                options.checkpoint.c_str(), static_cast<long long>(written_at), *loss, perplexity,
                static_cast<long long>(tokens),
                static_cast<long long>(config.eval.steps),
                static_cast<long long>(config.train.global_batch),
                static_cast<long long>(config.model.seq_len), toml_strings(options.data).c_str());
  }
  std::fflush(stdout);
}

}  // namespace trident

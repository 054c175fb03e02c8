// trident train: resolve the config, build the grid, print the run's figures, train.
#include <sched.h>

#include <csignal>
#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "checkpoint/commit.hpp"
#include "config/config.hpp"
#include "grid/process_grid.hpp"
#include "kernels/cpu/blas.hpp"
#include "model/architecture.hpp"
#include "model/model_stats.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace trident {

void add_train_command(CLI::App& app, TrainOptions& options) {
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT model");
  cmd->add_option("--config", options.config, "TOML config file")->required();
  cmd->add_option("--set", options.overrides, "Override a key: section.key=value (repeatable)")
      ->take_all();
  cmd->add_option("--resume", options.resume,
                  "auto: the latest checkpoint in checkpoint.dir if there is one; or a file");
}

namespace {

// Set by SIGUSR1/SIGTERM; the trainer polls it between steps. (A signal handler can only
// reach process-wide state.)
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int signal) { g_stop_signal = signal; }

int cores_available() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

void print_figures(const Config& c, int world_size, int threads) {
  const int64_t params = parameter_count(c.model);
  const double flops =
      training_flops_per_token(c.model, padded_vocab_size(c.model, c.parallel.tensor)) *
      static_cast<double>(c.tokens_per_step());
  std::printf("# resolved config (from %s)\n%s\n", c.source.c_str(), c.to_toml().c_str());
  std::printf("model: %s, parameters: %lld (%.2f M)\n", c.model.arch.c_str(),
              static_cast<long long>(params), params / 1e6);
  std::printf("tokens per step: %lld (global batch %lld x seq %lld; %lld micro-batches of %lld "
              "per replica)\n",
              static_cast<long long>(c.tokens_per_step()),
              static_cast<long long>(c.train.global_batch),
              static_cast<long long>(c.model.seq_len),
              static_cast<long long>(c.num_microbatches()),
              static_cast<long long>(c.train.micro_batch));
  std::printf("training FLOPs per step: %.4g (matmuls, forward + backward; docs/model.md)\n",
              flops);
  std::printf("ranks: %d, threads per rank: %d\n", world_size, threads);
  std::fflush(stdout);
}

}  // namespace

int run_train(const TrainOptions& options) {
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const Config config = load_config(options.config, options.overrides);
  ProcessGrid grid(MPI_COMM_WORLD, config);

  // Each rank gets its share of the node's cores, so ranks never oversubscribe them.
  const int threads = config.train.threads > 0
                          ? static_cast<int>(config.train.threads)
                          : std::max(1, cores_available() / std::max(1, grid.ranks_per_node()));
  cpu::set_num_threads(threads);
  const bool lead = grid.rank() == 0;
  if (lead) {
    print_figures(config, grid.world_size(), threads);
    std::printf("%s\n", grid.describe().c_str());
    std::fflush(stdout);
  }

  Trainer trainer(config, TrainerGroups::from_grid(grid));
  if (lead) {
    std::printf("device of rank 0: %s, precision %s%s\n", trainer.device().describe().c_str(),
                config.train.precision.c_str(),
                config.train.device == "cuda"
                    ? (", device buffers over " + config.parallel.comm).c_str()
                    : "");
    std::fflush(stdout);
  }
  std::string resume_from;
  if (options.resume == "auto") {
    if (config.checkpoint.dir.empty())
      throw Error("--resume auto needs checkpoint.dir in " + config.source);
    if (auto latest = latest_checkpoint(config.checkpoint.dir)) resume_from = *latest;
  } else if (!options.resume.empty()) {
    resume_from = options.resume;
  }
  if (!resume_from.empty()) {
    trainer.load_checkpoint(resume_from);
    if (lead) std::printf("resumed from %s at step %lld\n", resume_from.c_str(),
                          static_cast<long long>(trainer.start_step()));
  } else if (lead && options.resume == "auto") {
    std::printf("no checkpoint in %s: starting from step 0\n", config.checkpoint.dir.c_str());
  }
  std::fflush(stdout);
  trainer.set_stop_check([] { return g_stop_signal != 0; });
  const RunOutcome outcome = trainer.run();
  const std::string pipeline = trainer.pipeline_report();  // collective over the pipeline group
  const std::string memory = trainer.memory_report();      // collective over all ranks
  if (lead) {
    double comm_seconds = 0;
    for (const Communicator* c : grid.communicators())
      for (const auto& [op, st] : c->stats().ops) comm_seconds += st.seconds;
    std::printf("%s%scommunication of rank 0:\n%s", pipeline.c_str(), memory.c_str(),
                grid.stats_table().c_str());
    // GPU runs: the device-buffer communicators (NCCL or staged MPI) carry the tensors.
    for (const auto& c : trainer.device_communicators())
      for (const auto& [op, st] : c->stats().ops) {
        std::printf("device communicator %-9s %-14s %8lld calls %12.3f MB %9.3f s\n",
                    c->name().c_str(), op.c_str(), static_cast<long long>(st.calls),
                    st.bytes / 1e6, st.seconds);
        comm_seconds += st.seconds;
      }
    std::printf("run summary: %lld steps in %.3f s of training; rank 0 spent %.3f s in "
                "communication calls (%.1f%% of the training time)\n",
                static_cast<long long>(trainer.steps_run()), trainer.train_seconds(), comm_seconds,
                100.0 * comm_seconds / std::max(1e-9, trainer.train_seconds()));
    std::fflush(stdout);
  }
  return outcome == RunOutcome::Stopped ? kExitRequeue : 0;
}

}  // namespace trident

// trident train: resolve the config, build the grid, print the run's figures, train.

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <iostream>
#include <mutex>

#include "commands.hpp"
#include "comm/comm_watchdog.hpp"
#include "comm/mpi_comm.hpp"
#include "checkpoint/commit.hpp"
#include "config/config.hpp"
#include "grid/process_grid.hpp"
#include "kernels/cpu/blas.hpp"
#include "model/architecture.hpp"
#include "model/model_stats.hpp"
#include "runtime/backend.hpp"
#include "stop_signals.hpp"
#include "train/run_reports.hpp"
#include "train/startup_checks.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"
#include "util/rank_log.hpp"
#include "util/test_hooks.hpp"

namespace trident {

void add_train_command(CLI::App& app, TrainOptions& options) {
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT model");
  add_config_options(*cmd, options.configs, options.overrides);
  cmd->add_option("--resume", options.resume,
                  "auto: the latest checkpoint in checkpoint.dir if there is one; or a file");
  cmd->add_option("--plan", options.plan,
                  "auto: the layout (every parallel.* layout key, micro-batch, schedule, ZeRO, "
                  "recompute) the cost model predicts fastest for the ranks launched, in place "
                  "of the config's (docs/plan.md)")
      ->check(CLI::IsMember({"auto"}));
  cmd->add_option("--hardware", options.hardware,
                  "the hardware description --plan auto plans for (configs/hardware/*.toml)");
}

namespace {

// Whether any rank was asked to stop, agreed by all (the signal reaches ranks at different
// moments; every rank must leave at the same point or the others wait in a collective).
bool stop_requested_by_any_rank() {
  int32_t stop = stop_signal() != 0;
  MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
  return stop != 0;
}

// The exit code of a run stopped early: 75 ("checkpointed, please requeue") when it has a
// checkpoint.dir to be resumed from. Without one nothing was saved (train.exit_interval and
// train.exit_after_minutes need checkpoint.dir, so only a signal gets here) and the run ends as
// the signal would have ended it: 128 + the signal (143 for SIGTERM, 138 for SIGUSR1).
int stop_exit_code(const Config& config) {
  if (!config.checkpoint.dir.empty()) return kExitRequeue;
  const int signal = stop_signal();
  return 128 + (signal != 0 ? signal : SIGTERM);
}

// --plan auto: the config with the cost model's layout for the ranks launched applied last
// (after every --set), and on rank 0 the line saying why.
Config load_planned_config(const TrainOptions& options) {
  if (options.hardware.empty())
    throw Error("train --plan auto needs --hardware FILE (a configs/hardware/*.toml description)");
  int ranks = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const Config given = load_configs(options.configs, options.overrides);
  const AutoLayout chosen = plan_layout_for_ranks(given, options.hardware, ranks);
  std::vector<std::string> overrides = options.overrides;
  overrides.insert(overrides.end(), chosen.overrides.begin(), chosen.overrides.end());
  if (rank == 0) {
    std::string set;
    for (const std::string& o : chosen.overrides) set += " --set " + o;
    std::printf("%s\n  applied:%s\n", chosen.why.c_str(), set.c_str());
    std::fflush(stdout);
  }
  return load_configs(options.configs, overrides);
}

// <log.dir>/config.toml: the resolved config with the provenance of each value, so that a run
// directory says what ran (compare_runs.py reads it) and can be rerun with --config. Rewritten
// by each start, a resume included: it is the config of the latest start.
void write_resolved_config(const Config& c) {
  const std::filesystem::path dir(c.log.dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("log.dir '" + c.log.dir + "': cannot create directory: " + ec.message());
  const std::filesystem::path path = dir / "config.toml";
  const std::filesystem::path partial = dir / "config.toml.partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << c.to_toml_with_provenance();
    out.close();
    if (!out) throw Error("cannot write '" + partial.string() + "'");
  }
  // Renamed into place: a reader never sees half a file.
  std::filesystem::rename(partial, path, ec);
  if (ec) throw Error("cannot write '" + path.string() + "': " + ec.message());
}

// TRIDENT_TEST_SKIP_COLLECTIVE's hook; its group must be one of the table of dimensions
// (grid/parallel_dims.hpp), else the hook would never fire and its test wait in vain.
SkipHook skip_hook_of_table(const std::string& text) {
  SkipHook hook = parse_skip_hook(text);
  if (find_dim(hook.group) == nullptr)
    throw Error(std::string(test_hook_variable(TestHook::SkipCollective)) + "='" + text +
                "': no group '" + hook.group + "' (the groups: " + dim_names() + ")");
  return hook;
}

// The collective watchdog of this rank (comm/comm_watchdog.hpp) over the grid's communicators,
// from start-up to the end of the run. Its timeout ends the job: the line on stderr, the
// device's NCCL communicators aborted (their kernels may wait for the stalled peer), then
// MPI_Abort with kCommTimeoutExitCode, which makes mpiexec/srun end every rank.
class JobWatchdog {
 public:
  JobWatchdog(ProcessGrid& grid, const Config& config)
      : grid_(grid),
        watchdog_(grid.rank(), comm_timeout_seconds(config.parallel.comm_timeout_s),
                  [this](const std::string& line) { end_job(line); }) {
    if (const std::string hook = test_hook(TestHook::SkipCollective); !hook.empty())
      watchdog_.set_skip_hook(skip_hook_of_table(hook));
    watchdog_.set_io_timeout(config.checkpoint.io_timeout_s, "checkpoint.io_timeout_s");
    for (Communicator* c : grid_.communicators()) c->set_watchdog(&watchdog_);
    watchdog_.start();
  }
  ~JobWatchdog() {
    watchdog_.stop();
    for (Communicator* c : grid_.communicators()) c->set_watchdog(nullptr);
  }
  CommWatchdog* get() { return &watchdog_; }
  // GPU runs: the device's communicators, aborted before the job ends.
  void watch_device(std::shared_ptr<CommWatch> device) {
    std::lock_guard<std::mutex> lock(mutex_);
    device_ = std::move(device);
  }

 private:
  [[noreturn]] void end_job(const std::string& line) {
    std::fprintf(stderr, "trident: error: %s\n", line.c_str());
    std::fflush(stderr);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (device_) device_->abort_all("collective watchdog: " + line);
    }
    abort_job(kCommTimeoutExitCode);
  }

  ProcessGrid& grid_;
  CommWatchdog watchdog_;
  std::mutex mutex_;
  std::shared_ptr<CommWatch> device_;
};

}  // namespace

std::string RankThreads::explain(const CoreShare& share) const {
  return (source.empty() ? "" : source + "; ") + "rank 0: " + share.describe();
}

RankThreads rank_threads(int64_t configured, const CoreShare& share) {
  if (configured > 0) return {static_cast<int>(configured), "train.threads"};
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env == nullptr || *env == '\0') return {share.threads, ""};
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(env, &end, 10);
  if (end == env || (*end != '\0' && *end != ',') || errno != 0 || n < 1 || n > 1024)
    throw Error("OMP_NUM_THREADS=" + std::string(env) +
                " is not a thread count in [1, 1024] (with train.threads = 0 it sets the "
                "threads per rank; unset it for one thread per core of the rank's share)");
  return {static_cast<int>(n), "OMP_NUM_THREADS"};
}

RankThreads set_rank_threads(const Config& config, const ProcessGrid& grid) {
  const RankThreads threads = rank_threads(config.train.threads, grid.core_share());
  cpu::set_num_threads(threads.threads);
  return threads;
}

int run_train(const TrainOptions& options) {
  // SIGUSR1/SIGTERM are recorded since main's first lines (stop_signals.hpp,
  // catch_stop_signals); the trainer polls stop_signal() between steps and between evaluation
  // batches, run_train between the phases of start-up.
  // Past a file-size limit (RLIMIT_FSIZE) a write fails with EFBIG, reported like a full disk,
  // instead of the process being killed without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  // A stop requested during start-up (a large model's allocation and initialisation, reading
  // a checkpoint) ends the run before its first step: nothing to save, the state on disk is as
  // it was. Checked between the phases, agreed by all ranks; the same exit code as a stop
  // between steps.
  auto stopped_in_start_up = [](const char* phase) {
    if (!stop_requested_by_any_rank()) return false;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      std::printf("stopping during start-up (%s; signal): no step run, nothing saved\n", phase);
      std::fflush(stdout);
    }
    return true;
  };
  if (!options.hardware.empty() && options.plan.empty())
    throw Error("train --hardware " + options.hardware + " is only read with --plan auto");
  const Config loaded = options.plan.empty() ? load_configs(options.configs, options.overrides)
                                              : load_planned_config(options);
  if (stopped_in_start_up("after reading the config")) return stop_exit_code(loaded);
  ProcessGrid grid(MPI_COMM_WORLD, loaded);
  JobWatchdog watchdog(grid, loaded);

  // train.threads, else OMP_NUM_THREADS, else the rank's share of its machine's cores.
  const RankThreads threads = set_rank_threads(loaded, grid);
  std::string bf16_note;
  const Config config = agree_cpu_bf16_gemm(loaded, MPI_COMM_WORLD, &bf16_note);
  const bool lead = grid.rank() == 0;
  const RankLog out(lead);
  if (lead) {
    const CoreShare& share = grid.core_share();
    write_resolved_config(config);
    out.text(start_up_figures(config, grid.world_size(), threads.threads, threads.explain(share)) +
             threads_above_share_note(threads.threads, threads.source, share) +
             overlap_without_a_core_note(config, threads.threads, share));
    out.print("%s\n", grid.describe().c_str());
    out.text(model_state_lines(config, static_cast<int>(config.parallel.data *
                                                        config.parallel.context)));
  }

  // Tests: a start-up that takes this long (as a large model's initialisation would), so that
  // a signal can be sent during it.
  if (const int64_t ms = test_hook_int(TestHook::SlowStartMs); ms != 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (stop_signal() == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (stopped_in_start_up("before building the model")) return stop_exit_code(config);
  Trainer trainer(config, grid.dims());
  watchdog.watch_device(trainer.comm_watch());
  trainer.set_checkpoint_watchdog(watchdog.get());
  if (stopped_in_start_up("after building the model")) return stop_exit_code(config);
  out.print("device of rank 0: %s, precision %s%s\n", trainer.device().describe().c_str(),
            config.train.precision.c_str(),
            config.train.device == "cuda"
                ? (", device buffers over " + config.parallel.comm).c_str()
                : "");
  if (config.train.device == "cpu" && config.train.precision == "bf16")
    out.print("gemm: bf16 products: %s\n%s", cpu_bf16_gemm_text(config).c_str(),
              bf16_note.empty() ? "" : (bf16_note + "\n").c_str());
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
    out.print("resumed from %s at step %lld\n", resume_from.c_str(),
              static_cast<long long>(trainer.start_step()));
    // A resumed run has trained past its initial weights: the checkpoint holds them.
    if (!config.train.init_from.empty())
      out.print("train.init_from = %s ignored: resuming from %s\n",
                config.train.init_from.c_str(), resume_from.c_str());
  } else {
    if (options.resume == "auto")
      out.print("no checkpoint in %s: starting from step 0\n", config.checkpoint.dir.c_str());
    if (!config.train.init_from.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t written_at = trainer.init_weights_from(config.train.init_from);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out.print("weights initialised from %s (train.init_from; written at step %lld): "
                "step 0, fresh optimizer state, in %.3f s\n",
                config.train.init_from.c_str(), static_cast<long long>(written_at), seconds);
    }
  }
  // Remains of killed writes (docs/checkpoint-format.md, "Directory").
  if (lead && !config.checkpoint.dir.empty())
    if (const auto note = clean_temp_files(config.checkpoint.dir).describe(config.checkpoint.dir);
        !note.empty())
      out.print("%s\n", note.c_str());
  if (stopped_in_start_up("before the first step")) return stop_exit_code(config);
  trainer.set_stop_check([] { return stop_signal() != 0; });
  const RunOutcome outcome = trainer.run();
  const std::string pipeline = trainer.pipeline_report();  // collective over the pipeline group
  const std::string memory = trainer.memory_report();      // collective over all ranks
  if (lead)
    out.text(pipeline + memory +
             communication_report(grid.stats_table(), grid.communicators(),
                                  trainer.device_communicators(), trainer.steps_run(),
                                  trainer.train_seconds()) +
             checkpoint_report(trainer.checkpoint_saves(), trainer.checkpoint_seconds(),
                               trainer.train_seconds()));
  // Lost log lines (a full disk) did not stop training; they make the run fail at its end.
  std::string log_failure = trainer.log_failure();
  if (lead && log_failure.empty() && (std::fflush(stdout) != 0 || std::ferror(stdout)))
    log_failure = "writing the log to standard output failed";
  int32_t failed = !log_failure.empty();
  grid.world().all_reduce(&failed, 1, DType::I32, ReduceOp::Max);
  if (failed) {
    if (lead) {
      std::fprintf(stderr, "trident: error: the run's log is incomplete: %s\n",
                   log_failure.c_str());
      std::fflush(stderr);
    }
    return 1;
  }
  if (outcome == RunOutcome::Diverged) return kExitDiverged;
  return outcome == RunOutcome::Stopped ? stop_exit_code(config) : 0;
}

}  // namespace trident

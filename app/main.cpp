// trident: one SPMD executable, launched by mpiexec/srun on N ranks (or alone for one rank).
//   trident train --config FILE [--set section.key=value ...] [--resume auto|FILE]
//   trident ckpt info FILE [--verify]
//   trident model --config FILE [--set section.key=value ...]
//   trident config --config FILE [--config FILE ...] [--set section.key=value ...]
//   trident export --format hf CKPT OUT_DIR [--dtype f32|bf16] [--max-shard-size 5GB]
//   trident import --format hf IN_DIR OUT.h5 [--seq-len N]
//   trident plan --config FILE --hardware HW.toml --nodes N [--top K] [--json] [--layout ...]
//   trident bench-hw --out HW.toml [--ranks N]
//   trident eval --ckpt FILE --data SOURCE [--data ...] [--steps N] [--json] [--set k=v ...]
//   trident tokenize [--tokenizer tokenizer.json] [--decode]
//   trident generate --ckpt FILE [--tokenizer FILE] --prompt TEXT [--max-new-tokens N] ...
// export/import convert to and from Hugging Face transformers directories (docs/interop.md).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>
#include <thread>

#include "cli_numbers.hpp"
#include "comm/comm_watchdog.hpp"
#include "comm/mpi_comm.hpp"
#include "commands.hpp"
#include "file_size_signal.hpp"
#include "kernels/cpu/blas.hpp"
#include "stop_signals.hpp"
#include "util/error.hpp"

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// A failure ends the whole job, never a hang: MPI_Abort takes every rank down. Errors that all
// ranks hit alike (config, layout) are printed by rank 0 alone: the other ranks wait a moment
// for rank 0's abort before printing their own, so a rank-local failure is still reported.
[[noreturn]] void fail(const std::string& message, int code = 1) {
  const int rank = world_rank();
  if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(3));
  std::fprintf(stderr, "trident: error%s: %s\n",
               rank == 0 ? "" : (" on rank " + std::to_string(rank)).c_str(),
               trident::printable_line(message).c_str());
  std::fflush(stderr);
  trident::abort_job(code);
}

// The command level (the app or a subcommand such as `ckpt`) that required a subcommand and
// got none, when the first word left over is no option: that word ("" otherwise).
std::string unknown_command(CLI::App& app, const CLI::ParseError& e) {
  if (dynamic_cast<const CLI::RequiredError*>(&e) == nullptr) return "";
  CLI::App* level = &app;
  while (true) {
    const auto chosen = level->get_subcommands();
    if (chosen.empty()) break;
    level = chosen.front();
  }
  if (level->get_require_subcommand_min() == 0) return "";
  for (CLI::App* a = level; a != nullptr; a = a->get_parent()) {
    const std::vector<std::string> rest = a->remaining();
    if (!rest.empty()) return rest.front();
  }
  return "";
}

// "trident's commands: train, ckpt, model" ("trident ckpt's commands: info"): those of the
// level the error is about.
std::string command_list(CLI::App& app) {
  std::string name = "trident";
  CLI::App* level = &app;
  while (!level->get_subcommands().empty()) {
    level = level->get_subcommands().front();
    name += " " + level->get_name();
  }
  std::string out = name + "'s commands: ";
  const auto all = level->get_subcommands({});
  for (size_t i = 0; i < all.size(); ++i) out += (i == 0 ? "" : ", ") + all[i]->get_name();
  return out;
}

// CLI11's messages, on one line.
std::string one_line(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  // First, before any thread (the GEMM check below starts OpenMP's): SIGUSR1 and SIGTERM go to
  // a thread of their own, never to one running the GEMM (stop_signals.hpp). Kept across the
  // GEMM kernel's re-run (execv keeps the blocked set and pending signals).
  trident::start_stop_signal_thread();
  // Before MPI_Init and any thread: may run this program again with the GEMM kernel that fits
  // the core (kernels/cpu/blas.hpp). `train` also times the GEMM now, while no rank's MPI
  // progress loop competes for the cores, for the start-up line printed below.
  trident::cpu::settle_gemm_kernel(argv);
  const bool training = argc > 1 && std::string(argv[1]) == "train";
  // train: a stop signal from here on is recorded, and run_train's first start-up check ends
  // the run with the stop's exit code (cmd_train.cpp), even if it came before MPI_Init.
  if (training) trident::catch_stop_signals();
  trident::cpu::GemmSpeedProbe gemm_probe;
  if (training) gemm_probe = trident::cpu::probe_gemm_speed();

  // MPI_THREAD_MULTIPLE: the collective watchdog's thread (comm/comm_watchdog.hpp) calls
  // MPI_Abort while the main thread may be inside a blocking MPI call, and checkpoint.async's
  // writer thread (train/async_checkpoint.hpp) runs collectives beside training's (refused at
  // start-up without it, train/startup_checks.hpp). A file-size limit too
  // small for MPI's start-up ends it in one line; past it, a write beyond the limit fails with
  // EFBIG, reported by the writer naming its file (file_size_signal.hpp).
  trident::fail_on_file_size_signal();
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  trident::ignore_file_size_signal();
  if (provided < MPI_THREAD_MULTIPLE && world_rank() == 0)
    std::fprintf(stderr, "trident: warning: this MPI provides thread level %d, not "
                         "MPI_THREAD_MULTIPLE: the collective watchdog's abort from its own "
                         "thread is not guaranteed to work\n", provided);
  CLI::App app{"Trident: 3D-parallel GPT training"};
  app.require_subcommand(1);
  trident::TrainOptions train;
  trident::add_train_command(app, train);
  trident::CkptOptions ckpt;
  trident::add_ckpt_command(app, ckpt);
  trident::ModelOptions model;
  trident::add_model_command(app, model);
  trident::ConfigOptions config_options;
  trident::add_config_command(app, config_options);
  trident::ExportOptions export_options;
  trident::add_export_command(app, export_options);
  trident::ImportOptions import_options;
  trident::add_import_command(app, import_options);
  trident::PlanOptions plan_options;
  trident::add_plan_command(app, plan_options);
  trident::BenchHwOptions bench_hw_options;
  trident::add_bench_hw_command(app, bench_hw_options);
  trident::EvalOptions eval_options;
  trident::add_eval_command(app, eval_options);
  trident::GenerateOptions generate_options;
  trident::add_generate_command(app, generate_options);
  trident::TokenizeOptions tokenize_options;
  trident::add_tokenize_command(app, tokenize_options);
  trident::check_number_types(app);
  trident::refuse_empty_text(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A word that is no command (or an option where a command belongs): CLI11 would only say
    // "A subcommand is required". Name it.
    if (const std::string word = unknown_command(app, e); !word.empty()) {
      if (world_rank() == 0)
        std::fprintf(stderr, "trident: error: unknown %s '%s' (%s; see --help)\n",
                     word[0] == '-' ? "option" : "command", word.c_str(),
                     command_list(app).c_str());
      MPI_Finalize();
      return 1;
    }
    // --help and --version print as CLI11 does; an error is one line, as every other error.
    const int code = e.get_exit_code();
    if (world_rank() == 0) {
      if (code == 0) app.exit(e);
      else
        std::fprintf(stderr, "trident: error: %s (see --help)\n", one_line(e.what()).c_str());
    }
    MPI_Finalize();
    return code;
  }
  if (training && world_rank() == 0) {
    std::printf("gemm: %s; sgemm probe %.0f GFLOP/s on one thread\n",
                trident::cpu::gemm_description().c_str(), gemm_probe.gemm_gflops);
    std::fflush(stdout);
    if (const std::string w = trident::cpu::gemm_speed_warning(gemm_probe); !w.empty())
      std::fprintf(stderr, "%s\n", w.c_str());
  }
  int exit_code = 0;
  try {
    if (app.got_subcommand("train")) exit_code = trident::run_train(train);
    if (app.got_subcommand("ckpt")) trident::run_ckpt_info(ckpt);
    if (app.got_subcommand("model")) trident::run_model(model);
    if (app.got_subcommand("config")) trident::run_config(config_options);
    if (app.got_subcommand("export")) trident::run_export(export_options);
    if (app.got_subcommand("import")) trident::run_import(import_options);
    if (app.got_subcommand("plan")) trident::run_plan(plan_options);
    if (app.got_subcommand("bench-hw")) trident::run_bench_hw(bench_hw_options);
    if (app.got_subcommand("eval")) trident::run_eval(eval_options);
    if (app.got_subcommand("generate")) trident::run_generate(generate_options);
    if (app.got_subcommand("tokenize")) trident::run_tokenize(tokenize_options);
  } catch (const trident::CommTimeoutError& e) {
    fail(e.what(), trident::kCommTimeoutExitCode);
  } catch (const trident::Error& e) {
    fail(e.what());
  } catch (const std::exception& e) {
    fail(std::string("internal error: ") + e.what());
  }
  MPI_Finalize();
  return exit_code;
}

#pragma once
// Shared helpers for tests that run the trident binary: a tiny config and a small synthetic
// corpus in a scratch directory, readers for the run's metrics.jsonl, and the test's cores.
#include <nlohmann/json.hpp>
#include <sched.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "run_util.hpp"

namespace trident::test {

// A corpus with some structure (so the loss falls): repeated phrases with variation.
inline std::vector<uint16_t> synthetic_tokens(int64_t n, uint64_t salt = 0) {
  std::vector<uint16_t> t(n);
  uint64_t x = 88172645463325252ULL ^ salt;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t[i] = static_cast<uint16_t>((i % 17 == 0) ? (x % 64) : ('a' + (i * 7 + (x % 3)) % 26));
  }
  return t;
}

// A tiny model that trains in well under a second per step on one core.
inline std::string tiny_config(const std::filesystem::path& dir) {
  return "[model]\nlayers = 2\nheads = 4\nwidth = 32\nvocab_size = 256\nseq_len = 32\n"
         "vocab_multiple = 8\n"
         "[train]\nsteps = 6\nseed = 42\nmicro_batch = 2\nglobal_batch = 8\nthreads = 1\n"
         "[optim]\nlr = 1e-2\nmin_lr = 1e-3\nwarmup_steps = 2\n"
         "[data]\ntrain = \"" + (dir / "train_*.bin").string() + "\"\nval = \"" +
         (dir / "val.bin").string() + "\"\n"
         "[eval]\ninterval = 3\nsteps = 1\n"
         "[log]\ndir = \"" + (dir / "run").string() + "\"\ninterval = 1\n";
}

// Writes train_000.bin, train_001.bin, val.bin and config.toml into `dir`; returns the config.
inline std::filesystem::path make_tiny_run(const std::filesystem::path& dir) {
  write_shard((dir / "train_000.bin").string(), synthetic_tokens(20000, 1));
  write_shard((dir / "train_001.bin").string(), synthetic_tokens(12000, 2));
  write_shard((dir / "val.bin").string(), synthetic_tokens(4000, 3));
  const auto config = dir / "config.toml";
  write_file(config, tiny_config(dir));
  return config;
}

// `trident train` arguments of a small Llama (4 layers, grouped-query attention: 2 kv heads) on
// the tiny corpus made in dir, logging every step, then `extra`.
inline std::string small_llama_args(const std::filesystem::path& dir, const std::string& extra) {
  return "train --config " + make_tiny_run(dir).string() +
         " --set model.arch=\\\"llama\\\" --set model.layers=4 --set model.kv_heads=2"
         " --set log.interval=1 " + extra;
}

inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& run_dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// A run's per-step training losses, gradient norms and validation losses, in step order.
struct RunLosses {
  std::vector<double> loss, val, grad_norm;
};

inline RunLosses read_losses(const std::filesystem::path& run_dir) {
  RunLosses r;
  for (const auto& row : read_metrics(run_dir)) {
    r.loss.push_back(row["loss"].get<double>());
    r.grad_norm.push_back(row["grad_norm"].get<double>());
    if (row.contains("val_loss")) r.val.push_back(row["val_loss"].get<double>());
  }
  return r;
}

// |a - b| / |b|: a's relative difference from the reference b.
inline double relative_difference(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

// The cores this test may run on (its affinity mask), which trident, started from it, counts
// as its own (grid/core_share.hpp).
inline cpu_set_t affinity_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    throw std::runtime_error("sched_getaffinity failed");
  return set;
}

inline std::string trident_cmd(const std::string& args) {
  return std::string(TRIDENT_BINARY) + " " + args;
}

// trident_cmd(args) on `ranks` MPI ranks (one rank: run directly, without mpiexec).
inline std::string trident_cmd_on(int ranks, const std::string& args) {
  if (ranks == 1) return trident_cmd(args);
  return std::string(TRIDENT_MPIEXEC) + " -n " + std::to_string(ranks) + " " + trident_cmd(args);
}

}  // namespace trident::test

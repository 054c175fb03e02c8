// trident model: a config's architecture, exact parameter count and training FLOPs per token
// and per step, without training (no data is opened). The config is validated as `train`
// validates it, and so is its parallel layout (parallel.tensor * pipeline * data ranks).
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "config/config.hpp"
#include "grid/grid.hpp"
#include "model/model_stats.hpp"

namespace trident {

void add_model_command(CLI::App& app, ModelOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "model", "Print a config's parameter count and training FLOPs (no training)");
  add_config_options(*cmd, options.configs, options.overrides);
}

namespace {

// 1234567 -> "1,234,567".
std::string grouped(unsigned __int128 v) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The exact integer when the double holds one (below 2^53), with the scientific form.
std::string flops_text(double flops, int64_t times) {
  char sci[32];
  std::snprintf(sci, sizeof sci, "%.4g", flops * static_cast<double>(times));
  if (flops >= 9007199254740992.0) return sci;
  const auto exact = static_cast<unsigned __int128>(static_cast<uint64_t>(flops)) *
                     static_cast<unsigned __int128>(times);
  return grouped(exact) + " (" + sci + ")";
}

}  // namespace

void run_model(const ModelOptions& options) {
  const Config c = load_configs(options.configs, options.overrides);
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const GridShape shape{static_cast<int>(p.tensor), static_cast<int>(p.pipeline),
                        static_cast<int>(p.data)};
  validate_layout(shape, static_cast<int>(p.world_size()), static_cast<int>(p.ranks_per_node),
                  m);
  const int64_t vp = padded_vocab(m.vocab_size, m.vocab_multiple, p.tensor);
  const int64_t params = parameter_count(m);
  const double flops = training_flops_per_token(m, vp);

  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  std::printf("config: %s\n", c.source.c_str());
  std::printf("arch: %s\n", m.arch.c_str());
  std::printf("shape: %lld layers, width %lld, %lld heads of %lld, %lld kv heads, MLP %lld, "
              "vocabulary %lld (padded %lld), seq_len %lld, %s embeddings\n",
              static_cast<long long>(m.layers), static_cast<long long>(m.width),
              static_cast<long long>(m.heads), static_cast<long long>(m.head_size()),
              static_cast<long long>(m.kv_head_count()), static_cast<long long>(m.ffn_size()),
              static_cast<long long>(m.vocab_size), static_cast<long long>(vp),
              static_cast<long long>(m.seq_len), m.tie_embeddings ? "tied" : "untied");
  const bool billions = params >= 1000000000;
  std::printf("parameters: %s (%.2f %s)\n", grouped(static_cast<unsigned __int128>(params)).c_str(),
              static_cast<double>(params) / (billions ? 1e9 : 1e6), billions ? "B" : "M");
  if (m.moe_experts > 0)
    std::printf("mixture of experts: %lld of %lld layers, %lld experts, top-%lld; active "
                "parameters per token: %s\n",
                static_cast<long long>(moe_layer_count(m)), static_cast<long long>(m.layers),
                static_cast<long long>(m.moe_experts), static_cast<long long>(m.moe_top_k),
                grouped(static_cast<unsigned __int128>(active_parameter_count(m))).c_str());
  std::printf("training FLOPs per token: %s\n", flops_text(flops, 1).c_str());
  std::printf("tokens per step: %s (global batch %lld x seq_len %lld)\n",
              grouped(static_cast<unsigned __int128>(c.tokens_per_step())).c_str(),
              static_cast<long long>(c.train.global_batch), static_cast<long long>(m.seq_len));
  std::printf("training FLOPs per step: %s\n", flops_text(flops, c.tokens_per_step()).c_str());
  std::printf("layout: tensor %lld x pipeline %lld x data %lld = %lld rank%s\n",
              static_cast<long long>(p.tensor), static_cast<long long>(p.pipeline),
              static_cast<long long>(p.data), static_cast<long long>(p.world_size()),
              p.world_size() == 1 ? "" : "s");
  std::fflush(stdout);
}

}  // namespace trident

// trident config: the resolved config (includes, several --config files and --set overrides
// applied, validated) with the provenance of each value, without training. Every command that
// reads a config takes its options from add_config_options, so they all layer alike.
#include <mpi.h>

#include <cstdio>

#include "commands.hpp"
#include "config/config.hpp"

namespace trident {

void add_config_options(CLI::App& cmd, std::vector<std::string>& configs,
                        std::vector<std::string>& overrides) {
  cmd.add_option("--config", configs,
                 "TOML config file; repeatable: later files override earlier ones")
      ->required()
      ->take_all();
  cmd.add_option("--set", overrides,
                 "Override a key: section.key=value (repeatable; wins over every file)")
      ->take_all();
}

void add_config_command(CLI::App& app, ConfigOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "config", "Print the resolved config and where each value came from (no training)");
  add_config_options(*cmd, options.configs, options.overrides);
}

void run_config(const ConfigOptions& options) {
  const Config config = load_configs(options.configs, options.overrides);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  std::fputs(config.to_toml_with_provenance().c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace trident

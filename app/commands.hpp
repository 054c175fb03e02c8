#pragma once
// The subcommands of the trident executable.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace trident {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
};
void add_train_command(CLI::App& app, TrainOptions& options);
void run_train(const TrainOptions& options);

}  // namespace trident

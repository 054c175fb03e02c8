// `trident config` (the resolved config with provenance, validation only) and the config.toml
// `trident train` writes into log.dir, from the built binary.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "app_fixture.hpp"

using namespace trident::test;
namespace fs = std::filesystem;

namespace {

RunResult config_cmd(const std::string& args) {
  return run_command(trident_cmd("config " + args), 60);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// base/small.toml <- exp/lr.toml; exp/seed.toml stands alone; the tiny corpus in dir.
fs::path make_layered_configs(const std::string& name) {
  const fs::path dir = scratch_dir(name);
  make_tiny_run(dir);
  fs::create_directories(dir / "base");
  fs::create_directories(dir / "exp");
  write_file(dir / "base/small.toml", tiny_config(dir));
  write_file(dir / "exp/lr.toml", "include = [\"../base/small.toml\"]\n[optim]\nlr = 0.003\n");
  write_file(dir / "exp/seed.toml", "[train]\nseed = 7\nsteps = 4\n");
  return dir;
}

}  // namespace

TEST(AppConfig, PrintsTheResolvedConfigWithProvenance) {
  const fs::path dir = make_layered_configs("config_print");
  const auto r = run_command(
      trident_cmd("config --config " + (dir / "exp/lr.toml").string() + " --config " +
                  (dir / "exp/seed.toml").string() + " --set train.steps=5"),
      60, /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string& line :
       {"lr = 0.003  # from " + (dir / "exp/lr.toml").string(),
        "min_lr = 0.001  # from " + (dir / "base/small.toml").string(),
        "seed = 7  # from " + (dir / "exp/seed.toml").string(),
        std::string("steps = 5  # --set"), std::string("beta1 = 0.9\n"),
        std::string("[optim]\n")})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  // Nothing but the config: no training figures, no run directory made.
  EXPECT_EQ(r.output.find("parameters"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run"));
}

TEST(AppConfig, InvalidInputIsOneErrorLine) {
  const fs::path dir = make_layered_configs("config_invalid");
  write_file(dir / "exp/cycle_a.toml", "include = [\"cycle_b.toml\"]\n");
  write_file(dir / "exp/cycle_b.toml", "include = [\"cycle_a.toml\"]\n");
  const std::string a = (dir / "exp/cycle_a.toml").string(), b = (dir / "exp/cycle_b.toml").string();
  auto r = config_cmd("--config " + a);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("trident: error: " + a + " -> " + b + " -> " + a +
                          ": include cycle: the file includes itself\n"),
            std::string::npos)
      << r.output;

  write_file(dir / "exp/missing.toml", "include = [\"../base/gone.toml\"]\n");
  r = config_cmd("--config " + (dir / "exp/missing.toml").string());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find((dir / "exp/missing.toml").string() + " -> " +
                          (dir / "base/gone.toml").string() +
                          ": cannot open file: No such file or directory"),
            std::string::npos)
      << r.output;

  r = config_cmd("--config " + (dir / "exp/lr.toml").string() + " --set optim.lr=-1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("optim.lr (-1.0) must be > 0"), std::string::npos) << r.output;
}

TEST(AppConfig, TrainWritesTheResolvedConfigIntoLogDir) {
  const fs::path dir = make_layered_configs("config_train");
  const auto r = run_command(trident_cmd("train --config " + (dir / "exp/lr.toml").string() +
                                         " --config " + (dir / "exp/seed.toml").string() +
                                         " --set train.steps=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string written = read_text(dir / "run" / "config.toml");
  EXPECT_NE(written.find("lr = 0.003  # from " + (dir / "exp/lr.toml").string()),
            std::string::npos)
      << written;
  EXPECT_NE(written.find("steps = 2  # --set"), std::string::npos) << written;
  // The file is a config that reproduces the run: `trident config` reads it back.
  const auto again = run_command(
      trident_cmd("config --config " + (dir / "run" / "config.toml").string()), 60, false);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("steps = 2  # from "), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("seed = 7  # from "), std::string::npos) << again.output;
}

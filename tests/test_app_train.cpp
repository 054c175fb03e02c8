// End-to-end tests of `trident train` on one rank: it trains, it is deterministic, and bad
// input ends it with one clear error line and a non-zero exit code (never a crash or a hang).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "app_fixture.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> loss_strings(const fs::path& run) {
  std::vector<std::string> out;
  for (const auto& row : read_metrics(run)) out.push_back(row["loss"].dump());
  return out;
}

}  // namespace

TEST(TrainApp, TrainsLogsAndEvaluates) {
  const auto dir = scratch_dir("train_basic");
  const auto config = make_tiny_run(dir);
  const auto r = run_command(trident_cmd("train --config " + config.string() +
                                         " --set train.steps=12 --set eval.interval=6"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("parameters: "), std::string::npos);
  EXPECT_NE(r.output.find("training FLOPs per step"), std::string::npos);
  EXPECT_NE(r.output.find("step     12/12 | loss "), std::string::npos) << r.output;
  const auto rows = read_metrics(dir / "run");
  ASSERT_EQ(rows.size(), 12u);
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s"})
    EXPECT_TRUE(rows[0].contains(key)) << key;
  EXPECT_TRUE(rows[5].contains("val_loss"));
  EXPECT_TRUE(rows[11].contains("val_loss"));
  EXPECT_FALSE(rows[0].contains("val_loss"));
  EXPECT_LT(rows[11]["loss"].get<double>(), rows[0]["loss"].get<double>() - 0.5);
  EXPECT_LT(rows[11]["val_loss"].get<double>(), rows[5]["val_loss"].get<double>());
  EXPECT_NEAR(rows[0]["loss"].get<double>(), std::log(256.0), 0.1);  // starts near uniform
}

TEST(TrainApp, SameSeedIsBitwiseIdenticalAndAnotherSeedDiffers) {
  const auto dir = scratch_dir("train_determinism");
  const auto config = make_tiny_run(dir);
  std::vector<std::vector<std::string>> losses;
  for (const std::string& seed_and_dir : {"42 a", "42 b", "43 c"}) {
    const std::string seed = seed_and_dir.substr(0, 2), name = seed_and_dir.substr(3);
    const auto run = dir / name;
    const auto r = run_command(trident_cmd("train --config " + config.string() +
                                           " --set train.seed=" + seed + " --set log.dir=" +
                                           run.string() + " --set train.threads=2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses.push_back(loss_strings(run));
    ASSERT_EQ(losses.back().size(), 6u);
  }
  EXPECT_EQ(losses[0], losses[1]);  // every loss, all 17 significant digits
  EXPECT_NE(losses[0], losses[2]);
}

// ---------------------------------------------------------------- bad input

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = make_tiny_run(dir_);
  }
  // Runs trident, expects failure with a one-line "trident: error: ..." containing `needle`.
  void expect_error(const std::string& args, const std::string& needle) {
    const auto r = run_command(trident_cmd("train " + args), 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "timed out: " << r.output;
    EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.output;
    const auto pos = r.output.find("trident: error: ");
    ASSERT_NE(pos, std::string::npos) << r.output;
    const std::string line = r.output.substr(pos, r.output.find('\n', pos) - pos);
    EXPECT_NE(line.find(needle), std::string::npos) << "error line: " << line;
    EXPECT_EQ(r.output.find("core dumped"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("Segmentation"), std::string::npos) << r.output;
  }
  std::string config() const { return "--config " + config_.string(); }
  fs::path dir_, config_;
};

TEST_F(BadInput, MissingConfigFile) {
  expect_error("--config " + (dir_ / "absent.toml").string(), "absent.toml");
}

// Sets an environment variable for the scope of a test (children inherit it).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST_F(BadInput, UnknownKey) {
  expect_error(config() + " --set model.widht=64", "model.widht");
}

TEST_F(BadInput, UnknownKeyInFile) {
  write_file(config_, tiny_config(dir_) + "[checkpoint]\nfrequency = 3\n");
  expect_error(config(), "checkpoint.frequency");
}

TEST_F(BadInput, WrongType) {
  expect_error(config() + " --set model.layers=two", "model.layers");
}

TEST_F(BadInput, ZeroAndNegativeSizes) {
  expect_error(config() + " --set model.width=0", "model.width");
  expect_error(config() + " --set train.micro_batch=-2", "train.micro_batch");
  expect_error(config() + " --set model.layers=-1", "model.layers");
}

TEST_F(BadInput, HeadsNotDividingWidth) {
  expect_error(config() + " --set model.heads=5", "model.heads");
}

TEST_F(BadInput, ShardShorterThanOneWindow) {
  write_shard((dir_ / "short.bin").string(), synthetic_tokens(20));
  expect_error(config() + " --set data.train=" + (dir_ / "short.bin").string(), "short.bin");
}

TEST_F(BadInput, MissingShard) {
  expect_error(config() + " --set data.train=" + (dir_ / "nothing_*.bin").string(), "nothing_");
  expect_error(config() + " --set data.val=" + (dir_ / "gone.bin").string(), "gone.bin");
}

TEST_F(BadInput, TruncatedShard) {
  const auto path = dir_ / "train_001.bin";
  fs::resize_file(path, fs::file_size(path) - 10);
  expect_error(config(), "truncated");
}

TEST_F(BadInput, WrongMagicAndVersion) {
  const auto path = dir_ / "train_000.bin";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t bad = 12345;
    f.write(reinterpret_cast<const char*>(&bad), 4);
  }
  expect_error(config(), "magic");
  write_shard(path.string(), synthetic_tokens(20000, 1));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t version = 7;
    f.seekp(4);
    f.write(reinterpret_cast<const char*>(&version), 4);
  }
  expect_error(config(), "version");
}

TEST_F(BadInput, SettingsThisMachineCannotRunAreRefused) {
  // No GPU visible (forced, so that the case means the same on a machine with one): refused
  // with the key named, whether or not this build has CUDA.
  ScopedEnv hide("CUDA_VISIBLE_DEVICES", "");
  expect_error(config() + " --set train.device=cuda", "train.device");
  expect_error(config() + " --set train.device=cuda --set parallel.comm=mpi", "train.device");
  // bf16 runs on the GPU backend only.
  expect_error(config() + " --set train.precision=bf16", "train.precision");
}

TEST_F(BadInput, TokenOutsideTheVocabulary) {
  expect_error(config() + " --set model.vocab_size=100", "token");
}

TEST_F(BadInput, ErrorIsPrintedOnceOnSeveralRanks) {
  const auto r = run_command(std::string(TRIDENT_MPIEXEC) + " -n 2 " +
                                 trident_cmd("train " + config() + " --set model.heads=3"),
                             60);
  EXPECT_NE(r.exit_code, 0);
  size_t count = 0;
  for (size_t p = r.output.find("trident: error"); p != std::string::npos;
       p = r.output.find("trident: error", p + 1))
    ++count;
  EXPECT_EQ(count, 1u) << r.output;
}

// `trident eval`: a checkpoint's loss on the validation data equals the validation loss the
// trainer logged at that step (the same batches through the same evaluation), on the layout it
// trained on exactly and on other layouts to rounding; bad input ends it with one error line.
#include <gtest/gtest.h>

#include <cmath>

#include "app_fixture.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {

// The JSON of `trident eval --json`: the last line of its output.
nlohmann::json last_json_line(const std::string& output) {
  std::string text = output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const size_t start = text.rfind('\n');
  return nlohmann::json::parse(start == std::string::npos ? text : text.substr(start + 1));
}

class EvalApp : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(std::string("eval_") +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = make_tiny_run(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // Trains 3 steps (tiny_config evaluates at step 3) on `ranks` ranks; returns the logged
  // validation loss of step 3 and sets checkpoint_.
  double train(int ranks, const std::string& sets) {
    const auto r = run_command(
        trident_cmd_on(ranks, "train --config " + config_.string() + " --set train.steps=3" +
                           " --set checkpoint.dir=" + (dir_ / "ckpt").string() +
                           " --set log.dir=" + (dir_ / "run").string() + " " + sets),
        110);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    checkpoint_ = dir_ / "ckpt" / "step_00000003.h5";
    const auto rows = read_metrics(dir_ / "run");
    if (rows.size() != 3 || !rows[2].contains("val_loss")) {
      ADD_FAILURE() << "no validation loss at step 3 in " << (dir_ / "run").string();
      return NAN;
    }
    return rows[2]["val_loss"].get<double>();
  }
  // `trident eval --json` on the validation data; its JSON.
  nlohmann::json eval(int ranks, const std::string& sets) {
    const auto r = run_command(trident_cmd_on(ranks, "eval --ckpt " + checkpoint_.string() +
                                                         " --data " + (dir_ / "val.bin").string() +
                                                         " --json " + sets),
                               110);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return nlohmann::json{{"loss", NAN}, {"tokens", 0}};
    return last_json_line(r.output);
  }

  fs::path dir_, config_, checkpoint_;
};

}  // namespace

TEST_F(EvalApp, OneRankEqualsLoggedValidationLoss) {
  const double logged = train(1, "");
  const auto out = eval(1, "");
  std::printf("logged val_loss %.17g, eval loss %.17g\n", logged, out["loss"].get<double>());
  EXPECT_EQ(out["loss"].get<double>(), logged);
  EXPECT_DOUBLE_EQ(out["perplexity"].get<double>(), std::exp(logged));
  EXPECT_EQ(out["tokens"].get<int64_t>(), 1 * 8 * 32);  // eval.steps x global batch x seq
  // --steps: more batches, the first one among them.
  const auto two = eval(1, "--steps 2");
  EXPECT_EQ(two["tokens"].get<int64_t>(), 2 * 8 * 32);
  EXPECT_TRUE(std::isfinite(two["loss"].get<double>()));
  EXPECT_NE(two["loss"].get<double>(), logged);
  // The plain line.
  const auto r = run_command(trident_cmd("eval --ckpt " + checkpoint_.string() + " --data " +
                                         (dir_ / "val.bin").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  char expected[64];
  std::snprintf(expected, sizeof expected, "loss %.6f | perplexity ", logged);
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  // The evaluation writes nothing into the run's log.dir (the stored config's).
  EXPECT_EQ(read_metrics(dir_ / "run").size(), 3u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "run"), fs::directory_iterator()), 2)
      << "config.toml and metrics.jsonl only";
}

TEST_F(EvalApp, PipelineLayoutEqualsLoggedValidationLoss) {
  const double logged = train(2, "--set parallel.pipeline=2");
  // The layout it trained on: the same computation, the same value.
  const double pipeline2 = eval(2, "--set parallel.pipeline=2")["loss"].get<double>();
  EXPECT_EQ(pipeline2, logged);
  // Other layouts read the same weights: equal to rounding.
  const double one_rank = eval(1, "")["loss"].get<double>();
  const double tensor2 = eval(2, "--set parallel.tensor=2")["loss"].get<double>();
  const double data2 = eval(2, "")["loss"].get<double>();  // parallel.data = 2 by default
  std::printf("logged val_loss (PP2) %.17g; eval PP2 %.17g, 1 rank %.17g, TP2 %.17g, DP2 %.17g\n",
              logged, pipeline2, one_rank, tensor2, data2);
  EXPECT_NEAR(one_rank, logged, 1e-5 * logged);
  EXPECT_NEAR(tensor2, logged, 1e-5 * logged);
  EXPECT_NEAR(data2, logged, 1e-5 * logged);
}

// Context parallelism: a CP = 2 run's logged validation loss is the CP = 2 evaluation's to the
// bit, and one rank's within 1e-5 (the eval layout's default is CP = 1, whatever trained).
TEST_F(EvalApp, ContextParallelEqualsLoggedValidationLoss) {
  const double logged = train(2, "--set parallel.context=2 --set eval.sample_interval=0");
  const double context2 = eval(2, "--set parallel.context=2")["loss"].get<double>();
  const double one_rank = eval(1, "")["loss"].get<double>();
  std::printf("logged val_loss (CP2) %.17g; eval CP2 %.17g, 1 rank %.17g\n", logged, context2,
              one_rank);
  EXPECT_EQ(context2, logged);
  EXPECT_NEAR(one_rank, logged, 1e-5 * logged);
}

TEST_F(EvalApp, BlendOfValidationSets) {
  train(1, "");
  const auto r = run_command(trident_cmd(
      "eval --ckpt " + checkpoint_.string() + " --json --data 0.5:" +
      (dir_ / "val.bin").string() + " 0.5:" + (dir_ / "train_001.bin").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data.val: blend of 2 datasets"), std::string::npos) << r.output;
  const auto out = last_json_line(r.output);
  EXPECT_TRUE(std::isfinite(out["loss"].get<double>()));
  EXPECT_EQ(out["tokens"].get<int64_t>(), 256);
}

TEST_F(EvalApp, BadInputOneErrorLine) {
  train(1, "");
  const std::string base = "eval --ckpt " + checkpoint_.string() + " --data " +
                           (dir_ / "val.bin").string();
  struct Case {
    std::string command;
    std::string message;
  };
  const std::vector<Case> cases = {
      {trident_cmd("eval --ckpt " + (dir_ / "missing.h5").string() + " --data x.bin"),
       "missing.h5"},
      {trident_cmd(base + " --set model.width=64"), "model.width"},
      {trident_cmd("eval --ckpt " + checkpoint_.string() + " --data " +
                   (dir_ / "nothing_*.bin").string()),
       "nothing_*.bin"},
      {trident_cmd_on(3, base + " --set parallel.tensor=2"), "not a multiple"},
  };
  for (const Case& c : cases) {
    const auto r = run_command(c.command, 110);
    EXPECT_NE(r.exit_code, 0) << c.command;
    const size_t pos = r.output.find("trident: error");
    ASSERT_NE(pos, std::string::npos) << c.command << "\n" << r.output;
    EXPECT_EQ(r.output.find("trident: error", pos + 1), std::string::npos) << r.output;
    const std::string line = r.output.substr(pos, r.output.find('\n', pos) - pos);
    EXPECT_NE(line.find(c.message), std::string::npos) << line;
  }
}

// Issue 56 item 12: --steps 99999999999999999999 was taken as INT64_MAX (CLI11's strtoll
// saturates) and the evaluation ran until killed; CLI range errors printed a 300-digit bound.
// Refused while the command line is parsed, naming the value, before any checkpoint is read.
TEST(EvalCli, StepsOutOfRangeAreRefusedNamingTheValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"99999999999999999999",
       "--steps: must be a whole number >= 1, got 99999999999999999999 (beyond 64 bits)"},
      {"0", "--steps: must be a whole number >= 1, got 0"},
      {"1e3", "--steps: must be a whole number >= 1, got 1e3"},
  };
  for (const auto& [steps, message] : cases) {
    const auto r = run_command(
        trident_cmd("eval --ckpt missing.h5 --data missing.bin --steps " + steps), 30);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_LT(r.output.size(), 200u) << r.output;
  }
}

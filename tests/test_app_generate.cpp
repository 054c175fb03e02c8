// `trident generate`: the key/value-cache forward gives the trainer's numbers (the prompt's
// cross-entropy over the first validation window equals `trident eval` on that one window, for
// GPT-2 and for Llama with grouped-query attention and RoPE), sampling is a function of the
// seed, greedy decoding of none, and bad input is one error line.
#include <gtest/gtest.h>

#include <cmath>

#include "app_fixture.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {

class GenerateApp : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name)
      if (c == '/') c = '_';
    dir_ = scratch_dir("generate_" + name);
    config_ = make_tiny_run(dir_);
    const auto r = run_command(trident_cmd(
        "train --config " + config_.string() + " --set train.steps=2 --set eval.interval=0" +
        " --set checkpoint.dir=" + (dir_ / "ckpt").string() + " --set log.dir=" +
        (dir_ / "run").string() + " " + GetParam()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    checkpoint_ = dir_ / "ckpt" / "step_00000002.h5";
    // The first validation window: seq_len + 1 = 33 tokens, all bytes (vocabulary 256).
    std::string window;
    for (const uint16_t t : synthetic_tokens(33, 3)) window += static_cast<char>(t);
    write_file(dir_ / "window.bin", window);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  RunResult generate(const std::string& args) {
    return run_command(trident_cmd("generate --ckpt " + checkpoint_.string() + " " + args), 60,
                       false);
  }
  fs::path dir_, config_, checkpoint_;
};

}  // namespace

TEST_P(GenerateApp, PromptLossEqualsEvaluationOfTheWindow) {
  const auto g = generate("--prompt-file " + (dir_ / "window.bin").string() +
                          " --max-new-tokens 0 --prompt-loss");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  double cached = NAN;
  ASSERT_EQ(std::sscanf(g.output.c_str(), "prompt loss %lf over 32 tokens", &cached), 1)
      << g.output;
  const auto e = run_command(trident_cmd("eval --ckpt " + checkpoint_.string() + " --data " +
                                         (dir_ / "val.bin").string() +
                                         " --json --steps 1 --set train.global_batch=1" +
                                         " --set train.micro_batch=1"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto line = e.output.substr(e.output.rfind('{'));
  const double evaluated = nlohmann::json::parse(line)["loss"].get<double>();
  std::printf("%s: prompt loss through the cache %.10f, trainer's evaluation %.10f\n",
              GetParam().c_str(), cached, evaluated);
  EXPECT_NEAR(cached, evaluated, 1e-5 * evaluated);
}

TEST_P(GenerateApp, SamplingFollowsTheSeed) {
  const std::string base = "--prompt abc --max-new-tokens 20 --top-k 50 --top-p 0.95 ";
  const auto a = generate(base + "--seed 1");
  const auto b = generate(base + "--seed 1");
  const auto c = generate(base + "--seed 2");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
  // Byte-level: the prompt, one byte per new token, a newline.
  EXPECT_EQ(a.output.size(), 3u + 20u + 1u);
  EXPECT_EQ(a.output.substr(0, 3), "abc");
  const auto g1 = generate("--prompt abc --max-new-tokens 10 --temperature 0 --seed 1");
  const auto g2 = generate("--prompt abc --max-new-tokens 10 --temperature 0 --seed 2");
  ASSERT_EQ(g1.exit_code, 0) << g1.output;
  EXPECT_EQ(g1.output, g2.output);
}

TEST_P(GenerateApp, BadInputIsOneErrorLine) {
  std::string long_prompt(40, 'a');  // seq_len is 32
  const std::vector<std::pair<std::string, std::string>> cases = {
      {trident_cmd("generate --ckpt " + checkpoint_.string() + " --prompt " + long_prompt),
       "longer than model.seq_len (32"},
      {trident_cmd("generate --ckpt " + checkpoint_.string()), "--prompt"},
      {trident_cmd("generate --ckpt " + (dir_ / "missing.h5").string() + " --prompt a"),
       "missing.h5"},
      {std::string(TRIDENT_MPIEXEC) + " -n 2 " +
           trident_cmd("generate --ckpt " + checkpoint_.string() + " --prompt a"),
       "one rank"},
  };
  for (const auto& [command, message] : cases) {
    const auto r = run_command(command, 60);
    EXPECT_NE(r.exit_code, 0) << command;
    const size_t pos = r.output.find("trident: error");
    ASSERT_NE(pos, std::string::npos) << command << "\n" << r.output;
    const std::string line = r.output.substr(pos, r.output.find('\n', pos) - pos);
    EXPECT_NE(line.find(message), std::string::npos) << line;
  }
}

// A MoE checkpoint (docs/moe.md) is refused in one line naming the key, before any decoding.
TEST(GenerateMoe, MixtureOfExpertsCheckpointIsOneErrorLine) {
  const fs::path dir = scratch_dir("generate_moe");
  const fs::path config = make_tiny_run(dir);
  const auto trained = run_command(trident_cmd(
      "train --config " + config.string() + " --set train.steps=1 --set eval.interval=0" +
      " --set model.moe_experts=4 --set checkpoint.dir=" + (dir / "ckpt").string() +
      " --set log.dir=" + (dir / "run").string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const auto r = run_command(
      trident_cmd("generate --ckpt " + (dir / "ckpt" / "step_00000001.h5").string() +
                  " --prompt a"),
      60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  const size_t pos = r.output.find("trident: error");
  ASSERT_NE(pos, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("trident: error", pos + 1), std::string::npos) << r.output;
  const std::string line = r.output.substr(pos, r.output.find('\n', pos) - pos);
  EXPECT_NE(line.find("model.moe_experts = 4: the key/value-cache decoder has no mixture of "
                      "experts yet"),
            std::string::npos)
      << line;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Architectures, GenerateApp,
                         ::testing::Values("--set model.arch=gpt2",
                                           "--set model.arch=llama --set model.kv_heads=2"));

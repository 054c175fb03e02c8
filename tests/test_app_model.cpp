// `trident model`: the figures of a config without training, from the built binary. The
// published parameter counts (GPT-2 124M, Llama 3.2 1B, Llama 3.1 8B) are the reference.
#include <gtest/gtest.h>

#include <string>

#include "app_fixture.hpp"

using namespace trident::test;

namespace {

std::string config(const std::string& name) {
  return std::string(TRIDENT_SOURCE_DIR) + "/configs/" + name;
}

RunResult model(const std::string& args) { return run_command(trident_cmd("model " + args), 60); }

void expect_lines(const RunResult& r, std::initializer_list<std::string> lines) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const std::string& line : lines)
    EXPECT_NE(r.output.find(line + "\n"), std::string::npos) << line << "\n" << r.output;
}

}  // namespace

TEST(AppModel, Llama3_2_1B) {
  expect_lines(model("--config " + config("llama_3.2_1b.toml")),
               {"arch: llama", "parameters: 1,235,814,400 (1.24 B)",
                "training FLOPs per token: 8,219,787,264 (8.22e+09)",
                "tokens per step: 524,288 (global batch 256 x seq_len 2048)",
                "training FLOPs per step: 4,309,535,825,068,032 (4.31e+15)",
                "layout: tensor 2 x pipeline 1 x data 4 = 8 ranks"});
}

TEST(AppModel, Llama3_1_8B) {
  expect_lines(model("--config " + config("llama_3.1_8b.toml")),
               {"arch: llama", "parameters: 8,030,261,248 (8.03 B)",
                "training FLOPs per token: 48,249,176,064 (4.825e+10)"});
}

TEST(AppModel, Gpt2_124MWithOverrides) {
  // GPT-2's unpadded vocabulary; the FLOPs use the padded one (50257 -> 50304 at 128 * TP 1).
  expect_lines(model("--config " + config("gpu_124m.toml") +
                     " --set model.vocab_size=50257 --set model.vocab_multiple=128"),
               {"arch: gpt2", "parameters: 124,439,808 (124.44 M)",
                "training FLOPs per token: 854,654,976 (8.547e+08)",
                "layout: tensor 1 x pipeline 1 x data 1 = 1 rank"});
}

TEST(AppModel, InvalidConfigOrLayoutIsOneErrorLine) {
  auto r = model("--config " + config("llama_tiny.toml") + " --set model.arch=gpt3");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.arch (\"gpt3\") must be gpt2 or llama"), std::string::npos)
      << r.output;
  r = model("--config " + config("llama_tiny.toml") +
            " --set model.kv_heads=2 --set parallel.tensor=4");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.kv_heads = 2 is not divisible by parallel.tensor = 4"),
            std::string::npos)
      << r.output;
}

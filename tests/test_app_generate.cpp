// `trident generate`: the key/value-cache forward gives the trainer's numbers (the prompt's
// cross-entropy over the first validation window equals `trident eval` on that one window, for
// GPT-2 and for Llama with grouped-query attention and RoPE), sampling is a function of the
// seed, greedy decoding of none, and bad input is one error line.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>

#include "app_fixture.hpp"
#include "sanitizer.hpp"

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
        (dir_ / "run").string() + " --set eval.sample_interval=2 --set eval.sample_prompt=" +
        "\\\"ab\\\" --set eval.sample_tokens=8 " + GetParam()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    train_output_ = r.output;
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
  // Rank 0's stdout of a generate run under mpiexec -n `ranks`.
  RunResult generate_on(int ranks, const std::string& args) {
    return run_command(std::string(TRIDENT_MPIEXEC) + " -n " + std::to_string(ranks) + " " +
                           trident_cmd("generate --ckpt " + checkpoint_.string() + " " + args),
                       120, false);
  }
  fs::path dir_, config_, checkpoint_;
  std::string train_output_;
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

// Issue 56 item 6: with --prompt-loss the new tokens were streamed and then the whole text
// printed again. The loss line, then the text once: what the run without --prompt-loss prints.
TEST_P(GenerateApp, PromptLossPrintsTheTextOnce) {
  const std::string args = "--prompt abcdef --max-new-tokens 6 --temperature 0";
  const auto plain = generate(args);
  const auto with_loss = generate(args + " --prompt-loss");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(with_loss.exit_code, 0) << with_loss.output;
  EXPECT_EQ(plain.output.size(), 6u + 6u + 1u) << plain.output;
  const size_t line_end = with_loss.output.find('\n');
  ASSERT_NE(line_end, std::string::npos) << with_loss.output;
  EXPECT_EQ(with_loss.output.rfind("prompt loss ", 0), 0u) << with_loss.output;
  EXPECT_NE(with_loss.output.find(" over 5 tokens\n"), std::string::npos) << with_loss.output;
  EXPECT_EQ(with_loss.output.substr(line_end + 1), plain.output);
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
      {trident_cmd("generate --ckpt " + checkpoint_.string() + " --prompt a --stop xy"),
       "--stop 'xy': not one token of the tokenizer (256 ids)"},
      {trident_cmd("generate --ckpt " + checkpoint_.string() + " --prompt \"a <|endoftext|>\""),
       "the prompt has '<|endoftext|>', which the tokenizer has no special token for (256 ids)"},
      {trident_cmd("generate --ckpt " + (dir_ / "missing.h5").string() + " --prompt a"),
       "missing.h5"},
      {std::string(TRIDENT_MPIEXEC) + " -n 2 " +
           trident_cmd("generate --ckpt " + checkpoint_.string() +
                       " --prompt a --set parallel.pipeline=2"),
       "tensor parallelism only"},
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

TEST_P(GenerateApp, TensorParallelTwoGivesTheTokensOfOne) {
  // Two prompts batched: per-row positions and the vocab-parallel logits gathered under TP.
  write_file(dir_ / "prompts.txt", "abc\nthe longer prompt\n");
  const std::string args = "--prompts " + (dir_ / "prompts.txt").string() +
                           " --max-new-tokens 12 --temperature 0";
  const auto one = generate_on(1, args);
  const auto two = generate_on(2, args);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  std::printf("%s: TP 1 and TP 2 print\n%s", GetParam().c_str(), one.output.c_str());
  EXPECT_EQ(std::count(one.output.begin(), one.output.end(), '\n'), 2) << one.output;
  EXPECT_EQ(one.output.rfind("0\tabc", 0), 0u) << one.output;
  EXPECT_EQ(two.output, one.output);
  // Every logit counts in the prompt's loss: TP 2's (vocab-parallel head, gathered) is TP 1's.
  const std::string window = "--prompt-file " + (dir_ / "window.bin").string() +
                             " --max-new-tokens 0 --prompt-loss";
  double loss[2] = {NAN, NAN};
  for (const int ranks : {1, 2}) {
    const auto r = generate_on(ranks, window);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(std::sscanf(r.output.c_str(), "prompt loss %lf over 32 tokens", &loss[ranks - 1]),
              1) << r.output;
  }
  std::printf("%s: prompt loss TP 1 %.10f, TP 2 %.10f\n", GetParam().c_str(), loss[0], loss[1]);
  EXPECT_NEAR(loss[1], loss[0], 1e-6 * loss[0]);
}

TEST_P(GenerateApp, BatchedPromptsEqualSingleRuns) {
  write_file(dir_ / "prompts.txt", "x\nhello there\nab\n");
  const auto batch = generate("--prompts " + (dir_ / "prompts.txt").string() +
                              " --max-new-tokens 10 --temperature 0");
  ASSERT_EQ(batch.exit_code, 0) << batch.output;
  std::string expected;
  int index = 0;
  for (const std::string prompt : {"x", "hello there", "ab"}) {
    write_file(dir_ / "one.txt", prompt);
    const auto single = generate("--prompt-file " + (dir_ / "one.txt").string() +
                                 " --max-new-tokens 10 --temperature 0");
    ASSERT_EQ(single.exit_code, 0) << single.output;
    std::string text = single.output.substr(0, single.output.size() - 1);  // the last newline
    std::string escaped;
    for (const char c : text) escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
    expected += std::to_string(index++) + "\t" + escaped + "\n";
  }
  EXPECT_EQ(batch.output, expected);
}

TEST_P(GenerateApp, TrainerSamplesAreWhatGenerateGivesTheCheckpoint) {
  // The trainer printed a greedy sample of 8 tokens of "ab" at step 2 from its live weights;
  // the step-2 checkpoint through `trident generate` gives the same text.
  const std::string tag = "sample at step 2: ";
  const size_t at = train_output_.find(tag);
  ASSERT_NE(at, std::string::npos) << train_output_;
  const std::string json = train_output_.substr(at + tag.size(),
                                                train_output_.find('\n', at) - at - tag.size());
  const std::string sampled = nlohmann::json::parse(json).get<std::string>();
  const auto g = generate("--prompt ab --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  std::printf("%s: trainer sample %s\n", GetParam().c_str(), json.c_str());
  EXPECT_EQ(sampled.size(), 2u + 8u);
  EXPECT_EQ(g.output, sampled + "\n");
}

TEST_P(GenerateApp, TensorParallelTrainingsSamplesAndCheckpointAgreeWithOneRank) {
  // Trained on TP 2 with sequence parallelism (decoding runs without it), sampling from its
  // live weights; its checkpoint read by one rank gives the same greedy text.
  const fs::path ckpt_dir = dir_ / "ckpt_tp2";
  const auto r = run_command(
      std::string(TRIDENT_MPIEXEC) + " -n 2 " +
          trident_cmd("train --config " + config_.string() +
                      " --set train.steps=2 --set eval.interval=0 --set checkpoint.dir=" +
                      ckpt_dir.string() + " --set log.dir=" + (dir_ / "run_tp2").string() +
                      " --set parallel.tensor=2 --set parallel.sequence_parallel=true" +
                      " --set eval.sample_interval=2 --set eval.sample_prompt=\\\"ab\\\"" +
                      " --set eval.sample_tokens=8 " + GetParam()),
      120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string tag = "sample at step 2: ";
  const size_t at = r.output.find(tag);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string json =
      r.output.substr(at + tag.size(), r.output.find('\n', at) - at - tag.size());
  const auto g = run_command(trident_cmd("generate --ckpt " +
                                         (ckpt_dir / "step_00000002.h5").string() +
                                         " --prompt ab --max-new-tokens 8 --temperature 0"),
                             60, false);
  ASSERT_EQ(g.exit_code, 0) << g.output;
  std::printf("%s: TP 2 + SP trainer sample %s, one rank's generate %s", GetParam().c_str(),
              json.c_str(), g.output.c_str());
  EXPECT_EQ(g.output, nlohmann::json::parse(json).get<std::string>() + "\n");
}

// `trident generate --prompt a` on the checkpoint of one training step of the tiny run with
// `setting` (a --set), for the refusal tests below: the run's exit status, output and error line,
// which must be the only one ("" when there is none; the expectations here then fail).
namespace {
struct Refusal {
  int exit_code = 0;
  std::string ckpt, output, line;
};
Refusal generate_on_one_step(const fs::path& dir, const std::string& setting) {
  const fs::path config = make_tiny_run(dir);
  const auto trained = run_command(trident_cmd(
      "train --config " + config.string() + " --set train.steps=1 --set eval.interval=0" +
      " --set " + setting + " --set checkpoint.dir=" + (dir / "ckpt").string() +
      " --set log.dir=" + (dir / "run").string()));
  Refusal refusal;
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  if (trained.exit_code != 0) return refusal;
  refusal.ckpt = (dir / "ckpt" / "step_00000001.h5").string();
  const auto r = run_command(trident_cmd("generate --ckpt " + refusal.ckpt + " --prompt a"), 60);
  refusal.exit_code = r.exit_code;
  refusal.output = r.output;
  const size_t pos = r.output.find("trident: error");
  EXPECT_NE(pos, std::string::npos) << r.output;
  if (pos == std::string::npos) return refusal;
  EXPECT_EQ(r.output.find("trident: error", pos + 1), std::string::npos) << r.output;
  refusal.line = r.output.substr(pos, r.output.find('\n', pos) - pos);
  return refusal;
}
}  // namespace

// A MoE checkpoint (docs/moe.md) is refused in one line naming the key, before any decoding.
TEST(GenerateMoe, MixtureOfExpertsCheckpointIsOneErrorLine) {
  const fs::path dir = scratch_dir("generate_moe");
  const Refusal r = generate_on_one_step(dir, "model.moe_experts=4");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.line.find("model.moe_experts = 4: the key/value-cache decoder has no mixture of "
                        "experts yet"),
            std::string::npos)
      << r.line;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// A checkpoint whose vocabulary is not the byte-level one (a BPE model's) without --tokenizer
// is refused in one line naming the key: the bytes would have decoded nonsense.
TEST(GenerateTokenizer, AnotherVocabularyWithoutTokenizerIsOneErrorLine) {
  const fs::path dir = scratch_dir("generate_vocab");
  const Refusal r = generate_on_one_step(dir, "model.vocab_size=320");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.line, "trident: error: generate: checkpoint '" + r.ckpt +
                        "' has model.vocab_size = 320 but no --tokenizer was given: the default, "
                        "byte-level (256 ids), is a 256-id model's; pass the tokenizer.json its "
                        "data was made with");
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// The trainer's samples read eval.sample_tokenizer and encode eval.sample_prompt at start-up: a
// missing file, or a prompt whose tokens the model has no ids for, is one error line before
// the first step, not at the first sample (here never reached: interval 1000, 2 steps).
TEST(TrainerSamples, BadTokenizerOrPromptIsAnErrorAtStartUp) {
  const fs::path dir = scratch_dir("trainer_sample_tokenizer");
  const fs::path config = make_tiny_run(dir);
  // The fuzz corpus's GPT-2-style tokenizer (its JSON up to the NUL, the fuzzer's text after):
  // 256 byte tokens and merges up to "Ġwor" ("or" is id 257), past the tiny model's 256 ids.
  const std::string seed =
      read_file(fs::path(TRIDENT_SOURCE_DIR) / "tests/fuzz/corpus/tokenizer/gpt2_strings");
  const fs::path tokenizer = dir / "tokenizer.json";
  write_file(tokenizer, seed.substr(0, seed.find('\0')));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"eval.sample_tokenizer=\\\"" + (dir / "missing.json").string() + "\\\"",
       "trident: error: eval.sample_tokenizer: "},
      {"eval.sample_tokenizer=\\\"" + tokenizer.string() +
           "\\\" --set eval.sample_prompt=\\\"world\\\"",
       "trident: error: eval.sample_prompt: token id 257 of the tokenizer '" +
           tokenizer.string() + "' is outside model.vocab_size (256)"},
  };
  for (const auto& [setting, message] : cases) {
    const auto r = run_command(
        trident_cmd("train --config " + config.string() +
                    " --set train.steps=2 --set eval.interval=0 --set eval.sample_interval=1000"
                    " --set log.dir=" + (dir / "run").string() + " --set " + setting),
        60);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const size_t pos = r.output.find("trident: error");
    ASSERT_NE(pos, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("trident: error", pos + 1), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(message), pos) << r.output;
    // A step's line ("step      1/2 | loss ..."): none before the error.
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << "trained before the error:\n"
                                                           << r.output;
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// Issue 56 item 2: a FIFO as --prompt-file or --tokenizer blocked for ever, /dev/zero was read
// until the kernel's OOM killer came. Every file argument is checked as a config file is: a
// regular file of bounded size, refused before it is read (and before the checkpoint is). Each
// run is bounded in time and, but under AddressSanitizer, in memory, so that the unfixed
// program fails the test instead of hanging it or filling the machine's memory.
TEST(GenerateFiles, FifoDeviceDirectoryAndHugeFileAreRefusedUnread) {
  const fs::path dir = scratch_dir("generate_files");
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path huge = dir / "huge.txt";
  write_file(huge, "abc");
  fs::resize_file(huge, (int64_t{64} << 20) + 1);  // sparse: costs nothing
  const std::string limit = kUnderAddressSanitizer ? "" : "ulimit -v 4000000; ";
  const std::string ckpt = "generate --ckpt " + (dir / "missing.h5").string() + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--prompt-file " + fifo,
       "--prompt-file " + fifo + ": not a regular file (a FIFO): --prompt-file needs a text file"},
      {"--prompt-file /dev/zero", "--prompt-file /dev/zero: not a regular file (a character "
                                  "device): --prompt-file needs a text file"},
      {"--prompt-file " + dir.string(), "--prompt-file " + dir.string() +
                                            ": not a regular file (a directory): --prompt-file "
                                            "needs a text file"},
      {"--prompts " + fifo,
       "--prompts " + fifo + ": not a regular file (a FIFO): --prompts needs a text file"},
      {"--prompt-file " + huge.string(),
       "--prompt-file " + huge.string() + ": prompt file is 67108865 bytes, more than the 64 "
                                          "MiB a prompt may have: --prompt-file needs a text file"},
      {"--prompt a --tokenizer " + fifo,
       fifo + ": not a regular file (a FIFO): --tokenizer needs a tokenizer.json file"},
      {"--prompt a --tokenizer /dev/zero",
       "/dev/zero: not a regular file (a character device): --tokenizer needs a tokenizer.json "
       "file"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_command(limit + trident_cmd(ckpt + args + " < /dev/null"), 20);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    const size_t pos = r.output.find("trident: error: ");
    ASSERT_NE(pos, std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.substr(pos, r.output.find('\n', pos) - pos), "trident: error: " + message)
        << r.output;
  }
  fs::remove_all(dir);
}

// Issue 56 item 12: --temperature nan and --top-p nan were accepted (every comparison with nan
// is false), --max-new-tokens -1 was refused with a 300-digit bound. Each is refused while the
// command line is parsed, in a short line naming the option and the value.
TEST(GenerateCli, NumbersOutOfRangeAreRefusedNamingTheValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--temperature nan", "--temperature: must be a number >= 0, got nan"},
      {"--temperature inf", "--temperature: must be a number >= 0, got inf"},
      {"--temperature -1", "--temperature: must be a number >= 0, got -1"},
      {"--top-p nan", "--top-p: must be a number in [0, 1], got nan"},
      {"--top-p 1.5", "--top-p: must be a number in [0, 1], got 1.5"},
      {"--max-new-tokens -1", "--max-new-tokens: must be a whole number >= 0, got -1"},
      {"--top-k 99999999999999999999",
       "--top-k: must be a whole number >= 0, got 99999999999999999999 (beyond 64 bits)"},
      {"--seed -1", "--seed: must be a whole number >= 0 (64 bits), got -1"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_command(trident_cmd("generate --ckpt missing.h5 --prompt a " + args), 30);
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_LT(r.output.size(), 200u) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GenerateApp,
                         ::testing::Values("--set model.arch=gpt2",
                                           "--set model.arch=llama --set model.kv_heads=2"));

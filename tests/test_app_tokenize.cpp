// `trident tokenize`: the byte-level vocabulary without --tokenizer, --lines, decoding, and bad
// input (ids, text, files) ending it with one error line naming what is wrong. (The ids of real
// tokenizer.json files against Hugging Face's: tests/tools/test_tokenizer.py.)
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "app_fixture.hpp"
#include "sanitizer.hpp"

using namespace trident::test;
namespace fs = std::filesystem;

namespace {

// `trident tokenize ARGS` with `input` on standard input (a file: any bytes).
RunResult tokenize(const fs::path& dir, const std::string& input, const std::string& args,
                   bool merge_stderr = true) {
  const auto in = dir / "stdin.txt";
  write_file(in, input);
  return run_command(trident_cmd("tokenize " + args + " < " + in.string()), 60, merge_stderr);
}

std::string error_line(const std::string& output) {
  const auto pos = output.find("trident: error");
  if (pos == std::string::npos || output.find("trident: error", pos + 1) != std::string::npos)
    return "";
  return output.substr(pos, output.find('\n', pos) - pos);
}

}  // namespace

TEST(TokenizeApp, ByteLevelAndLines) {
  const auto dir = scratch_dir("tokenize_bytes");
  auto r = tokenize(dir, "Hi\xFF\n", "", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "72 105 255 10\n");
  r = tokenize(dir, "ab\n\nc\n", "--lines", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "97 98\n\n99\n");
  r = tokenize(dir, "97 98\n\n99\n", "--lines --decode", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "ab\n\nc\n");
  r = tokenize(dir, "72 105\n255 10", "--decode", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "Hi\xFF\n");
}

TEST(TokenizeApp, BadInputIsOneErrorLine) {
  const auto dir = scratch_dir("tokenize_errors");
  // A tokenizer.json of another model type (refused) and one cut short.
  write_file(dir / "bad.json", "{\"model\": {\"type\": \"WordPiece\"}}");
  write_file(dir / "broken.json", "{\"model\": ");
  struct Case {
    std::string input, args, message;
  };
  const std::vector<Case> cases = {
      {"12 x 3", "--decode", "'x' is not a token id"},
      {"12 256", "--decode", "token id 256 is not in the vocabulary (256 ids)"},
      {"-1", "--decode", "'-1' is not a token id"},
      {"text", "--tokenizer " + (dir / "missing.json").string(), "missing.json"},
      {"text", "--tokenizer " + (dir / "bad.json").string(), "model type \"WordPiece\""},
      {"text", "--tokenizer " + (dir / "broken.json").string(),
       "broken.json: not a usable tokenizer.json"},
  };
  for (const Case& c : cases) {
    const auto r = tokenize(dir, c.input, c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    const std::string line = error_line(r.output);
    EXPECT_NE(line.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

// Issue 56 item 2: a FIFO or a device as --tokenizer blocked (or was read without end); both are
// refused before reading, as a config file is. Bounded in time and memory (see
// test_app_generate.cpp's GenerateFiles).
TEST(TokenizeApp, TokenizerThatIsNoRegularFileIsRefusedUnread) {
  const auto dir = scratch_dir("tokenize_files");
  const std::string fifo = (dir / "fifo.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string limit = trident::test::kUnderAddressSanitizer ? "" : "ulimit -v 4000000; ";
  for (const std::string& path : {fifo, std::string("/dev/zero"), dir.string()}) {
    const auto r = run_command(limit + trident_cmd("tokenize --tokenizer " + path + " < /dev/null"),
                               20);
    EXPECT_EQ(r.exit_code, 1) << path << "\n" << r.output;
    const std::string line = error_line(r.output);
    EXPECT_NE(line.find(path + ": not a regular file ("), std::string::npos) << r.output;
    EXPECT_NE(line.find("): --tokenizer needs a tokenizer.json file"), std::string::npos)
        << r.output;
  }
  fs::remove_all(dir);
}

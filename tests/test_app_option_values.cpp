// Command-line values every subcommand shares the reading of (app/cli_numbers.hpp, main's error
// line), each case from a sweep of hostile inputs (2026-12-07): a leading zero read as octal
// (`--nodes 010` planned 8 nodes), an empty text value taken as the option not given
// (`--resume ''` trained from scratch), a NUL byte ending a token id early, and a newline in a
// quoted path splitting the error line.
#include <gtest/gtest.h>

#include "app_fixture.hpp"

using namespace trident::test;
namespace fs = std::filesystem;

namespace {

// The lines of `output` that are not empty.
std::vector<std::string> lines_of(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

std::string plan(const std::string& args) {
  return trident_cmd("plan --config " + std::string(TRIDENT_SOURCE_DIR) +
                     "/configs/tiny.toml --hardware " + std::string(TRIDENT_SOURCE_DIR) +
                     "/configs/hardware/cpu_2core.toml --top 1 " + args);
}

}  // namespace

TEST(OptionValues, LeadingZerosAreDecimal) {
  const RunResult r = run_command(plan("--nodes 010"), 60, /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(": 10 node(s) x "), std::string::npos) << r.output;
  const RunResult eight = run_command(plan("--nodes 08"), 60, false);
  ASSERT_EQ(eight.exit_code, 0) << eight.output << " (08 is 8, not a bad octal number)";
  EXPECT_NE(eight.output.find(": 8 node(s) x "), std::string::npos) << eight.output;
}

TEST(OptionValues, EmptyTextIsRefusedNamingTheOption) {
  const auto dir = scratch_dir("option_values_empty");
  write_file(dir / "in.txt", "hi\n");
  int compared = 0;
  for (const auto& [args, option] : std::vector<std::pair<std::string, std::string>>{
           {"tokenize --tokenizer '' < " + (dir / "in.txt").string(), "--tokenizer"},
           {"config --config ''", "--config"},
           {"train --config " + std::string(TRIDENT_SOURCE_DIR) + "/configs/tiny.toml --resume ''",
            "--resume"},
           {"ckpt info ''", "file"}}) {
    const RunResult r = run_command(trident_cmd(args), 60);
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_LT(r.exit_code, 128) << args << "\n" << r.output;
    const auto got = lines_of(r.output);
    ASSERT_EQ(got.size(), 1u) << args << "\n" << r.output;
    EXPECT_EQ(got[0].rfind("trident: error: ", 0), 0u) << got[0];
    EXPECT_NE(got[0].find(option), std::string::npos) << got[0];
    EXPECT_NE(got[0].find("must not be empty"), std::string::npos) << got[0];
    ++compared;
  }
  EXPECT_EQ(compared, 4);
}

TEST(OptionValues, ATokenIdWithANulByteIsRefused) {
  const auto dir = scratch_dir("option_values_nul");
  write_file(dir / "ids.txt", std::string("65\0" "66 67", 8));
  const RunResult r =
      run_command(trident_cmd("tokenize --decode < " + (dir / "ids.txt").string()), 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto got = lines_of(r.output);
  ASSERT_EQ(got.size(), 1u) << r.output;
  EXPECT_EQ(got[0], "trident: error: standard input: '65\\u000066' is not a token id");
}

TEST(OptionValues, ANewlineInAQuotedPathStaysOnTheErrorLine) {
  const RunResult r = run_command(
      trident_cmd("plan --config " + std::string(TRIDENT_SOURCE_DIR) +
                  "/configs/tiny.toml --nodes 1 --hardware $'/nonexistent/a\\nb.toml'"),
      60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto got = lines_of(r.output);
  ASSERT_EQ(got.size(), 1u) << r.output;
  EXPECT_NE(got[0].find("/nonexistent/a\\nb.toml"), std::string::npos) << got[0];
}

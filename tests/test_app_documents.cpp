// `trident train` on packed documents (data.document_mask, model.position_reset): training on
// sequences of two documents each equals training on the documents one per sequence; every
// layout trains as one rank; the keys' bad values are refused naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "app_fixture.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {

constexpr int kEod = 255;  // synthetic_tokens never yields it

// A stream of documents: the synthetic corpus cut into pieces of `lengths` (cycled), each
// ended by kEod.
std::vector<uint16_t> documents(int64_t n, uint64_t salt, const std::vector<int64_t>& lengths) {
  const std::vector<uint16_t> text = synthetic_tokens(n, salt);
  std::vector<uint16_t> out;
  size_t next = 0;
  for (int64_t i = 0; static_cast<int64_t>(out.size()) < n; ++next) {
    const int64_t len = lengths[next % lengths.size()];
    for (int64_t k = 0; k + 1 < len && i < n; ++k) out.push_back(text[static_cast<size_t>(i++)]);
    out.push_back(kEod);
  }
  return out;
}

std::string run_dir_config(const fs::path& dir, const std::vector<int64_t>& lengths) {
  write_shard((dir / "train_000.bin").string(), documents(12000, 1, lengths));
  write_shard((dir / "val.bin").string(), documents(3000, 3, lengths));
  write_file(dir / "config.toml", tiny_config(dir));
  return "train --config " + (dir / "config.toml").string() + " --set eval.interval=3" +
         " --set data.eod_id=" + std::to_string(kEod);
}

struct Losses {
  std::vector<double> train, val;
  int64_t compared = 0;
};

Losses losses(const fs::path& run) {
  Losses l;
  for (const auto& row : read_metrics(run)) {
    l.train.push_back(row["loss"].get<double>());
    if (row.contains("val_loss")) l.val.push_back(row["val_loss"].get<double>());
  }
  return l;
}

// Worst relative difference of b from a, step by step (train and validation losses); fails on
// different counts.
double worst_difference(const Losses& a, const Losses& b, int64_t& compared) {
  EXPECT_EQ(a.train.size(), b.train.size());
  EXPECT_EQ(a.val.size(), b.val.size());
  double worst = 0;
  compared = 0;
  for (auto pair : {&Losses::train, &Losses::val})
    for (size_t i = 0; i < std::min((a.*pair).size(), (b.*pair).size()); ++i, ++compared)
      worst = std::max(worst, std::fabs((b.*pair)[i] - (a.*pair)[i]) / std::fabs((a.*pair)[i]));
  return worst;
}

}  // namespace

// Documents of exactly seq_len / 2 tokens: a packed window of 32 tokens holds two whole
// documents, and the same stream read as windows of 16 holds one each, in the same order with
// the same targets (global batch doubled: the same tokens per step). With the mask and
// restarted positions the two runs compute the same thing (gpt2: the learned table's first 16
// rows; llama: RoPE); without the mask they differ.
TEST(DocumentsApp, PackedTrainingEqualsTrainingOnEachDocumentAlone) {
  for (const std::string arch : {"gpt2", "llama"}) {
    const auto dir = scratch_dir("documents_alone_" + arch);
    const std::string common = run_dir_config(dir, {16}) + " --set model.arch=\\\"" + arch +
                               "\\\" --set train.steps=6";
    const std::string packed = common + " --set data.document_mask=true" +
                               " --set model.position_reset=true";
    const auto a = run_command(trident_cmd(packed + " --set log.dir=" + (dir / "packed").string()));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const auto b = run_command(trident_cmd(common + " --set log.dir=" + (dir / "alone").string() +
                                           " --set model.seq_len=16 --set train.micro_batch=4" +
                                           " --set train.global_batch=16"));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    const auto c = run_command(trident_cmd(common + " --set log.dir=" + (dir / "stream").string()));
    ASSERT_EQ(c.exit_code, 0) << c.output;
    int64_t compared = 0;
    const double alone = worst_difference(losses(dir / "packed"), losses(dir / "alone"), compared);
    EXPECT_EQ(compared, 6 + 2) << arch;  // 6 steps, evaluations at steps 3 and 6
    EXPECT_LE(alone, 2e-6) << arch << ": packed documents against each alone";
    const double stream =
        worst_difference(losses(dir / "packed"), losses(dir / "stream"), compared);
    EXPECT_GT(stream, 1e-3) << arch << ": the mask changed nothing";
    std::printf("[documents] %s: packed vs alone worst rel diff %.2e over %lld losses; "
                "vs unmasked %.2e\n",
                arch.c_str(), alone, static_cast<long long>(compared), stream);
  }
}

// Documents of uneven lengths (some crossing the windows' edges): pipeline stages (each needs
// the tokens for its masks), tensor parallelism with sequence parallelism, and context
// parallelism (documents crossing the ranks' chunks: the ring's masks) train as one rank.
TEST(DocumentsApp, EveryLayoutTrainsAsOneRank) {
  const auto dir = scratch_dir("documents_layouts");
  const std::string common = run_dir_config(dir, {7, 20, 3, 41, 12}) +
                             " --set model.arch=\\\"llama\\\" --set train.steps=4" +
                             " --set data.document_mask=true --set model.position_reset=true";
  const auto one = run_command(trident_cmd(common + " --set log.dir=" + (dir / "one").string()));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Losses reference = losses(dir / "one");
  for (const std::string layout :
       {"--set parallel.pipeline=2",
        "--set parallel.tensor=2 --set parallel.sequence_parallel=true",
        "--set parallel.context=2"}) {
    const fs::path log = dir / ("run_" + std::to_string(layout.size()));
    const std::string args = common + " " + layout + " --set log.dir=" + log.string();
    const auto r = run_command(std::string(TRIDENT_MPIEXEC) + " -n 2 " + trident_cmd(args));
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    int64_t compared = 0;
    const double worst = worst_difference(reference, losses(log), compared);
    EXPECT_EQ(compared, 4 + 2) << layout;  // 4 steps, evaluations at steps 3 and 4
    EXPECT_LE(worst, 1e-5) << layout;
    std::printf("[documents] %s: worst rel diff %.2e over %lld losses\n", layout.c_str(), worst,
                static_cast<long long>(compared));
  }
}

class DocumentsBadInput : public ::testing::Test {
 protected:
  void expect_refused(const std::string& sets, const std::string& key) {
    const auto dir = scratch_dir("documents_bad");
    const auto r = run_command(trident_cmd("train --config " + make_tiny_run(dir).string() + " " +
                                           sets));
    EXPECT_NE(r.exit_code, 0) << sets << "\n" << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << sets << "\n" << r.output;
  }
};

TEST_F(DocumentsBadInput, MaskWithoutTheEndOfDocumentToken) {
  expect_refused("--set data.document_mask=true", "data.document_mask = true needs data.eod_id");
}
TEST_F(DocumentsBadInput, EndOfDocumentTokenOutsideTheVocabulary) {
  expect_refused("--set data.document_mask=true --set data.eod_id=256",
                 "data.eod_id (256) must be < model.vocab_size (256)");
  expect_refused("--set data.eod_id=-2", "data.eod_id");
}
TEST_F(DocumentsBadInput, PositionResetWithoutTheMask) {
  expect_refused("--set model.position_reset=true",
                 "model.position_reset = true restarts positions");
}

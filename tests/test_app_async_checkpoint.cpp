// Asynchronous checkpoints (checkpoint.async) through the trident binary, on 1 and 2 ranks:
// training goes on while a save is written, the files are those of a synchronous save (a
// resume from one continues the uninterrupted run bit for bit), a failed write ends the job at
// a step boundary with the file named and `latest` kept, a kill during a write leaves the
// previous checkpoint selected, and a stop waits for the save in flight and then saves the
// final state. Each dataset write is slowed (TRIDENT_TEST_SLOW_CHECKPOINT_MS) so that saves
// last several steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "app_fixture.hpp"

using namespace trident::test;
namespace fs = std::filesystem;

namespace {

const std::string kSlowWrites = "TRIDENT_TEST_SLOW_CHECKPOINT_MS=20";

class AsyncCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = make_tiny_run(dir_);
  }
  // `ranks` ranks (data parallel; one: without mpiexec), `steps` steps, checkpoint.async
  // into dir_/ckpt.
  std::string train(int ranks, int steps, const std::string& extra,
                    const std::string& env = kSlowWrites) const {
    const std::string launch =
        ranks > 1 ? std::string(TRIDENT_MPIEXEC) + " -n " + std::to_string(ranks) + " " : "";
    return env + " " + launch +
           trident_cmd("train --config " + config_.string() + " --set parallel.data=" +
                       std::to_string(ranks) + " --set train.steps=" + std::to_string(steps) +
                       " --set eval.interval=0 --set checkpoint.async=true --set checkpoint.dir=" +
                       ck().string() + " " + extra);
  }
  fs::path ck() const { return dir_ / "ckpt"; }
  fs::path checkpoint(int step) const {
    char name[64];
    std::snprintf(name, sizeof name, "step_%08d.h5", step);
    return ck() / name;
  }
  // The step records of a run's metrics.jsonl (events left out), and their losses as written.
  std::vector<nlohmann::json> steps_of(const fs::path& run) const {
    std::vector<nlohmann::json> out;
    for (const auto& row : read_metrics(run))
      if (row.contains("loss")) out.push_back(row);
    return out;
  }
  std::vector<std::string> losses(const fs::path& run) const {
    std::vector<std::string> out;
    for (const auto& row : steps_of(run)) out.push_back(row["loss"].dump());
    return out;
  }
  std::vector<std::string> temp_files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(ck()))
      if (e.path().filename().string().find(".tmp") != std::string::npos)
        out.push_back(e.path().filename());
    return out;
  }
  void expect_verifies(const fs::path& file) const {
    const auto r = run_command(trident_cmd("ckpt info --verify " + file.string()));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  fs::path dir_, config_;
};

// The "trident: error: ..." line of a run ("" if there is none).
std::string error_line(const RunResult& r) {
  const auto pos = r.output.find("trident: error: ");
  if (pos == std::string::npos) return "";
  return r.output.substr(pos, r.output.find('\n', pos) - pos);
}

}  // namespace

// 2 ranks, 12 steps: straight (no checkpoint) against a run saving every 3 steps in the
// background that stops at step 7 (exit 75) and resumes; and a resume from the asynchronously
// written checkpoint of step 6, which `latest` no longer names. Losses bitwise equal in all;
// the checkpoint of step 6 resumed on one rank too (another layout: within 1e-5).
TEST_F(AsyncCheckpoint, ResumeIsBitwiseAndTrainingGoesOnDuringTheWrite) {
  auto r = run_command(train(2, 12, "--set checkpoint.dir= --set log.dir=" +
                                        (dir_ / "straight").string()), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string saving = "--set checkpoint.interval=3 --set checkpoint.keep=10 ";
  r = run_command(train(2, 12, saving + "--set train.exit_interval=7 --set log.dir=" +
                                   (dir_ / "split").string() + " --resume auto"), 120);
  ASSERT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("(step 3, asynchronous)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(step 6, asynchronous)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("written (step 7)"), std::string::npos) << "the final save: sync";
  EXPECT_NE(r.output.find("checkpoint step 3: training waited"), std::string::npos) << r.output;
  // Training went on while the slowed saves were written.
  const auto rows = steps_of(dir_ / "split");
  const auto in_flight = std::count_if(rows.begin(), rows.end(), [](const nlohmann::json& row) {
    return row.value("checkpoint_in_flight", false);
  });
  EXPECT_GE(in_flight, 1) << "no step ran while a save was being written";
  int stall_events = 0;
  for (const auto& row : read_metrics(dir_ / "split"))
    if (row.value("event", "") == "checkpoint_stall") {
      ++stall_events;
      EXPECT_EQ(row.value("type", ""), "event") << "the metrics tools skip typed records";
      EXPECT_GE(row["stall_s"].get<double>(), 0.0);
    }
  EXPECT_EQ(stall_events, 2) << "one stall record per asynchronous save (steps 3 and 6)";
  r = run_command(train(2, 12, saving + "--set log.dir=" + (dir_ / "split").string() +
                                   " --resume auto"), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto straight = losses(dir_ / "straight");
  ASSERT_EQ(straight.size(), 12u);
  EXPECT_EQ(losses(dir_ / "split"), straight);
  for (int step : {3, 6, 9, 12}) expect_verifies(checkpoint(step));
  EXPECT_EQ(read_file(ck() / "latest"), "step_00000012.h5\n");
  EXPECT_TRUE(temp_files().empty());

  r = run_command(train(2, 12, "--set log.dir=" + (dir_ / "from6").string() + " --resume " +
                                   checkpoint(6).string()), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses(dir_ / "from6"),
            std::vector<std::string>(straight.begin() + 6, straight.end()));

  // Another layout resumes it as any checkpoint: one rank (the same global batch) continues
  // within 1e-5 of the 2-rank run (summation order only), as tests/mpi/
  // test_checkpoint_resume_np8.cpp requires of synchronously written ones.
  r = run_command(train(1, 12, "--set log.dir=" + (dir_ / "from6_one_rank").string() +
                                   " --resume " + checkpoint(6).string()), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto one_rank = steps_of(dir_ / "from6_one_rank"), two_ranks = steps_of(dir_ / "from6");
  ASSERT_EQ(one_rank.size(), 6u);
  ASSERT_EQ(two_ranks.size(), 6u);
  for (size_t i = 0; i < one_rank.size(); ++i) {
    const double a = one_rank[i]["loss"].get<double>(), b = two_ranks[i]["loss"].get<double>();
    EXPECT_LE(std::abs(a - b) / std::abs(b), 1e-5) << "step " << 7 + i;
  }
}

// A write that fails in the writer thread (past a file-size limit, EFBIG): the job ends with
// exit 1 and one error line naming the temporary file and the cause, at 1 and 2 ranks; the
// checkpoint before stays `latest`, intact, and no temporary file is left.
TEST_F(AsyncCheckpoint, WriterFailureEndsTheJobAndKeepsLatest) {
  auto r = run_command(train(1, 1, "--set log.dir=" + (dir_ / "m").string(), ""), 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto limit = fs::file_size(checkpoint(1)) / 2;
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    r = run_command(train(ranks, 5, "--set checkpoint.interval=1 --set log.dir=" +
                                        (dir_ / ("run" + std::to_string(ranks))).string() +
                                        " --resume auto",
                          "TRIDENT_TEST_CHECKPOINT_FILE_LIMIT=" + std::to_string(limit)),
                    60);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string line = error_line(r);
    EXPECT_NE(line.find("asynchronous checkpoint save of step 2 failed"), std::string::npos)
        << r.output;
    EXPECT_NE(line.find(ck().string() + "/step_00000002.h5.tmp-"), std::string::npos) << line;
    EXPECT_NE(line.find("File too large"), std::string::npos) << line;
    EXPECT_NE(line.find("stays 'latest'"), std::string::npos) << line;
    EXPECT_EQ(r.output.find("Segmentation"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(ck() / "latest"), "step_00000001.h5\n");
    EXPECT_FALSE(fs::exists(checkpoint(2)));
    EXPECT_TRUE(temp_files().empty());
    expect_verifies(checkpoint(1));
  }
}

// SIGKILL while an asynchronous save is being written (training going on meanwhile): the
// previous checkpoint stays `latest`, and the resumed run continues the uninterrupted one bit
// for bit.
TEST_F(AsyncCheckpoint, KilledDuringAWriteLeavesThePreviousOneSelected) {
  auto r = run_command(train(1, 14, "--set checkpoint.dir= --set log.dir=" +
                                        (dir_ / "straight").string()), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string run = train(1, 14, "--set checkpoint.interval=4 --set log.dir=" +
                                           (dir_ / "run").string());
  const std::string pid = (dir_ / "pid").string();
  r = run_command("( " + run + " > " + (dir_ / "log").string() + " 2>&1 & echo $! > " + pid +
                      " ); for i in $(seq 600); do "
                      "  if [ -f " + checkpoint(4).string() + " ] && ls " + ck().string() +
                      "/step_00000008.h5.tmp* >/dev/null 2>&1; then kill -9 $(cat " + pid +
                      "); echo killed; break; fi; sleep 0.02; done;"
                      " sleep 0.5",
                  90);
  ASSERT_NE(r.output.find("killed"), std::string::npos) << r.output << read_file(dir_ / "log");
  EXPECT_FALSE(fs::exists(checkpoint(8)));
  EXPECT_EQ(read_file(ck() / "latest"), "step_00000004.h5\n");
  r = run_command(train(1, 14, "--set checkpoint.interval=4 --set log.dir=" +
                                   (dir_ / "resumed").string() + " --resume auto"),
                  120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 4"), std::string::npos) << r.output;
  const auto straight = losses(dir_ / "straight");
  ASSERT_EQ(straight.size(), 14u);
  EXPECT_EQ(losses(dir_ / "resumed"),
            std::vector<std::string>(straight.begin() + 4, straight.end()));
}

// A stop signal while an asynchronous save is written: the job waits for that save, then
// saves the state of the step it stops at (synchronously), and exits 75 with `latest` naming
// that final checkpoint, complete.
TEST_F(AsyncCheckpoint, SignalWaitsForTheSaveInFlightThenSavesTheFinalState) {
  const fs::path out = dir_ / "out.txt";
  const std::string pid_file = (dir_ / "pid_").string();
  const auto r = run_command(
      kSlowWrites + " " + std::string(TRIDENT_MPIEXEC) + " -n 2 bash -c 'echo $$ > " +
          pid_file + "${PMI_RANK:-$OMPI_COMM_WORLD_RANK}; exec " +
          trident_cmd("train --config " + config_.string() +
                      " --set parallel.data=2 --set eval.interval=0 --set train.steps=1000"
                      " --set checkpoint.async=true --set checkpoint.interval=5"
                      " --set checkpoint.dir=" + ck().string() +
                      " --set log.dir=" + (dir_ / "run").string()) +
          "' > " + out.string() + " 2>&1 & pid=$!; trap 'kill -KILL $pid' TERM; " +
          "for i in $(seq 1500); do ls " + ck().string() + "/step_00000005.h5.tmp* >/dev/null " +
          "2>&1 && break; sleep 0.02; done; kill -TERM $(cat " + pid_file + "1); wait $pid; " +
          "rc=$?; cat " + out.string() + "; exit $rc",
      90);
  EXPECT_EQ(r.exit_code, 75) << r.output;
  const auto rows = steps_of(dir_ / "run");
  ASSERT_FALSE(rows.empty());
  const int last = rows.back()["step"].get<int>();
  EXPECT_GE(last, 5);
  EXPECT_NE(r.output.find("stopping after step " + std::to_string(last) + " of 1000"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(step 5, asynchronous)"), std::string::npos) << r.output;
  char name[64];
  std::snprintf(name, sizeof name, "step_%08d.h5", last);
  EXPECT_EQ(read_file(ck() / "latest"), std::string(name) + "\n") << r.output;
  EXPECT_TRUE(temp_files().empty());
  expect_verifies(ck() / name);
  expect_verifies(checkpoint(5));
}

// The single-process parts of lib/checkpoint: the directory protocol (checkpoint names, the
// `latest` pointer and its fallback, temp files never selected, retention with keep/protect,
// publish) and the pure helpers of the file layer (runs -> hyperslab boxes, run validation,
// the checksum, pinned to values computed independently from docs/checkpoint-format.md).
// The MPI/HDF5 parts run on 4 ranks in tests/mpi/test_checkpoint_io_np4.cpp.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <map>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/ckpt_runs.hpp"
#include "checkpoint/commit.hpp"
#include "checkpoint/h5_file.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

namespace fs = std::filesystem;
// Inside a TEST body `Run` names testing::Test::Run(); the checkpoint run is spelled R here.
using R = trident::Run;

// A fresh directory, removed afterwards.
class checkpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "trident_ckpt_XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir = templ;
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (fs::path(dir) / name).string(); }
  void touch(const std::string& name, const std::string& content = "x") const {
    std::ofstream(path(name)) << content;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(path(name));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string dir;
};

TEST(checkpointName, FormatAndParse) {
  EXPECT_EQ(checkpoint_name(100), "step_00000100.h5");
  EXPECT_EQ(checkpoint_name(0), "step_00000000.h5");
  EXPECT_EQ(checkpoint_name(123456789), "step_123456789.h5");
  EXPECT_THROW(checkpoint_name(-1), Error);
  EXPECT_EQ(checkpoint_step("step_00000100.h5"), 100);
  EXPECT_EQ(checkpoint_step("step_123456789.h5"), 123456789);
  EXPECT_EQ(checkpoint_step("step_00000100.h5.tmp-12-ab"), std::nullopt);
  EXPECT_EQ(checkpoint_step("step_.h5"), std::nullopt);
  EXPECT_EQ(checkpoint_step("step_12a.h5"), std::nullopt);
  EXPECT_EQ(checkpoint_step("latest"), std::nullopt);
  EXPECT_EQ(checkpoint_step("xstep_00000100.h5"), std::nullopt);
}

TEST_F(checkpointDir, ListSortsByStepAndIgnoresOtherFiles) {
  touch("step_00000200.h5");
  touch("step_00000010.h5");
  touch("step_1000000000.h5");  // more digits: sorted by number, not by name
  touch("step_00000300.h5.tmp-1-ff");
  touch("latest", "step_00000200.h5\n");
  touch("notes.txt");
  fs::create_directory(path("step_00000400.h5"));  // not a regular file
  const auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 10);
  EXPECT_EQ(all[1].step, 200);
  EXPECT_EQ(all[2].step, 1000000000);
  EXPECT_EQ(all[2].path, path("step_1000000000.h5"));
  EXPECT_TRUE(list_checkpoints(path("missing")).empty());
}

TEST_F(checkpointDir, LatestFollowsPointerThenFallsBack) {
  EXPECT_EQ(latest_checkpoint(dir), std::nullopt);
  EXPECT_EQ(latest_checkpoint(path("missing")), std::nullopt);
  touch("step_00000300.h5.tmp-1-ff");  // a write in progress is never selected
  EXPECT_EQ(latest_checkpoint(dir), std::nullopt);

  touch("step_00000100.h5");
  touch("step_00000200.h5");
  EXPECT_EQ(latest_checkpoint(dir), path("step_00000200.h5"));  // no pointer: newest
  touch("latest", "step_00000100.h5\n");
  EXPECT_EQ(latest_checkpoint(dir), path("step_00000100.h5"));  // the pointer wins
  touch("latest", "step_00000500.h5\n");                        // names a missing file
  EXPECT_EQ(latest_checkpoint(dir), path("step_00000200.h5"));
  touch("latest", "step_00000300.h5.tmp-1-ff\n");                // never a temp file
  EXPECT_EQ(latest_checkpoint(dir), path("step_00000200.h5"));
  touch("latest", "../step_00000100.h5\n");                      // not a checkpoint name
  EXPECT_EQ(latest_checkpoint(dir), path("step_00000200.h5"));
  touch("latest", "");
  EXPECT_EQ(latest_checkpoint(dir), path("step_00000200.h5"));
}

TEST_F(checkpointDir, PruneKeepsNewestProtectedAndLatest) {
  for (int s : {100, 200, 300, 400, 500}) touch(checkpoint_name(s));
  touch("step_00000050.h5.tmp-1-ff");  // old temp file: never touched
  touch("latest", "step_00000200.h5\n");
  const auto removed = prune_checkpoints(dir, 2, {"step_00000100.h5"});
  EXPECT_EQ(removed, (std::vector<std::string>{path("step_00000300.h5")}));
  std::set<int64_t> left;
  for (const auto& e : list_checkpoints(dir)) left.insert(e.step);
  // 400, 500: newest two; 100: protected; 200: latest.
  EXPECT_EQ(left, (std::set<int64_t>{100, 200, 400, 500}));
  EXPECT_TRUE(fs::exists(path("step_00000050.h5.tmp-1-ff")));
  EXPECT_TRUE(fs::exists(path("latest")));

  // protect by full path works too; keep 0 still keeps what latest names.
  prune_checkpoints(dir, 0, {path("step_00000400.h5")});
  left.clear();
  for (const auto& e : list_checkpoints(dir)) left.insert(e.step);
  EXPECT_EQ(left, (std::set<int64_t>{200, 400}));
  EXPECT_THROW(prune_checkpoints(dir, -1), Error);
  EXPECT_TRUE(prune_checkpoints(path("missing"), 1).empty());
}

TEST_F(checkpointDir, TempFilesOlderThanTheNewestCheckpointAreRemoved) {
  // No committed checkpoint: nothing to compare with, every temp file is kept and reported.
  touch("step_00000010.h5.tmp-1-aa");
  auto c = clean_temp_files(dir);
  EXPECT_EQ(c.kept, (std::vector<std::string>{"step_00000010.h5.tmp-1-aa"}));
  EXPECT_TRUE(c.removed.empty());
  EXPECT_NE(c.describe(dir).find("kept 1 temporary file (no committed checkpoint"),
            std::string::npos) << c.describe(dir);

  const auto now = fs::file_time_type::clock::now();
  auto age = [&](const std::string& name, int seconds) {
    fs::last_write_time(path(name), now - std::chrono::seconds(seconds));
  };
  touch("step_00000020.h5.tmp-1-bb");
  touch("step_00000030.h5.tmp-2-cc");
  touch(checkpoint_name(20));
  touch(checkpoint_name(25));
  touch("latest", checkpoint_name(20) + "\n");
  touch("notes.h5.tmp-1-dd");   // not a checkpoint's temp name: never touched
  touch("step_00000040.h5.tmp-3-ee");
  age("step_00000010.h5.tmp-1-aa", 300);
  age("step_00000020.h5.tmp-1-bb", 200);
  age("notes.h5.tmp-1-dd", 300);
  age(checkpoint_name(20), 100);  // latest names it: the newest committed one
  age("step_00000030.h5.tmp-2-cc", 50);
  age("step_00000040.h5.tmp-3-ee", 100);  // as old as the checkpoint: kept
  c = clean_temp_files(dir);
  EXPECT_EQ(c.newest, checkpoint_name(20));
  EXPECT_EQ(c.removed, (std::vector<std::string>{"step_00000010.h5.tmp-1-aa",
                                                 "step_00000020.h5.tmp-1-bb"}));
  EXPECT_EQ(c.kept, (std::vector<std::string>{"step_00000030.h5.tmp-2-cc",
                                              "step_00000040.h5.tmp-3-ee"}));
  EXPECT_FALSE(fs::exists(path("step_00000010.h5.tmp-1-aa")));
  EXPECT_TRUE(fs::exists(path("step_00000030.h5.tmp-2-cc")));
  EXPECT_TRUE(fs::exists(path("notes.h5.tmp-1-dd")));
  EXPECT_EQ(list_checkpoints(dir).size(), 2u);
  EXPECT_EQ(c.describe(dir),
            "checkpoint directory '" + dir + "': removed 2 temporary files of unfinished writes "
            "older than step_00000020.h5 (step_00000010.h5.tmp-1-aa, step_00000020.h5.tmp-1-bb); "
            "kept 2 temporary files not older than step_00000020.h5 (a write in progress?): "
            "step_00000030.h5.tmp-2-cc, step_00000040.h5.tmp-3-ee");
  // Nothing left to remove, and a directory without temp files has nothing to say.
  EXPECT_TRUE(clean_temp_files(dir).removed.empty());
  fs::remove(path("step_00000030.h5.tmp-2-cc"));
  fs::remove(path("step_00000040.h5.tmp-3-ee"));
  EXPECT_EQ(clean_temp_files(dir).describe(dir), "");
  EXPECT_EQ(clean_temp_files(path("missing")).describe(path("missing")), "");
}

TEST_F(checkpointDir, PublishRenamesAndPointsLatest) {
  touch("step_00000007.h5.tmp-9-1", "data7");
  EXPECT_EQ(publish_checkpoint(path("step_00000007.h5.tmp-9-1"), dir, 7),
            path("step_00000007.h5"));
  EXPECT_FALSE(fs::exists(path("step_00000007.h5.tmp-9-1")));
  EXPECT_EQ(read("step_00000007.h5"), "data7");
  EXPECT_EQ(read("latest"), "step_00000007.h5\n");
  EXPECT_FALSE(fs::exists(path("latest.tmp")));
  EXPECT_EQ(latest_checkpoint(dir), path("step_00000007.h5"));

  // A missing temp file: error naming it; latest unchanged.
  try {
    publish_checkpoint(path("step_00000008.h5.tmp-9-2"), dir, 8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_00000008.h5.tmp-9-2"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read("latest"), "step_00000007.h5\n");
}

// ---- runs -> boxes ----

// Row-major flat indices of the elements of `boxes`, box by box.
std::vector<int64_t> box_elements(const std::vector<int64_t>& shape, const std::vector<Box>& boxes) {
  std::vector<int64_t> out;
  for (const Box& b : boxes) {
    const size_t n = shape.size();
    std::vector<int64_t> idx(n, 0);
    int64_t total = 1;
    for (int64_t c : b.count) total *= c;
    for (int64_t k = 0; k < total; ++k) {
      int64_t flat = 0;
      for (size_t d = 0; d < n; ++d) flat = flat * shape[d] + b.start[d] + idx[d];
      out.push_back(flat);
      for (size_t d = n; d-- > 0;) {
        if (++idx[d] < b.count[d]) break;
        idx[d] = 0;
      }
    }
  }
  return out;
}

TEST(checkpointRuns, TwoDimRangeIsAtMostThreeBoxes) {
  const std::vector<int64_t> shape{37, 10};
  // Partial first row, 2 full rows, partial last row.
  auto b = flat_range_boxes(shape, 7, 3 + 20 + 4);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (Box{{0, 7}, {1, 3}}));
  EXPECT_EQ(b[1], (Box{{1, 0}, {2, 10}}));
  EXPECT_EQ(b[2], (Box{{3, 0}, {1, 4}}));
  // Whole rows only; inside one row; the whole array.
  EXPECT_EQ(flat_range_boxes(shape, 20, 30), (std::vector<Box>{{{2, 0}, {3, 10}}}));
  EXPECT_EQ(flat_range_boxes(shape, 42, 5), (std::vector<Box>{{{4, 2}, {1, 5}}}));
  EXPECT_EQ(flat_range_boxes(shape, 0, 370), (std::vector<Box>{{{0, 0}, {37, 10}}}));
  EXPECT_EQ(flat_range_boxes({5}, 1, 3), (std::vector<Box>{{{1}, {3}}}));
  EXPECT_TRUE(flat_range_boxes(shape, 5, 0).empty());
  EXPECT_THROW(flat_range_boxes(shape, 365, 6), Error);
  EXPECT_THROW(flat_range_boxes(shape, -1, 2), Error);
}

TEST(checkpointRuns, RandomRangesCoverExactlyTheirElements) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<int64_t> shape(1 + rng() % 4);
    for (auto& d : shape) d = 1 + static_cast<int64_t>(rng() % 6);
    const int64_t numel = shape_numel(shape);
    const int64_t begin = static_cast<int64_t>(rng() % numel);
    const int64_t length = static_cast<int64_t>(rng() % (numel - begin + 1));
    const auto boxes = flat_range_boxes(shape, begin, length);
    EXPECT_LE(boxes.size(), 2 * shape.size() - 1);
    std::vector<int64_t> want(length);
    for (int64_t i = 0; i < length; ++i) want[i] = begin + i;
    EXPECT_EQ(box_elements(shape, boxes), want) << shape_string(shape) << " " << begin << "+"
                                                << length;
  }
}

TEST(checkpointRuns, ColumnBlockMergesIntoOneBox) {
  // Rank 1 of 4 owning columns [3, 6) of a [37, 10] tensor: 37 runs, one box.
  std::vector<R> runs;
  for (int64_t r = 0; r < 37; ++r) runs.push_back({r * 3, r * 10 + 3, 3});
  ASSERT_EQ(normalize_runs(runs, 370, 37 * 3, true), "");
  EXPECT_EQ(runs.size(), 37u);
  EXPECT_EQ(runs_to_boxes({37, 10}, runs), (std::vector<Box>{{{0, 3}, {37, 3}}}));
  // 3-D: the last-dim slab of every matrix merges into one box as well.
  std::vector<R> r3;
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 5; ++b) r3.push_back({(a * 5 + b) * 2, (a * 5 + b) * 6 + 1, 2});
  ASSERT_EQ(normalize_runs(r3, 120, 40, true), "");
  EXPECT_EQ(runs_to_boxes({4, 5, 6}, r3), (std::vector<Box>{{{0, 0, 1}, {4, 5, 2}}}));
}

TEST(checkpointRuns, NormalizeSortsMergesAndRejects) {
  std::vector<R> runs{{10, 50, 5}, {0, 0, 10}, {15, 55, 5}, {3, 30, 0}};
  ASSERT_EQ(normalize_runs(runs, 100, 20, true), "");
  EXPECT_EQ(runs, (std::vector<R>{{0, 0, 10}, {10, 50, 10}}));

  std::vector<R> overlap{{0, 0, 10}, {10, 5, 10}};
  EXPECT_NE(normalize_runs(overlap, 100, 20, true).find("overlap in the dataset"),
            std::string::npos);
  std::vector<R> local_overlap{{0, 0, 10}, {5, 20, 10}};
  EXPECT_EQ(normalize_runs(local_overlap, 100, 20, false), "");  // writes may reuse local data
  local_overlap = {{0, 0, 10}, {5, 20, 10}};
  EXPECT_NE(normalize_runs(local_overlap, 100, 20, true).find("overlap in the local buffer"),
            std::string::npos);
  std::vector<R> past{{0, 95, 10}};
  EXPECT_NE(normalize_runs(past, 100, 20, true).find("past the dataset"), std::string::npos);
  std::vector<R> past_local{{15, 0, 10}};
  EXPECT_NE(normalize_runs(past_local, 100, 20, true).find("past the local buffer"),
            std::string::npos);
  std::vector<R> negative{{0, -1, 3}};
  EXPECT_NE(normalize_runs(negative, 100, 20, true).find("negative"), std::string::npos);
}

TEST(checkpointRuns, SubsetOfReadRuns) {
  const std::vector<R> read{{0, 0, 10}, {10, 50, 10}};
  EXPECT_EQ(runs_subset({{2, 2, 8}, {10, 50, 3}}, read), "");
  EXPECT_EQ(runs_subset({}, read), "");
  EXPECT_NE(runs_subset({{0, 5, 10}}, read), "");   // 10..14 not read
  EXPECT_NE(runs_subset({{1, 50, 3}}, read), "");   // read, but to other local positions
}

TEST(checkpointRuns, ChecksumMatchesTheSpec) {
  // Values computed with the formula of docs/checkpoint-format.md in Python.
  const std::vector<float> v{1.0f, -2.5f, 0.0f, 3.25f};
  EXPECT_EQ(checksum_range(v.data(), 0, 4), 0x995d61e72885f696ull);
  EXPECT_EQ(checksum_range(v.data(), 0, 2), 0xc0be51522cf2bd37ull);
  EXPECT_EQ(checksum_range(v.data() + 2, 2, 2), 0xd89f1094fb93395full);
  // Parts add up, in any order, from any local layout.
  const std::vector<float> local{0.0f, 3.25f, 1.0f, -2.5f};
  EXPECT_EQ(checksum_runs(local, {{2, 0, 2}, {0, 2, 2}}), 0x995d61e72885f696ull);
  const float neg_zero = -0.0f;
  EXPECT_EQ(checksum_range(&neg_zero, 0, 1), 0xec105bf588587c9full);  // bits, not value
}

TEST(checkpointAttributes, SealMatchesTheSpec) {
  // Value computed with attributes_checksum() of tests/checkpoint_h5py.py (the Python of
  // docs/checkpoint-format.md) from the same attributes as h5py reads them.
  std::map<std::string, AttributeValue> a;
  auto add = [&](const char* key, AttributeValue::Kind kind) -> AttributeValue& {
    AttributeValue& v = a[key];
    v.kind = kind;
    return v;
  };
  add("step", AttributeValue::Kind::Int).i = 3;
  add("lr", AttributeValue::Kind::Double).d = 0.1;
  add("layout", AttributeValue::Kind::String).text = "tensor=2";
  add("checksum", AttributeValue::Kind::Uint).u = UINT64_MAX;
  add("neg", AttributeValue::Kind::Int).i = -7;
  add(kAttributesChecksumKey, AttributeValue::Kind::Uint).u = 5;  // not part of itself
  EXPECT_EQ(attributes_checksum(a), 0x1f78f573ebeda4dcull);
  EXPECT_EQ(attributes_checksum({}), 0xcbf29ce484222325ull);  // FNV-1a's offset basis
  // Any change of a name, a value or a type changes it.
  const uint64_t sealed = attributes_checksum(a);
  auto changed = [&](auto&& change) {
    auto b = a;
    change(b);
    return attributes_checksum(b);
  };
  EXPECT_NE(changed([](auto& b) { b["step"].i = 7; }), sealed);
  EXPECT_NE(changed([](auto& b) { b["step"].kind = AttributeValue::Kind::Double, b["step"].d = 3; }),
            sealed);
  EXPECT_NE(changed([](auto& b) { b["layout"].text = "tensor=9"; }), sealed);
  EXPECT_NE(changed([](auto& b) { b.erase("neg"); }), sealed);
  AttributeValue other;  // a type Trident does not read
  other.text = "int32 array of 3 elements";
  EXPECT_THROW(changed([&](auto& b) { b["x"] = other; }), Error);
}

TEST(checkpointValues, FirstOffendingElementIsNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v{1.0f, -0.0f, -2.0f, nan, inf};
  EXPECT_EQ(check_values(v.data(), 0, 5, ValueCheck::Any), "");
  EXPECT_EQ(check_values(v.data(), 0, 3, ValueCheck::Finite), "");
  EXPECT_EQ(check_values(v.data(), 10, 5, ValueCheck::Finite), "holds nan at element 13");
  EXPECT_EQ(check_values(v.data() + 4, 4, 1, ValueCheck::Finite), "holds inf at element 4");
  EXPECT_EQ(check_values(v.data(), 0, 2, ValueCheck::FiniteNonNegative), "");  // -0.0 is >= 0
  EXPECT_EQ(check_values(v.data(), 0, 5, ValueCheck::FiniteNonNegative),
            "holds -2 at element 2 (must be >= 0)");
  // Over runs: global order, local positions anywhere.
  EXPECT_EQ(check_values_runs(v, {{3, 100, 1}, {2, 50, 1}}, ValueCheck::FiniteNonNegative),
            "holds -2 at element 50 (must be >= 0)");
}

}  // namespace
}  // namespace trident

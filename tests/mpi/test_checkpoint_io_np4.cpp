// The checkpoint file layer on 4 ranks: tensors written by rows (uneven, one rank empty), by
// columns, by a flat ZeRO-like partition crossing rows (with a non-contiguous local layout),
// replicated (written by one rank), 1-D; read back with other partitions, values exact; the
// checksum catches one flipped byte; attributes round-trip; every error (missing/non-HDF5/
// truncated file, missing dataset, shape mismatch, a bad run on one rank, a simulated full
// disk) is thrown on every rank; the atomic commit leaves `latest` untouched on failure; a
// missing checksum attribute is an error, values are checked (ReaderOptions::value_check) and
// sealed root attributes catch a change; check_checkpoint refuses at once a stored model larger
// than the file.
// Collectives are few per test: MPICH busy-polls and 4 ranks share 2 cores.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/commit.hpp"
#include "checkpoint/h5_file.hpp"
#include "config/config.hpp"
#include "model/architecture.hpp"
#include "train/checkpointing.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

namespace fs = std::filesystem;
// Inside a TEST body `Run` names testing::Test::Run(); the checkpoint run is spelled R here.
using R = trident::Run;
using Runs = std::vector<trident::Run>;

constexpr int64_t kRows = 37, kCols = 10, kN = kRows * kCols;
// A string attribute longer than an object header holds (64 KiB), with a multi-byte character.
const std::string kLongText = std::string(100000, 'x') + "\u00fc";

// A distinct, exactly representable value for every element of every tensor.
float value(int tensor, int64_t i) { return static_cast<float>(tensor * 1000 + i) * 0.25f - 7.0f; }

// The part [b[r], b[r+1]) of a partition, for this rank.
struct Part {
  int64_t begin, end;
};
Part part(const std::vector<int64_t>& bounds, int r) { return {bounds[r], bounds[r + 1]}; }

class CkptIo : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    ASSERT_EQ(n, 4);
    std::string d;
    if (r == 0) {
      std::string templ = (fs::temp_directory_path() / "trident_ckpt_io_XXXXXX").string();
      d = mkdtemp(templ.data()) ? templ : "";
    }
    int64_t len = static_cast<int64_t>(d.size());
    MPI_Bcast(&len, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    d.resize(len);
    MPI_Bcast(d.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
    ASSERT_FALSE(d.empty());
    dir = d;
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) fs::remove_all(dir);
  }
  std::string path(const std::string& name) const { return (fs::path(dir) / name).string(); }
  // The string attributes are fixed-length: inside the attribute messages that the 1.8 format
  // checksums, not in the global heap that holds variable-length strings, which no HDF5 format
  // checksums (a damaged one crashed the library's reader: docs/fuzzing.md).
  static void expect_fixed_length_strings(
      const std::string& file, const std::vector<std::pair<std::string, std::string>>& attrs) {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0) << file;
    int checked = 0;
    for (const auto& [object, key] : attrs) {
      const hid_t a = H5Aopen_by_name(f, object.c_str(), key.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      ASSERT_GE(a, 0) << object << " " << key;
      const hid_t type = H5Aget_type(a);
      EXPECT_EQ(H5Tget_class(type), H5T_STRING) << object << " " << key;
      EXPECT_EQ(H5Tis_variable_str(type), 0) << object << " " << key;
      EXPECT_EQ(H5Tget_cset(type), H5T_CSET_UTF8) << object << " " << key;
      H5Tclose(type);
      H5Aclose(a);
      ++checked;
    }
    H5Fclose(f);
    EXPECT_EQ(checked, static_cast<int>(attrs.size()));
    EXPECT_GT(checked, 0);
  }

  void round_trip(bool collective);

  // Runs of a row-block partition of the [37, 10] tensor; local = those rows.
  Runs row_runs(Part p) const {
    if (p.end == p.begin) return {};
    return {R{0, p.begin * kCols, (p.end - p.begin) * kCols}};
  }
  // Runs of a column-block partition; local = [37, width] row-major.
  Runs col_runs(Part p) const {
    Runs out;
    const int64_t w = p.end - p.begin;
    for (int64_t row = 0; row < kRows && w > 0; ++row) out.push_back(R{row * w, row * kCols + p.begin, w});
    return out;
  }
  // Local buffer holding `runs` of tensor t.
  static std::vector<float> fill(int t, const Runs& runs, int64_t local_size) {
    std::vector<float> v(local_size, -1e9f);
    for (const R& run : runs)
      for (int64_t k = 0; k < run.length; ++k) v[run.local_offset + k] = value(t, run.global_offset + k);
    return v;
  }
  // Expects local to hold exactly `runs` of tensor t.
  static void expect_holds(int t, const Runs& runs, const std::vector<float>& v) {
    int bad = 0;
    for (const R& run : runs)
      for (int64_t k = 0; k < run.length; ++k)
        if (v[run.local_offset + k] != value(t, run.global_offset + k) && bad++ < 3)
          ADD_FAILURE() << "tensor " << t << " element " << run.global_offset + k;
    EXPECT_EQ(bad, 0);
  }

  int r = 0, n = 0;
  std::string dir;
};

// Runs `f` expecting a trident::Error on this rank whose message contains every `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one containing '" << parts.front() << "')";
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n lacks: " << p;
  }
}

const std::vector<int64_t> kRowBounds{0, 12, 20, 37, 37};  // uneven; rank 3 owns nothing
const std::vector<int64_t> kColBounds{0, 3, 6, 8, 10};
const std::vector<int64_t> kFlatBounds{0, 55, 56, 201, 370};  // crosses rows
const std::vector<int64_t> kShape{kRows, kCols};

TEST_F(CkptIo, PartitionsRoundTripExactly) { round_trip(false); }
TEST_F(CkptIo, PartitionsRoundTripExactlyCollective) { round_trip(true); }

// Writes each tensor with one partition and reads it back with another.
void CkptIo::round_trip(bool collective) {
  const std::string file = path("a.h5");
  {
    CheckpointWriter w(file, MPI_COMM_WORLD, WriterOptions{.collective_data = collective});
    // 1: by rows.
    Runs rows = row_runs(part(kRowBounds, r));
    w.write_tensor("/model/rows", kShape, rows, fill(1, rows, runs_length(rows)));
    // 2: by columns.
    Runs cols = col_runs(part(kColBounds, r));
    w.write_tensor("/model/cols", kShape, cols, fill(2, cols, runs_length(cols)));
    // 3: flat partition; rank 2 keeps its piece's halves swapped in memory (staging path).
    Part f = part(kFlatBounds, r);
    Runs flat{R{0, f.begin, f.end - f.begin}};
    if (r == 2) {
      const int64_t half = (f.end - f.begin) / 2, rest = f.end - f.begin - half;
      flat = {R{rest, f.begin, half}, R{0, f.begin + half, rest}};
    }
    w.write_tensor("model/flat/", kShape, flat, fill(3, flat, f.end - f.begin));
    // 4: replicated, written by rank 1 only.
    Runs rep = r == 1 ? Runs{R{0, 0, kN}} : Runs{};
    w.write_tensor("/model/replicated", kShape, rep, fill(4, Runs{R{0, 0, kN}}, kN));
    // 5: 1-D.
    const std::vector<int64_t> b1{0, 400, 401, 700, 1000};
    Runs one{R{0, b1[r], b1[r + 1] - b1[r]}};
    w.write_tensor("/opt/m", {1000}, one, fill(5, one, b1[r + 1] - b1[r]));
    // 6: no elements at all.
    w.write_tensor("/opt/empty", {0, 4}, {}, {});

    w.set_attribute("/", "step", int64_t{123});
    w.set_attribute("/", "lr", 6e-4);
    w.set_attribute("/", "config", std::string("[model]\nn_layer = 2\nname = \"ünïcode\"\n"));
    w.set_attribute("/model/rows", "note", "by rows");
    w.set_attribute("/meta/run", "version", 3);  // int -> int64; creates /meta/run
    w.set_attribute("/", "empty", std::string());
    // Past an object header's 64 KiB: HDF5 keeps it in the group's dense attribute storage.
    w.set_attribute("/meta/run", "long", kLongText);
    w.set_attribute("/", "step", int64_t{124});  // replaces
    w.set_attribute("/", "rank", r);               // rank 0's value is written
    EXPECT_EQ(w.data_bytes(), (4 * kN + 1000) * 4);
    w.close();
  }

  CheckpointReader rd(file, MPI_COMM_WORLD, ReaderOptions{.collective_data = collective});
  EXPECT_EQ(rd.datasets(), (std::vector<std::string>{"/model/cols", "/model/flat", "/model/replicated",
                                                     "/model/rows", "/opt/empty", "/opt/m"}));
  EXPECT_EQ(rd.shape("/opt/empty"), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(rd.shape("/model/rows"), kShape);
  EXPECT_EQ(rd.shape("opt/m"), (std::vector<int64_t>{1000}));
  EXPECT_TRUE(rd.has_dataset("/model/flat"));
  EXPECT_FALSE(rd.has_dataset("/model"));
  EXPECT_EQ(rd.attribute_int("/", "step"), 124);
  EXPECT_EQ(rd.attribute_int("/", "rank"), 0);
  EXPECT_EQ(rd.attribute_double("/", "lr"), 6e-4);
  EXPECT_EQ(rd.attribute_string("/", "config"), "[model]\nn_layer = 2\nname = \"ünïcode\"\n");
  EXPECT_EQ(rd.attribute_string("/model/rows", "note"), "by rows");
  EXPECT_EQ(rd.attribute_int("/meta/run", "version"), 3);
  EXPECT_EQ(rd.attribute_string("/", "empty"), "");
  EXPECT_EQ(rd.attribute_string("/meta/run", "long"), kLongText);
  EXPECT_TRUE(rd.has_attribute("/model/cols", "checksum"));
  EXPECT_FALSE(rd.has_attribute("/", "nope"));
  EXPECT_EQ(rd.attributes("/"),
            (std::vector<std::string>{"config", "empty", "lr", "rank", "step"}));

  // rows-written tensor read by columns, columns-written by rows (rank 3 reads nothing).
  Runs cols = col_runs(part(kColBounds, r));
  std::vector<float> a(runs_length(cols));
  rd.read_tensor("/model/rows", kShape, cols, a);
  expect_holds(1, cols, a);
  Runs rows = row_runs(part(kRowBounds, r));
  std::vector<float> b(runs_length(rows));
  rd.read_tensor("/model/cols", kShape, rows, b);
  expect_holds(2, rows, b);
  // flat tensor: every rank reads it whole, each counting another flat part.
  std::vector<float> c(kN);
  const std::vector<int64_t> own{0, 100, 200, 300, 370};
  rd.read_tensor("/model/flat", kShape, {R{0, 0, kN}}, c,
                 ChecksumShare::only({R{own[r], own[r], own[r + 1] - own[r]}}));
  expect_holds(3, {R{0, 0, kN}}, c);
  // replicated: every rank reads all (scattered into a reversed-rows local layout on rank 0);
  // rank 3 alone counts it.
  Runs all_rows;
  for (int64_t row = 0; row < kRows; ++row) all_rows.push_back(R{(kRows - 1 - row) * kCols, row * kCols, kCols});
  std::vector<float> d(kN);
  const Runs& rep_runs = r == 0 ? all_rows : Runs{R{0, 0, kN}};
  rd.read_tensor("/model/replicated", kShape, rep_runs, d,
                 r == 3 ? ChecksumShare::all() : ChecksumShare::none());
  expect_holds(4, rep_runs, d);
  // 1-D, another partition, nobody counting (no check).
  const std::vector<int64_t> b1{0, 250, 500, 750, 1000};
  Runs one{R{0, b1[r], 250}};
  std::vector<float> e(250);
  rd.read_tensor("/opt/m", {1000}, one, e, ChecksumShare::none());
  rd.read_tensor("/opt/empty", {0, 4}, {}, {});
  rd.finish();
  expect_holds(5, one, e);
  rd.verify_all(64);  // several rounds per dataset
  rd.close();
  expect_fixed_length_strings(file, {{"/", "config"}, {"/", "empty"}, {"/model/rows", "note"},
                                     {"/meta/run", "long"}});
}

TEST_F(CkptIo, ChecksumCatchesOneFlippedByte) {
  const std::string file = path("b.h5");
  {
    CheckpointWriter w(file, MPI_COMM_WORLD);
    Runs rows = row_runs(part(kRowBounds, r));
    w.write_tensor("/x/bad", kShape, rows, fill(1, rows, runs_length(rows)));
    w.write_tensor("/x/good", kShape, rows, fill(2, rows, runs_length(rows)));
    w.close();
  }
  if (r == 0) {  // flip one byte of /x/bad's data with plain file I/O
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/x/bad", H5P_DEFAULT);
    const haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    ASSERT_NE(off, HADDR_UNDEF);
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(off + 4 * 123 + 1));
    char byte = 0;
    io.read(&byte, 1);
    byte ^= 0x10;
    io.seekp(static_cast<std::streamoff>(off + 4 * 123 + 1));
    io.write(&byte, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CheckpointReader rd(file, MPI_COMM_WORLD);
  Runs cols = col_runs(part(kColBounds, r));
  std::vector<float> a(runs_length(cols));
  expect_error(
      [&] {
        rd.read_tensor("/x/bad", kShape, cols, a);
        rd.finish();
      },
      {"checkpoint '" + file + "': dataset '/x/bad' is corrupt (checksum mismatch)"});
  rd.read_tensor("/x/good", kShape, cols, a);
  rd.finish();
  expect_holds(2, cols, a);
  expect_error([&] { rd.verify_all(); }, {"'/x/bad' is corrupt"});
}

TEST_F(CkptIo, FileErrorsOnEveryRank) {
  expect_error([&] { CheckpointReader(path("missing.h5"), MPI_COMM_WORLD); },
               {path("missing.h5"), "No such file"});
  if (r == 0) std::ofstream(path("text.h5")) << "not hdf5 at all";
  MPI_Barrier(MPI_COMM_WORLD);
  expect_error([&] { CheckpointReader(path("text.h5"), MPI_COMM_WORLD); },
               {path("text.h5"), "not an HDF5 file"});
  {
    CheckpointWriter w(path("t.h5"), MPI_COMM_WORLD);
    Runs one{R{0, r * 100000, 100000}};
    w.write_tensor("/big", {400000}, one, std::vector<float>(100000, 1.0f));
    w.close();
  }
  if (r == 0) fs::resize_file(path("t.h5"), fs::file_size(path("t.h5")) / 2);
  MPI_Barrier(MPI_COMM_WORLD);
  expect_error([&] { CheckpointReader(path("t.h5"), MPI_COMM_WORLD); }, {path("t.h5"), "truncated"});
  // Writers: an existing file without overwrite; a missing directory.
  expect_error([&] { CheckpointWriter(path("t.h5"), MPI_COMM_WORLD); }, {path("t.h5"), "already exists"});
  expect_error([&] { CheckpointWriter(path("no/such/x.h5"), MPI_COMM_WORLD); },
               {path("no/such/x.h5"), "No such file"});
}

TEST_F(CkptIo, DatasetErrorsOnEveryRank) {
  const std::string file = path("c.h5");
  Runs rows = row_runs(part(kRowBounds, r));
  const auto local = fill(1, rows, runs_length(rows));
  {
    CheckpointWriter w(file, MPI_COMM_WORLD);
    w.write_tensor("/w", kShape, rows, local);
    expect_error([&] { w.write_tensor("/w", kShape, rows, local); }, {"'/w'", "written twice"});
    w.close();
  }
  // Errors only some ranks see are agreed on (at close with independent transfers): a bad run
  // on rank 2 only; elements nobody writes (rank 0 writes nothing).
  Runs bad = rows;
  if (r == 2) bad[0].length += 1;
  expect_error(
      [&] {
        CheckpointWriter w(path("c2.h5"), MPI_COMM_WORLD);
        w.write_tensor("/w2", kShape, bad, local);
        w.close();
      },
      {"dataset '/w2'", "rank 2", "goes past the dataset's 370 elements"});
  expect_error(
      [&] {
        CheckpointWriter w(path("c3.h5"), MPI_COMM_WORLD, WriterOptions{.collective_data = true});
        w.write_tensor("/w3", kShape, bad, local);  // collective: agreed before writing
        w.close();
      },
      {"dataset '/w3'", "rank 2", "goes past the dataset's 370 elements"});
  expect_error(
      [&] {
        CheckpointWriter w(path("c4.h5"), MPI_COMM_WORLD);
        w.write_tensor("/w4", kShape, r == 0 ? Runs{} : rows, local);
        w.close();
      },
      {"dataset '/w4'", "wrote 250 elements in total, the dataset has 370"});
  CheckpointReader rd(file, MPI_COMM_WORLD);
  std::vector<float> buf(kN);
  expect_error([&] { rd.read_tensor("/model/nope", kShape, {}, buf); },
               {"checkpoint '" + file + "'", "no dataset '/model/nope'"});
  expect_error([&] { rd.shape("/nope"); }, {"no dataset '/nope'"});
  expect_error([&] { rd.read_tensor("/w", {10, 37}, {}, buf); },
               {"dataset '/w'", "expected [10, 37], found [37, 10]"});
  Runs bad_read{R{0, r == 1 ? kN - 5 : 0, 10}};
  expect_error(
      [&] {
        rd.read_tensor("/w", kShape, bad_read, buf, ChecksumShare::none());
        rd.finish();
      },
      {"dataset '/w'", "rank 1", "past the dataset"});
  // Everybody counting a whole replicated read: meaningless, hence an error.
  expect_error(
      [&] {
        rd.read_tensor("/w", kShape, {R{0, 0, kN}}, buf);
        rd.finish();
      },
      {"counted 1480 elements toward the checksum, the dataset has 370"});
  expect_error([&] { rd.attribute_int("/", "step"); }, {"'/' has no attribute 'step'"});
  expect_error([&] { rd.attribute_string("/w", "checksum"); },
               {"'/w' attribute 'checksum' is an unsigned integer, expected a string"});
}

TEST_F(CkptIo, CommitIsAtomic) {
  const std::string ck = path("ckpt");
  auto writes = [&](int t) {
    return [&, t](CheckpointWriter& w) {
      Runs rows = row_runs(part(kRowBounds, r));
      w.write_tensor("/t", kShape, rows, fill(t, rows, runs_length(rows)));
      w.set_attribute("/", "step", int64_t{t});
    };
  };
  EXPECT_EQ(write_checkpoint(ck, 100, MPI_COMM_WORLD, writes(1)), ck + "/step_00000100.h5");
  EXPECT_EQ(latest_checkpoint(ck), ck + "/step_00000100.h5");
  // A failure on one rank inside the write (a bad run): error everywhere, no temp file left,
  // latest untouched.
  expect_error(
      [&] {
        write_checkpoint(ck, 200, MPI_COMM_WORLD, [&](CheckpointWriter& w) {
          Runs rows = row_runs(part(kRowBounds, r));
          if (r == 1) rows[0].global_offset = kN;
          w.write_tensor("/t", kShape, rows, fill(2, row_runs(part(kRowBounds, r)), runs_length(rows)));
        });
      },
      {"step_00000200.h5.tmp-", "rank 1"});
  // A simulated full disk: while the 2 MB tensor is written, a process may write at most
  // 256 KiB into a file (RLIMIT_FSIZE: writes fail with EFBIG). The limit goes as soon as the
  // error is out, as space would on a real disk once the temp file is emptied.
  struct rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);
  expect_error(
      [&] {
        write_checkpoint(ck, 300, MPI_COMM_WORLD, [&](CheckpointWriter& w) {
          struct rlimit small = old;
          small.rlim_cur = 256 << 10;
          setrlimit(RLIMIT_FSIZE, &small);
          try {
            Runs one{R{0, r * 131072, 131072}};
            w.write_tensor("/big", {4 * 131072}, one, std::vector<float>(131072, 2.0f));
          } catch (...) {
            setrlimit(RLIMIT_FSIZE, &old);
            throw;
          }
          setrlimit(RLIMIT_FSIZE, &old);
        });
      },
      {"step_00000300.h5.tmp-", "dataset '/big'", "write failed", "File too large"});
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000100.h5"}));
  EXPECT_EQ(latest_checkpoint(ck), ck + "/step_00000100.h5");
  // The survivor is intact.
  CheckpointReader rd(ck + "/step_00000100.h5", MPI_COMM_WORLD);
  EXPECT_EQ(rd.attribute_int("/", "step"), 1);
  rd.verify_all();
  rd.close();
  // A directory that cannot be created (a file is in the way).
  if (r == 0) std::ofstream(path("a.h5")) << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  expect_error([&] { write_checkpoint(path("a.h5/sub"), 1, MPI_COMM_WORLD, writes(1)); },
               {"checkpoint directory '" + path("a.h5/sub") + "'"});
}

TEST_F(CkptIo, ChecksumsRequiredValuesCheckedAttributesSealed) {
  const std::string file = path("v.h5");
  const int64_t nan_at = 25 * kCols + 3;  // in rank 2's rows when written
  {
    CheckpointWriter w(file, MPI_COMM_WORLD);
    const Runs rows = row_runs(part(kRowBounds, r));
    std::vector<float> local = fill(1, rows, runs_length(rows));
    if (r == 2) local[nan_at - kRowBounds[2] * kCols] = std::nanf("");
    w.write_tensor("/w", kShape, rows, local);
    w.write_tensor("/v", {4}, r == 0 ? Runs{R{0, 0, 4}} : Runs{},
                   std::vector<float>{1.0f, 2.0f, -3.0f, 4.0f});
    w.set_attribute("/", "step", int64_t{5});
    w.set_attribute("/", "name", "x");
    w.seal_attributes("/");
    w.close();
  }
  ReaderOptions opts;
  opts.value_check = [](const std::string& name) {
    return name == "/v" ? ValueCheck::FiniteNonNegative : ValueCheck::Finite;
  };
  {
    CheckpointReader rd(file, MPI_COMM_WORLD, opts);
    rd.verify_attributes("/");
    // Each rank reads another part than it wrote; whoever reads the NaN, every rank throws.
    const Part mine = part(kFlatBounds, r);
    std::vector<float> buf(static_cast<size_t>(mine.end - mine.begin));
    const Runs flat = mine.end > mine.begin ? Runs{R{0, mine.begin, mine.end - mine.begin}} : Runs{};
    expect_error([&] { rd.read_tensor("/w", kShape, flat, buf); rd.finish(); },
                 {"dataset '/w' holds nan at element " + std::to_string(nan_at)});
    expect_error([&] { rd.verify("/w"); }, {"dataset '/w' holds nan"});
    expect_error([&] { rd.verify("/v"); }, {"dataset '/v' holds -3 at element 2 (must be >= 0)"});
    rd.close();
  }
  // Rank 0 damages the file with HDF5 itself: /w loses its checksum, the root an attribute.
  if (r == 0) {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT_GE(H5Adelete_by_name(f, "/w", "checksum", H5P_DEFAULT), 0);
    EXPECT_GE(H5Adelete(f, "name"), 0);
    EXPECT_GE(H5Fclose(f), 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CheckpointReader rd(file, MPI_COMM_WORLD, opts);
  expect_error([&] { rd.verify_attributes("/"); },
               {"the attributes of '/' are corrupt (attributes_checksum mismatch)"});
  expect_error([&] { rd.verify("/w"); }, {"dataset '/w' has no 'checksum' attribute"});
  std::vector<float> all(kN);
  expect_error(
      [&] {
        rd.read_tensor("/w", kShape, {R{0, 0, kN}}, all,
                       r == 0 ? ChecksumShare::all() : ChecksumShare::none());
      },
      {"dataset '/w' has no 'checksum' attribute"});
  rd.close();
}

TEST_F(CkptIo, SlowHookSleepsAfterEachDataset) {
  setenv("TRIDENT_TEST_SLOW_CHECKPOINT_MS", "60", 1);
  const auto t0 = std::chrono::steady_clock::now();
  {
    CheckpointWriter w(path("s.h5"), MPI_COMM_WORLD);
    unsetenv("TRIDENT_TEST_SLOW_CHECKPOINT_MS");
    Runs none;
    Runs all = r == 0 ? Runs{R{0, 0, 4}} : none;
    w.write_tensor("/a", {4}, all, std::vector<float>(4, 1.0f));
    w.write_tensor("/b", {4}, all, std::vector<float>(4, 1.0f));
    w.close();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.12);
}

// Found with tests/fuzz/fuzz_checkpoint (a hand-made input, corpus: huge_stored_model): a
// checkpoint whose stored config (sealed, consistent with the root attributes) describes 10^8
// layers made check_checkpoint build that model's parameter list (minutes, gigabytes) before
// it noticed the missing datasets. Refused at once, naming the file, on every rank.
TEST_F(CkptIo, AStoredModelLargerThanTheFileIsRefusedAtOnce) {
  const std::string file = path("huge.h5");
  const Config huge =
      parse_config("[model]\nlayers = 100000000\n[data]\ntrain = \"x.bin\"\n", "huge.toml");
  {
    CheckpointWriter w(file, MPI_COMM_WORLD);
    write_checkpoint_attributes(w, huge, CheckpointProgress{});
    w.write_tensor("/model/wte/weight", {2}, r == 0 ? Runs{R{0, 0, 2}} : Runs{},
                   std::vector<float>{1.0f, 2.0f});
    w.close();
  }
  CheckpointReader rd(file, MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)check_checkpoint(rd);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("checkpoint '" + file + "': the stored config's model has 100000000 "
                        "layers, more than the file's 1 datasets can hold"),
              std::string::npos)
        << what;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  rd.close();
}

// What check_checkpoint says of `file`: its error, or "accepted".
std::string check_checkpoint_error(const std::string& file) {
  CheckpointReader rd(file, MPI_COMM_WORLD);
  std::string what = "accepted";
  try {
    (void)check_checkpoint(rd);
  } catch (const Error& e) {
    what = e.what();
  }
  rd.close();
  return what;
}

// Found by the suite's 20 s run of tests/fuzz/fuzz_checkpoint (corpus: newline_in_model_arch):
// a model_arch root attribute holding a newline (sealed, so only its value is wrong) made the
// mismatch with the stored config's model.arch two lines. The file's text is quoted with its
// control characters escaped: one line, naming the file, on every rank.
TEST_F(CkptIo, ModelArchFromTheFileStaysOnOneLine) {
  const std::string file = path("arch.h5");
  const Config config = parse_config("[model]\nlayers = 1\n[data]\ntrain = \"x.bin\"\n", "a.toml");
  {
    CheckpointWriter w(file, MPI_COMM_WORLD);
    write_checkpoint_attributes(w, config, CheckpointProgress{});
    w.set_attribute("/", "model_arch", std::string("l]\nx\"y"));  // sealed at close
    w.close();
  }
  EXPECT_EQ(check_checkpoint_error(file),
            "checkpoint '" + file + "': model_arch = \"l]\\nx\\\"y\", but the stored "
            "config's model.arch = \"gpt2\"");
}

// A dataset name comes from the file too: one the stored model lacks, holding a newline, is
// named quoted with the newline escaped (one line, naming the file, on every rank).
TEST_F(CkptIo, AnUnexpectedDatasetNameStaysOnOneLine) {
  const std::string file = path("extra.h5");
  const Config config = parse_config(
      "[model]\nlayers = 1\nheads = 2\nwidth = 4\nvocab_size = 8\nseq_len = 4\n"
      "[data]\ntrain = \"x.bin\"\n", "e.toml");
  {
    CheckpointWriter w(file, MPI_COMM_WORLD);
    write_checkpoint_attributes(w, config, CheckpointProgress{});
    const auto write_zeros = [&](const std::string& name, const std::vector<int64_t>& shape) {
      int64_t numel = 1;
      for (const int64_t d : shape) numel *= d;
      w.write_tensor(name, shape, r == 0 ? Runs{R{0, 0, numel}} : Runs{},
                     std::vector<float>(r == 0 ? numel : 0, 0.0f));
    };
    int written = 0;
    for (const ParamInfo& p : global_parameters(config.model))
      for (const char* root : {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"}) {
        write_zeros(dataset_path(root, p.name), p.global_shape);
        ++written;
      }
    EXPECT_GT(written, 3);
    write_zeros("/model/extra\nline", {2});
    w.close();
  }
  EXPECT_EQ(check_checkpoint_error(file),
            "checkpoint '" + file + "': unexpected dataset \"/model/extra\\nline\" (not in the "
            "stored config's model)");
}

}  // namespace
}  // namespace trident

// `trident train` says what GEMM it runs on (one start-up line on rank 0: oneDNN's sgemm, or
// OpenBLAS's under TRIDENT_SGEMM=openblas; OpenBLAS's dgemm), refuses a bad TRIDENT_SGEMM in one
// line, forces the OpenBLAS kernel that fits the core by running itself again before MPI_Init, undoes a kernel that computes
// wrong results, keeps a user's OPENBLAS_CORETYPE, and warns when the GEMM is far below what
// the core's FMAs reach. TRIDENT_TEST_GEMM_CORENAME / TRIDENT_TEST_GEMM_WRONG pretend what
// OpenBLAS picked alone and a wrong result (lib/kernels/cpu/blas.cpp), so that every path runs
// on any machine.
#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include "app_fixture.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "sanitizer.hpp"

namespace trident::test {
namespace {

// The start-up lines that begin with "gemm: ".
std::vector<std::string> gemm_lines(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("gemm: ", 0) == 0) out.push_back(line);
  return out;
}

// The one "gemm: " line of a run that worked; "" after a failure when the run failed or did
// not say it exactly once.
std::string only_gemm_line(const RunResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto lines = gemm_lines(r.output);
  EXPECT_EQ(lines.size(), 1u) << r.output;
  return r.exit_code == 0 && lines.size() == 1 ? lines[0] : "";
}

// The environment Trident's choice starts from: no kernel set by anyone.
const std::string kClean = "env -u OPENBLAS_CORETYPE -u TRIDENT_GEMM_KERNEL -u TRIDENT_SGEMM ";

class GemmApp : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = make_tiny_run(dir_);
  }
  RunResult train(const std::string& env, const std::string& launcher = "",
                  const std::string& extra = "") {
    return run_command(env + launcher + trident_cmd("train --config " + config_.string() +
                                                    " --set train.steps=2 --set eval.interval=0" +
                                                    extra));
  }
  std::filesystem::path dir_, config_;
};

std::string usable_kernel() {
  return cpu::avx512_usable(cpu::read_cpu_features()) ? "SkylakeX" : "Haswell";
}

TEST_F(GemmApp, StartUpLineNamesLibraryKernelAndCore) {
  const std::string line = only_gemm_line(train(kClean));
  const cpu::CpuFeatures f = cpu::read_cpu_features();
  EXPECT_EQ(line.rfind("gemm: sgemm oneDNN ", 0), 0u) << line;
  EXPECT_NE(line.find(", dgemm OpenBLAS "), std::string::npos) << line;
  EXPECT_NE(line.find(", kernel "), std::string::npos) << line;
  EXPECT_NE(line.find(", core " + cpu::isa_name(f) + " (" + f.vendor), std::string::npos) << line;
  EXPECT_NE(line.find("; sgemm probe "), std::string::npos) << line;

  // OpenBLAS for float too, when asked.
  const std::string oline = only_gemm_line(train(kClean + "TRIDENT_SGEMM=openblas "));
  EXPECT_EQ(oline.rfind("gemm: sgemm and dgemm OpenBLAS ", 0), 0u) << oline;
  EXPECT_NE(oline.find("(TRIDENT_SGEMM=openblas as set), kernel "), std::string::npos) << oline;
}

// oneDNN capped at AVX2 (what an AVX2 core such as AMD Zen 3 runs): the line says that A^T B
// runs on OpenBLAS, and the run trains to the losses of the uncapped one within rounding.
TEST_F(GemmApp, OneDnnCappedAtAvx2HandsATransposedBToOpenBlas) {
  if (cpu::fma_vector_bits(cpu::read_cpu_features()) == 0)
    GTEST_SKIP() << "no AVX2/FMA on this core: oneDNN cannot run its AVX2 kernels here";
  const auto step_losses = [&] {
    std::vector<double> out;
    for (const auto& row : read_metrics(dir_ / "run"))
      if (!row.contains("type")) out.push_back(row.at("loss").get<double>());
    return out;
  };
  const std::string line = only_gemm_line(train(kClean + "ONEDNN_MAX_CPU_ISA=AVX2 "));
  EXPECT_NE(line.find("(JIT kernels up to avx2) with A^T B on OpenBLAS, dgemm OpenBLAS "),
            std::string::npos)
      << line;
  const std::vector<double> a = step_losses();
  std::filesystem::remove_all(dir_ / "run");
  EXPECT_NE(only_gemm_line(train(kClean)), "");
  const std::vector<double> b = step_losses();
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4) << "step " << i + 1;
}

TEST_F(GemmApp, AnUnknownSgemmLibraryIsOneLine) {
  const auto r = train(kClean + "TRIDENT_SGEMM=mkl ", std::string(TRIDENT_MPIEXEC) + " -n 2 ",
                       " --set parallel.data=2 --set train.threads=1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.exit_code, 128) << r.output;
  const std::string line = "trident: error: TRIDENT_SGEMM=mkl: must be onednn (the default) or "
                           "openblas";
  const size_t first = r.output.find(line);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(line, first + 1), std::string::npos) << "said twice:\n" << r.output;
}

TEST_F(GemmApp, ANarrowKernelIsReplacedByRunningAgainAlsoUnderMpiexec) {
  if (cpu::fma_vector_bits(cpu::read_cpu_features()) == 0)
    GTEST_SKIP() << "no AVX2/FMA on this core: Trident forces no kernel";
  const std::string expected = "kernel " + usable_kernel() + " (chosen by Trident for this " +
                               cpu::isa_name(cpu::read_cpu_features()) +
                               " core; OpenBLAS alone picks Prescott)";
  const std::string env = kClean + "TRIDENT_TEST_GEMM_CORENAME=Prescott ";
  const std::string line = only_gemm_line(train(env));
  EXPECT_NE(line.find(expected), std::string::npos) << line;

  // Two ranks: each runs itself again before MPI_Init; the job works, rank 0 says it once.
  const std::string mline = only_gemm_line(train(env, std::string(TRIDENT_MPIEXEC) + " -n 2 ",
                                                 " --set parallel.data=2 --set train.threads=1"));
  EXPECT_NE(mline.find(expected), std::string::npos) << mline;
}

TEST_F(GemmApp, AKernelWithWrongResultsIsUndone) {
  if (cpu::fma_vector_bits(cpu::read_cpu_features()) == 0)
    GTEST_SKIP() << "no AVX2/FMA on this core: Trident forces no kernel";
  const std::string line = only_gemm_line(
      train(kClean + "TRIDENT_TEST_GEMM_CORENAME=Prescott TRIDENT_TEST_GEMM_WRONG=1 "));
  EXPECT_NE(line.find("(OpenBLAS's own choice: " + usable_kernel() +
                      " computed wrong results on this core)"),
            std::string::npos)
      << line;
}

TEST_F(GemmApp, AUsersCoretypeIsKeptAndASlowGemmIsWarnedAbout) {
  if (cpu::fma_vector_bits(cpu::read_cpu_features()) == 0)
    GTEST_SKIP() << "no AVX2/FMA on this core: nothing to compare the GEMM with";
  if (kUnderAddressSanitizer)
    GTEST_SKIP() << "sanitized build: its FMA peak loop runs below the core's peak, so the "
                    "GEMM probe is not compared with the core's vector width";
  // Prescott: OpenBLAS's SSE3 kernel, a fraction of what AVX2 or AVX-512 FMAs reach; it runs
  // the float GEMM (and so the probe) under TRIDENT_SGEMM=openblas.
  const auto r = train(kClean + "OPENBLAS_CORETYPE=Prescott TRIDENT_SGEMM=openblas ");
  const std::string line = only_gemm_line(r);
  EXPECT_NE(line.find("kernel Prescott (OPENBLAS_CORETYPE=Prescott as set)"), std::string::npos)
      << line;
  EXPECT_NE(r.output.find("trident: warning: sgemm runs at "), std::string::npos) << r.output;
}

// bench/gemm_profile.cpp preloaded: each rank writes one table of its GEMM calls at exit,
// whose rows add up to its header, from the library that ran them.
struct ProfileTable {
  long long header_calls = -1, row_calls = 0;
  std::map<std::string, int> rows_by_library;
  std::map<std::string, std::set<std::string>> ops_by_library;  // "NT", "TN", ...
  bool every_rate_positive = true;
};
std::map<std::string, ProfileTable> profile_tables(const std::string& output) {
  std::map<std::string, ProfileTable> tables;  // by the header's "rank N"
  std::istringstream in(output);
  std::string line;
  ProfileTable* table = nullptr;
  while (std::getline(in, line)) {
    if (line.rfind("gemm profile, ", 0) == 0) {
      const std::string rank = line.substr(14, line.find(" (pid") - 14);
      table = &tables[rank];
      const size_t colon = line.find("): ");
      table->header_calls = colon == std::string::npos ? -1 : std::stoll(line.substr(colon + 3));
      continue;
    }
    // "  oneDNN  512 x 50304 x 256  NT  library  12  1503.7  26.3%  105.2", with "2 threads" in
    // place of "library" where a team of two ran the pieces
    std::istringstream row(line);
    std::vector<std::string> words;
    for (std::string w; row >> w;) words.push_back(w);
    if (table == nullptr || line.rfind("  ", 0) != 0 || words.size() < 11 || words[2] != "x" ||
        !std::isdigit(static_cast<unsigned char>(words[1][0])))  // not the column names
      continue;
    const std::string& library = words[0];
    const long long calls = std::stoll(words[words.size() - 4]);
    const double rate = std::stod(words.back());
    table->row_calls += calls;
    table->rows_by_library[library]++;
    table->ops_by_library[library].insert(words[6]);
    if (!(rate > 0)) table->every_rate_positive = false;
  }
  return tables;
}

TEST_F(GemmApp, ThePreloadedProfileTablesEachRanksGemms) {
  if (kUnderAddressSanitizer)
    GTEST_SKIP() << "sanitized build: the sanitizer's runtime must be the first library loaded, "
                    "so nothing can be preloaded before it";
  const std::string preload = "LD_PRELOAD=" + std::string(TRIDENT_GEMM_PROFILE_LIBRARY) + " ";
  for (const std::string library : {"oneDNN", "OpenBLAS"}) {
    SCOPED_TRACE(library);
    std::filesystem::remove_all(dir_ / "run");
    const auto r = train(kClean + preload +
                             (library == "OpenBLAS" ? "TRIDENT_SGEMM=openblas " : ""),
                         std::string(TRIDENT_MPIEXEC) + " -n 2 ",
                         " --set parallel.data=2 --set train.threads=1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto tables = profile_tables(r.output);
    ASSERT_EQ(tables.size(), 2u) << r.output;
    for (const std::string rank : {"rank 0", "rank 1"}) {
      ASSERT_EQ(tables.count(rank), 1u) << r.output;
      const ProfileTable& t = tables.at(rank);
      EXPECT_GT(t.header_calls, 0) << r.output;
      EXPECT_EQ(t.row_calls, t.header_calls) << r.output;
      EXPECT_EQ(t.rows_by_library.size(), 1u) << r.output;
      EXPECT_GT(t.rows_by_library.count(library), 0u) << r.output;
      EXPECT_TRUE(t.every_rate_positive) << r.output;
    }
  }
}

// The bf16 products of the CPU's oneDNN engine are oneDNN matmul primitives: the profile times
// them at their execute and lists them as "matmul" rows (the forward NT, the input gradient NN,
// the weight gradient TN among them), counted in the table's header like the sgemm calls.
TEST_F(GemmApp, ThePreloadedProfileTablesTheBf16EnginesMatmuls) {
  if (kUnderAddressSanitizer)
    GTEST_SKIP() << "sanitized build: nothing can be preloaded before the sanitizer's runtime";
  if (!cpu::bf16_gemm_available())
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this core: " << cpu::bf16_gemm_description();
  const std::string preload = "LD_PRELOAD=" + std::string(TRIDENT_GEMM_PROFILE_LIBRARY) + " ";
  const auto r = train(kClean + preload, std::string(TRIDENT_MPIEXEC) + " -n 1 ",
                       " --set train.precision=\\\"bf16\\\" "
                       "--set train.cpu_bf16_gemm=\\\"onednn\\\" --set train.threads=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tables = profile_tables(r.output);
  ASSERT_EQ(tables.size(), 1u) << r.output;
  const ProfileTable& t = tables.begin()->second;
  EXPECT_GT(t.header_calls, 0) << r.output;
  EXPECT_EQ(t.row_calls, t.header_calls) << r.output;
  ASSERT_GT(t.rows_by_library.count("matmul"), 0u) << r.output;
  for (const std::string ops : {"NT", "NN", "TN"})
    EXPECT_EQ(t.ops_by_library.at("matmul").count(ops), 1u) << ops << "\n" << r.output;
  EXPECT_TRUE(t.every_rate_positive) << r.output;
}

}  // namespace
}  // namespace trident::test

// GoogleTest main for tests that run on several MPI ranks. Every rank runs every test; only
// rank 0 prints the progress (failures are printed by the rank that saw them). The exit code is
// non-zero on every rank if any rank failed, so mpiexec reports the failure; it is
// kSkippedExitCode on every rank when nothing failed and no test passed on any rank but some
// were skipped (GTEST_SKIP, e.g. the GPU tests without a GPU), so that CTest
// (SKIP_RETURN_CODE, tests/CMakeLists.txt) reports the binary skipped, not passed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "kernels/cpu/blas.hpp"

namespace {
constexpr int kSkippedExitCode = 77;  // tests/CMakeLists.txt: SKIP_RETURN_CODE of MPI tests
}  // namespace

namespace {

// Ranks other than 0 print nothing of the progress, but each failed assertion they see: with
// the default printer gone, that rank's failure would show only as the exit code.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // The test's name is kept here: UnitTest::current_test_info() takes the lock that gtest holds
  // while it reports a result, so asking it from OnTestPartResult deadlocks.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(),
                 result.file_name() != nullptr ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
  std::string test_ = "(no test)";
};

}  // namespace

int main(int argc, char** argv) {
  // As app/main.cpp: MPI_THREAD_MULTIPLE (the watchdog's thread; the tensor-parallel backward's
  // progress helper, comm.hpp's ProgressHelper).
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  // Several ranks share few cores in these tests: one thread each, or OpenMP's spinning
  // threads and MPI's busy-polling ranks starve each other.
  trident::cpu::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));  // gtest owns and deletes it
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // Passed and skipped test counts over all ranks: a rank that skips while another runs the
  // test is still a binary that tested something.
  const auto* unit = ::testing::UnitTest::GetInstance();
  long long counts[2] = {unit->successful_test_count(), unit->skipped_test_count()};
  long long totals[2] = {0, 0};
  MPI_Allreduce(counts, totals, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  if (any_failed) return 1;
  if (totals[0] == 0 && totals[1] > 0) {
    if (rank == 0) std::printf("every test was skipped: exit code %d (skipped)\n", kSkippedExitCode);
    return kSkippedExitCode;
  }
  return 0;
}

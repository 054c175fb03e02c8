// GoogleTest main for tests that run on several MPI ranks. Every rank runs every test; only
// rank 0 prints the progress (failures are printed by the rank that saw them). The exit code is
// non-zero on every rank if any rank failed, so mpiexec reports the failure.
#include <gtest/gtest.h>
#include <mpi.h>

#include "kernels/cpu/blas.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Several ranks share few cores in these tests: one thread each, or OpenMP's spinning
  // threads and MPI's busy-polling ranks starve each other.
  trident::cpu::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && failed == 0 && rank != 0) {
    // keep quiet: the failing rank printed its own assertion
  }
  MPI_Finalize();
  return any_failed;
}

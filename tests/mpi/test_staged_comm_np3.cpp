// The staged communicator's all_to_all_v on 3 ranks (an odd group: every pair of ranks has
// different counts in each direction) against MpiCommunicator's; the cases are shared with
// test_staged_comm_np2 (tests/mpi/staged_all_to_all_cases.hpp).
#include "mpi/staged_all_to_all_cases.hpp"

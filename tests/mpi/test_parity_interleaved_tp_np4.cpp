// The interleaved schedule (v 2) against the single-rank run, as in
// test_parity_interleaved_np4.cpp: PP 2 x TP 2 with sequence parallelism, and llama (untied
// head, grouped-query attention) on PP 2 x TP 2.
#include "interleaved_parity.hpp"

using namespace trident;
using namespace trident::test;

TEST(InterleavedParity, Tp2Pp2V2SequenceParallel) {
  check_interleaved_parity({2, 2, 1}, interleaved(2, {"parallel.sequence_parallel=true"}));
}
TEST(InterleavedParity, LlamaTp2Pp2V2) {
  check_interleaved_parity({2, 2, 1}, llama(interleaved(2)), ParityData::Indexed);
}

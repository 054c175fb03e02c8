// The interleaved schedule (parallel.schedule = "interleaved", parallel.virtual_stages = v: the
// layers cut into p * v chunks, stage s holding chunks s, s + p, ...) run for real, against the
// single-rank run (1F1B on one rank): every gradient after step 1 and 20 losses within 1e-5
// relative, on PP 2 (v 2 and v 3), PP 2 x DP 2 (the data-parallel all-reduce started by the
// grads-final hook from each chunk's last backward), PP 2 x TP 2 and PP 4 (8 layers, v 2:
// chunks of one layer). Sequence parallelism and llama: test_parity_interleaved_tp_np4.cpp.
#include "interleaved_parity.hpp"

using namespace trident;
using namespace trident::test;

TEST(InterleavedParity, Pp2V2) { check_interleaved_parity({1, 2, 1}, interleaved(2)); }
TEST(InterleavedParity, Pp2Dp2V2) { check_interleaved_parity({1, 2, 2}, interleaved(2)); }
TEST(InterleavedParity, Tp2Pp2V2) { check_interleaved_parity({2, 2, 1}, interleaved(2)); }
// Three chunks per stage (6 layers): the last stage's chunk c feeds the first stage's c + 1
// twice.
TEST(InterleavedParity, Pp2V3) {
  check_interleaved_parity({1, 2, 1}, interleaved(3, {"model.layers=6"}));
}
// 8 layers in 8 chunks of one; 4 micro-batches per step (a multiple of 4 stages).
TEST(InterleavedParity, Pp4V2) {
  check_interleaved_parity({1, 4, 1}, interleaved(2, {"model.layers=8"}));
}

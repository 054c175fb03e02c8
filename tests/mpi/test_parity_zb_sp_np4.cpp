// ZB-H1 (parallel.schedule = "zb-h1") against the single-rank run (counted_parity.hpp: every
// gradient after step 1 and 20 losses within 1e-5 relative, every element of the global model
// compared): PP 2 x TP 2 with sequence parallelism (the weight gradients of the row-parallel
// layers from their output gradient gathered over the tensor group, kept for W), for gpt2 and
// llama, and PP 4 (one layer per stage). The other layouts: test_parity_zb_np4.cpp (a
// separate binary: each fits its MPI test timeout).
#include "counted_parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

const std::string kZeroBubble = "parallel.schedule=zb-h1";
const std::string kSequenceParallel = "parallel.sequence_parallel=true";

}  // namespace

TEST(ZeroBubbleParity, Tp2Pp2SequenceParallel) {
  check_counted_parity({2, 2, 1}, {kZeroBubble, kSequenceParallel});
}
TEST(ZeroBubbleParity, LlamaTp2Pp2SequenceParallel) {
  check_counted_parity({2, 2, 1}, llama({kZeroBubble, kSequenceParallel}), ParityData::Indexed);
}
TEST(ZeroBubbleParity, Pp4) { check_counted_parity({1, 4, 1}, {kZeroBubble}); }

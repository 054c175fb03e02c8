// The LM head and its cross-entropy over chunks of rows (train.lm_head_chunk_rows = 96 of the
// 256 rows of a micro-batch: chunks of 96, 96 and 64) against the single-rank run
// (counted_parity.hpp: every gradient after step 1 and 20 losses within 1e-5 relative, every
// element of the global model compared): TP 2 with sequence parallelism (the all-gathered
// final norm cut into chunks, each chunk's max and sums all-reduced over the tensor group
// before the next chunk), TP 2 with parallel.tp_overlap (with and without SP), and ZB-H1 on PP 2 x TP 2 (the head's
// gradients formed in the training forward, nothing of them deferred). A binary of its own
// so that each fits its MPI test timeout.
#include "counted_parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

const std::string kChunks = "train.lm_head_chunk_rows=96";

}  // namespace

TEST(LmHeadChunkParity, Tp2SequenceParallel) {
  check_counted_parity({2, 1, 1}, {kChunks, "parallel.sequence_parallel=true"});
}
// With parallel.tp_overlap: the column-parallel layers' and the head's last chunk's
// input-gradient all-reduces run non-blocking while their weight gradients are computed.
TEST(LmHeadChunkParity, Tp2Overlap) {
  check_counted_parity({2, 1, 1}, {kChunks, "parallel.tp_overlap=true"});
}
// Both: under SP the input gradients' reduce-scatters run non-blocking during the weight
// gradients.
TEST(LmHeadChunkParity, Tp2SequenceParallelOverlap) {
  check_counted_parity({2, 1, 1}, {kChunks, "parallel.sequence_parallel=true",
                                   "parallel.tp_overlap=true"});
}
TEST(LmHeadChunkParity, ZeroBubbleTp2Pp2) {
  check_counted_parity({2, 2, 1}, {kChunks, "parallel.schedule=zb-h1"});
}

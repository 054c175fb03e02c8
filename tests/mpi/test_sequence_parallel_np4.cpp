// Sequence parallelism against the single-rank run and its collective pattern (apart from
// test_parity_np4 so that each binary stays well inside its timeout on 2 cores).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include "grid/process_grid.hpp"
#include "model/cpu_model.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

// Sequence parallelism: the same numbers as the single-rank run (LayerNorm gradients summed over
// the tensor group; the data-parallel reduction then runs after the backward).
const std::vector<std::string> kSp = {"parallel.sequence_parallel=true"};
TEST(Parity, Tp2SequenceParallel) { check_parity({2, 1, 1}, kSp); }
TEST(Parity, Tp4SequenceParallel) { check_parity({4, 1, 1}, kSp); }
TEST(Parity, Tp2Pp2SequenceParallel) { check_parity({2, 2, 1}, kSp); }
TEST(Parity, Tp2Dp2SequenceParallelZero) {
  check_parity({2, 1, 2}, {"parallel.sequence_parallel=true", "optim.zero_stage=1"});
}

TEST(TensorParallel, SequenceParallelTradesAllReducesForGathersAndScatters) {
  const auto dir = shared_corpus("collectives_sp");
  const ParityLayout l{4, 1, 1};
  const Config config = parity_config(dir, l, kSp);
  const Config plain = parity_config(dir, l);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    grid.tensor().stats().reset();
    t.forward_backward(0);
    // Per micro-batch, in place of the [N,C] all-reduces: a reduce-scatter after each
    // row-parallel matmul and the embedding lookup (2 per layer and 1), one after each
    // column-parallel input gradient (2 per layer and the LM head's); an all-gather before each
    // column-parallel matmul (2 per layer, the LM head), of the stream gradient before each
    // row-parallel backward (2 per layer, the embedding) and of each norm output recomputed in
    // backward for a column-parallel weight gradient (2 per layer; the norm outputs are not
    // stashed, as Megatron-LM re-gathers them). The cross-entropy keeps its two
    // all-reduces; once per step the LayerNorm gradients are summed (4 per layer, final LN 2).
    const CommStats& st = grid.tensor().stats();
    const int64_t L = config.model.layers, M = config.num_microbatches();
    const int64_t N = config.train.micro_batch * config.model.seq_len;
    const int64_t rows_c = N / 4 * config.model.width;
    EXPECT_EQ(st.calls("all_gather"), M * (6 * L + 2));
    EXPECT_EQ(st.calls("reduce_scatter"), M * (4 * L + 2));
    EXPECT_EQ(st.ops.at("all_gather").bytes, M * (6 * L + 2) * rows_c * 4);
    EXPECT_EQ(st.ops.at("reduce_scatter").bytes, M * (4 * L + 2) * rows_c * 4);
    EXPECT_EQ(st.calls("all_reduce"), 2 * M + 4 * L + 2);
    const auto& counts = st.all_reduce_counts;
    EXPECT_EQ(std::count(counts.begin(), counts.end(), N), M);
    EXPECT_EQ(std::count(counts.begin(), counts.end(), 2 * N), M);
    // Activations per micro-batch shrink: the stream, residuals and LayerNorm statistics are
    // a quarter.
    const int64_t with_sp = t.model().activation_bytes(config.train.micro_batch, false);
    const ModelShard& s = t.model().shard();
    ModelShard no_sp = s;
    no_sp.sequence_parallel = false;
    auto self = make_self_communicator("tensor");
    const int64_t without =
        CpuModel<float>(plain.model, no_sp, *self).activation_bytes(config.train.micro_batch);
    EXPECT_LT(with_sp, without);
    if (grid.rank() == 0)
      std::printf("[ measured ] TP=4 activations per micro-batch: %lld bytes with sequence "
                  "parallelism, %lld without\n",
                  static_cast<long long>(with_sp), static_cast<long long>(without));
  });
}

}  // namespace

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

// parallel.tp_overlap under SP, as Megatron-LM overlaps a column-parallel layer's backward:
// the all-gather of its recomputed input during its input gradient, then the input gradient's
// reduce-scatter during its weight gradient. Against the blocking order on TP 2 x DP 2: every
// loss, weight and AdamW moment to the bit (a gather copies; a sum of two partials is one
// rounding either way), the same collectives and bytes, and the overlapped ones posted
// non-blocking: per micro-batch 2 all-gathers a layer (the qkv's and MLP up's inputs) and 2
// reduce-scatters a layer plus the LM head's.
TEST(TensorParallel, SequenceParallelOverlapChangesNoBitOrCount) {
  const auto dir = shared_corpus("sp_overlap");
  const ParityLayout l{2, 1, 2};
  constexpr int64_t kSteps = 3;
  TrainingState blocking;
  CommStats blocking_stats;
  on_layout(parity_config(dir, l, kSp), [&](Trainer& t, ProcessGrid& grid) {
    grid.tensor().stats().reset();
    blocking = training_state(t, train_steps(t, 0, kSteps));
    blocking_stats = grid.tensor().stats();
  });
  const Config config = parity_config(dir, l, {kSp[0], "parallel.tp_overlap=true"});
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    ASSERT_TRUE(grid.tensor().progress_from_helper_thread());
    grid.tensor().stats().reset();
    const TrainingState overlapped = training_state(t, train_steps(t, 0, kSteps));
    const CommStats& st = grid.tensor().stats();
    const int64_t L = config.model.layers, M = config.num_microbatches() * kSteps;
    for (const std::string& op : {kAllGather, kReduceScatter, kAllReduce}) {
      EXPECT_EQ(st.calls(op), blocking_stats.calls(op)) << op;
      EXPECT_EQ(st.bytes(op), blocking_stats.bytes(op)) << op;
      EXPECT_EQ(blocking_stats.ops.at(op).posted, 0) << op;
    }
    EXPECT_EQ(st.ops.at(kAllGather).posted, M * 2 * L);
    EXPECT_EQ(st.ops.at(kReduceScatter).posted, M * (2 * L + 1));
    EXPECT_EQ(overlapped.losses, blocking.losses);  // every loss bit for bit
    const StateComparison c = compare_states(blocking, overlapped, t, grid);
    EXPECT_EQ(c.differing, 0) << "of " << c.compared << " elements";
    EXPECT_EQ(c.weights_covered, global_param_count(config));
    EXPECT_EQ(c.exp_avg_covered, global_param_count(config));
  });
}

TEST(TensorParallel, SequenceParallelTradesAllReducesForGathersAndScatters) {
  const auto dir = shared_corpus("collectives_sp");
  const ParityLayout l{4, 1, 1};
  const Config config = parity_config(dir, l, kSp);
  const Config plain = parity_config(dir, l);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    grid.tensor().stats().reset();
    grid.tensor().stats().keep_all_reduce_counts = true;
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

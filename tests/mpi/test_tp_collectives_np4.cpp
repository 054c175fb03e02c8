// The tensor group's all-reduces of one micro-batch, forward and backward counted apart
// (TP=4 on 4 ranks).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "grid/process_grid.hpp"
#include "model/stage_model.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

// Megatron's tensor-parallel collectives (test_parity_np4.cpp counts them per step) split by
// pass: one micro-batch's forward, then its backward, run on the stage model directly and
// counted apart. Forward: the row-parallel attention output and MLP
// down projections all-reduce [N,C] (2 per layer), plus the vocabulary-parallel embedding
// lookup's [N,C], the cross-entropy's max [N] and [sum-exp | target logit] [2N], and the LM
// head's input gradient [N,C] (a training forward forms the head's gradients while its logits
// are there: Transformer::head_forward). Backward: the column-parallel QKV and MLP up
// projections all-reduce their input gradient [N,C] (2 per layer). Nothing else in the tensor
// group in either pass.
TEST(TensorParallel, TwoAllReducesPerLayerForwardAndTwoBackward) {
  const auto dir = shared_corpus("collectives_by_pass");
  const ParityLayout l{4, 1, 1};
  const Config config = parity_config(dir, l);
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    StageModel& model = t.model();
    const int64_t B = config.train.micro_batch, L = config.model.layers;
    const int64_t N = B * config.model.seq_len, NC = N * config.model.width;
    std::vector<int32_t> tokens(N), targets(N);
    for (int64_t i = 0; i < N; ++i) {
      tokens[i] = static_cast<int32_t>((7 * i + 3) % config.model.vocab_size);
      targets[i] = static_cast<int32_t>((11 * i + 5) % config.model.vocab_size);
    }
    auto acts = model.make_activations(B, /*split_backward=*/false);
    model.zero_grads();
    CommStats& st = grid.tensor().stats();
    st.keep_all_reduce_counts = true;
    const auto other_calls = [&] {
      int64_t other = 0;
      for (const auto& [op, s] : st.ops)
        if (op != "all_reduce") other += s.calls;
      return other;
    };

    st.reset();
    model.forward(*acts, tokens.data(), targets.data(), nullptr, 1.0f);
    const std::vector<int64_t> forward = st.all_reduce_counts;
    EXPECT_EQ(other_calls(), 0) << "forward";
    st.reset();
    model.backward(*acts, 1.0f, nullptr, nullptr);
    const std::vector<int64_t> backward = st.all_reduce_counts;
    EXPECT_EQ(other_calls(), 0) << "backward";
    model.take_loss_sum();

    const auto count = [](const std::vector<int64_t>& v, int64_t n) {
      return std::count(v.begin(), v.end(), n);
    };
    ASSERT_EQ(static_cast<int64_t>(forward.size()), 2 * L + 4);
    // 2 per layer, the embedding lookup and the LM head's input gradient
    EXPECT_EQ(count(forward, NC), 2 * L + 2);
    EXPECT_EQ(count(forward, N), 1);
    EXPECT_EQ(count(forward, 2 * N), 1);
    ASSERT_EQ(static_cast<int64_t>(backward.size()), 2 * L);
    EXPECT_EQ(count(backward, NC), 2 * L);  // 2 per layer
    if (grid.rank() == 0)
      std::printf("[ measured ] TP=4, %lld layers, one micro-batch: %zu all-reduces forward, "
                  "%zu backward\n",
                  static_cast<long long>(L), forward.size(), backward.size());
  });
}

}  // namespace

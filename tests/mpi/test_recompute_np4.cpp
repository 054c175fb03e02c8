// Activation recomputation on TP2 x PP2 (and TP2 x DP2 with ZeRO-1): train.recompute =
// selective and full give every step-1 gradient and every loss of train.recompute = none on the
// same layout to the bit, under 1F1B, zb-h1 (split backward) with sequence parallelism, the
// interleaved schedule, for gpt2 and llama. Full recomputation reruns each layer's forward with
// its tensor-parallel collectives in backward.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>

#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 6;

struct Run {
  std::vector<float> grads;  // this rank's flat gradients after step 1
  std::vector<double> losses;
  int64_t tensor_collectives = 0;  // all-reduces, all-gathers, reduce-scatters of step 1
  int64_t layers = 0;              // on this rank
};

Run train(const Config& config) {
  Run r;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    r.layers = t.model().shard().layer_count();
    for (int64_t s = 0; s < kSteps; ++s) {
      if (s == 0) grid.tensor().stats().reset();
      const double loss = t.forward_backward(s);
      if (s == 0) {
        r.grads = t.host_grads();
        const CommStats& st = grid.tensor().stats();
        r.tensor_collectives =
            st.calls("all_reduce") + st.calls("all_gather") + st.calls("reduce_scatter");
      }
      r.losses.push_back(t.apply_update(s, loss).loss);
    }
  });
  return r;
}

const std::vector<std::string> kLlama = {"model.arch=llama", "model.heads=8", "model.kv_heads=4",
                                         "model.ffn_width=64", "model.tie_embeddings=false"};

void check_recompute(const ParityLayout& l, std::vector<std::string> extra,
                     const std::string& what) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const auto dir = shared_corpus("recompute");
  auto with = [&](const std::string& mode) {
    std::vector<std::string> o = extra;
    o.push_back("train.recompute=" + mode);
    return parity_config(dir, l, o);
  };
  const Run none = train(with("none"));
  ASSERT_EQ(none.losses.size(), static_cast<size_t>(kSteps));
  for (const std::string mode : {"selective", "full"}) {
    const Run r = train(with(mode));
    ASSERT_EQ(r.grads.size(), none.grads.size());
    int64_t counts[3] = {0, 0, 0};  // compared, differing, non-zero (this rank)
    for (size_t i = 0; i < r.grads.size(); ++i, ++counts[0]) {
      if (std::memcmp(&r.grads[i], &none.grads[i], sizeof(float)) != 0) ++counts[1];
      if (none.grads[i] != 0.0f) ++counts[2];
    }
    int64_t losses_equal = 0;
    for (int64_t s = 0; s < kSteps; ++s)
      if (std::memcmp(&r.losses[s], &none.losses[s], sizeof(double)) == 0) ++losses_equal;
    EXPECT_GT(counts[0], 0) << "rank " << world_rank << " compared no gradient";
    EXPECT_EQ(counts[1], 0) << what << " " << mode << ": of " << counts[0] << " gradients";
    EXPECT_GT(counts[2], counts[0] / 2) << "most gradients carry a contribution";
    EXPECT_EQ(losses_equal, kSteps) << what << " " << mode;
    // Full recomputation reruns each layer's forward with its two tensor-parallel collectives
    // (under sequence parallelism two all-gathers and two reduce-scatters) per micro-batch;
    // selective communicates as none does.
    const Config c = with(mode);
    const bool sp = c.parallel.sequence_parallel;
    const int64_t rerun = mode == "full" ? (sp ? 4 : 2) * r.layers * c.num_microbatches() : 0;
    EXPECT_EQ(r.tensor_collectives - none.tensor_collectives, rerun) << what << " " << mode;
    MPI_Allreduce(MPI_IN_PLACE, counts, 3, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &losses_equal, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    if (world_rank == 0)
      std::printf("[ measured ] %s %s recompute=%s: %lld step-1 gradients (4 ranks) compared, "
                  "%lld differing from none; %lld of %lld losses bitwise equal (final %.6f)\n",
                  l.name().c_str(), what.c_str(), mode.c_str(),
                  static_cast<long long>(counts[0]), static_cast<long long>(counts[1]),
                  static_cast<long long>(losses_equal), static_cast<long long>(kSteps),
                  none.losses.back());
  }
}

}  // namespace

TEST(Recompute, Tp2Pp2Gpt2OneFOneB) { check_recompute({2, 2, 1}, {}, "gpt2 1f1b"); }

TEST(Recompute, Tp2Pp2LlamaZeroBubbleSequenceParallel) {
  std::vector<std::string> o = kLlama;
  o.insert(o.end(), {"parallel.schedule=zb-h1", "parallel.sequence_parallel=true"});
  check_recompute({2, 2, 1}, o, "llama zb-h1 SP");
}

TEST(Recompute, Tp2Pp2Gpt2Interleaved) {
  check_recompute({2, 2, 1}, {"parallel.schedule=interleaved", "parallel.virtual_stages=2"},
                  "gpt2 interleaved v2");
}

TEST(Recompute, Tp2Dp2LlamaZero1) {
  std::vector<std::string> o = kLlama;
  o.push_back("optim.zero_stage=1");
  check_recompute({2, 1, 2}, o, "llama ZeRO-1");
}

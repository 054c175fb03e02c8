// Context parallelism (parallel.context; model/context_parallel.hpp) against the single-rank
// run: per-step losses of 20 steps and every gradient after step 1 within 1e-5 relative
// (parity.hpp), on CP alone and with tensor (and sequence) parallelism, every pipeline schedule,
// data parallelism with ZeRO-1, recomputation and both architectures; and a checkpoint written
// on CP = 2 resumed on CP = 1 and on TP = 2.
#include <gtest/gtest.h>

#include "moe_configs.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

ParityLayout cp(int n, int tp = 1, int pp = 1, int dp = 1) {
  ParityLayout l;
  l.cp = n;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  return l;
}

}  // namespace

// gpt2: learned positions at the chunks' positions; every rank's 16 of the 32 tokens.
TEST(ContextParity, Cp2) { check_parity(cp(2)); }
// Chunks of 4 tokens: rank i holds chunks i and 7 - i.
TEST(ContextParity, Cp4) { check_parity(cp(4)); }
TEST(ContextParity, Tp2Cp2) { check_parity(cp(2, 2)); }
TEST(ContextParity, Tp2Cp2SequenceParallel) {
  check_parity(cp(2, 2), {"parallel.sequence_parallel=true"});
}
TEST(ContextParity, Cp2Pp2OneFOneB) { check_parity(cp(2, 1, 2)); }
TEST(ContextParity, Cp2Pp2ZeroBubble) { check_parity(cp(2, 1, 2), {"parallel.schedule=zb-h1"}); }
TEST(ContextParity, Cp2Pp2ZeroBubbleH2) {
  check_parity(cp(2, 1, 2), {"parallel.schedule=zb-h2"});
}
TEST(ContextParity, Cp2Pp2GPipe) { check_parity(cp(2, 1, 2), {"parallel.schedule=gpipe"}); }
// 4 layers in 2 stages x 2 chunks.
TEST(ContextParity, Cp2Pp2Interleaved) {
  check_parity(cp(2, 1, 2), {"parallel.schedule=interleaved", "parallel.virtual_stages=2"});
}
TEST(ContextParity, Cp2Dp2Zero1) { check_parity(cp(2, 1, 1, 2), {"optim.zero_stage=1"}); }
TEST(ContextParity, Cp2SelectiveRecompute) {
  check_parity(cp(2), {"train.recompute=selective"});
}
TEST(ContextParity, Cp2FullRecompute) { check_parity(cp(2), {"train.recompute=full"}); }
// Grouped-query attention: only the 4 kv heads travel; rotary embeddings at the positions.
TEST(ContextParity, LlamaGqaCp2) { check_parity(cp(2), llama(), ParityData::Indexed); }
TEST(ContextParity, LlamaGqaTp2Cp2) { check_parity(cp(2, 2), llama(), ParityData::Indexed); }

// A dropless mixture of experts: the load-balancing loss of a sequence from its counts and
// probabilities summed over the context group (model/moe.hpp); the aux loss and the expert
// loads compared too (check_parity).
TEST(ContextParity, DroplessMoeCp2) {
  check_parity(cp(2), gpt2_moe({"model.moe_capacity_factor=0"}));
}
TEST(ContextParity, LlamaDroplessMoeTp2Cp2) { check_parity(cp(2, 2), llama_moe()); }
// Expert parallelism over the data ranks: each expert's gradient sums over expert data x
// context (grid.hpp expert_data_group).
TEST(ContextParity, DroplessMoeCp2Dp2Ep2) {
  check_parity(cp(2, 1, 1, 2), gpt2_moe({"model.moe_capacity_factor=0", "parallel.expert=2"}));
}
TEST(ContextParity, DroplessMoeCp2Dp2Ep2Zero1) {
  check_parity(cp(2, 1, 1, 2), gpt2_moe({"model.moe_capacity_factor=0", "parallel.expert=2",
                                         "optim.zero_stage=1"}));
}

// A CP = 2 checkpoint (weights and moments of global tensors: unchanged by CP) resumed on one
// rank and on TP = 2: the losses of the resumed steps within 1e-5 of the uninterrupted run's.
TEST(ContextResume, Cp2CheckpointOnCp1AndTp2) {
  const auto dir = shared_corpus("context_resume");
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  // One job of 2 ranks (CP = 2); the other two ranks run their own copy of it.
  const std::string ckpt = "ckpt_" + std::to_string(world_rank / 2);
  const Config source = checkpoint_config(dir, 1, 1, 1, 0, ckpt, {"parallel.context=2"});
  const SavedRun run = train_saving_at(source, 4, 8);
  ASSERT_EQ(run.losses.size(), 8u);
  Config cp1 = source, tp2 = source;
  cp1.parallel.context = 1;
  tp2.parallel.context = 1;
  tp2.parallel.tensor = 2;
  const double on_cp1 = resumed_loss_error(cp1, run, 4, 8, "CP=1");
  const double on_tp2 = resumed_loss_error(tp2, run, 4, 8, "TP=2");
  if (world_rank == 0)
    std::printf("[ measured ] CP=2 checkpoint after step 4 resumed to step 8: losses worst "
                "relative error %.3e on CP=1, %.3e on TP=2\n",
                on_cp1, on_tp2);
}

// The ring's traffic as the context communicator counted it, against the design
// (model/context_parallel.hpp): per layer and micro-batch, with E = micro_batch * seq_len / CP *
// 2 * kv_heads * head_size elements (one key/value block), the forward sends (CP - 1) E and
// the backward (CP - 1) E of blocks and CP E of their gradients; selective recomputation runs
// the forward's ring once more in the backward. Nothing else crosses the context group.
TEST(ContextRing, BytesPerStepAreTheDesigns) {
  const auto dir = shared_corpus("context_bytes");
  for (const char* recompute : {"none", "selective"}) {
    const Config config = parity_config(
        dir, cp(2), llama({"model.heads=8", "model.kv_heads=2", std::string("train.recompute=") +
                                                                     recompute}),
        ParityData::Indexed);
    const ModelConfig& m = config.model;
    const int64_t CP = 2, layers = m.layers, micro = config.num_microbatches();
    const int64_t E = config.train.micro_batch * (m.seq_len / CP) * 2 * m.kv_head_count() *
                      m.head_size();
    const int64_t forwards = std::string(recompute) == "selective" ? 2 : 1;
    const int64_t want =
        4 * layers * micro * ((CP - 1) * E * forwards + (CP - 1) * E + CP * E);
    int64_t sent = -1, received = -1, other = -1;
    on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
      Communicator* ring = grid.dims().context().host;
      ASSERT_NE(ring, nullptr);
      ring->stats().reset();
      t.forward_backward(0);
      sent = ring->stats().bytes(kSend);
      received = ring->stats().bytes(kRecv);
      other = 0;
      for (const auto& [op, s] : ring->stats().ops)
        if (op != kSend && op != kRecv) other += s.calls;
    });
    EXPECT_EQ(sent, want) << recompute << ": bytes sent per step";
    EXPECT_EQ(received, want) << recompute << ": bytes received per step";
    EXPECT_EQ(other, 0) << recompute << ": other operations on the context group";
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_rank == 0)
      std::printf("[ measured ] CP=2 recompute=%s: %lld bytes sent per step over the context "
                  "group (%lld layers x %lld micro-batches; block %lld elements)\n",
                  recompute, static_cast<long long>(sent), static_cast<long long>(layers),
                  static_cast<long long>(micro), static_cast<long long>(E));
  }
}

// Same-layout resume on CP = 2, and on CP2 x DP2 with ZeRO-1 (moments sliced over data x
// context): every loss, weight and AdamW moment bit for bit, each global element compared
// (parity.hpp).
TEST(ContextResume, SameLayoutIsBitwise) {
  const auto dir = shared_corpus("context_bitwise");
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const std::string ckpt = "ckpt_" + std::to_string(world_rank / 2);
  expect_bitwise_resume(checkpoint_config(dir, 1, 1, 1, 0, ckpt, {"parallel.context=2"}), 6, 3);
}

TEST(ContextResume, SameLayoutWithZero1OverDataAndContextIsBitwise) {
  const auto dir = shared_corpus("context_bitwise_zero1");
  expect_bitwise_resume(
      checkpoint_config(dir, 1, 1, 2, 1, "ckpt", {"parallel.context=2"}), 6, 3);
}

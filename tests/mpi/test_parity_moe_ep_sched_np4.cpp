// Expert parallelism with the rest of the trainer's machinery (docs/moe.md): the zero-bubble
// (H1, H2) and interleaved pipeline schedules, and full recomputation, whose rerun forward
// exchanges the tokens again. Against the single rank holding every expert (parity.hpp): 20 steps'
// losses, step-1 gradients of every parameter, aux losses and loads within 1e-5.
#include <gtest/gtest.h>

#include "moe_configs.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

TEST(MoeExpertParity, Ep2Pp2ZeroBubble) {
  check_parity({1, 2, 2}, gpt2_moe({"parallel.expert=2", "parallel.schedule=zb-h1"}));
}
TEST(MoeExpertParity, Ep2Pp2ZeroBubbleH2) {
  check_parity({1, 2, 2}, gpt2_moe({"parallel.expert=2", "parallel.schedule=zb-h2"}));
}
TEST(MoeExpertParity, Ep2Pp2Interleaved) {
  check_parity({1, 2, 2}, gpt2_moe({"parallel.expert=2", "parallel.schedule=interleaved",
                                    "parallel.virtual_stages=2"}));
}
TEST(MoeExpertParity, Ep2FullRecompute) {
  check_parity({1, 1, 2}, gpt2_moe({"parallel.expert=2", "train.recompute=full"}));
}
TEST(MoeExpertParity, Ep4SelectiveRecomputeZero1) {
  check_parity({1, 1, 4}, gpt2_moe({"parallel.expert=4", "train.recompute=selective",
                                    "optim.zero_stage=1"}));
}

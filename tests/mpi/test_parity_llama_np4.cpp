// The Llama architecture (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention, untied
// head) on every parallel layout of up to 4 ranks against the single-rank run: per-step losses
// of 20 steps and every gradient after step 1 within 1e-5 relative (parity.hpp). The data are a
// Megatron indexed dataset (int32 tokens, windows across document boundaries): its windows and
// their order are the same on every layout.
#include <gtest/gtest.h>

#include "parity.hpp"

using namespace trident::test;

constexpr ParityData kIndexed = ParityData::Indexed;

TEST(LlamaParity, Tp2) { check_parity({2, 1, 1}, llama(), kIndexed); }
TEST(LlamaParity, Tp4KvHeadsEqualTensor) { check_parity({4, 1, 1}, llama(), kIndexed); }
TEST(LlamaParity, Pp2) { check_parity({1, 2, 1}, llama(), kIndexed); }
TEST(LlamaParity, Tp2Pp2) { check_parity({2, 2, 1}, llama(), kIndexed); }
TEST(LlamaParity, Tp2Dp2Zero1) {
  check_parity({2, 1, 2}, llama({"optim.zero_stage=1"}), kIndexed);
}
TEST(LlamaParity, Pp2TiedEmbeddings) {
  check_parity({1, 2, 1}, llama({"model.tie_embeddings=true"}), kIndexed);
}

// The Llama architecture under sequence parallelism against the single-rank run (apart from
// test_parity_llama_np4 so that each binary stays well inside its timeout on 2 cores). PP2 has
// one tensor rank: sequence parallelism is a no-op there, and the run says so by matching too.
#include <gtest/gtest.h>

#include "parity.hpp"

using namespace trident::test;

namespace {

std::vector<std::string> llama_sp(std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.arch=llama",   "model.heads=8",
                                "model.kv_heads=4",   "model.ffn_width=64",
                                "model.tie_embeddings=false", "model.rope_theta=500.0",
                                "parallel.sequence_parallel=true"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

}  // namespace

TEST(LlamaParity, Tp2SequenceParallel) { check_parity({2, 1, 1}, llama_sp()); }
TEST(LlamaParity, Tp4KvHeadsEqualTensorSequenceParallel) { check_parity({4, 1, 1}, llama_sp()); }
TEST(LlamaParity, Pp2SequenceParallel) { check_parity({1, 2, 1}, llama_sp()); }
TEST(LlamaParity, Tp2Pp2SequenceParallel) { check_parity({2, 2, 1}, llama_sp()); }
TEST(LlamaParity, Tp2Dp2SequenceParallelZero1) {
  check_parity({2, 1, 2}, llama_sp({"optim.zero_stage=1"}));
}

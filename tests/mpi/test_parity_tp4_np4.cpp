// Two TP 4 layouts of the parity table (each 4-rank tensor group costs ~30 s of busy-polling
// collectives on 2 cores, so no binary runs more than two): llama with kv_heads = 2 * tensor
// (8 kv heads: two per tensor rank), with and without sequence
// parallelism. Each against the single-rank run: per-step losses of 20 steps and every
// gradient after step 1 within 1e-5.
#include <gtest/gtest.h>

#include "parity.hpp"

using namespace trident::test;

namespace {

const std::vector<std::string> kLlamaKv8 = {
    "model.arch=llama", "model.heads=8", "model.kv_heads=8", "model.ffn_width=64",
    "model.tie_embeddings=false", "model.rope_theta=500.0"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(LlamaParity, Tp4KvHeadsTwiceTensor) { check_parity({4, 1, 1}, kLlamaKv8); }
TEST(LlamaParity, Tp4KvHeadsTwiceTensorSequenceParallel) {
  check_parity({4, 1, 1}, with(kLlamaKv8, {"parallel.sequence_parallel=true"}));
}

#pragma once
// The mixture-of-experts variants of the parity tests' tiny model (parity.hpp's tiny_config),
// shared by the MoE parity and checkpoint tests with and without expert parallelism.
#include <string>
#include <vector>

#include "parity.hpp"

namespace trident::test {

// 4 experts, top-2; capacity 1.0 = 16 of a sequence's 64 assignments per expert.
inline std::vector<std::string> gpt2_moe(std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.moe_experts=4", "model.moe_top_k=2",
                                "model.moe_capacity_factor=1.0", "model.moe_aux_loss_coeff=0.05",
                                "model.moe_z_loss_coeff=0.001"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// 3 SwiGLU experts, top-2, dropless, MoE layers 0 and 2 of 4. At tiny_config's lr 1e-2 this
// llama drifts from the single-rank run by 2.6e-6 in 20 steps even without experts (TP2), and
// such a drift eventually flips a top-2 choice that is nearly tied (a jump, not a drift): the
// lower lr keeps the runs within rounding of each other.
inline std::vector<std::string> llama_moe(std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.arch=llama",       "model.heads=4",
                                "model.kv_heads=2",       "model.ffn_width=48",
                                "model.moe_experts=3",    "model.moe_top_k=2",
                                "model.moe_layer_interval=2", "optim.lr=3e-3",
                                "optim.min_lr=3e-4"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// The MoE checkpoint tests' config (checkpoint_config): 4 experts (or `experts`), top-2,
// capacity 1.5, 12 steps, expert-parallel degree `ep`.
inline Config moe_for(const std::filesystem::path& dir, int tp, int pp, int dp, int zero,
                      const std::string& ckpt, int experts = 4, int ep = 1) {
  return checkpoint_config(dir, tp, pp, dp, zero, ckpt,
                           {"model.moe_experts=" + std::to_string(experts), "model.moe_top_k=2",
                            "model.moe_capacity_factor=1.5", "train.steps=12",
                            "parallel.expert=" + std::to_string(ep)});
}

}  // namespace trident::test

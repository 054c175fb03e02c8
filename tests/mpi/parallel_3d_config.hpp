#pragma once
// The model, data and optimizer settings of the 8-rank 3D tests (test_parallel_3d_np8: losses,
// gradient norms and collective counts; test_parallel_3d_grads_np8: per-parameter gradients),
// on layout (TP, PP, DP) with ZeRO stage `zero`: one definition, so both test the same run.
#include <filesystem>
#include <string>

#include "parity.hpp"

namespace trident::test {

inline Config parallel_3d_config(const std::filesystem::path& dir, int tp, int pp, int dp,
                                 int zero) {
  return parse_config(tiny_config(dir), "3d.toml",
                      {"train.steps=20", "eval.interval=0", "model.layers=2",
                       "train.global_batch=8", "train.micro_batch=2", "optim.grad_clip=1.0",
                       "parallel.dp_bucket_mb=0.05",
                       "parallel.tensor=" + std::to_string(tp),
                       "parallel.pipeline=" + std::to_string(pp),
                       "parallel.data=" + std::to_string(dp),
                       "optim.zero_stage=" + std::to_string(zero),
                       "log.dir=" + (dir / "run").string()});
}

}  // namespace trident::test

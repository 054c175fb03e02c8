#pragma once
// Checks a run makes before it allocates anything, for problems that would otherwise show only
// late (an unusable checkpoint.dir at the first save, after hours of training) or without a
// name (std::bad_alloc). Each returns "" or a one-line problem that names the keys; the trainer
// agrees on it across ranks so that every rank stops with the same error.
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "model/architecture.hpp"

namespace trident {

// checkpoint.dir as the checkpoint writer will need it: creates it (and its parents) when
// missing, as the writer would, then checks that it is a directory in which a file can be
// created (a file is created and removed: permission bits alone say nothing for root or on a
// read-only mount). "" when usable.
std::string checkpoint_dir_problem(const std::string& dir);

// A lower bound of the host memory one rank needs: its share of the weights, gradients and
// AdamW state (ZeRO-1: the state over the data-parallel group) and the activations of the
// micro-batches its pipeline stage holds at once under parallel.schedule
// (schedule_peak_bound: 1 without a pipeline, up to M under GPipe, 2p-1 under ZB-H2; under
// interleaved its chunk stashes over the v chunks, rounded down). Floating point: sizes far
// beyond int64 are still ordered correctly.
struct RankMemory {
  double parameters = 0;   // this rank's share (count)
  double state_bytes = 0;  // weights + gradients + optimizer state
  double activation_bytes = 0;
  int64_t micro_batches_held = 1;  // the stage's micro-batches of activations counted
  double total() const { return state_bytes + activation_bytes; }
};
// stage: this rank's pipeline stage (0 .. parallel.pipeline - 1).
RankMemory estimate_rank_memory(const Config& config, const ModelShard& shard, int dp_size,
                                int stage = 0);

// The node's physical memory in bytes (0 if unknown).
double physical_memory_bytes();

// "" if the rank's estimate fits in `memory_bytes` (or memory_bytes is 0), else a line naming
// the keys that size it: model.layers/model.width (the model's share) or model.seq_len/
// train.micro_batch (activations), whichever dominates first.
std::string rank_memory_problem(const Config& config, const ModelShard& shard, int rank,
                                int dp_size, double memory_bytes, int stage = 0);

}  // namespace trident

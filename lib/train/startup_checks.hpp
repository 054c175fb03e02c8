#pragma once
// Checks a run makes before it allocates anything, for problems that would otherwise show only
// late (an unusable checkpoint.dir at the first save, after hours of training) or without a
// name (std::bad_alloc). Each returns "" or a one-line problem that names the keys; the trainer
// agrees on it across ranks so that every rank stops with the same error.
#include <cstdint>
#include <string>
#include <utility>

#include "config/config.hpp"
#include "model/architecture.hpp"
#include "model/zero_shards.hpp"

namespace trident {

class ParallelDims;

// checkpoint.dir as the checkpoint writer will need it: creates it (and its parents) when
// missing, as the writer would, then checks that it is a directory in which a file can be
// created (a file is created and removed: permission bits alone say nothing for root or on a
// read-only mount). "" when usable.
std::string checkpoint_dir_problem(const std::string& dir);

// The model state of one rank holding its share of the model, by kind, under ZeRO stage
// optim.zero_stage over `dp_size` replicas (docs/parallelism.md "ZeRO stages"); per parameter
// P: weights 4, gradients 4, moments 8 at stage 0; moments 8/d at stage 1; gradients 4/d too at
// stage 2; weights 4/d too at stage 3; a compute copy of 2 at bf16 (none at stage 3). Gather
// buffers, from the largest unit L (a layer, or the embeddings on the stages that hold them):
// stage 1 and 2 the staging of a reduce-scatter / all-gather, 4 (B + B/d) for a bucket B;
// stage 2 three gradient windows, 12L, and a received slice, 4L/d; stage 3 those and 2u+1 slots
// of L compute elements (u: units a layer has, 2 with expert parallelism). Over one
// replica (d = 1) no staging and no windows.
ModelStateBytes estimate_model_state(const Config& config, const ModelShard& shard, int dp_size);
// "model state per rank (ZeRO-3 over 4 ranks): weights 2.1 MB | ..." for each pipeline stage.
std::string model_state_lines(const Config& config, int dp_size);

// A lower bound of the host memory one rank needs: its share of the weights, gradients and
// AdamW state (estimate_model_state) and the activations of the
// micro-batches its pipeline stage holds at once under parallel.schedule
// (schedule_peak_bound: 1 without a pipeline, up to M under GPipe, 2p-1 under ZB-H2; under
// interleaved its chunk stashes over the v chunks, rounded down). Floating point: sizes far
// beyond int64 are still ordered correctly.
struct RankMemory {
  double parameters = 0;   // this rank's share (count)
  double state_bytes = 0;  // weights + gradients + optimizer state
  double activation_bytes = 0;
  // checkpoint.async (with a checkpoint.dir): the staging copy of the weights and moments.
  double staging_bytes = 0;
  int64_t micro_batches_held = 1;  // the stage's micro-batches of activations counted
  double total() const { return state_bytes + activation_bytes + staging_bytes; }
};
// stage: this rank's pipeline stage (0 .. parallel.pipeline - 1).
RankMemory estimate_rank_memory(const Config& config, const ModelShard& shard, int dp_size,
                                int stage = 0);

// An amount of memory a rank may use and what limits it, as the problem line words it after
// the amount ("more than the 8.0 GB <what>"). Made from a bare number (a test's, or 0: unknown,
// no check), it is the node's physical memory.
struct MemoryLimit {
  double bytes = 0;
  std::string what = "of physical memory of this node";
  MemoryLimit(double b = 0) : bytes(b) {}  // NOLINT: implicit, as the number it stands for
  MemoryLimit(double b, std::string w) : bytes(b), what(std::move(w)) {}
};

// The limits a rank's memory is under, each {0, ...} when there is none or it is unknown:
// the address space this process may still map under RLIMIT_AS (ulimit -v: the limit less what
// is mapped already, /proc/self/statm);
MemoryLimit address_space_limit();
// the memory limit of the process's cgroup and its ancestors (v2 memory.max, v1
// memory.limit_in_bytes) from the text of /proc/self/cgroup, under `root` (/sys/fs/cgroup, with
// v2 also looked for under root/unified, v1 under root/memory);
MemoryLimit cgroup_memory_limit(const std::string& proc_self_cgroup,
                                const std::string& root = "/sys/fs/cgroup");
// the job's memory on this node under Slurm: SLURM_MEM_PER_NODE, else SLURM_MEM_PER_CPU x
// SLURM_CPUS_ON_NODE (MB, as Slurm counts: MiB).
MemoryLimit slurm_memory_limit();

// The smallest of the node's physical memory and the limits above: the memory a rank of this
// process may use at most ({0, ...} if none is known).
MemoryLimit usable_memory_limit();

// "" if the rank's estimate fits in `memory` (or memory.bytes is 0), else a line naming the keys
// that size it: model.layers/model.width (the model's share) or model.seq_len/train.micro_batch
// (activations), whichever dominates first, and the limit it exceeds.
std::string rank_memory_problem(const Config& config, const ModelShard& shard, int rank,
                                int dp_size, const MemoryLimit& memory, int stage = 0);

// "" unless checkpoint.async is set (with a checkpoint.dir) and MPI provides `thread_level`
// below MPI_THREAD_MULTIPLE, which the writer thread's collectives beside training's need.
std::string async_checkpoint_problem(const Config& config, int thread_level);

// Collective over the world of `groups`: async_checkpoint_problem, checkpoint_dir_problem
// (rank 0) and rank_memory_problem (every rank, against usable_memory_limit on the CPU; a GPU
// rank's model lives in device memory, whose allocation failures name the device), agreed so
// that every rank throws the first problem found, or none does.
void agree_start_up_checks(const Config& config, const ModelShard& shard,
                           const ParallelDims& groups);

}  // namespace trident

#pragma once
// What a training run reports on standard output, apart from the step lines (metrics_log.hpp)
// and the straggler line (straggler.hpp): the figures at start-up, the blends' shares and
// counts, and at the end the pipeline's bubbles, each rank's memory and the communication
// table. Each function returns the text (lines ending in '\n', "" when there is nothing to
// say); the caller prints it on the logging rank (util/rank_log.hpp). Those marked collective
// must be called on every rank of the group named, whichever prints.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace trident {

class AdamW;
class BlendedDataset;
class Communicator;
class Device;
class GradientSync;
class StageModel;
struct CoreShare;
struct DimGroup;
struct PipelineStats;

// "sample at step N: \"...\"\n": eval.sample_interval's text as a JSON string. A sample is
// whatever bytes the model chose: bytes that are no UTF-8 (a byte-level vocabulary's, or a
// token cut inside a character) are shown as U+FFFD instead of ending the run.
std::string sample_line(int64_t steps_done, const std::string& text);

// Start-up: the resolved config, the model's size, the tokens and FLOPs of a step, the ranks and
// their threads (`threads` per rank, `threads_explained`: where that number comes from).
std::string start_up_figures(const Config& config, int world_size, int threads,
                             const std::string& threads_explained);
// A note when `threads` per rank (set by `threads_source`: train.threads or OMP_NUM_THREADS;
// "" when chosen from the share) is above rank 0's share of cores: threads take turns on them.
std::string threads_above_share_note(int threads, const std::string& threads_source,
                                     const CoreShare& share);
// A note when parallel.tp_overlap's helper thread has no core of its own on the CPU (its polls
// then take time from the GEMMs; docs/model.md, "Overlap in backward").
std::string overlap_without_a_core_note(const Config& config, int threads,
                                        const CoreShare& share);

// Each blend's datasets with their target shares (data.train, data.val: nullptr or a single
// dataset says nothing).
std::string blend_shares_text(const BlendedDataset* train, const BlendedDataset* val);
// The samples each dataset of the data.train blend gave in steps [0, steps_done).
std::string blend_counts_text(const BlendedDataset& train, int64_t steps_done,
                              int64_t global_batch);

// Each pipeline stage's measured bubble (wait / busy) since the previous call
// (StepMetrics::pipeline_bubble). Collective over the pipeline group.
class PipelineBubbles {
 public:
  std::vector<double> since_last(const PipelineStats& stats, const DimGroup& pipeline);

 private:
  double wait_seconds_ = 0, busy_seconds_ = 0;  // at the last call
};

// Per stage, over the whole run: the bubble measured and that of the schedule in use with unit
// costs, the peak micro-batches held and their activations. Collective over the pipeline group.
std::string pipeline_report(const PipelineStats& stats, const DimGroup& pipeline,
                            const Config& config);
// Per rank: parameters (the weights stored), gradients, optimizer state and peak activations
// counted; the device allocator's bytes now and at their peak, measured; the compute copy and
// the gather buffers (ZeRO's windows, slots and staging) counted. Collective over `world`.
std::string memory_report(const StageModel& model, const AdamW& optimizer,
                          const GradientSync& sync, const PipelineStats& stats,
                          const Device& device, Communicator& world);

// Rank 0's communication at the end of a run: the host table (`host_table`, the process grid's
// stats_table over `host`), a line per operation of each device communicator (GPU runs), and
// the summary line with the share of the training time (when there was training).
std::string communication_report(const std::string& host_table,
                                 const std::vector<Communicator*>& host,
                                 const std::vector<std::unique_ptr<Communicator>>& device,
                                 int64_t steps_run, double train_seconds);

// "checkpoints: N saves took S s beyond the steps' T s of training (P %)": what the run's saves
// cost outside its steps (Trainer::checkpoint_seconds), the figure `trident plan` adds to a
// step over the checkpoint interval (docs/plan.md "Checkpoints"); "" without saves.
std::string checkpoint_report(int64_t saves, double seconds, double train_seconds);

}  // namespace trident

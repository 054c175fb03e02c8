#pragma once
// The cost model behind `trident plan` (docs/plan.md): for one parallel layout of a model on a
// described cluster (plan/hardware.hpp), the predicted step time, split by cause, and the peak
// memory per device, split by kind. Pure: no MPI, no device. It takes the FLOP counts from
// model/model_stats.hpp, the per-rank parameter counts from model/architecture.hpp, the layer
// split and activation stash bound from pipeline/schedule.hpp and the bubble from
// pipeline/simulator.hpp: one source of truth with the trainer.
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "model/architecture.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/simulator.hpp"
#include "plan/hardware.hpp"

namespace trident {

// Activation recomputation: model/architecture.hpp's Recompute (parse_recompute, to_string),
// the trainer's own.

struct Layout {
  int64_t tp = 1, pp = 1, dp = 1;
  int64_t micro_batch = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int64_t virtual_stages = 1;
  // optim.zero_stage, sharded over the data x context group (the experts' over the
  // expert-data group; docs/plan.md "ZeRO stages"): 0 nothing; 1 the AdamW moments; 2 the
  // gradients too, reduce-scattered unit by unit in every micro-batch's backward; 3 the fp32
  // master weights too, each unit's compute copy all-gathered before its forward and its
  // backward. A unit: a transformer layer (its experts a second one under EP), the embedding,
  // the LM head with the final norm.
  int zero_stage = 0;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  // Expert parallelism (parallel.expert, docs/moe.md): the experts of each MoE layer split over
  // EP ranks taken from inside DP; 1 for a dense model.
  int64_t ep = 1;
  // parallel.pipeline_balance: how the layers are cut over the stages (pipeline/stage_split.hpp):
  // "even", or "flops" (the last stage, which runs the LM head, gets fewer; one chunk per stage,
  // PP > 1 only: interleaved chunks are always even).
  std::string balance = "even";
  // Context parallelism (parallel.context, docs/plan.md "Context parallelism"): each sequence
  // split over CP ranks (2 CP chunks, rank i holding chunks i and 2 CP - 1 - i), attention by a
  // ring of K/V blocks over them; a factor of the world size, between tensor and pipeline
  // (rank = ((dp * PP + pp) * CP + cp) * TP + tp).
  int64_t cp = 1;
  int64_t devices() const { return tp * cp * pp * dp; }
};
// "tensor=8,pipeline=2,data=4,micro_batch=1,schedule=1f1b,virtual_stages=1,zero=3,
//  sequence_parallel=1,recompute=full" (one line, the --layout syntax), ",context=CP" after
// the tensor degree when CP > 1, ",expert=EP" added when EP > 1, ",pipeline_balance=flops"
// when the split is by FLOPs.
std::string to_string(const Layout& l);

// What one plan is about: the model, the batch, the precision, the cluster.
struct PlanProblem {
  ModelConfig model;
  int64_t global_batch = 1;       // sequences per step
  std::string precision = "fp32"; // train.precision
  double dp_bucket_mb = 25.0;     // parallel.dp_bucket_mb
  HardwareSpec hw;
  int64_t nodes = 1;
  // The software being modelled. Trident's trainer: attention fused (row logsumexp kept) on
  // both backends; DP reduction overlapping the last backward.
  // Other systems (bench/plan_megatron_table1.sh models Megatron-LM of 2021, which had
  // neither) set them apart: plan --attention materialized --no-dp-overlap.
  std::string attention;  // "" (the backend's for hw.device.kind) | "materialized" | "fused"
  bool dp_overlap = true;
  // Dropout on the materialized attention probabilities (Megatron-LM's attention_dropout;
  // Trident's trainer has none): plan --attention-dropout.
  bool attention_dropout = false;
  // train.fp8_skip_first_layers, train.fp8_skip_last_layers (precision "fp8"): the layers at
  // each end of the model whose linear layers keep the base precision.
  int64_t fp8_skip_first = 1, fp8_skip_last = 1;
  // train.fp8_recipe = "delayed": scales fixed before the step from the amax history, so no
  // per-GEMM amax all-reduce (one reduction of every layer's amaxes a step: a few hundred bytes,
  // not counted) and, on a GPU, the amax taken in the quantisation pass (no pass of its own).
  bool fp8_delayed = false;
  // checkpoint.interval and checkpoint.async with a checkpoint.dir (docs/plan.md
  // "Checkpoints"): a save every `checkpoint_interval` steps (0: no periodic saves), written by
  // a thread of each rank while training goes on when `checkpoint_async`. Modelled where the
  // hardware file gives storage.write_gbs (models_checkpoints).
  int64_t checkpoint_interval = 0;
  bool checkpoint_async = false;
  bool models_checkpoints() const { return checkpoint_interval > 0 && hw.storage_write_gbs > 0; }
  bool materialized_attention() const {
    return attention.empty() ? hw.device.materializes_attention() : attention == "materialized";
  }
  int64_t devices() const { return nodes * hw.devices_per_node; }
  bool fp8() const { return precision == "fp8"; }
  // Whether model layer `layer` runs its linear layers' GEMMs in FP8: the trainer's own test
  // (Fp8Settings::covers); false unless precision is "fp8".
  bool fp8_covers(int64_t layer) const;
  // The layers fp8_covers, of model.layers.
  int64_t fp8_layers() const;
  // The precision of everything but the FP8 GEMMs (activations, the weights' compute copy,
  // attention, norms, the LM head): `precision`, or for "fp8" hw.fp8_base_precision() (bf16
  // on a GPU, fp32 on the CPU reference).
  std::string base_precision() const;
};

// Seconds of one training step, by cause. Their sum is the step time.
struct StepTime {
  double compute = 0.0;      // matmuls and memory-bound work of the slowest stage, recompute incl.
  double tp_comm = 0.0;      // tensor-parallel all-reduces / all-gathers / reduce-scatters
                             // (fp8's amax all-reduces included)
  double bubble = 0.0;       // pipeline idle time (the schedule's simulator)
  double pp_transfer = 0.0;  // pipeline activation / gradient messages on the critical path
  double ep_comm = 0.0;      // expert-parallel all-to-alls of the MoE layers' routed rows
  double cp_comm = 0.0;      // the context-parallel K/V ring, what attention does not hide
                             // (and fp8's amax all-reduces over the context group)
  double dp_exposed = 0.0;   // data-parallel gradient reduction not hidden behind backward
  double optimizer = 0.0;    // AdamW (memory-bound) on the rank's slice
  double checkpoint = 0.0;   // what training waits for one save, over the checkpoint interval
  double total() const {
    return compute + tp_comm + bubble + pp_transfer + ep_comm + cp_comm + dp_exposed +
           optimizer + checkpoint;
  }
};

// Bytes on the fullest device, by kind.
struct MemoryUse {
  double weights = 0.0;      // fp32 master (+ the bf16 compute copy); ZeRO-3: the master's
                             // slice and the gather buffers of the units' compute copies
  double gradients = 0.0;    // fp32; ZeRO-2/3: the slice and the units' gradient windows
  double optimizer = 0.0;    // AdamW moments, fp32 (1/(DP x CP) from ZeRO stage 1)
  double activations = 0.0;  // the stashes the schedule holds at its peak
  double buffers = 0.0;      // communication and backward scratch, reserved memory
  double staging = 0.0;      // checkpoint.async's staging copy on a CPU (host memory is its
                             // memory; a GPU's is host memory: Prediction::checkpoint_*)
  double total() const {
    return weights + gradients + optimizer + activations + buffers + staging;
  }
};

struct Prediction {
  Layout layout;
  int64_t microbatches = 0;     // per replica per step
  StepTime time;
  MemoryUse memory;             // of the fullest stage
  int64_t fullest_stage = 0;
  bool fits = false;            // memory.total() <= device capacity
  double step_seconds = 0.0;
  double tokens_per_second = 0.0;
  double model_flops_per_step = 0.0;    // the model's training FLOPs (model_stats)
  double hardware_flops_per_step = 0.0; // + recomputation
  double tflops_per_device = 0.0;       // hardware FLOPs / step time / devices
  double mfu = 0.0;                     // model FLOPs / step time / devices / peak
  // The data-parallel gradient reduction (DP > 1): its whole time, the backward it is taken to
  // overlap (the last micro-batch's, on the busiest stage) and the part of it the model counts
  // as hidden there. That overlap is assumed, not simulated: the pipeline's simulator schedules
  // the stages' ops and transfers, never the reduction's buckets (layout_warnings says so).
  double dp_gradient_bytes = 0.0;  // the largest stage's gradients, fp32
  double dp_reduce_seconds = 0.0;
  double dp_window_seconds = 0.0;
  double dp_hidden_seconds = 0.0;
  // The data group's traffic over a step, message bytes (the buffer each collective is of,
  // as collective_seconds takes it) of the largest stage: the gradients reduced (an
  // all-reduce or, from ZeRO stage 1, a reduce-scatter: once a step, from stage 2 once a
  // micro-batch) and the weights all-gathered (stages 1 and 2: the fp32 weights after the
  // update; stage 3: the compute copy before each micro-batch's forward and backward).
  double dp_reduced_bytes = 0.0;
  double dp_gathered_bytes = 0.0;
  // The context-parallel ring (CP > 1): one K/V block (B x T/CP tokens' k and v of the rank's
  // KVH/TP heads), the bytes one layer's forward sends (CP - 1 blocks), and over the step on
  // the busiest stage the seconds all its transfers take on the link (forward, backward's K/V
  // and dK/dV, recomputation's) and the part of them exposed (time.cp_comm).
  double cp_block_bytes = 0.0;
  double cp_forward_bytes_per_layer = 0.0;
  double cp_ring_seconds = 0.0;
  // train.precision = "fp8" (docs/plan.md "FP8"): the model's layers whose linear GEMMs run in
  // FP8 (PlanProblem::fp8_layers); over a step on the busiest stage, those GEMMs' seconds at
  // the FP8 rate (in time.compute), the quantisation passes' bytes and seconds (memory-bound,
  // in time.compute) and the amax all-reduces of one float: how many cross a group of more
  // than one rank (tensor, and context for activations) and their seconds (in time.tp_comm and
  // time.cp_comm); on the fullest stage the quantised copies' scratch (in memory.buffers).
  // `mfu` stays against the base precision's peak ("bf16-equivalent" on a GPU).
  int64_t fp8_layers = 0;
  double fp8_gemm_seconds = 0.0;
  double fp8_quantise_bytes = 0.0;
  double fp8_quantise_seconds = 0.0;
  double fp8_amax_reductions = 0.0;
  double fp8_amax_seconds = 0.0;
  double fp8_scratch_bytes = 0.0;
  // time.compute split by what does it, over a step on the busiest stage (docs/plan.md "The
  // cost model"): the transformer layers' linear GEMMs (the experts' and router's under MoE;
  // at the FP8 rate where FP8 runs them), their attention cores, their memory-bound passes
  // (the stash's traffic, materialized scores, dropout, FP8 quantisation), and the LM head and
  // loss (its GEMMs and the logits' passes); recomputation's reruns in each. They sum to
  // time.compute: what a measured step's kernel table is set beside.
  double compute_gemm_seconds = 0.0;
  double compute_attention_seconds = 0.0;
  double compute_memory_seconds = 0.0;
  double compute_head_seconds = 0.0;
  // Checkpoints (PlanProblem::models_checkpoints; docs/plan.md "Checkpoints"): one save's bytes
  // (every parameter's fp32 weight and two AdamW moments, written once whatever the layout),
  // the seconds the job's write of them takes at storage.write_gbs, the fullest rank's staging
  // copy of its weights and moments (bytes; seconds: a device-to-host copy at
  // device.host_link_gbs on a GPU, a copy in memory on a CPU) and what training waits for one
  // save (checkpoint_stall_seconds; time.checkpoint is it over the interval): synchronous, the
  // staging on a GPU and the write; asynchronous on a GPU, the staging (the main thread
  // copies) and the part of the write that outlasts the interval's steps (the next save waits
  // for it: checkpoint_backlog); asynchronous on a CPU, the staging and the write, both done by
  // the writer thread on the cores the step's threads fill.
  double checkpoint_bytes = 0.0;
  double checkpoint_write_seconds = 0.0;
  double checkpoint_staging_bytes = 0.0;
  double checkpoint_staging_seconds = 0.0;
  double checkpoint_stall_seconds = 0.0;
  bool checkpoint_backlog = false;
};

// ZeRO-2 and 3's transient full-size units (docs/plan.md "ZeRO stages"), each the size of the
// stage's largest unit: the gradient windows a unit's backward writes before they are
// reduce-scattered (fp32: the one being written, the one in flight) and, under stage 3, the
// gather buffers of the compute copy (the unit in use, the one prefetched, the one in flight).
inline constexpr double kZeroGradientWindows = 2.0;
inline constexpr double kZeroGatherBuffers = 3.0;

// What a plan's numbers may hide, said beside them (docs/plan.md "Warnings"). `kind` is a
// short name (JSON) and `code` its letter in the table's warn column; `text` one line.
struct PlanWarning {
  std::string kind;
  char code = ' ';
  std::string text;
};

// The thresholds of the warnings (docs/plan.md "Warnings").
inline constexpr int64_t kWarnMicrobatchesPerStage = 2;  // micro-batches per step per stage
inline constexpr double kWarnHeadroom = 0.10;            // of the device's memory
inline constexpr double kWarnBubble = 0.20;              // of the step
inline constexpr double kWarnRingExposed = 0.05;         // of the step
inline constexpr double kWarnCheckpoint = 0.05;          // of the step, over the interval

// The plan's own warnings, for every layout alike: fewer sequences per step than devices (no
// layout can give every device a sequence of its own: DP <= the global batch, so the rest of the
// devices go to TP x PP whether or not the model needs them).
std::vector<PlanWarning> problem_warnings(const PlanProblem& p);

// A predicted layout's warnings, each where its condition holds:
//   microbatches (m): PP > 1 and M = global batch / (DP x micro_batch) < 2 PP micro-batches;
//   headroom (h): it fits, with under 10 % of the device's memory_gib left;
//   bubble (b): the pipeline bubble over 20 % of the step;
//   overlap (o): some of the DP gradient reduction counted as hidden behind backward, an
//   overlap the model assumes rather than schedules;
//   ring (r): the context-parallel ring's exposed transfers over 5 % of the step;
//   context_nodes (x): CP > 1 and the context group crosses nodes (TP x CP > devices per node),
//   its ring on the inter-node link;
//   checkpoint (c): checkpoints cost over 5 % of the step, or an asynchronous save's write
//   outlasts the interval (each save then waits for the one before).
std::vector<PlanWarning> layout_warnings(const PlanProblem& p, const Prediction& r);

// What one of r's saves writes and stages (PlanProblem::models_checkpoints): "96.4 GB written
// at 10 GB/s in 9.64 s; staging 1.51 GB a rank in 0.0235 s", for the checkpoint warning and the
// plan's checkpoints line.
std::string checkpoint_save_text(const PlanProblem& p, const Prediction& r);

// Why `l` cannot run `p` (one line naming the key), or "" when it can: the trainer's own
// layout checks (heads, kv heads, FFN width and vocabulary divisible by TP; TP within a node;
// PP <= layers), plus: devices = nodes * devices_per_node, micro_batch * DP dividing the global
// batch, the schedule's own conditions (interleaved, as the trainer runs it: v >= 2, PP >= 2,
// micro-batches a multiple of PP, model.layers divisible by PP x v; others v = 1), sequence
// parallelism only with TP > 1, and context parallelism's: model.seq_len divisible by 2 CP,
// under sequence parallelism micro_batch x seq_len / CP divisible by TP, no MoE layers.
std::string layout_problem(const PlanProblem& p, const Layout& l);

// The prediction for a valid layout; trident::Error (layout_problem's line) otherwise.
Prediction predict(const PlanProblem& p, const Layout& l);

// Activation bytes one layer keeps for backward, for one micro-batch of `micro_batch`
// sequences on one tensor rank: model/model_stats.hpp's layer_activation_bytes (the trainer's
// own count) with `element_bytes` per activation element, fp32 statistics, and attention's saved
// state fp32 probabilities [N, NH/TP, T] when `materialized_attention`, else one logsumexp per
// row and head.
double layer_activation_bytes(const ModelConfig& m, bool materialized_attention, int64_t micro_batch,
                              int64_t tp, bool sequence_parallel, Recompute recompute,
                              double element_bytes);

// The (token, expert) assignments a MoE layer's experts compute for one micro-batch of
// `micro_batch` sequences, routing assumed balanced: N * top_k, less what the capacity drops
// (model.moe_capacity_factor > 0: each expert takes at most ceil(factor * T * top_k / E) of a
// sequence's T * top_k assignments, so E * capacity of them at most; 0, dropless: all).
double moe_routed_rows(const ModelConfig& m, int64_t micro_batch);

// The simulated makespan of l's schedule over `microbatches` with uniform op costs: the
// simulator itself up to 5 PP micro-batches, its steady-state period extended beyond.
double pipeline_makespan(const Layout& l, int64_t microbatches, const PipeSimCosts& costs);
// The same with stage s computing chunk c at chunk_costs[s][c] (PP entries of virtual_stages
// each): the chunk holding the embedding or the LM head costs more than the others.
double pipeline_makespan(const Layout& l, int64_t microbatches,
                         const std::vector<std::vector<PipeSimCosts>>& chunk_costs);

// A partial layout: fields left unset (0 / empty) are enumerated.
struct LayoutFilter {
  int64_t tp = 0, pp = 0, dp = 0, micro_batch = 0, virtual_stages = 0, ep = 0, cp = 0;
  std::string schedule;   // "" or a schedule name
  int zero_stage = -1;    // -1 any, 0 .. 3
  int sequence_parallel = -1;
  std::string recompute;  // "" or none|selective|full
  std::string balance;    // "" or even|flops (pipeline_balance)
};
// "tensor=8,context=2,pipeline=2,..." (to_string(Layout)'s keys, any subset); trident::Error
// naming the unknown key or bad value.
LayoutFilter parse_layout_filter(const std::string& text);

// The trainer's config overrides that run layout `l` at `global_batch` sequences per step
// ("parallel.tensor=2", ..., "train.recompute=full"): trident plan prints them as --set lines,
// trident train --plan auto applies them.
std::vector<std::string> layout_overrides(const Layout& l, int64_t global_batch);

// What a plan models, beyond which it refuses (plan_size_problem) rather than search for
// minutes: the enumeration walks the divisors of the devices and of the global batch, and each
// layout's pipeline simulation costs PP x 5 PP micro-batches (pipeline_makespan), so a PP of
// 128 takes ~0.2 s and the PP^2 growth makes deeper ones minutes. The largest published runs
// are ~10^5 devices, a few thousand sequences a step and PP <= 64.
inline constexpr int64_t kPlanMaxDevices = int64_t{1} << 20;      // nodes x devices per node
inline constexpr int64_t kPlanMaxGlobalBatch = int64_t{1} << 24;  // sequences per step
inline constexpr int64_t kPlanMaxPipeline = 128;                  // stages; deeper: not listed

// Why `p` is past those bounds (one line naming the devices or the global batch, and the
// bound), or "" when it is not. `batch_source` names where the global batch came from
// ("--global-batch", "train.global_batch").
std::string plan_size_problem(const PlanProblem& p, const std::string& batch_source);

// The context-parallel degrees enumerated: powers of two up to kPlanMaxContext that leave each
// context rank at least kPlanMinContextTokens of a sequence (two chunks of 1K; 2K of a 128K
// sequence at CP 64, no CP for 2K): a ring step of fewer tokens is too small an attention to
// hide its transfer or fill a device, and each degree multiplies the layouts searched (a 4K
// sequence's CP 2 alone: 2x the layouts). Any other value only when `--layout context=` asks
// for it.
inline constexpr int64_t kPlanMaxContext = 64;
inline constexpr int64_t kPlanMinContextTokens = 2048;

// Every valid layout matching `f` (layout_problem() == ""), in a fixed order. With MoE layers
// (model.moe_experts = E > 0) every EP dividing both DP and E; a dense model EP 1 only. Both
// pipeline balances where they differ (PP > 1, one chunk per stage), "even" elsewhere. CP in
// powers of two up to kPlanMaxContext and model.seq_len / kPlanMinContextTokens (f.cp: that
// value only).
// PP up to kPlanMaxPipeline. trident::Error (plan_size_problem's line) for a problem past the
// plan's bounds.
std::vector<Layout> enumerate_layouts(const PlanProblem& p, const LayoutFilter& f);
// Whether kPlanMaxPipeline left out a PP that `f`, the devices, the layers and the global batch
// allow (TP x CP x PP x DP = the devices, PP <= model.layers, DP dividing the global batch): the
// plan then says so.
bool pipeline_cap_excludes(const PlanProblem& p, const LayoutFilter& f);

// Predictions of `layouts`, the fitting ones first, each group by step time (fastest first).
std::vector<Prediction> rank_layouts(const PlanProblem& p, const std::vector<Layout>& layouts);

}  // namespace trident

#pragma once
// Simulation of all stages of one pipeline together, under the executor's rules: each stage
// executes its op list (pipeline/schedule.hpp) in order. A send is non-blocking: it appends
// the message (micro-batch, destination chunk, ready time) to the FIFO channel (from stage, to
// stage, direction). A receive blocks until its channel is non-empty, then takes the front
// message, which must be the receive's own micro-batch and chunk (MPI with one tag per
// direction matches in send order). Stages are stepped round-robin, one op each per round.
// Time: each stage has a clock; compute ops advance it by their cost, a send stamps its message
// ready at clock + comm and does not advance it, a receive advances it to at least the
// message's ready time.
// Also checked: an op's own preconditions (Forward after its RecvForward; SendForward after
// Forward; Backward / BackwardInput after Forward and RecvBackward; BackwardWeight after
// BackwardInput; SendBackward after the input gradient), no receive from / send to a virtual
// stage that does not exist, every channel empty at the end, every micro-batch of every chunk
// forwarded and backwarded (whole, or input and weight parts) once on every stage.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pipeline/schedule.hpp"

namespace trident {

struct PipeSimCosts {
  double forward = 1.0;
  double backward = 2.0;  // a whole Backward: input and weight gradients
  double comm = 0.0;
  // The weight-gradient part of `backward`: BackwardWeight costs `weight`, BackwardInput
  // `backward - weight` (the zero-bubble schedules).
  double weight = 1.0;
};

struct PipeSimInterval {
  PipeOp op;  // a compute op: Forward, Backward, BackwardInput or BackwardWeight
  double start;
  double end;
};

struct PipeSimResult {
  bool ok = false;
  std::string error;  // when !ok: what went wrong and the state of every stage and channel
  double makespan = 0.0;                              // the latest stage clock at the end
  std::vector<double> busy;                           // per stage: compute time
  std::vector<int64_t> peak_in_flight;                // per stage, in chunk stashes
  std::vector<std::vector<PipeSimInterval>> timeline; // per stage: compute intervals in order
  // Fraction of stage-time spent idle: 1 - sum(busy) / (stages * makespan).
  double bubble_fraction() const;
};

// stage_ops[s]: the op list of stage s; every stage holds `virtual_stages` chunks.
PipeSimResult simulate_pipeline(const std::vector<std::vector<PipeOp>>& stage_ops,
                                int64_t microbatches, const PipeSimCosts& costs = {},
                                int virtual_stages = 1);

// Stage s computing at its own costs stage_costs[s] (a send: at its sender's comm), e.g. the
// op times a real run measured per stage; as many entries as stages.
PipeSimResult simulate_pipeline_per_stage(const std::vector<std::vector<PipeOp>>& stage_ops,
                                          int64_t microbatches,
                                          const std::vector<PipeSimCosts>& stage_costs,
                                          int virtual_stages = 1);

// Stage s computing chunk c at chunk_costs[s][c] (a send: at its sender chunk's comm), e.g.
// the op times a real interleaved run measured per chunk: the chunk holding the embedding or
// the LM head costs more than the others. As many entries as stages, each with
// `virtual_stages` chunks' costs.
PipeSimResult simulate_pipeline_per_chunk(
    const std::vector<std::vector<PipeOp>>& stage_ops, int64_t microbatches,
    const std::vector<std::vector<PipeSimCosts>>& chunk_costs, int virtual_stages);

// Seconds of one compute op (Forward, Backward, BackwardInput, BackwardWeight) of stage `stage`.
using PipeOpSeconds = std::function<double(int stage, const PipeOp& op)>;

// Every compute op at its own cost, op_seconds(stage, op) (e.g. what each op of one measured
// step took), a send at its sender chunk's chunk_costs[s][c].comm (the other fields unused).
PipeSimResult simulate_pipeline_per_op(const std::vector<std::vector<PipeOp>>& stage_ops,
                                       int64_t microbatches,
                                       const std::vector<std::vector<PipeSimCosts>>& chunk_costs,
                                       const PipeOpSeconds& op_seconds, int virtual_stages);

// All stages of one schedule, simulated.
PipeSimResult simulate_pipeline(ScheduleKind kind, int stages, int64_t microbatches,
                                const PipeSimCosts& costs = {}, int virtual_stages = 1);

}  // namespace trident

#pragma once
// Pipeline parallelism, the pure part: which layers each stage holds, and the ordered list of
// operations one stage performs in one training step (docs/pipeline.md). No MPI, no tensors:
// the executor walks the op list, doing sends as non-blocking isends (completed later) and
// receives as blocking receives. simulate_pipeline() runs all stages' lists together under the
// same rules, to prove a schedule completes and to estimate its bubble.
//
// Room for interleaved 1F1B (virtual stages) later: PipeOp would gain a `chunk` field (the
// model chunk the op runs on, default 0, so `PipeOp{kind, micro}` stays valid) and
// pipeline_schedule() a chunk count; the simulator's channels would then also key on the chunk.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trident {

// The six operations of a stage. Forward/Backward compute one micro-batch; the others move the
// activation (forward direction, stage s -> s+1) or its gradient (backward, s+1 -> s).
enum class PipeOpKind { RecvForward, Forward, SendForward, RecvBackward, Backward, SendBackward };

struct PipeOp {
  PipeOpKind kind;
  int64_t micro;  // micro-batch index, 0 .. microbatches-1
  bool operator==(const PipeOp&) const = default;
};

enum class ScheduleKind { OneFOneB, GPipe };

// "1f1b" | "gpipe" (the values of parallel.schedule); anything else: trident::Error.
ScheduleKind parse_schedule_kind(const std::string& name);
std::string to_string(ScheduleKind kind);  // "1f1b" | "gpipe"

// Short names for logs and test failures: RF, F, SF, RB, B, SB; an op adds its micro-batch
// ("F3", "RB2"); a list is its ops separated by spaces.
std::string to_string(PipeOpKind kind);
std::string to_string(const PipeOp& op);
std::string to_string(const std::vector<PipeOp>& ops);

// The ordered operations of stage `stage` (0-based, of `stages`) for one training step of
// `microbatches` micro-batches. Pure. A forward of micro-batch m is
//   [RecvForward m (not on the first stage), Forward m, SendForward m (not on the last stage)]
// and a backward is
//   [RecvBackward m (not on the last stage), Backward m, SendBackward m (not on the first stage)];
// the last stage computes the loss in Forward and starts Backward from it.
//   GPipe: the forwards of micro-batches 0..M-1, then the backwards in the same order 0..M-1.
//   1F1B:  warmup = min(stages - stage - 1, M) forwards, then M - warmup times (next forward,
//          oldest backward), then the remaining warmup backwards.
// Both schedules run forwards and backwards in micro-batch order, so gradients accumulate in
// the same order (and to the same bits) under either schedule.
// trident::Error when stages < 1, stage is not in [0, stages) or microbatches < 1.
std::vector<PipeOp> pipeline_schedule(ScheduleKind kind, int stage, int stages, int64_t microbatches);

// Most micro-batches whose Forward has run and whose Backward has not, over the list: the
// activations the stage must hold at once (1F1B: min(stages - stage, M); GPipe: M).
int64_t peak_in_flight(const std::vector<PipeOp>& ops);

// Layers per stage. `explicit_counts` non-empty (parallel.pipeline_layers): used as given after
// checking it has `stages` entries, each >= 1, summing to `layers`. Empty: an even split,
// layers / stages each, and the remainder r = layers % stages one extra layer on each of the r
// stages just before the last (stages - 1 - r .. stages - 2). The last stage never gets an
// extra (it also runs the final layer norm, the LM head and the loss); among the others the
// later stages hold fewer micro-batches in flight under 1F1B, so extras go as late as possible
// and the first stage gets one only when every other non-last stage does.
// E.g. 10 layers on 4 stages: [2, 3, 3, 2]; 7 on 4: [2, 2, 2, 1]; 3 on 2: [2, 1].
// trident::Error (one line naming parallel.pipeline, parallel.pipeline_layers or model.layers)
// when stages < 1, layers < 1, stages > layers, or the explicit counts are wrong.
std::vector<int64_t> stage_layer_counts(int64_t layers, int stages,
                                        const std::vector<int64_t>& explicit_counts);

// [begin, end) global layer indices of stage `stage` under `counts`. trident::Error when
// `stage` is not in [0, counts.size()).
std::pair<int64_t, int64_t> stage_layer_range(const std::vector<int64_t>& counts, int stage);

// ---- Simulation of all stages of one pipeline together -------------------------------------
// Each stage executes its op list in order. A send is non-blocking: it appends the message
// (micro-batch, ready time) to the FIFO channel (from, to, direction). A receive blocks until
// its channel is non-empty, then takes the front message, which must carry the receive's
// micro-batch (MPI with one tag per direction matches in send order). Stages are stepped
// round-robin, one op each per round. Time: each stage has a clock; Forward and Backward
// advance it by their cost, a send stamps its message ready at clock + comm and does not
// advance it, a receive advances it to at least the message's ready time.
// Also checked: an op's own preconditions (Forward m after RecvForward m; SendForward m after
// Forward m; Backward m after Forward m and RecvBackward m; SendBackward m after Backward m),
// no receive from / send to a stage that does not exist, every channel empty at the end, every
// micro-batch forwarded and backwarded once on every stage.
struct PipeSimCosts {
  double forward = 1.0;
  double backward = 2.0;
  double comm = 0.0;
};

struct PipeSimInterval {
  PipeOp op;  // Forward or Backward
  double start;
  double end;
};

struct PipeSimResult {
  bool ok = false;
  std::string error;  // when !ok: what went wrong and the state of every stage and channel
  double makespan = 0.0;                              // the latest stage clock at the end
  std::vector<double> busy;                           // per stage: compute time
  std::vector<int64_t> peak_in_flight;                // per stage
  std::vector<std::vector<PipeSimInterval>> timeline; // per stage: compute intervals in order
  // Fraction of stage-time spent idle: 1 - sum(busy) / (stages * makespan).
  double bubble_fraction() const;
};

PipeSimResult simulate_pipeline(const std::vector<std::vector<PipeOp>>& stage_ops,
                                int64_t microbatches, const PipeSimCosts& costs = {});

// All stages of one schedule, simulated.
PipeSimResult simulate_pipeline(ScheduleKind kind, int stages, int64_t microbatches,
                                const PipeSimCosts& costs = {});

}  // namespace trident

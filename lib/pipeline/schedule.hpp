#pragma once
// Pipeline parallelism, the pure part: which layers each stage holds, and the ordered list of
// operations one stage performs in one training step (docs/pipeline.md). No MPI, no tensors:
// the executor walks the op list, doing sends as non-blocking isends (completed later) and
// receives as blocking receives. pipeline/simulator.hpp runs all stages' lists together under
// the same rules, to prove a schedule completes and to measure its bubble.
//
// Virtual stages (the interleaved schedule): the layers are cut into stages * v chunks and
// stage s holds chunks s, s + p, s + 2p, ... (its local chunk c is the model's virtual stage
// c * p + s). An op names its local chunk; activations flow virtual stage k -> k + 1, so the
// last stage's chunk c feeds the first stage's chunk c + 1.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trident {

// The operations of a stage. Forward/Backward compute one micro-batch of one chunk; the
// receives and sends move the activation (forward direction, virtual stage k -> k+1) or its
// gradient (backward, k+1 -> k). Backward computes both the input gradient and the weight
// gradient; the zero-bubble schedules split it into BackwardInput (the input gradient: on the
// critical path, the previous stage waits for it) and BackwardWeight (the weight gradient,
// which nothing downstream waits for, so it can be deferred into the bubble).
enum class PipeOpKind {
  RecvForward, Forward, SendForward, RecvBackward, Backward, SendBackward,
  BackwardInput, BackwardWeight
};

struct PipeOp {
  PipeOpKind kind;
  int64_t micro;   // micro-batch index, 0 .. microbatches-1
  int chunk = 0;   // the stage's local model chunk, 0 .. virtual_stages-1
  bool operator==(const PipeOp&) const = default;
};

enum class ScheduleKind { OneFOneB, GPipe, Interleaved, ZeroBubbleH1, ZeroBubbleH2 };

// "1f1b" | "gpipe" | "interleaved" | "zb-h1" | "zb-h2"; anything else: trident::Error naming
// parallel.schedule.
ScheduleKind parse_schedule_kind(const std::string& name);
std::string to_string(ScheduleKind kind);

// Whether the schedule splits each backward into BackwardInput and BackwardWeight (the
// zero-bubble schedules): the activations must then keep what the input gradient leaves for
// the weight gradient.
bool splits_backward(ScheduleKind kind);

// Short names for logs and test failures: RF, F, SF, RB, B, SB, BI (BackwardInput), W; an op
// adds its micro-batch ("F3", "RB2") and, for a chunk other than 0, ":chunk" ("F3:1"); a list
// is its ops separated by spaces.
std::string to_string(PipeOpKind kind);
std::string to_string(const PipeOp& op);
std::string to_string(const std::vector<PipeOp>& ops);

// The ordered operations of stage `stage` (0-based, of `stages`) for one training step of
// `microbatches` (M) micro-batches, the stage holding `virtual_stages` (v) chunks. Pure.
// A forward of micro-batch m on chunk c is
//   [RecvForward (not on virtual stage 0), Forward, SendForward (not on the last virtual stage)]
// and a backward is
//   [RecvBackward (not on the last virtual stage), Backward | BackwardInput,
//    SendBackward (not on virtual stage 0)];
// the last virtual stage computes the loss in Forward and starts the backward from it.
//   GPipe: the forwards of micro-batches 0..M-1, then the backwards in the same order.
//   1F1B:  warmup = min(stages - stage - 1, M) forwards, then M - warmup times (next forward,
//          oldest backward), then the remaining warmup backwards.
//   Interleaved (Megatron-LM's interleaved 1F1B, v >= 2, p >= 2, M a multiple of p): the k-th
//          forward of a stage (k < M v) runs chunk (k mod p v) / p on micro-batch
//          (k / p v) p + k mod p; the k-th backward the same micro-batch on chunk
//          v - 1 - (k mod p v) / p. Warmup: all M v forwards first when M = p, else
//          min((p - stage - 1) * 2 + (v - 1) * p, M v); then (next forward, oldest backward)
//          pairs; then the remaining backwards.
//   ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", the handcrafted schedule H1): 1F1B's
//          order with every Backward split into BackwardInput in 1F1B's place and
//          BackwardWeight deferred: stage s keeps up to s weight gradients pending (run after
//          the input gradient that makes more than s pending), and runs the rest at the end.
//          The later stages, which hold fewer micro-batches under 1F1B, thereby hold at most
//          min(stages, M), the first stage's 1F1B peak, and their deferred weight gradients fill
//          the cooldown bubble: with unit F = B = W the bubble is (p-1)/(3M+p-1), a third of
//          1F1B's.
//   ZB-H2 (the same paper's H2): more memory for less bubble when the weight gradient costs
//          less than the input gradient. Stage s runs 2(p-s)-1 forwards before its first
//          BackwardInput (H1: p-s), filling the wait for the first gradient, then (input
//          gradient, weight gradient unless deferred, next forward); it keeps up to 2s weight
//          gradients pending (H1: s), so the later stages' deferred weight gradients fill the
//          longer cooldown. Every stage holds min(2p-1, M) micro-batches. For M < 2p-1 the
//          deferral is capped at M-(p-s): uncapped, the schedule would be slower than ZB-H1
//          there; capped, it is never slower (the tests check every p <= 8, M <= 16 with
//          W = B and W < B). With F = B = W its step equals ZB-H1's for M >= 2p-1; with
//          W < B it is shorter: the extra forwards fill stage 0's wait for its first
//          gradient, and the later stages' deferred weight gradients overlap stage 0's last
//          input and weight gradients.
// Every schedule runs the forwards and the backwards (and weight gradients) of a chunk in
// micro-batch order, so gradients accumulate in the same order (and to the same bits).
// trident::Error (one line naming the keys) when stages < 1, stage is not in [0, stages),
// microbatches < 1, virtual_stages is not 1 for a schedule other than interleaved, or for
// interleaved when virtual_stages < 2, stages < 2 or microbatches is not a multiple of stages.
std::vector<PipeOp> pipeline_schedule(ScheduleKind kind, int stage, int stages,
                                      int64_t microbatches, int virtual_stages = 1);

// The activation stashes a stage holds at once under the schedule: chunk micro-batches whose
// Forward has run and whose Backward (or BackwardWeight, which still needs the stash) has not.
// In units of one chunk's activations (a stage's activations / v):
//   GPipe M;  1F1B min(stages - stage, M);  ZB-H1 min(stages, M);  ZB-H2 min(2 stages - 1, M);
//   interleaved min(warmup + 1, M v) with warmup as above.
int64_t schedule_peak_bound(ScheduleKind kind, int stage, int stages, int64_t microbatches,
                            int virtual_stages = 1);

// Most chunk micro-batches whose Forward has run and whose Backward (or BackwardWeight) has not,
// over the list: the activations the stage must hold at once (schedule_peak_bound).
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

// Layers per stage balancing work (parallel.pipeline_balance = "flops"): every layer costs
// `layer_cost`, the last stage `last_extra` more (the final norm, the LM head and the loss);
// the embedding is a gather, counted as nothing. The last stage gets the k layers that minimise
// the largest stage cost, the others the rest split as stage_layer_counts' even rule does
// (extras on the latest of them). Ties go to the smaller k: a FLOP count prices the head's
// GEMMs but not its softmax and loss, which cost more than their FLOPs. last_extra = 0 gives the
// even split. E.g. 8 layers, 2 stages, head 3 layers' cost: [6, 2]. Errors as stage_layer_counts.
std::vector<int64_t> balanced_stage_layer_counts(int64_t layers, int stages, double layer_cost,
                                                 double last_extra);

// [begin, end) global layer indices of stage `stage` under `counts`. trident::Error when
// `stage` is not in [0, counts.size()).
std::pair<int64_t, int64_t> stage_layer_range(const std::vector<int64_t>& counts, int stage);

// The interleaved schedule's chunks of stage `stage`: the layers are cut into stages *
// virtual_stages chunks of layers / (stages * virtual_stages) each, and the stage holds chunks
// stage, stage + stages, stage + 2 stages, ... (its local chunk c is virtual stage
// c * stages + stage). [begin, end) layer ranges, in model order. trident::Error (one line
// naming model.layers, parallel.pipeline and parallel.virtual_stages) when the layers do not
// divide evenly, and for stages / virtual_stages < 1 or a stage out of range.
std::vector<std::pair<int64_t, int64_t>> stage_layer_chunks(int64_t layers, int stages,
                                                            int virtual_stages, int stage);

}  // namespace trident

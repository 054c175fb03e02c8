#pragma once
// Runs one stage's pipeline schedule for one training step: forwards and backwards of the
// stage's model shard, activations to the next stage and gradients to the previous one by
// non-blocking point-to-point messages, activations stashed from a micro-batch's forward to its
// backward (under ZB-H1's split backward: to its weight gradient) and freed right after. It
// knows the schedule's operations, not the model's layers.
// Under the interleaved schedule the model holds several chunks (virtual stages); a chunk's
// output goes to the next stage's same chunk, or from the last stage to the first stage's next
// chunk, and its input gradient the reverse way (docs/pipeline.md, "Interleaved execution").
// Messages are device memory of the model's device in its stream type (the pipeline
// communicator must accept such buffers).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "model/stage_model.hpp"
#include "pipeline/schedule.hpp"
#include "util/interval_timer.hpp"

namespace trident {

// Times. On a host device (CPU) they are host wall time. On a device that times its own stream
// (util/interval_timer.hpp: the GPU) they are the STREAM's time, measured with events: a wait
// under NCCL only makes the stream wait, so host time around it reads near zero while the GPU
// idles; the events measure that idling, so the bubble (wait / busy) is the GPU's. The event
// times of a step are read when the next step starts (the trainer has waited for the device at
// the end of the step, so nothing waits) or when stats() is called. Evaluation is not timed.
struct PipelineStats {
  int64_t peak_in_flight = 0;         // chunk micro-batches whose activations were held at once
  int64_t peak_activation_bytes = 0;  // their stashes plus the message buffers
  double wait_seconds = 0;            // blocked in pipeline receives and send completions
  double busy_seconds = 0;            // whole schedule, waits included
  void reset() { *this = PipelineStats{}; }
};

class PipelineExecutor {
 public:
  // Fills the tokens [B*T] and targets [B*T] of micro-batch `micro` (0-based) of this step.
  using LoadFn = std::function<void(int64_t micro, int32_t* tokens, int32_t* targets)>;

  PipelineExecutor(StageModel& model, Communicator& pipeline, ScheduleKind kind,
                   int64_t micro_batch);

  // One training step of `microbatches` micro-batches; parameter gradients accumulate in the
  // model with each loss scaled by 1/microbatches. Returns the sum of the micro-batch losses on
  // the last stage, 0 elsewhere.
  double train(int64_t microbatches, const LoadFn& load);
  // Forward only (evaluation): returns the sum of the micro-batch losses on the last stage.
  double evaluate(int64_t microbatches, const LoadFn& load);

  // Installed on the model during the backward of the step's last micro-batch, the one after
  // which each parameter gradient is final (see Transformer::set_grads_final_hook); under a
  // split backward (ZB-H1) during its BackwardWeight, the step's last, not its BackwardInput.
  // With several chunks: during each chunk's last backward (the schedule runs them from the
  // last chunk down, so the watermarks fall).
  void set_last_backward_hook(std::function<void(int64_t)> hook) { last_hook_ = std::move(hook); }

  // Called after each operation of a training step's schedule with the op as the schedule gave
  // it (micro-batch, chunk) and its host wall-clock interval (the timeline trace, the bubble
  // tests). On a GPU the interval is the host's: when the op was enqueued, not when it ran.
  using OpObserver =
      std::function<void(const PipeOp& op, std::chrono::steady_clock::time_point start,
                         std::chrono::steady_clock::time_point end)>;
  void set_op_observer(OpObserver observer) { op_observer_ = std::move(observer); }

  // The non-const form first adds the device times not read yet (waits, bounded, for the
  // stream to pass the step's last mark); the const form returns what has been read.
  const PipelineStats& stats() const { return stats_; }
  PipelineStats& stats() {
    collect_device_times();
    return stats_;
  }

 private:
  struct Slot {  // the activations of one micro-batch of one chunk in flight
    int chunk = 0;
    std::unique_ptr<StageModel::Activations> acts;
    std::unique_ptr<CommRequest> pending_send;  // its forward output, on its way
  };
  static constexpr int kNoSlot = -1;
  int acquire_slot(int chunk);
  // `slot` (the one op's micro-batch holds), or an Error naming op when it holds none.
  int held_slot(int slot, const PipeOp& op) const;
  void release_slot(int slot);
  void wait(std::unique_ptr<CommRequest>& request);
  // loss_scale: the micro-batch's backward's (training), 0 for evaluation (StageModel::forward).
  void forward(int64_t micro, int slot, const LoadFn& load, float loss_scale);
  // Where the chunk's input comes from / output goes: virtual stage 0 (the first stage's chunk
  // 0) reads tokens, the last one (the last stage's last chunk) computes the loss.
  bool first_virtual(int chunk) const { return stage_ == 0 && chunk == 0; }
  bool last_virtual(int chunk) const { return stage_ == stages_ - 1 && chunk == chunks_ - 1; }
  int next_stage() const { return (stage_ + 1) % stages_; }
  int previous_stage() const { return (stage_ + stages_ - 1) % stages_; }
  // A Backward or a BackwardInput op: receives nothing, sends nothing (the ops around it do).
  void run_backward(const PipeOp& op, int64_t microbatches, float loss_scale, int slot);
  void note_memory();
  void collect_device_times();

  StageModel& model_;
  Communicator& pipe_;
  ScheduleKind kind_;
  // ZB-H1: BackwardInput and BackwardWeight ops; a slot is held from Forward to BackwardWeight.
  bool split_backward_ = false;
  int stage_, stages_;
  int chunks_;  // the model's chunks: the schedule's virtual stages
  int64_t micro_batch_, stream_elems_;
  DType stream_type_;
  std::vector<PipeOp> schedule_;       // train()'s ops for schedule_microbatches_
  int64_t schedule_microbatches_ = 0;
  std::vector<int> slot_of_;           // [micro * chunks_ + chunk] -> slot, kNoSlot if none
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::vector<int>> free_slots_;  // per chunk
  int in_flight_ = 0;
  int64_t in_flight_bytes_ = 0;  // the activation bytes of the slots in flight
  std::vector<int32_t> tokens_, targets_;  // host memory
  std::shared_ptr<void> recv_buffer_, grad_buffer_, send_grad_buffer_;  // [B,T,C] each
  std::unique_ptr<CommRequest> pending_grad_send_;
  int next_final_chunk_ = 0;  // train(): the chunk whose last backward is due next
  std::function<void(int64_t)> last_hook_;
  OpObserver op_observer_;
  PipelineStats stats_;
  // The device's stream timers (nullptr: host wall clock), for the waits and the whole step.
  std::unique_ptr<IntervalTimer> wait_timer_, busy_timer_;
  bool evaluating_ = false;  // evaluate(): waits on the host clock, discarded
};

}  // namespace trident

#include "pipeline/executor.hpp"

#include <chrono>

#include "util/elapsed.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;
// Message tags: the forward activation and the backward gradient of a micro-batch crossing the
// boundary after virtual stage k = chunk * stages + stage, named by k's chunk (k / stages).
// Between two ranks the boundaries of one micro-batch differ in that chunk (and, for two
// stages, in the direction), so every message of a step has a tag of its own per pair.
int forward_tag(int64_t micro, int boundary_chunk, int chunks) {
  return static_cast<int>(2 * (micro * chunks + boundary_chunk));
}
int backward_tag(int64_t micro, int boundary_chunk, int chunks) {
  return forward_tag(micro, boundary_chunk, chunks) + 1;
}

}  // namespace

PipelineExecutor::PipelineExecutor(StageModel& model, Communicator& pipeline, ScheduleKind kind,
                                   int64_t micro_batch)
    : model_(model),
      pipe_(pipeline),
      kind_(kind),
      stage_(pipeline.rank()),
      stages_(pipeline.size()),
      chunks_(model.chunk_count()),
      micro_batch_(micro_batch),
      stream_elems_(model.stream_elements(micro_batch)),
      stream_type_(model.stream_dtype()) {
  // The model's chunks are the schedule's virtual stages: pipeline_schedule refuses a count
  // that does not fit the schedule (one chunk for all but interleaved, two or more for it).
  pipeline_schedule(kind, stage_, stages_, stages_, chunks_);
  // The zero-bubble schedules' split backward runs on activations that keep what
  // backward_input leaves for backward_weight.
  split_backward_ = splits_backward(kind);
  free_slots_.resize(static_cast<size_t>(chunks_));
  wait_timer_ = model.device().make_interval_timer();  // nullptr on the CPU: wall clock
  busy_timer_ = model.device().make_interval_timer();
  tokens_.resize(micro_batch * model.config().seq_len);
  targets_.resize(tokens_.size());
  if (stages_ > 1) {
    const int64_t bytes = stream_elems_ * static_cast<int64_t>(dtype_bytes(stream_type_));
    recv_buffer_ = model.device().allocate(bytes);
    grad_buffer_ = model.device().allocate(bytes);
    send_grad_buffer_ = model.device().allocate(bytes);
  }
}

int PipelineExecutor::acquire_slot(int chunk) {
  std::vector<int>& free = free_slots_[static_cast<size_t>(chunk)];
  if (free.empty()) {
    auto slot = std::make_unique<Slot>();
    slot->chunk = chunk;
    slot->acts = model_.make_activations(micro_batch_, split_backward_, chunk);
    slots_.push_back(std::move(slot));
    free.push_back(static_cast<int>(slots_.size()) - 1);
  }
  const int s = free.back();
  free.pop_back();
  ++in_flight_;
  in_flight_bytes_ += model_.activation_bytes(micro_batch_, split_backward_, chunk);
  note_memory();
  return s;
}

void PipelineExecutor::release_slot(int slot) {
  Slot& s = *slots_[slot];
  wait(s.pending_send);  // its activation buffer may be reused now
  free_slots_[static_cast<size_t>(s.chunk)].push_back(slot);
  --in_flight_;
  in_flight_bytes_ -= model_.activation_bytes(micro_batch_, split_backward_, s.chunk);
}

int PipelineExecutor::held_slot(int slot, const PipeOp& op) const {
  if (slot == kNoSlot)
    throw Error("pipeline schedule: " + to_string(op) + " before its micro-batch's forward");
  return slot;
}

void PipelineExecutor::note_memory() {
  stats_.peak_in_flight = std::max<int64_t>(stats_.peak_in_flight, in_flight_);
  const int64_t message_bytes =
      stages_ > 1 ? 3 * stream_elems_ * static_cast<int64_t>(dtype_bytes(stream_type_)) : 0;
  stats_.peak_activation_bytes =
      std::max(stats_.peak_activation_bytes, in_flight_bytes_ + message_bytes);
}

void PipelineExecutor::wait(std::unique_ptr<CommRequest>& request) {
  if (!request) return;
  if (wait_timer_ && !evaluating_) {
    wait_timer_->begin();  // when the stream has run everything before the wait ...
    request->wait();
    wait_timer_->end();    // ... to when the message let it go on
  } else {
    const auto t0 = Clock::now();
    request->wait();
    stats_.wait_seconds += seconds_since(t0);
  }
  request.reset();
}

void PipelineExecutor::forward(int64_t micro, int slot, const LoadFn& load, float loss_scale) {
  load(micro, tokens_.data(), targets_.data());
  Slot& s = *slots_[slot];
  const void* input = first_virtual(s.chunk) ? nullptr : recv_buffer_.get();
  model_.forward(*s.acts, tokens_.data(), targets_.data(), input, loss_scale);
}

void PipelineExecutor::run_backward(const PipeOp& op, int64_t microbatches, float loss_scale,
                                    int slot) {
  wait(pending_grad_send_);  // send_grad_buffer_ is free again
  const bool last = last_virtual(op.chunk), first = first_virtual(op.chunk);
  const void* d_output = last ? nullptr : grad_buffer_.get();
  void* d_input = first ? nullptr : send_grad_buffer_.get();
  StageModel::Activations& acts = *slots_[slot]->acts;
  if (op.kind == PipeOpKind::BackwardInput) {
    // The grads-final hook is installed around the last BackwardWeight instead.
    model_.backward_input(acts, loss_scale, d_output, d_input);
    return;
  }
  // A chunk's backwards run in micro-batch order, and the chunks' last ones from the last chunk
  // down: each chunk's params lie below the later chunks' in the buffer (parameter_layout).
  const bool final_micro = op.micro == microbatches - 1;
  if (final_micro && op.chunk != next_final_chunk_)
    throw Error("pipeline schedule: " + to_string(op) + " is a chunk's last backward out of "
                "order (chunk " + std::to_string(next_final_chunk_) + "'s is next)");
  if (final_micro) --next_final_chunk_;
  if (final_micro) model_.set_grads_final_hook(last_hook_);
  model_.backward(acts, loss_scale, d_output, d_input);
  if (final_micro) model_.set_grads_final_hook(nullptr);
}

void PipelineExecutor::collect_device_times() {
  if (!busy_timer_) return;
  stats_.wait_seconds += wait_timer_->take_seconds();
  stats_.busy_seconds += busy_timer_->take_seconds();
}

double PipelineExecutor::train(int64_t microbatches, const LoadFn& load) {
  const auto t0 = Clock::now();
  collect_device_times();  // the previous step's (finished: no wait)
  if (busy_timer_) busy_timer_->begin();
  const float loss_scale = 1.0f / static_cast<float>(microbatches);
  // The schedule and the slot map are made for the first step and kept (no allocation in a
  // step); the micro-batch count only changes if the trainer's does.
  if (microbatches != schedule_microbatches_) {
    schedule_ = pipeline_schedule(kind_, stage_, stages_, microbatches, chunks_);
    schedule_microbatches_ = microbatches;
  }
  slot_of_.assign(static_cast<size_t>(microbatches * chunks_), kNoSlot);
  // The RecvForward / RecvBackward of an op runs right before it (pipeline_schedule), so one
  // receive buffer per direction serves every chunk.
  auto slot_of = [&](const PipeOp& op) -> int& {
    return slot_of_[static_cast<size_t>(op.micro * chunks_ + op.chunk)];
  };
  int64_t next_weight = 0;             // the BackwardWeight due next (split backward)
  next_final_chunk_ = chunks_ - 1;     // the chunk whose last backward is due next
  // The boundary after this stage's chunk c is chunk c's; the one before it is the previous
  // stage's chunk c, or, on the first stage, the last stage's chunk c - 1.
  auto boundary_before = [&](int chunk) { return stage_ == 0 ? chunk - 1 : chunk; };
  for (const PipeOp& op : schedule_) {
    const auto op_start = Clock::now();
    switch (op.kind) {
      case PipeOpKind::RecvForward: {
        auto request = pipe_.irecv(recv_buffer_.get(), stream_elems_, stream_type_,
                                   previous_stage(),
                                   forward_tag(op.micro, boundary_before(op.chunk), chunks_));
        wait(request);
        break;
      }
      case PipeOpKind::Forward: {
        const int slot = acquire_slot(op.chunk);
        slot_of(op) = slot;
        forward(op.micro, slot, load, loss_scale);
        break;
      }
      case PipeOpKind::SendForward: {
        Slot& s = *slots_[held_slot(slot_of(op), op)];
        s.pending_send = pipe_.isend(model_.output(*s.acts), stream_elems_, stream_type_,
                                     next_stage(), forward_tag(op.micro, op.chunk, chunks_));
        break;
      }
      case PipeOpKind::RecvBackward: {
        auto request = pipe_.irecv(grad_buffer_.get(), stream_elems_, stream_type_, next_stage(),
                                   backward_tag(op.micro, op.chunk, chunks_));
        wait(request);
        break;
      }
      case PipeOpKind::Backward:
      case PipeOpKind::BackwardInput:
        run_backward(op, microbatches, loss_scale, held_slot(slot_of(op), op));
        if (op.kind == PipeOpKind::Backward) {  // BackwardInput: kept until BackwardWeight
          release_slot(slot_of(op));
          slot_of(op) = kNoSlot;
        }
        break;
      case PipeOpKind::BackwardWeight: {
        // The weight gradients accumulate in micro-batch order (as a whole backward's do): the
        // gradients are bitwise those of 1F1B. The last one's is where they become final.
        if (op.micro != next_weight)
          throw Error("pipeline schedule: " + to_string(op) + " out of order (W" +
                      std::to_string(next_weight) + " is next)");
        ++next_weight;
        const int slot = held_slot(slot_of(op), op);
        const bool final_micro = op.micro == microbatches - 1;
        if (final_micro) model_.set_grads_final_hook(last_hook_);
        model_.backward_weight(*slots_[slot]->acts);
        if (final_micro) model_.set_grads_final_hook(nullptr);
        release_slot(slot);  // the activations were kept for the weight gradient
        slot_of(op) = kNoSlot;
        break;
      }
      case PipeOpKind::SendBackward:
        pending_grad_send_ =
            pipe_.isend(send_grad_buffer_.get(), stream_elems_, stream_type_, previous_stage(),
                        backward_tag(op.micro, boundary_before(op.chunk), chunks_));
        break;
    }
    if (op_observer_) op_observer_(op, op_start, Clock::now());
  }
  wait(pending_grad_send_);
  if (in_flight_ != 0) throw Error("pipeline schedule left micro-batches without a backward");
  // The trainer's gradient-norm and non-finite check after the step reads every gradient: under
  // a split backward each must have received its weight-gradient part by now.
  if (split_backward_ && next_weight != microbatches)
    throw Error("pipeline schedule ran " + std::to_string(next_weight) + " of " +
                std::to_string(microbatches) + " weight gradients");
  if (busy_timer_) busy_timer_->end();  // read with the next step (collect_device_times)
  else stats_.busy_seconds += seconds_since(t0);
  return model_.take_loss_sum();
}

double PipelineExecutor::evaluate(int64_t microbatches, const LoadFn& load) {
  const double wait_before = stats_.wait_seconds;  // the bubble figures are of training alone
  evaluating_ = true;
  // Each micro-batch passes through the virtual stages in order: every rank walks its chunks
  // in the same order, so the chain of blocking receives goes through.
  for (int64_t micro = 0; micro < microbatches; ++micro) {
    for (int chunk = 0; chunk < chunks_; ++chunk) {
      if (!first_virtual(chunk)) {
        const int boundary = stage_ == 0 ? chunk - 1 : chunk;
        auto request = pipe_.irecv(recv_buffer_.get(), stream_elems_, stream_type_,
                                   previous_stage(), forward_tag(micro, boundary, chunks_));
        wait(request);
      }
      const int slot = acquire_slot(chunk);
      forward(micro, slot, load, 0.0f);
      if (!last_virtual(chunk)) {
        Slot& s = *slots_[slot];
        s.pending_send = pipe_.isend(model_.output(*s.acts), stream_elems_, stream_type_,
                                     next_stage(), forward_tag(micro, chunk, chunks_));
      }
      release_slot(slot);  // waits for the send: evaluation keeps one micro-batch in flight
    }
  }
  evaluating_ = false;
  stats_.wait_seconds = wait_before;
  return model_.take_loss_sum();
}

}  // namespace trident

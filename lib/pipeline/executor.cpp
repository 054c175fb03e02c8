#include "pipeline/executor.hpp"

#include <chrono>
#include <map>

#include "util/error.hpp"

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
// Message tags: the forward activation and the backward gradient of a micro-batch.
int forward_tag(int64_t micro) { return static_cast<int>(2 * micro); }
int backward_tag(int64_t micro) { return static_cast<int>(2 * micro + 1); }

}  // namespace

PipelineExecutor::PipelineExecutor(StageModel& model, Communicator& pipeline, ScheduleKind kind,
                                   int64_t micro_batch)
    : model_(model),
      pipe_(pipeline),
      kind_(kind),
      stage_(pipeline.rank()),
      stages_(pipeline.size()),
      micro_batch_(micro_batch),
      stream_elems_(model.stream_elements(micro_batch)),
      stream_type_(model.stream_dtype()) {
  // The executor runs one model chunk per stage (the interleaved schedule's virtual stages are
  // not executed yet); ZB-H1's split backward runs on activations that keep what
  // backward_input leaves for backward_weight.
  if (kind == ScheduleKind::Interleaved)
    throw Error("parallel.schedule = \"" + to_string(kind) +
                "\" is not run by the pipeline executor yet (\"1f1b\", \"gpipe\" and "
                "\"zb-h1\" are)");
  split_backward_ = kind == ScheduleKind::ZeroBubbleH1;
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

int PipelineExecutor::acquire_slot() {
  if (free_slots_.empty()) {
    auto slot = std::make_unique<Slot>();
    slot->acts = model_.make_activations(micro_batch_, split_backward_);
    slots_.push_back(std::move(slot));
    free_slots_.push_back(static_cast<int>(slots_.size()) - 1);
  }
  const int s = free_slots_.back();
  free_slots_.pop_back();
  ++in_flight_;
  note_memory();
  return s;
}

void PipelineExecutor::release_slot(int slot) {
  wait(slots_[slot]->pending_send);  // its activation buffer may be reused now
  free_slots_.push_back(slot);
  --in_flight_;
}

void PipelineExecutor::note_memory() {
  stats_.peak_in_flight = std::max<int64_t>(stats_.peak_in_flight, in_flight_);
  const int64_t message_bytes =
      stages_ > 1 ? 3 * stream_elems_ * static_cast<int64_t>(dtype_bytes(stream_type_)) : 0;
  stats_.peak_activation_bytes =
      std::max(stats_.peak_activation_bytes,
               in_flight_ * model_.activation_bytes(micro_batch_, split_backward_) +
                   message_bytes);
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

void PipelineExecutor::forward(int64_t micro, int slot, const LoadFn& load) {
  load(micro, tokens_.data(), targets_.data());
  Slot& s = *slots_[slot];
  const void* input = model_.shard().has_embedding ? nullptr : recv_buffer_.get();
  model_.forward(*s.acts, tokens_.data(), targets_.data(), input);
}

void PipelineExecutor::run_backward(const PipeOp& op, int64_t microbatches, float loss_scale,
                                    int slot) {
  wait(pending_grad_send_);  // send_grad_buffer_ is free again
  const bool last = model_.shard().has_head, first = model_.shard().has_embedding;
  const void* d_output = last ? nullptr : grad_buffer_.get();
  void* d_input = first ? nullptr : send_grad_buffer_.get();
  StageModel::Activations& acts = *slots_[slot]->acts;
  if (op.kind == PipeOpKind::BackwardInput) {
    // The grads-final hook is installed around the last BackwardWeight instead.
    model_.backward_input(acts, loss_scale, d_output, d_input);
    return;
  }
  const bool final_micro = op.micro == microbatches - 1;  // backwards run in order
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
  std::map<int64_t, int> slot_of;  // micro-batch -> its activation slot
  int64_t next_weight = 0;         // the BackwardWeight due next (split backward)
  for (const PipeOp& op : pipeline_schedule(kind_, stage_, stages_, microbatches)) {
    const auto op_start = Clock::now();
    switch (op.kind) {
      case PipeOpKind::RecvForward: {
        auto request = pipe_.irecv(recv_buffer_.get(), stream_elems_, stream_type_, stage_ - 1,
                                   forward_tag(op.micro));
        wait(request);
        break;
      }
      case PipeOpKind::Forward: {
        const int slot = acquire_slot();
        slot_of[op.micro] = slot;
        forward(op.micro, slot, load);
        break;
      }
      case PipeOpKind::SendForward: {
        Slot& s = *slots_[slot_of.at(op.micro)];
        s.pending_send = pipe_.isend(model_.output(*s.acts), stream_elems_, stream_type_,
                                     stage_ + 1, forward_tag(op.micro));
        break;
      }
      case PipeOpKind::RecvBackward: {
        auto request = pipe_.irecv(grad_buffer_.get(), stream_elems_, stream_type_, stage_ + 1,
                                   backward_tag(op.micro));
        wait(request);
        break;
      }
      case PipeOpKind::Backward:
      case PipeOpKind::BackwardInput:
        run_backward(op, microbatches, loss_scale, slot_of.at(op.micro));
        if (op.kind == PipeOpKind::Backward) {  // BackwardInput: kept until BackwardWeight
          release_slot(slot_of.at(op.micro));
          slot_of.erase(op.micro);
        }
        break;
      case PipeOpKind::BackwardWeight: {
        // The weight gradients accumulate in micro-batch order (as a whole backward's do): the
        // gradients are bitwise those of 1F1B. The last one's is where they become final.
        if (op.micro != next_weight)
          throw Error("pipeline schedule: " + to_string(op) + " out of order (W" +
                      std::to_string(next_weight) + " is next)");
        ++next_weight;
        const int slot = slot_of.at(op.micro);
        const bool final_micro = op.micro == microbatches - 1;
        if (final_micro) model_.set_grads_final_hook(last_hook_);
        model_.backward_weight(*slots_[slot]->acts);
        if (final_micro) model_.set_grads_final_hook(nullptr);
        release_slot(slot);  // the activations were kept for the weight gradient
        slot_of.erase(op.micro);
        break;
      }
      case PipeOpKind::SendBackward:
        pending_grad_send_ = pipe_.isend(send_grad_buffer_.get(), stream_elems_, stream_type_,
                                         stage_ - 1, backward_tag(op.micro));
        break;
    }
    if (op_observer_) op_observer_(op, op_start, Clock::now());
  }
  wait(pending_grad_send_);
  if (!slot_of.empty()) throw Error("pipeline schedule left micro-batches without a backward");
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
  const bool first = model_.shard().has_embedding, last = model_.shard().has_head;
  for (int64_t micro = 0; micro < microbatches; ++micro) {
    if (!first) {
      auto request = pipe_.irecv(recv_buffer_.get(), stream_elems_, stream_type_, stage_ - 1,
                                 forward_tag(micro));
      wait(request);
    }
    const int slot = acquire_slot();
    forward(micro, slot, load);
    if (!last) {
      Slot& s = *slots_[slot];
      s.pending_send = pipe_.isend(model_.output(*s.acts), stream_elems_, stream_type_,
                                   stage_ + 1, forward_tag(micro));
    }
    release_slot(slot);  // waits for the send: evaluation keeps one micro-batch in flight
  }
  evaluating_ = false;
  stats_.wait_seconds = wait_before;
  return model_.take_loss_sum();
}

}  // namespace trident

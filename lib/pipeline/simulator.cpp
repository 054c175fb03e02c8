#include "pipeline/simulator.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

namespace trident {

double PipeSimResult::bubble_fraction() const {
  if (busy.empty() || makespan <= 0.0) return 0.0;
  double total = 0.0;
  for (double b : busy) total += b;
  return 1.0 - total / (static_cast<double>(busy.size()) * makespan);
}

namespace {

struct Message {
  int64_t micro;
  int chunk;  // the receiver's chunk
  double ready;
};

// Per stage, chunk and micro-batch: what has happened to it.
struct MicroState {
  bool received_forward = false, forwarded = false, sent_forward = false;
  bool received_backward = false, sent_backward = false;
  bool backwarded = false;      // a whole Backward
  bool input_grad = false;      // BackwardInput
  bool weight_grad = false;     // BackwardWeight
};

enum Direction { kForward = 0, kBackward = 1 };

class Simulator {
 public:
  // costs[s][c]: stage s's costs on its chunk c; op_seconds, where given, each compute op's
  // instead of its chunk's.
  Simulator(const std::vector<std::vector<PipeOp>>& ops, int64_t microbatches,
            std::vector<std::vector<PipeSimCosts>> costs, int chunks,
            PipeOpSeconds op_seconds = nullptr)
      : ops_(ops), micro_(microbatches), chunk_costs_(std::move(costs)),
        op_seconds_(std::move(op_seconds)), stages_(static_cast<int>(ops.size())),
        chunks_(chunks) {}

  PipeSimResult run() {
    if (stages_ < 1) return fail("no stages to simulate");
    if (chunk_costs_.size() != static_cast<size_t>(stages_))
      return fail(std::to_string(chunk_costs_.size()) + " stage costs for " +
                  std::to_string(stages_) + " stages");
    if (micro_ < 1) return fail("microbatches = " + std::to_string(micro_) + " must be >= 1");
    if (chunks_ < 1) return fail("virtual_stages = " + std::to_string(chunks_) + " must be >= 1");
    for (int s = 0; s < stages_; ++s)
      if (chunk_costs_[s].size() != static_cast<size_t>(chunks_))
        return fail("stage " + std::to_string(s) + " has " +
                    std::to_string(chunk_costs_[s].size()) + " chunk costs for " +
                    std::to_string(chunks_) + " chunks");
    next_.assign(stages_, 0);
    clock_.assign(stages_, 0.0);
    in_flight_.assign(stages_, 0);
    state_.assign(static_cast<size_t>(stages_) * chunks_,
                  std::vector<MicroState>(static_cast<size_t>(micro_)));
    result_.busy.assign(stages_, 0.0);
    result_.peak_in_flight.assign(stages_, 0);
    result_.timeline.assign(stages_, {});

    for (;;) {
      bool progress = false;
      bool done = true;
      for (int s = 0; s < stages_; ++s) {
        if (next_[s] >= ops_[s].size()) continue;
        done = false;
        std::string error;
        const bool stepped = step(s, error);
        if (!error.empty()) return fail(error);
        if (stepped) {
          ++next_[s];
          progress = true;
        }
      }
      if (done) break;
      if (!progress) return fail("deadlock: every unfinished stage is blocked in a receive");
    }

    for (const auto& [key, channel] : channels_) {
      if (channel.empty()) continue;
      const auto [from, to, direction] = key;
      return fail("stage " + std::to_string(from) + " sent " +
                  (direction == kForward ? "forward" : "backward") +
                  " messages nobody received");
    }
    for (int s = 0; s < stages_; ++s)
      for (int c = 0; c < chunks_; ++c)
        for (int64_t m = 0; m < micro_; ++m) {
          const MicroState& st = micro_state(s, c, m);
          const bool backward_done = st.backwarded || (st.input_grad && st.weight_grad);
          if (!st.forwarded || !backward_done)
            return fail("stage " + std::to_string(s) + " finished without " +
                        (!st.forwarded              ? "Forward "
                         : st.input_grad            ? "BackwardWeight "
                                                    : "Backward ") +
                        to_string(PipeOp{PipeOpKind::Forward, m, c}).substr(1));
        }
    result_.ok = true;
    result_.makespan = *std::max_element(clock_.begin(), clock_.end());
    return result_;
  }

 private:
  MicroState& micro_state(int s, int c, int64_t m) {
    return state_[static_cast<size_t>(s) * chunks_ + c][static_cast<size_t>(m)];
  }
  // Virtual stage k = chunk * stages + stage; activations flow k -> k + 1.
  int virtual_stage(int s, int c) const { return c * stages_ + s; }
  int last_virtual() const { return stages_ * chunks_ - 1; }
  std::deque<Message>& channel(int from, int to, Direction d) { return channels_[{from, to, d}]; }

  // Executes the next op of stage s. false with `error` empty: blocked in a receive.
  bool step(int s, std::string& error) {
    const PipeOp& op = ops_[s][next_[s]];
    auto where = [&] {
      return "stage " + std::to_string(s) + " op " + std::to_string(next_[s]) + " (" +
             to_string(op) + "): ";
    };
    if (op.micro < 0 || op.micro >= micro_) {
      error = where() + "micro-batch out of range [0, " + std::to_string(micro_) + ")";
      return false;
    }
    if (op.chunk < 0 || op.chunk >= chunks_) {
      error = where() + "chunk out of range [0, " + std::to_string(chunks_) + ")";
      return false;
    }
    MicroState& st = micro_state(s, op.chunk, op.micro);
    const int k = virtual_stage(s, op.chunk);
    const int previous = (s + stages_ - 1) % stages_, next = (s + 1) % stages_;
    // The chunk of the neighbouring virtual stage on the previous / next physical stage.
    const int previous_chunk = s == 0 ? op.chunk - 1 : op.chunk;
    const int next_chunk = s == stages_ - 1 ? op.chunk + 1 : op.chunk;

    auto receive = [&](std::deque<Message>& from, bool& flag) {
      if (flag) {
        error = where() + "received twice";
        return false;
      }
      if (from.empty()) return false;  // blocked
      if (from.front().micro != op.micro || from.front().chunk != op.chunk) {
        error = where() + "the next message on the channel is micro-batch " +
                std::to_string(from.front().micro) +
                (chunks_ > 1 ? " of chunk " + std::to_string(from.front().chunk) : "") +
                ", sent before this one's";
        return false;
      }
      clock_[s] = std::max(clock_[s], from.front().ready);
      from.pop_front();
      flag = true;
      return true;
    };
    const PipeSimCosts& costs = chunk_costs_[s][op.chunk];  // this stage's, on this chunk
    auto send = [&](std::deque<Message>& to, int to_chunk, bool& flag) {
      if (flag) {
        error = where() + "sent twice";
        return false;
      }
      to.push_back({op.micro, to_chunk, clock_[s] + costs.comm});
      flag = true;
      return true;
    };
    auto compute = [&](double chunk_cost) {
      const double cost = op_seconds_ ? op_seconds_(s, op) : chunk_cost;
      const double start = clock_[s];
      clock_[s] += cost;
      result_.busy[s] += cost;
      result_.timeline[s].push_back({op, start, clock_[s]});
    };
    auto check = [&](bool ok, const char* what) {
      if (!ok) error = where() + what;
      return ok;
    };
    // Preconditions shared by Backward and BackwardInput.
    auto can_start_backward = [&] {
      return check(!st.backwarded && !st.input_grad, "backwarded twice") &&
             check(st.forwarded, "backward before its forward") &&
             check(k == last_virtual() || st.received_backward,
                   "its output gradient was not received");
    };

    switch (op.kind) {
      case PipeOpKind::RecvForward:
        if (k == 0) break;
        return receive(channel(previous, s, kForward), st.received_forward);
      case PipeOpKind::Forward:
        if (!check(!st.forwarded, "forwarded twice") ||
            !check(k == 0 || st.received_forward, "its input was not received"))
          return false;
        compute(costs.forward);
        st.forwarded = true;
        result_.peak_in_flight[s] = std::max(result_.peak_in_flight[s], ++in_flight_[s]);
        return true;
      case PipeOpKind::SendForward:
        if (k == last_virtual()) break;
        if (!check(st.forwarded, "sends an activation not computed yet")) return false;
        return send(channel(s, next, kForward), next_chunk, st.sent_forward);
      case PipeOpKind::RecvBackward:
        if (k == last_virtual()) break;
        return receive(channel(next, s, kBackward), st.received_backward);
      case PipeOpKind::Backward:
        if (!can_start_backward()) return false;
        compute(costs.backward);
        st.backwarded = true;
        --in_flight_[s];
        return true;
      case PipeOpKind::BackwardInput:
        if (!can_start_backward()) return false;
        compute(costs.backward - costs.weight);
        st.input_grad = true;
        return true;
      case PipeOpKind::BackwardWeight:
        if (!check(!st.weight_grad, "weight gradient computed twice") ||
            !check(st.input_grad, "weight gradient before its input gradient"))
          return false;
        compute(costs.weight);
        st.weight_grad = true;
        --in_flight_[s];
        return true;
      case PipeOpKind::SendBackward:
        if (k == 0) break;
        if (!check(st.backwarded || st.input_grad, "sends a gradient not computed yet"))
          return false;
        return send(channel(s, previous, kBackward), previous_chunk, st.sent_backward);
    }
    const bool to_previous =
        op.kind == PipeOpKind::RecvForward || op.kind == PipeOpKind::SendBackward;
    error = where() + (to_previous ? "the first stage has no previous stage"
                                   : "the last stage has no next stage");
    return false;
  }

  PipeSimResult fail(const std::string& what) {
    std::ostringstream m;
    m << what << "\n";
    for (int s = 0; s < static_cast<int>(next_.size()); ++s) {
      m << "  stage " << s << ": op " << next_[s] << " of " << ops_[s].size();
      if (next_[s] < ops_[s].size()) m << " (" << to_string(ops_[s][next_[s]]) << ")";
      m << ", clock " << clock_[s] << ", in flight " << in_flight_[s] << "\n";
    }
    for (const auto& [key, c] : channels_) {
      if (c.empty()) continue;
      const auto [from, to, direction] = key;
      m << "  channel " << from << "->" << to << (direction == kForward ? " forward [" : " backward [");
      for (size_t i = 0; i < c.size(); ++i)
        m << (i ? " " : "") << to_string(PipeOp{PipeOpKind::Forward, c[i].micro, c[i].chunk}).substr(1);
      m << "]\n";
    }
    result_.ok = false;
    result_.error = m.str();
    return result_;
  }

  const std::vector<std::vector<PipeOp>>& ops_;
  const int64_t micro_;
  const std::vector<std::vector<PipeSimCosts>> chunk_costs_;  // [stage][chunk]
  const PipeOpSeconds op_seconds_;                            // empty: the chunks' costs
  const int stages_;
  const int chunks_;
  std::vector<size_t> next_;
  std::vector<double> clock_;
  std::vector<int64_t> in_flight_;
  std::vector<std::vector<MicroState>> state_;  // [stage * chunks + chunk][micro]
  std::map<std::tuple<int, int, int>, std::deque<Message>> channels_;  // (from, to, direction)
  PipeSimResult result_;
};

}  // namespace

PipeSimResult simulate_pipeline(const std::vector<std::vector<PipeOp>>& stage_ops,
                                int64_t microbatches, const PipeSimCosts& costs,
                                int virtual_stages) {
  return simulate_pipeline_per_stage(
      stage_ops, microbatches, std::vector<PipeSimCosts>(stage_ops.size(), costs), virtual_stages);
}

PipeSimResult simulate_pipeline_per_stage(const std::vector<std::vector<PipeOp>>& stage_ops,
                                          int64_t microbatches,
                                          const std::vector<PipeSimCosts>& stage_costs,
                                          int virtual_stages) {
  std::vector<std::vector<PipeSimCosts>> chunk_costs;
  for (const PipeSimCosts& c : stage_costs)
    chunk_costs.emplace_back(static_cast<size_t>(std::max(virtual_stages, 0)), c);
  return Simulator(stage_ops, microbatches, std::move(chunk_costs), virtual_stages).run();
}

PipeSimResult simulate_pipeline_per_chunk(
    const std::vector<std::vector<PipeOp>>& stage_ops, int64_t microbatches,
    const std::vector<std::vector<PipeSimCosts>>& chunk_costs, int virtual_stages) {
  return Simulator(stage_ops, microbatches, chunk_costs, virtual_stages).run();
}

PipeSimResult simulate_pipeline_per_op(const std::vector<std::vector<PipeOp>>& stage_ops,
                                       int64_t microbatches,
                                       const std::vector<std::vector<PipeSimCosts>>& chunk_costs,
                                       const PipeOpSeconds& op_seconds, int virtual_stages) {
  return Simulator(stage_ops, microbatches, chunk_costs, virtual_stages, op_seconds).run();
}

PipeSimResult simulate_pipeline(ScheduleKind kind, int stages, int64_t microbatches,
                                const PipeSimCosts& costs, int virtual_stages) {
  std::vector<std::vector<PipeOp>> ops;
  for (int s = 0; s < stages; ++s)
    ops.push_back(pipeline_schedule(kind, s, stages, microbatches, virtual_stages));
  return simulate_pipeline(ops, microbatches, costs, virtual_stages);
}

}  // namespace trident

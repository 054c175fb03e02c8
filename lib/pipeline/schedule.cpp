#include "pipeline/schedule.hpp"

#include <algorithm>
#include <deque>
#include <sstream>

#include "util/error.hpp"

namespace trident {

namespace {

std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

}  // namespace

// ---- names ----------------------------------------------------------------------------------

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "gpipe") return ScheduleKind::GPipe;
  throw Error("parallel.schedule = \"" + name +
              "\" is not a pipeline schedule (expected \"1f1b\" or \"gpipe\")");
}

std::string to_string(ScheduleKind kind) {
  return kind == ScheduleKind::OneFOneB ? "1f1b" : "gpipe";
}

std::string to_string(PipeOpKind kind) {
  switch (kind) {
    case PipeOpKind::RecvForward: return "RF";
    case PipeOpKind::Forward: return "F";
    case PipeOpKind::SendForward: return "SF";
    case PipeOpKind::RecvBackward: return "RB";
    case PipeOpKind::Backward: return "B";
    case PipeOpKind::SendBackward: return "SB";
  }
  return "?";
}

std::string to_string(const PipeOp& op) { return to_string(op.kind) + std::to_string(op.micro); }

std::string to_string(const std::vector<PipeOp>& ops) {
  std::string s;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) s += ' ';
    s += to_string(ops[i]);
  }
  return s;
}

// ---- schedule -------------------------------------------------------------------------------

std::vector<PipeOp> pipeline_schedule(ScheduleKind kind, int stage, int stages,
                                      int64_t microbatches) {
  if (stages < 1)
    throw Error("parallel.pipeline = " + std::to_string(stages) + " must be >= 1");
  if (stage < 0 || stage >= stages)
    throw Error("pipeline stage " + std::to_string(stage) + " is out of range for parallel.pipeline = " +
                std::to_string(stages));
  if (microbatches < 1)
    throw Error("a pipeline step needs at least one micro-batch, got " +
                std::to_string(microbatches) +
                " (train.global_batch / (train.micro_batch * parallel.data))");

  const bool first = stage == 0;
  const bool last = stage == stages - 1;
  std::vector<PipeOp> ops;
  ops.reserve(static_cast<size_t>(microbatches) * 6);
  auto forward = [&](int64_t m) {
    if (!first) ops.push_back({PipeOpKind::RecvForward, m});
    ops.push_back({PipeOpKind::Forward, m});
    if (!last) ops.push_back({PipeOpKind::SendForward, m});
  };
  auto backward = [&](int64_t m) {
    if (!last) ops.push_back({PipeOpKind::RecvBackward, m});
    ops.push_back({PipeOpKind::Backward, m});
    if (!first) ops.push_back({PipeOpKind::SendBackward, m});
  };

  int64_t next_forward = 0;
  int64_t next_backward = 0;
  switch (kind) {
    case ScheduleKind::GPipe:
      while (next_forward < microbatches) forward(next_forward++);
      while (next_backward < microbatches) backward(next_backward++);
      break;
    case ScheduleKind::OneFOneB: {
      const int64_t warmup = std::min<int64_t>(stages - stage - 1, microbatches);
      for (int64_t i = 0; i < warmup; ++i) forward(next_forward++);
      for (int64_t i = 0; i < microbatches - warmup; ++i) {
        forward(next_forward++);
        backward(next_backward++);
      }
      while (next_backward < microbatches) backward(next_backward++);
      break;
    }
  }
  return ops;
}

int64_t peak_in_flight(const std::vector<PipeOp>& ops) {
  int64_t now = 0;
  int64_t peak = 0;
  for (const PipeOp& op : ops) {
    if (op.kind == PipeOpKind::Forward) peak = std::max(peak, ++now);
    if (op.kind == PipeOpKind::Backward) --now;
  }
  return peak;
}

// ---- stage partition ------------------------------------------------------------------------

std::vector<int64_t> stage_layer_counts(int64_t layers, int stages,
                                        const std::vector<int64_t>& explicit_counts) {
  if (stages < 1)
    throw Error("parallel.pipeline = " + std::to_string(stages) + " must be >= 1");
  if (layers < 1) throw Error("model.layers = " + std::to_string(layers) + " must be >= 1");
  if (stages > layers)
    throw Error("parallel.pipeline = " + std::to_string(stages) + " is more than model.layers = " +
                std::to_string(layers) + ": every pipeline stage needs at least one layer");

  if (!explicit_counts.empty()) {
    const std::string text = list_text(explicit_counts);
    if (explicit_counts.size() != static_cast<size_t>(stages))
      throw Error("parallel.pipeline_layers (" + text + ") must have parallel.pipeline (" +
                  std::to_string(stages) + ") entries, has " +
                  std::to_string(explicit_counts.size()));
    __int128 sum = 0;
    for (size_t s = 0; s < explicit_counts.size(); ++s) {
      if (explicit_counts[s] < 1)
        throw Error("parallel.pipeline_layers (" + text + ") gives stage " + std::to_string(s) +
                    " " + std::to_string(explicit_counts[s]) +
                    " layers: every pipeline stage needs at least one layer");
      sum += explicit_counts[s];
    }
    if (sum != layers) {
      // The sum of entries >= 1 that overflowed int64 is still printed correctly.
      std::string sum_text;
      for (__int128 v = sum; v > 0; v /= 10) sum_text.insert(sum_text.begin(), char('0' + int(v % 10)));
      throw Error("parallel.pipeline_layers (" + text + ") must sum to model.layers (" +
                  std::to_string(layers) + "), sums to " + sum_text);
    }
    return explicit_counts;
  }

  const int64_t base = layers / stages;
  const int64_t extra = layers % stages;  // < stages
  std::vector<int64_t> counts(static_cast<size_t>(stages), base);
  // The `extra` stages just before the last: stages - 1 - extra .. stages - 2.
  for (int64_t s = stages - 1 - extra; s < stages - 1; ++s) counts[static_cast<size_t>(s)] += 1;
  return counts;
}

std::pair<int64_t, int64_t> stage_layer_range(const std::vector<int64_t>& counts, int stage) {
  if (stage < 0 || static_cast<size_t>(stage) >= counts.size())
    throw Error("pipeline stage " + std::to_string(stage) + " is out of range for " +
                std::to_string(counts.size()) + " stages of parallel.pipeline_layers " +
                list_text(counts));
  int64_t begin = 0;
  for (int s = 0; s < stage; ++s) begin += counts[static_cast<size_t>(s)];
  return {begin, begin + counts[static_cast<size_t>(stage)]};
}

// ---- simulation -----------------------------------------------------------------------------

double PipeSimResult::bubble_fraction() const {
  if (busy.empty() || makespan <= 0.0) return 0.0;
  double total = 0.0;
  for (double b : busy) total += b;
  return 1.0 - total / (static_cast<double>(busy.size()) * makespan);
}

namespace {

struct Message {
  int64_t micro;
  double ready;
};

// Per-stage, per-micro-batch progress flags.
struct MicroState {
  bool received_forward = false, forwarded = false, sent_forward = false;
  bool received_backward = false, backwarded = false, sent_backward = false;
};

class Simulator {
 public:
  Simulator(const std::vector<std::vector<PipeOp>>& ops, int64_t microbatches,
            const PipeSimCosts& costs)
      : ops_(ops), micro_(microbatches), costs_(costs), stages_(static_cast<int>(ops.size())) {}

  PipeSimResult run() {
    if (stages_ < 1) return fail("no stages to simulate");
    if (micro_ < 1) return fail("microbatches = " + std::to_string(micro_) + " must be >= 1");
    next_.assign(stages_, 0);
    clock_.assign(stages_, 0.0);
    in_flight_.assign(stages_, 0);
    state_.assign(stages_, std::vector<MicroState>(static_cast<size_t>(micro_)));
    forward_channel_.assign(stages_, {});
    backward_channel_.assign(stages_, {});
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

    for (int s = 0; s + 1 < stages_; ++s) {
      if (!forward_channel_[s].empty())
        return fail("stage " + std::to_string(s) + " sent forward messages nobody received");
      if (!backward_channel_[s].empty())
        return fail("stage " + std::to_string(s + 1) + " sent backward messages nobody received");
    }
    for (int s = 0; s < stages_; ++s)
      for (int64_t m = 0; m < micro_; ++m) {
        const MicroState& st = state_[s][static_cast<size_t>(m)];
        if (!st.forwarded || !st.backwarded)
          return fail("stage " + std::to_string(s) + " finished without " +
                      (st.forwarded ? "Backward " : "Forward ") + std::to_string(m));
      }
    result_.ok = true;
    result_.makespan = *std::max_element(clock_.begin(), clock_.end());
    return result_;
  }

 private:
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
    MicroState& st = state_[s][static_cast<size_t>(op.micro)];
    const bool first = s == 0;
    const bool last = s == stages_ - 1;
    auto receive = [&](std::deque<Message>& channel, bool& flag) {
      if (flag) {
        error = where() + "received twice";
        return false;
      }
      if (channel.empty()) return false;  // blocked
      if (channel.front().micro != op.micro) {
        error = where() + "the next message on the channel is micro-batch " +
                std::to_string(channel.front().micro) + ", sent before this one's";
        return false;
      }
      clock_[s] = std::max(clock_[s], channel.front().ready);
      channel.pop_front();
      flag = true;
      return true;
    };
    auto send = [&](std::deque<Message>& channel, bool& flag) {
      if (flag) {
        error = where() + "sent twice";
        return false;
      }
      channel.push_back({op.micro, clock_[s] + costs_.comm});
      flag = true;
      return true;
    };
    auto compute = [&](double cost) {
      const double start = clock_[s];
      clock_[s] += cost;
      result_.busy[s] += cost;
      result_.timeline[s].push_back({op, start, clock_[s]});
    };

    switch (op.kind) {
      case PipeOpKind::RecvForward:
        if (first) break;
        return receive(forward_channel_[s - 1], st.received_forward);
      case PipeOpKind::Forward:
        if (st.forwarded) {
          error = where() + "forwarded twice";
          return false;
        }
        if (!first && !st.received_forward) {
          error = where() + "its input was not received";
          return false;
        }
        compute(costs_.forward);
        st.forwarded = true;
        result_.peak_in_flight[s] = std::max(result_.peak_in_flight[s], ++in_flight_[s]);
        return true;
      case PipeOpKind::SendForward:
        if (last) break;
        if (!st.forwarded) {
          error = where() + "sends an activation not computed yet";
          return false;
        }
        return send(forward_channel_[s], st.sent_forward);
      case PipeOpKind::RecvBackward:
        if (last) break;
        return receive(backward_channel_[s], st.received_backward);
      case PipeOpKind::Backward:
        if (st.backwarded) {
          error = where() + "backwarded twice";
          return false;
        }
        if (!st.forwarded) {
          error = where() + "backward before its forward";
          return false;
        }
        if (!last && !st.received_backward) {
          error = where() + "its output gradient was not received";
          return false;
        }
        compute(costs_.backward);
        st.backwarded = true;
        --in_flight_[s];
        return true;
      case PipeOpKind::SendBackward:
        if (first) break;
        if (!st.backwarded) {
          error = where() + "sends a gradient not computed yet";
          return false;
        }
        return send(backward_channel_[s - 1], st.sent_backward);
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
    auto channel_text = [](const std::deque<Message>& c) {
      std::string t = "[";
      for (size_t i = 0; i < c.size(); ++i) {
        if (i) t += ' ';
        t += std::to_string(c[i].micro);
      }
      return t + "]";
    };
    for (int s = 0; s + 1 < static_cast<int>(forward_channel_.size()); ++s) {
      m << "  channel " << s << "->" << s + 1 << " forward " << channel_text(forward_channel_[s])
        << ", " << s + 1 << "->" << s << " backward " << channel_text(backward_channel_[s])
        << "\n";
    }
    result_.ok = false;
    result_.error = m.str();
    return result_;
  }

  const std::vector<std::vector<PipeOp>>& ops_;
  const int64_t micro_;
  const PipeSimCosts costs_;
  const int stages_;
  std::vector<size_t> next_;
  std::vector<double> clock_;
  std::vector<int64_t> in_flight_;
  std::vector<std::vector<MicroState>> state_;
  // forward_channel_[s]: s -> s+1 activations; backward_channel_[s]: s+1 -> s gradients.
  std::vector<std::deque<Message>> forward_channel_, backward_channel_;
  PipeSimResult result_;
};

}  // namespace

PipeSimResult simulate_pipeline(const std::vector<std::vector<PipeOp>>& stage_ops,
                                int64_t microbatches, const PipeSimCosts& costs) {
  return Simulator(stage_ops, microbatches, costs).run();
}

PipeSimResult simulate_pipeline(ScheduleKind kind, int stages, int64_t microbatches,
                                const PipeSimCosts& costs) {
  std::vector<std::vector<PipeOp>> ops;
  for (int s = 0; s < stages; ++s) ops.push_back(pipeline_schedule(kind, s, stages, microbatches));
  return simulate_pipeline(ops, microbatches, costs);
}

}  // namespace trident

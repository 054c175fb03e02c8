#include "pipeline/schedule.hpp"

#include <algorithm>

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
  if (name == "interleaved") return ScheduleKind::Interleaved;
  if (name == "zb-h1") return ScheduleKind::ZeroBubbleH1;
  if (name == "zb-h2") return ScheduleKind::ZeroBubbleH2;
  throw Error("parallel.schedule = \"" + name +
              "\" is not a pipeline schedule (expected \"1f1b\", \"gpipe\", \"interleaved\", "
              "\"zb-h1\" or \"zb-h2\")");
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zb-h1";
    case ScheduleKind::ZeroBubbleH2: return "zb-h2";
  }
  return "?";
}

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleH2;
}

std::string to_string(PipeOpKind kind) {
  switch (kind) {
    case PipeOpKind::RecvForward: return "RF";
    case PipeOpKind::Forward: return "F";
    case PipeOpKind::SendForward: return "SF";
    case PipeOpKind::RecvBackward: return "RB";
    case PipeOpKind::Backward: return "B";
    case PipeOpKind::SendBackward: return "SB";
    case PipeOpKind::BackwardInput: return "BI";
    case PipeOpKind::BackwardWeight: return "W";
  }
  return "?";
}

std::string to_string(const PipeOp& op) {
  std::string s = to_string(op.kind);
  s += std::to_string(op.micro);
  if (op.chunk != 0) {
    s += ':';
    s += std::to_string(op.chunk);
  }
  return s;
}

std::string to_string(const std::vector<PipeOp>& ops) {
  std::string s;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) s += ' ';
    s += to_string(ops[i]);
  }
  return s;
}

// ---- schedules ------------------------------------------------------------------------------

namespace {

void check_schedule_arguments(ScheduleKind kind, int stage, int stages, int64_t microbatches,
                              int virtual_stages) {
  if (stages < 1)
    throw Error("parallel.pipeline = " + std::to_string(stages) + " must be >= 1");
  if (stage < 0 || stage >= stages)
    throw Error("pipeline stage " + std::to_string(stage) + " is out of range for parallel.pipeline = " +
                std::to_string(stages));
  if (microbatches < 1)
    throw Error("a pipeline step needs at least one micro-batch, got " +
                std::to_string(microbatches) +
                " (train.global_batch / (train.micro_batch * parallel.data))");
  const std::string v = "parallel.virtual_stages = " + std::to_string(virtual_stages);
  if (kind != ScheduleKind::Interleaved) {
    if (virtual_stages != 1)
      throw Error(v + " needs parallel.schedule = \"interleaved\" (it is \"" + to_string(kind) +
                  "\")");
    return;
  }
  if (virtual_stages < 2)
    throw Error(v + ": the interleaved schedule needs at least 2 model chunks per stage");
  if (stages < 2)
    throw Error("parallel.schedule = \"interleaved\" needs parallel.pipeline >= 2, it is " +
                std::to_string(stages));
  if (microbatches % stages != 0)
    throw Error("parallel.schedule = \"interleaved\" needs the micro-batches per step (" +
                std::to_string(microbatches) +
                " = train.global_batch / (train.micro_batch * parallel.data)) to be a multiple "
                "of parallel.pipeline = " + std::to_string(stages));
}

// Appends the ops of one stage, with the receives and sends its place in the chain of virtual
// stages asks for.
class OpListBuilder {
 public:
  OpListBuilder(int stage, int stages, int chunks) : stage_(stage), stages_(stages), chunks_(chunks) {}

  void forward(int64_t m, int c) {
    if (!first_virtual(c)) ops_.push_back({PipeOpKind::RecvForward, m, c});
    ops_.push_back({PipeOpKind::Forward, m, c});
    if (!last_virtual(c)) ops_.push_back({PipeOpKind::SendForward, m, c});
  }
  // kind: Backward (whole) or BackwardInput (the weight gradient comes later, weight()).
  void backward(int64_t m, int c, PipeOpKind kind = PipeOpKind::Backward) {
    if (!last_virtual(c)) ops_.push_back({PipeOpKind::RecvBackward, m, c});
    ops_.push_back({kind, m, c});
    if (!first_virtual(c)) ops_.push_back({PipeOpKind::SendBackward, m, c});
  }
  void weight(int64_t m, int c) { ops_.push_back({PipeOpKind::BackwardWeight, m, c}); }
  std::vector<PipeOp> take() { return std::move(ops_); }

 private:
  bool first_virtual(int c) const { return stage_ == 0 && c == 0; }
  bool last_virtual(int c) const { return stage_ == stages_ - 1 && c == chunks_ - 1; }
  int stage_, stages_, chunks_;
  std::vector<PipeOp> ops_;
};

int64_t one_f_one_b_warmup(int stage, int stages, int64_t microbatches) {
  return std::min<int64_t>(stages - stage - 1, microbatches);
}

// Megatron-LM's interleaved warmup: forwards before the first backward.
int64_t interleaved_warmup(int stage, int stages, int64_t microbatches, int chunks) {
  const int64_t total = microbatches * chunks;
  if (microbatches == stages) return total;
  return std::min<int64_t>(int64_t{stages - stage - 1} * 2 + int64_t{chunks - 1} * stages, total);
}

// The micro-batch and chunk of a stage's k-th forward (backward: chunks in reverse).
int64_t interleaved_micro(int64_t k, int stages, int chunks) {
  const int64_t group = int64_t{stages} * chunks;
  return (k / group) * stages + k % stages;
}
int interleaved_chunk(int64_t k, int stages, int chunks, bool forward) {
  const int c = static_cast<int>((k % (int64_t{stages} * chunks)) / stages);
  return forward ? c : chunks - 1 - c;
}

std::vector<PipeOp> gpipe(int stage, int stages, int64_t microbatches) {
  OpListBuilder b(stage, stages, 1);
  for (int64_t m = 0; m < microbatches; ++m) b.forward(m, 0);
  for (int64_t m = 0; m < microbatches; ++m) b.backward(m, 0);
  return b.take();
}

std::vector<PipeOp> one_f_one_b(int stage, int stages, int64_t microbatches) {
  OpListBuilder b(stage, stages, 1);
  const int64_t warmup = one_f_one_b_warmup(stage, stages, microbatches);
  int64_t next_forward = 0, next_backward = 0;
  for (int64_t i = 0; i < warmup; ++i) b.forward(next_forward++, 0);
  for (int64_t i = 0; i < microbatches - warmup; ++i) {
    b.forward(next_forward++, 0);
    b.backward(next_backward++, 0);
  }
  while (next_backward < microbatches) b.backward(next_backward++, 0);
  return b.take();
}

std::vector<PipeOp> interleaved(int stage, int stages, int64_t microbatches, int chunks) {
  OpListBuilder b(stage, stages, chunks);
  const int64_t total = microbatches * chunks;
  const int64_t warmup = interleaved_warmup(stage, stages, microbatches, chunks);
  auto forward = [&](int64_t k) {
    b.forward(interleaved_micro(k, stages, chunks), interleaved_chunk(k, stages, chunks, true));
  };
  auto backward = [&](int64_t k) {
    b.backward(interleaved_micro(k, stages, chunks), interleaved_chunk(k, stages, chunks, false));
  };
  for (int64_t k = 0; k < warmup; ++k) forward(k);
  for (int64_t k = 0; k < total - warmup; ++k) {
    forward(warmup + k);
    backward(k);
  }
  for (int64_t k = total - warmup; k < total; ++k) backward(k);
  return b.take();
}

// The zero-bubble schedules: `forwards_first` forwards before the first input gradient, then
// (input gradient, its weight gradient unless deferred, next forward) until every forward ran,
// then the remaining input gradients; at most `deferrable` weight gradients stay pending, the
// rest run at the end.
std::vector<PipeOp> zero_bubble(int stage, int stages, int64_t microbatches,
                                int64_t forwards_first, int64_t deferrable) {
  OpListBuilder b(stage, stages, 1);
  int64_t next_forward = 0, next_backward = 0, next_weight = 0;
  auto backward = [&] {
    b.backward(next_backward++, 0, PipeOpKind::BackwardInput);
    if (next_backward - next_weight > deferrable) b.weight(next_weight++, 0);
  };
  while (next_forward < std::min(forwards_first, microbatches)) b.forward(next_forward++, 0);
  while (next_forward < microbatches) {
    backward();
    b.forward(next_forward++, 0);
  }
  while (next_backward < microbatches) backward();
  while (next_weight < microbatches) b.weight(next_weight++, 0);
  return b.take();
}

// H1: 1F1B's order (its warmup plus one forward before the first input gradient), s deferred.
std::vector<PipeOp> zero_bubble_h1(int stage, int stages, int64_t microbatches) {
  return zero_bubble(stage, stages, microbatches, stages - stage, stage);
}

// H2: 2(p-s)-1 forwards first, 2s deferred (capped at M-(p-s) for few micro-batches).
std::vector<PipeOp> zero_bubble_h2(int stage, int stages, int64_t microbatches) {
  const int64_t deferrable =
      std::min<int64_t>(2 * int64_t{stage}, std::max<int64_t>(0, microbatches - (stages - stage)));
  return zero_bubble(stage, stages, microbatches, 2 * int64_t{stages - stage} - 1, deferrable);
}

}  // namespace

std::vector<PipeOp> pipeline_schedule(ScheduleKind kind, int stage, int stages,
                                      int64_t microbatches, int virtual_stages) {
  check_schedule_arguments(kind, stage, stages, microbatches, virtual_stages);
  switch (kind) {
    case ScheduleKind::GPipe: return gpipe(stage, stages, microbatches);
    case ScheduleKind::OneFOneB: return one_f_one_b(stage, stages, microbatches);
    case ScheduleKind::Interleaved: return interleaved(stage, stages, microbatches, virtual_stages);
    case ScheduleKind::ZeroBubbleH1: return zero_bubble_h1(stage, stages, microbatches);
    case ScheduleKind::ZeroBubbleH2: return zero_bubble_h2(stage, stages, microbatches);
  }
  throw Error("unknown pipeline schedule");
}

int64_t schedule_peak_bound(ScheduleKind kind, int stage, int stages, int64_t microbatches,
                            int virtual_stages) {
  check_schedule_arguments(kind, stage, stages, microbatches, virtual_stages);
  switch (kind) {
    case ScheduleKind::GPipe: return microbatches;
    case ScheduleKind::OneFOneB: return std::min<int64_t>(stages - stage, microbatches);
    case ScheduleKind::ZeroBubbleH1: return std::min<int64_t>(stages, microbatches);
    case ScheduleKind::ZeroBubbleH2:
      return std::min<int64_t>(2 * int64_t{stages} - 1, microbatches);
    case ScheduleKind::Interleaved:
      return std::min(interleaved_warmup(stage, stages, microbatches, virtual_stages) + 1,
                      microbatches * virtual_stages);
  }
  throw Error("unknown pipeline schedule");
}

int64_t peak_in_flight(const std::vector<PipeOp>& ops) {
  int64_t now = 0;
  int64_t peak = 0;
  for (const PipeOp& op : ops) {
    if (op.kind == PipeOpKind::Forward) peak = std::max(peak, ++now);
    if (op.kind == PipeOpKind::Backward || op.kind == PipeOpKind::BackwardWeight) --now;
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

std::vector<int64_t> balanced_stage_layer_counts(int64_t layers, int stages, double layer_cost,
                                                 double last_extra) {
  std::vector<int64_t> counts = stage_layer_counts(layers, stages, {});  // checks the sizes
  if (stages == 1 || !(layer_cost > 0.0) || !(last_extra > 0.0)) return counts;
  const int64_t others = stages - 1;
  int64_t best_last = counts.back();
  double best_cost = 1e300;
  for (int64_t last = layers - others; last >= 1; --last) {  // ties: the smaller `last` wins
    const int64_t widest = (layers - last + others - 1) / others;
    const double cost = std::max(static_cast<double>(widest) * layer_cost,
                                 static_cast<double>(last) * layer_cost + last_extra);
    if (cost <= best_cost) best_cost = cost, best_last = last;
  }
  const int64_t rest = layers - best_last, base = rest / others, extra = rest % others;
  for (int64_t s = 0; s < others; ++s)
    counts[static_cast<size_t>(s)] = base + (s >= others - extra ? 1 : 0);
  counts.back() = best_last;
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

std::vector<std::pair<int64_t, int64_t>> stage_layer_chunks(int64_t layers, int stages,
                                                            int virtual_stages, int stage) {
  if (stages < 1 || virtual_stages < 1)
    throw Error("parallel.pipeline (" + std::to_string(stages) +
                ") and parallel.virtual_stages (" + std::to_string(virtual_stages) +
                ") must be >= 1");
  if (stage < 0 || stage >= stages)
    throw Error("pipeline stage " + std::to_string(stage) + " is out of range for parallel.pipeline = " +
                std::to_string(stages));
  const int64_t chunks = static_cast<int64_t>(stages) * virtual_stages;
  if (layers < 1 || layers % chunks != 0)
    throw Error("model.layers (" + std::to_string(layers) +
                ") must be divisible by parallel.pipeline * parallel.virtual_stages (" +
                std::to_string(stages) + " * " + std::to_string(virtual_stages) + " = " +
                std::to_string(chunks) + "): the interleaved schedule cuts the layers into "
                "that many equal chunks");
  const int64_t per_chunk = layers / chunks;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int c = 0; c < virtual_stages; ++c) {
    const int64_t begin = (static_cast<int64_t>(c) * stages + stage) * per_chunk;
    ranges.emplace_back(begin, begin + per_chunk);
  }
  return ranges;
}

}  // namespace trident

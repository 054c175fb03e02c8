#pragma once
// Per-tensor scaling of FP8 training (train.precision = "fp8"; Transformer Engine's recipes): a
// tensor x is quantised as fp8(x * scale) and its GEMM's output multiplied by 1 / scale, with
//   scale = max_finite(format) / amax / 2^margin
// so that the tensor's largest magnitude lands 2^margin below the format's largest value.
//   current: amax of the tensor as it is quantised (fp8_scale of it, each time);
//   delayed: amax = the largest of the last `history` steps' amaxes, the step's own not
//            included: every use in a step quantises with the same scale, fixed before the step,
//            and the step's amax (the largest over its uses, reduced over the ranks that hold
//            parts of the tensor) joins the history when the step ends.
// An amax of 0 (nothing seen yet, an all-zero tensor) or one that is not finite keeps the
// previous scale (1 at first), as Transformer Engine does; a step whose amax was not finite
// is recorded in the history as 0, i.e. left out of its maximum (one bad step does not freeze
// the scale for `history` steps), and the history stays finite (a checkpoint holds it).
#include <cstdint>
#include <initializer_list>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "tensor/device.hpp"
#include "util/fp8.hpp"

namespace trident {

// The delayed recipe's state of one tensor: its amax history (a ring of `history` steps) and
// the scale of the current step. Pure: the caller reduces step_amax() over its ranks.
class Fp8DelayedScaling {
 public:
  Fp8DelayedScaling(Fp8Format format, int history, int margin);
  float scale() const { return scale_; }  // of the layout-free tensor
  // This rank's values are `factor` times the layout-free tensor's (1 but for the output
  // gradients on R data x context replicas: each averages its own share of the global batch,
  // so its gradients are R times one rank's). observe() takes this rank's amax and
  // local_scale() gives this rank's scale; the history and scale() stay layout-free, so a
  // checkpoint resumes on any layout.
  void set_local_factor(float factor) { factor_ = factor; }
  float local_scale() const { return scale_ / factor_; }
  // A use in the current step (this rank's amax): the step's amax is the largest of its uses'.
  void observe(float amax);
  // Where a quantise pass may record this rank's amax of a use on the device instead
  // (Fp8DelayedRecipe::keep_amaxes_on; the pass's fused maximum, taken in as observe() at
  // end_step), or nullptr: the uses are observe()d on the host.
  float* amax_slot() const { return amax_slot_; }
  void set_amax_slot(float* slot) { amax_slot_ = slot; }
  float step_amax() const { return step_amax_; }
  // Steps in the history (at most `history`): 0 before the first step ends.
  int64_t recorded() const { return static_cast<int64_t>(ring_.size()); }
  // Drops the uses seen since the last step ended (an evaluation's forwards).
  void discard_step() { step_amax_ = 0.0f; }
  // Ends the step with its amax as reduced over the ranks (every rank passes the same value):
  // it joins the history, the next step's scale is computed, the step's amax restarts at 0.
  void end_step(float reduced_amax);
  // The history oldest first (at most `history` values) and the scale: what a checkpoint
  // keeps; restore() sets them back, so that the next scales are those of an unbroken run.
  std::vector<float> history() const;
  void restore(const std::vector<float>& history, float scale);

 private:
  Fp8Format format_;
  int capacity_, margin_;
  std::vector<float> ring_;  // the last capacity_ steps' amaxes
  int64_t steps_ = 0;        // steps recorded (ring_[steps_ % capacity_] is the next slot)
  float scale_ = 1.0f;
  float step_amax_ = 0.0f;
  float factor_ = 1.0f;
  float* amax_slot_ = nullptr;
};

// The GEMMs of a transformer block that run in FP8, in the order of a checkpoint's rows.
enum class Fp8Gemm : int { Qkv, Proj, Up, Down };
inline constexpr int kFp8GemmCount = 4;

// The delayed recipe's state of one FP8 GEMM: one state per quantised operand.
struct Fp8GemmScaling {
  Fp8DelayedScaling x, w, dy;  // the input (E4M3), the weight (E4M3), the output gradient
};

// The delayed recipe's state of a model shard: the FP8 GEMMs of each of its layers (global
// indices). A step: begin_step(), the GEMMs observe their local amaxes, end_step() reduces
// them over the ranks that hold the other parts of each tensor and of the global batch, and
// every state takes the same reduced amax, so every layout scales as one rank does.
// A mixture-of-experts layer has, in place of the MLP's two GEMMs, each expert's up and down
// GEMMs, every expert's on every rank of the stage whichever experts it holds (a rank observes
// its own experts'; the reduction over the data x context ranks, which take in every expert
// group, gives each expert the global batch's amax): a few floats an expert, and one state
// whatever the layout.
class Fp8DelayedRecipe {
 public:
  Fp8DelayedRecipe(Fp8Format grad_format, int history, int margin);
  // A layer's GEMMs, fresh: the four of a dense layer, or (experts > 0) qkv, the attention
  // output, and the experts' up and down GEMMs.
  void add_layer(int64_t layer, int64_t experts = 0);
  // A GEMM of a dense layer, or the attention's (Qkv, Proj) of a MoE layer.
  Fp8GemmScaling& gemm(int64_t layer, Fp8Gemm kind);
  // A MoE layer's experts' states for `kind` (Up or Down), expert e at [e].
  Fp8GemmScaling* experts(int64_t layer, Fp8Gemm kind);
  bool has_layer(int64_t layer) const { return layers_.count(layer) > 0; }
  int history() const { return history_; }

  // The output gradients' local factor (Fp8DelayedScaling::set_local_factor): the number of
  // data x context replicas that average their own shares of the global batch.
  void set_gradient_replicas(int replicas);
  // The step's amaxes kept on `device`, one float per state (Fp8DelayedScaling::amax_slot):
  // once a state has a history its scale is known before the pass, so the quantise pass takes
  // the amax as it goes, instead of a pass of its own whose result the host waits for (one wait
  // per quantised tensor on a GPU); end_step reads them all back at once. The same values, so
  // the same scales and histories, as observing each use on the host.
  void keep_amaxes_on(Device& device);
  void begin_step();
  // Collective over each non-null group, in order (every rank of a group holds the same
  // layers): the maximum of the step's amaxes (not finite: +inf, which the history records
  // as 0), then end_step on every state.
  void end_step(std::initializer_list<Communicator*> groups);

  // A layer's state as a checkpoint holds it: layer_rows(experts) rows (GEMM-major: qkv x, w,
  // dy, proj x, ..., then a MoE layer's experts' up GEMMs in expert order, then their down
  // GEMMs) of row_length() floats each: the scale, the steps recorded, then the amax history
  // oldest first, zero-padded at the end.
  static constexpr int64_t layer_rows(int64_t experts) {
    return 3 * (experts > 0 ? 2 + 2 * experts : kFp8GemmCount);
  }
  int64_t row_length() const { return 2 + history_; }
  std::vector<float> layer_state(int64_t layer) const;
  // The inverse, from rows of `stored_history` + 2 floats (another history length: the newest
  // steps that fit). Throws naming what is wrong with a row that no layer_state() can write.
  void restore_layer(int64_t layer, std::span<const float> rows, int64_t stored_history);

 private:
  struct LayerStates {
    int64_t experts = 0;                // 0: a dense layer
    std::vector<Fp8GemmScaling> gemms;  // in the checkpoint's order
  };
  const LayerStates& states(int64_t layer) const;
  LayerStates& states(int64_t layer) {
    return const_cast<LayerStates&>(std::as_const(*this).states(layer));
  }
  // Every state's slot in amaxes_ (zeroed), in the checkpoint's order.
  void assign_amax_slots();
  // The slots' values observed by their states (a use the host observed is not in them), then
  // the slots zeroed.
  void take_device_amaxes();
  void zero_amax_slots();

  Fp8Format grad_format_;
  int history_, margin_;
  int gradient_replicas_ = 1;
  std::map<int64_t, LayerStates> layers_;
  Device* device_ = nullptr;  // keep_amaxes_on's
  DeviceArray<float> amaxes_;
};

}  // namespace trident

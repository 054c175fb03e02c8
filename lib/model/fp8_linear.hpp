#pragma once
// FP8 linear layers (train.precision = "fp8"): the GEMMs of a transformer block's linear layers
// (qkv, attention output, MLP in and out, a mixture's experts) on operands quantised to FP8,
// as Hopper's FP8 tensor cores take them, on a kernel set with FP8 GEMMs (kernels_have_fp8: the
// CPU reference's, fp32 GEMMs on the quantised values held as floats; the GPU's bf16 set,
// cuBLASLt's FP8 GEMMs on one-byte codes, K::Q).
//
//   forward   out  = (fp8(x sx) fp8(w sw)^T) / (sx sw) + b          x, w: E4M3
//   backward  dx   = (fp8(dy sg) fp8(w sw)) / (sg sw)               dy: the gradient format
//             dw  += (fp8(dy sg)^T fp8(x sx)) / (sg sx)             (E5M2 by default)
//             db  += sum_n dy                                       (unquantised)
// with each scale s = fp8_scale(amax) (model/fp8_scaling.hpp), from the tensor's amax as it is
// quantised ("current" scaling) or, under the delayed recipe, the GEMM's Fp8GemmScaling: the scale
// of the step, fixed before it from the amax history (the first step, with no history yet, scales
// as the current recipe does: Transformer Engine starts from 1, which flushes the first step's
// gradients below E5M2's smallest subnormal), while the GEMM records its local amaxes for the
// step's reduction (Fp8DelayedRecipe::end_step), in the quantise pass itself where the recipe keeps
// them in device slots (keep_amaxes_on). The amax is that of the whole tensor, whatever the layout:
// a weight's over the tensor group (its shards), an activation's or gradient's over the tensor and
// the context groups (its columns and its rows), so that every layout quantises with the same
// scales as one rank and stays within rounding of it. The quantised copies live in scratch held
// once; nothing is kept between forward and backward (the backward quantises again from the same
// tensors with the same scales, so the same values).
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "model/architecture.hpp"
#include "model/fp8_scaling.hpp"
#include "model/kernel_traits.hpp"
#include "tensor/device.hpp"
#include "util/error.hpp"

namespace trident {

// The rows of a mixture-of-experts layer's expert GEMMs (model/moe.hpp), expert-major, in
// blocks: block s = e * sources + q holds the rows of local expert e from source q (a
// micro-batch: the expert group's rank q under expert parallelism, else this rank's own), at
// rows [offsets[s], offsets[s + 1]) (host memory, experts * sources + 1 entries).
struct ExpertBlocks {
  const int64_t* offsets = nullptr;
  int64_t experts = 0, sources = 1;
  int64_t count() const { return experts * sources; }
  int64_t expert(int64_t s) const { return s / sources; }
  int64_t first(int64_t s) const { return offsets[s]; }
  int64_t rows(int64_t s) const { return offsets[s + 1] - offsets[s]; }
};

template <class K>
class Fp8Linear {
 public:
  using T = typename K::T;
  using G = typename K::G;
  using Q = typename K::Q;  // a quantised element: a value (the CPU reference) or an FP8 code

  Fp8Linear(const Fp8Settings& settings, Communicator& tensor) : s_(settings), tensor_(&tensor) {}
  // Context parallelism: the group whose ranks hold the other rows of every activation.
  void set_context_group(Communicator* group) { context_ = group; }

  // `delayed`: the GEMM's state under the delayed recipe; nullptr for current scaling.
  void forward(K& k, Fp8GemmScaling* delayed, T* out, const T* x, const T* w, const T* b,
               int64_t N, int64_t C, int64_t OC) {
    begin_scales(k, 2);
    const Scale sx = activation_scale(k, state(delayed, &Fp8GemmScaling::x), x, N * C,
                                      Fp8Format::E4M3);
    const Scale sw = weight_scale(k, state(delayed, &Fp8GemmScaling::w), w, OC * C);
    const Q* xq = quantize_operand(k, xq_, x, N, C, sx, Pass::Forward);
    const Q* wq = quantize_operand(k, wq_, w, OC, C, sw, Pass::Forward);
    k.fp8_linear_forward(out, xq, wq, b, N, C, OC, dequant(sx, sw));
  }
  // Any of dx, dw, db may be nullptr (the split backward), as in K::linear_backward; x is only
  // read for dw, w only for dx.
  void backward(K& k, Fp8GemmScaling* delayed, T* dx, G* dw, G* db, const T* dy, const T* x,
                const T* w, int64_t N, int64_t C, int64_t OC) {
    begin_scales(k, 3);
    const Scale sg = activation_scale(k, state(delayed, &Fp8GemmScaling::dy), dy, N * OC,
                                      s_.grad_format);
    Q* dyq = scratch(k, dyq_, dy_copies(dx, dw) * N * OC);
    quantize_gradient(k, dyq, dy, N, OC, sg, dx, dw);
    Scale sx, sw;
    Q* xq = nullptr;
    Q* wq = nullptr;
    if (dw) {
      sx = activation_scale(k, state(delayed, &Fp8GemmScaling::x), x, N * C, Fp8Format::E4M3);
      xq = quantize_operand(k, xq_, x, N, C, sx, Pass::Backward);
    }
    if (dx) {
      sw = weight_scale(k, state(delayed, &Fp8GemmScaling::w), w, OC * C);
      wq = quantize_operand(k, wq_, w, OC, C, sw, Pass::Backward);
    }
    const Q* dyt = dy_copies(dx, dw) == 2 ? dyq + N * OC : dyq;
    linear_backward(k, dx, dw, db, dy, dyq, dyt, xq, wq, N, C, OC, dequant(sg, sw),
                    dequant(sg, sx));
  }

  // The expert GEMMs of a mixture-of-experts layer: x [R,C] in `blocks`, w [E,OC,C] and
  // b [E,OC] the stacked experts (E = blocks.experts), out [R,OC] (overwrite). Current
  // scaling: each block is quantised as a tensor of its own (its amax over the tensor and
  // context groups, as a dense layer's activation) and each expert's weight as its own (over
  // the tensor group); so a block's GEMM is the one a single rank computes for that expert on
  // that micro-batch, whichever rank holds the expert (expert parallelism gathers several
  // micro-batches' rows on it). Transformer Engine's grouped linear layers also scale each
  // expert's GEMM apart. Delayed: `delayed` [E] are the experts' states (nullptr: current
  // scaling); once they have a history every block of expert e takes its state's scale of the
  // step (the global batch's, so one rank's on every layout) and the state records the local
  // amax of the expert's rows.
  void experts_forward(K& k, Fp8GemmScaling* delayed, T* out, const T* x, const T* w,
                       const T* b, const ExpertBlocks& blocks, int64_t C, int64_t OC) {
    begin_scales(k, blocks.count() + blocks.experts);
    block_scales(k, delayed, &Fp8GemmScaling::x, sx_, x, blocks, C, Fp8Format::E4M3);
    expert_scales(k, delayed, sw_, w, blocks.experts, OC * C);
    const Q* xq = quantize_blocks(k, xq_, x, blocks, C, sx_, Pass::Forward);
    const Q* wq = quantize_experts(k, wq_, w, blocks.experts, OC, C, sw_, Pass::Forward);
    for (int64_t s = 0; s < blocks.count(); ++s) {
      if (blocks.rows(s) == 0) continue;
      const int64_t e = blocks.expert(s), r0 = blocks.first(s);
      k.fp8_linear_forward(out + r0 * OC, xq + r0 * C, wq + e * OC * C, b ? b + e * OC : nullptr,
                           blocks.rows(s), C, OC, dequant(sx_[s], sw_[e]));
    }
  }
  // dx [R,C] (overwrite), dw [E,OC,C] +=, db [E,OC] += from dy [R,OC], as experts_forward
  // scales them (dy's blocks in train.fp8_grad_format); dx or dw and db may be nullptr.
  void experts_backward(K& k, Fp8GemmScaling* delayed, T* dx, G* dw, G* db, const T* dy,
                        const T* x, const T* w, const ExpertBlocks& blocks, int64_t C,
                        int64_t OC) {
    begin_scales(k, 2 * blocks.count() + blocks.experts);
    const int64_t R = blocks.offsets[blocks.count()];
    // dy's second layout (both wanted) after all of the first: block s's at second + its rows.
    const int64_t second = dy_copies(dx, dw) == 2 ? R * OC : 0;
    block_scales(k, delayed, &Fp8GemmScaling::dy, sg_, dy, blocks, OC, s_.grad_format);
    Q* dyq = scratch(k, dyq_, dy_copies(dx, dw) * R * OC);
    for (int64_t s = 0; s < blocks.count(); ++s)
      if (blocks.rows(s) > 0)
        quantize_gradient(k, dyq + blocks.first(s) * OC, dy + blocks.first(s) * OC,
                          blocks.rows(s), OC, sg_[static_cast<size_t>(s)], dx, dw, second);
    Q* xq = nullptr;
    Q* wq = nullptr;
    if (dw) {
      block_scales(k, delayed, &Fp8GemmScaling::x, sx_, x, blocks, C, Fp8Format::E4M3);
      xq = quantize_blocks(k, xq_, x, blocks, C, sx_, Pass::Backward);
    }
    if (dx) {
      expert_scales(k, delayed, sw_, w, blocks.experts, OC * C);
      wq = quantize_experts(k, wq_, w, blocks.experts, OC, C, sw_, Pass::Backward);
    }
    for (int64_t s = 0; s < blocks.count(); ++s) {
      if (blocks.rows(s) == 0) continue;
      const int64_t e = blocks.expert(s), r0 = blocks.first(s);
      linear_backward(k, dx ? dx + r0 * C : nullptr, dw ? dw + e * OC * C : nullptr,
                      db ? db + e * OC : nullptr, dy + r0 * OC, dyq + r0 * OC,
                      dyq + second + r0 * OC, xq ? xq + r0 * C : nullptr,
                      wq ? wq + e * OC * C : nullptr, blocks.rows(s), C, OC,
                      dequant(sg_[s], sw_[e]), dequant(sg_[s], sx_[s]));
    }
  }

 private:
  // A tensor's scale and where its quantise pass records its amax: the delayed state's device
  // slot (Fp8DelayedRecipe::keep_amaxes_on) once the state has a history; else nullptr (the
  // amax was taken before the scale, by a pass of its own).
  struct Scale {
    float value = 1.0f;
    const float* device = nullptr;  // the scale in K's memory instead (kDeviceScales)
    float* amax = nullptr;
    Fp8Scale ref() const { return {value, device}; }
  };
  static Fp8Dequant dequant(const Scale& a, const Scale& b) { return {a.ref(), b.ref()}; }

  // One unit's values (a tensor, a block of rows, an expert's weight).
  struct Values {
    const T* v;
    int64_t n;
  };

  // The scale of each block of v (rows of `width`): under the delayed recipe with a history,
  // its expert's state's (which records the block's local amax); else its amax over the tensor
  // and context groups (one reduction of all blocks' amaxes).
  void block_scales(K& k, Fp8GemmScaling* delayed, Fp8DelayedScaling Fp8GemmScaling::*operand,
                    std::vector<Scale>& scales, const T* v, const ExpertBlocks& blocks,
                    int64_t width, Fp8Format format) {
    scales_of(
        k, blocks.count(),
        [&](int64_t s) { return delayed ? &(delayed[blocks.expert(s)].*operand) : nullptr; },
        [&](int64_t s) { return Values{v + blocks.first(s) * width, blocks.rows(s) * width}; },
        context_, format, scales);
  }
  // The scale of each of `experts` weights of n values: under the delayed recipe with a
  // history, its state's; else its amax over the tensor group.
  void expert_scales(K& k, Fp8GemmScaling* delayed, std::vector<Scale>& scales, const T* w,
                     int64_t experts, int64_t n) {
    scales_of(
        k, experts, [&](int64_t e) { return delayed ? &delayed[e].w : nullptr; },
        [&](int64_t e) { return Values{w + e * n, n}; }, nullptr, Fp8Format::E4M3, scales);
  }
  // The scales of `units` tensors; `state(i)`: unit i's delayed state, or nullptr (current
  // scaling); `values(i)`: unit i's values. Three ways:
  //   * every unit's state has a history and a device slot: the states' scales of the step,
  //     the amaxes left to the quantise passes (Fp8DelayedRecipe::keep_amaxes_on);
  //   * current scaling on a kernel set that keeps its scales (kDeviceScales): the amaxes,
  //     their reduction over the tensor group and `rows`, and the scales, all in K's memory;
  //   * else the amaxes to the host, through finish_scales.
  template <class State, class Unit>
  void scales_of(K& k, int64_t units, State state, Unit values, Communicator* rows,
                 Fp8Format format, std::vector<Scale>& scales) {
    scales.assign(static_cast<size_t>(units), Scale{});
    bool fused = units > 0, current = true;
    for (int64_t i = 0; i < units; ++i) {
      const Fp8DelayedScaling* d = state(i);
      fused = fused && d && d->amax_slot() && d->recorded() > 0;
      current = current && !d;
    }
    if (fused) {
      for (int64_t i = 0; i < units; ++i)
        scales[static_cast<size_t>(i)] = {state(i)->local_scale(), nullptr, state(i)->amax_slot()};
      return;
    }
    if constexpr (kDeviceScales) {
      if (current && units > 0) {
        device_scales(k, units, values, rows, format, scales);
        return;
      }
    }
    amax_.assign(static_cast<size_t>(units), 0.0f);
    for (int64_t i = 0; i < units; ++i) {
      const Values u = values(i);
      amax_[static_cast<size_t>(i)] = u.n > 0 ? k.abs_max(u.v, u.n) : 0.0f;
    }
    finish_scales(k, amax_, rows, format, state);
    for (int64_t i = 0; i < units; ++i)
      scales[static_cast<size_t>(i)].value = amax_[static_cast<size_t>(i)];
  }
  // The current recipe's scales in K's memory: the next `units` of the call's amaxes and
  // scales (begin_scales), nothing read back.
  template <class Unit>
  void device_scales(K& k, int64_t units, Unit values, Communicator* rows, Fp8Format format,
                     std::vector<Scale>& scales) {
    if (next_scale_ + units > scale_capacity_)
      throw Error("FP8: " + std::to_string(next_scale_ + units) + " scales in one call, " +
                  std::to_string(scale_capacity_) + " reserved (Fp8Linear::begin_scales)");
    float* amax = amaxes_.data() + next_scale_;
    float* scale = scales_.data() + next_scale_;
    next_scale_ += units;
    for (int64_t i = 0; i < units; ++i) {
      const Values u = values(i);
      k.abs_max_into(amax + i, u.v, u.n);
    }
    if (reduces(rows)) max_over_groups(amax, units, rows);
    k.fp8_scales(scale, amax, units, format, s_.margin);
    for (int64_t i = 0; i < units; ++i) scales[static_cast<size_t>(i)] = {1.0f, scale + i, nullptr};
  }
  // A call's scales in K's memory (kDeviceScales): room for `units` of them, taken in order by
  // device_scales; every GEMM of the call reads its own (a later call's kernels run after it).
  void begin_scales(K& k, int64_t units) {
    if constexpr (kDeviceScales) {
      next_scale_ = 0;
      if (units <= scale_capacity_) return;
      amaxes_ = DeviceArray<float>();
      scales_ = DeviceArray<float>();
      amaxes_ = DeviceArray<float>(k.device(), units);
      scales_ = DeviceArray<float>(k.device(), units);
      scale_capacity_ = units;
    }
  }
  // scales: each unit's local amax on entry (a tensor, a block of rows, an expert's weight),
  // its scale on return. `state(i)`: unit i's delayed state, or nullptr (current scaling). Once
  // every unit's state has a history (they start and are restored together, and are the same
  // on every rank: the choice, and the collective it makes or not, is the group's), the
  // state's scale of the step, the state recording the local amax; else the amax reduced over
  // the tensor group and `rows`.
  template <class State>
  void finish_scales(K& k, std::vector<float>& scales, Communicator* rows, Fp8Format format,
                     State state) {
    bool history = true;
    for (size_t i = 0; i < scales.size(); ++i) {
      Fp8DelayedScaling* d = state(static_cast<int64_t>(i));
      if (d) d->observe(scales[i]);
      history = history && d && d->recorded() > 0;
    }
    if (history && !scales.empty()) {
      for (size_t i = 0; i < scales.size(); ++i)
        scales[i] = state(static_cast<int64_t>(i))->local_scale();
      return;
    }
    reduce_max(k, scales, rows);
    for (float& s : scales) s = fp8_scale(s, 1.0f, format, s_.margin);
  }
  // amax[i] = its maximum over the tensor group and `rows` (nullptr: none). The communicators
  // take device memory (a GPU's are NCCL or staged), so on a GPU the values travel through a
  // device buffer; the CPU's device memory is host memory.
  void reduce_max(K& k, std::vector<float>& amax, Communicator* rows) {
    const int64_t n = static_cast<int64_t>(amax.size());
    if (!reduces(rows)) return;
    Device& dev = k.device();
    float* values = amax.data();
    if (!dev.is_host()) {
      if (amax_device_.size() < n) amax_device_ = DeviceArray<float>(dev, n);
      values = amax_device_.data();
      dev.from_host(values, amax.data(), n * static_cast<int64_t>(sizeof(float)));
    }
    max_over_groups(values, n, rows);
    if (!dev.is_host()) dev.to_host(amax.data(), values, n * static_cast<int64_t>(sizeof(float)));
  }
  // Whether an amax has other ranks' parts to take in (the same answer on every rank of the
  // groups, so the collectives below are made by all of them or by none).
  bool reduces(const Communicator* rows) const {
    return tensor_->size() > 1 || (rows && rows->size() > 1);
  }
  // values[0, n) (K's memory) = their maxima over the tensor group and `rows` (nullptr: none).
  void max_over_groups(float* values, int64_t n, Communicator* rows) {
    tensor_->all_reduce(values, n, DType::F32, ReduceOp::Max);
    if (rows) rows->all_reduce(values, n, DType::F32, ReduceOp::Max);
  }
  // The backward's operands in the layout K's FP8 GEMMs take (kernels_fp8_transposed_backward):
  // row-major, as the forward's; or the input and the weight transposed ([cols, rows]) and the
  // output gradient row-major for dX and transposed for dW, each from one pass over v.
  static constexpr bool kTransposed = kernels_fp8_transposed_backward<K>;
  static constexpr bool kDeviceScales = kernels_fp8_device_scales<K>;
  // The output gradient's copies: two where both layouts are wanted (both halves, on a kernel
  // set that transposes), one else.
  static int64_t dy_copies(const T* dx, const G* dw) { return kTransposed && dx && dw ? 2 : 1; }
  // Which GEMMs an operand is quantised for: the forward's (row-major) or the backward's (in
  // the layout K's backward takes).
  enum class Pass { Forward, Backward };
  // v [rows, cols] (an input or a weight, E4M3) quantised into q for `pass`, its amax recorded
  // where the scale says.
  void quantize_operand(K& k, Q* q, const T* v, int64_t rows, int64_t cols, const Scale& scale,
                        Pass pass) {
    if constexpr (kTransposed) {
      if (pass == Pass::Backward) {
        k.fp8_quantize_transposed(q, nullptr, v, rows, cols, scale.ref(), Fp8Format::E4M3,
                                  scale.amax);
        return;
      }
    }
    k.fp8_quantize(q, v, rows * cols, scale.ref(), Fp8Format::E4M3, scale.amax);
  }
  // The same into `buf` (grown as needed).
  Q* quantize_operand(K& k, DeviceArray<Q>& buf, const T* v, int64_t rows, int64_t cols,
                      const Scale& scale, Pass pass) {
    Q* q = scratch(k, buf, rows * cols);
    quantize_operand(k, q, v, rows, cols, scale, pass);
    return q;
  }
  // The output gradient dy [rows, cols] into q: row-major (for dX) at q and, on a kernel set
  // that transposes, transposed (for dW) at q + second where both are wanted, else at q.
  void quantize_gradient(K& k, Q* q, const T* dy, int64_t rows, int64_t cols, const Scale& scale,
                         const T* dx, const G* dw, int64_t second = -1) {
    if (second < 0) second = rows * cols;
    const Fp8Format f = s_.grad_format;
    if constexpr (kTransposed) {
      if (dw) {
        k.fp8_quantize_transposed(dx ? q + second : q, dx ? q : nullptr, dy, rows, cols,
                                  scale.ref(), f, scale.amax);
        return;
      }
    }
    k.fp8_quantize(q, dy, rows * cols, scale.ref(), f, scale.amax);
  }
  // K's FP8 backward on operands in its layout (dyt: dy's transposed codes, or dyq again).
  void linear_backward(K& k, T* dx, G* dw, G* db, const T* dy, const Q* dyq, const Q* dyt,
                       const Q* xq, const Q* wq, int64_t N, int64_t C, int64_t OC,
                       const Fp8Dequant& inv_dx, const Fp8Dequant& inv_dw) {
    if constexpr (kTransposed)
      k.fp8_linear_backward_transposed(dx, dw, db, dy, dyq, dyt, xq, wq, N, C, OC, inv_dx,
                                       inv_dw, s_.grad_format);
    else
      k.fp8_linear_backward(dx, dw, db, dy, dyq, xq, wq, N, C, OC, inv_dx, inv_dw,
                            s_.grad_format);
  }
  // The blocks of rows of v [R, width] into `buf`, each as an operand of its own with its
  // scale (a block's codes at its rows' offset, [rows, width] or transposed [width, rows]).
  Q* quantize_blocks(K& k, DeviceArray<Q>& buf, const T* v, const ExpertBlocks& blocks,
                     int64_t width, const std::vector<Scale>& scales, Pass pass) {
    Q* q = scratch(k, buf, blocks.offsets[blocks.count()] * width);
    for (int64_t s = 0; s < blocks.count(); ++s) {
      const int64_t at = blocks.first(s) * width;
      if (blocks.rows(s) > 0)
        quantize_operand(k, q + at, v + at, blocks.rows(s), width,
                         scales[static_cast<size_t>(s)], pass);
    }
    return q;
  }
  // The experts' stacked weights w [E, OC, C] into `buf`, each with its scale.
  Q* quantize_experts(K& k, DeviceArray<Q>& buf, const T* w, int64_t experts, int64_t OC,
                      int64_t C, const std::vector<Scale>& scales, Pass pass) {
    Q* q = scratch(k, buf, experts * OC * C);
    for (int64_t e = 0; e < experts; ++e)
      quantize_operand(k, q + e * OC * C, w + e * OC * C, OC, C, scales[static_cast<size_t>(e)],
                       pass);
    return q;
  }

  static Fp8DelayedScaling* state(Fp8GemmScaling* gemm,
                                  Fp8DelayedScaling Fp8GemmScaling::*operand) {
    return gemm ? &(gemm->*operand) : nullptr;
  }
  // The scale of a tensor: its delayed state's, once that has a history (the state observes
  // the local amax for the step's reduction, or its quantise pass records it); else from the
  // whole tensor's amax, a weight's over the tensor group, an activation's over the tensor and
  // context groups (max of equal values where a group holds copies).
  Scale weight_scale(K& k, Fp8DelayedScaling* delayed, const T* w, int64_t n) {
    return scale(k, delayed, w, n, Fp8Format::E4M3, nullptr);
  }
  Scale activation_scale(K& k, Fp8DelayedScaling* delayed, const T* x, int64_t n,
                         Fp8Format format) {
    return scale(k, delayed, x, n, format, context_);
  }
  Scale scale(K& k, Fp8DelayedScaling* delayed, const T* v, int64_t n, Fp8Format format,
              Communicator* rows) {
    scales_of(
        k, 1, [&](int64_t) { return delayed; }, [&](int64_t) { return Values{v, n}; }, rows,
        format, one_);
    return one_[0];
  }
  // Grown to the largest call's size; the old buffer is freed first (its contents are not
  // needed), so growing never holds both.
  Q* scratch(K& k, DeviceArray<Q>& buf, int64_t n) {
    if (buf.size() < n) {
      buf = DeviceArray<Q>();
      buf = DeviceArray<Q>(k.device(), n);
    }
    return buf.data();
  }

  Fp8Settings s_;
  Communicator* tensor_;
  Communicator* context_ = nullptr;
  DeviceArray<Q> xq_, wq_, dyq_;
  std::vector<Scale> sx_, sw_, sg_;  // the expert GEMMs' scales (experts_forward/backward)
  std::vector<Scale> one_;           // scale()'s one tensor
  std::vector<float> amax_;          // scales_of()'s amaxes on the host
  DeviceArray<float> amaxes_, scales_;  // device_scales()'s, scale_capacity_ a call
  int64_t scale_capacity_ = 0, next_scale_ = 0;
  DeviceArray<float> amax_device_;    // reduce_max's buffer on a GPU
};

}  // namespace trident

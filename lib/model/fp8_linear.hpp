#pragma once
// FP8 linear layers (train.precision = "fp8", current scaling): the GEMMs of a transformer
// block's linear layers (qkv, attention output, MLP in and out) on operands quantised to FP8,
// as Hopper's FP8 tensor cores take them, on a kernel set that has the FP8 reference kernels
// (the CPU's: kernels/cpu/ops.hpp "FP8 quantisation"; kernels_have_fp8).
//
//   forward   out  = (fp8(x sx) fp8(w sw)^T) / (sx sw) + b          x, w: E4M3
//   backward  dx   = (fp8(dy sg) fp8(w sw)) / (sg sw)               dy: the gradient format
//             dw  += (fp8(dy sg)^T fp8(x sx)) / (sg sx)             (E5M2 by default)
//             db  += sum_n dy                                       (unquantised)
// with each scale s = fp8_scale(amax) (model/fp8_scaling.hpp), from the tensor's amax as it is
// quantised ("current" scaling) or, under the delayed recipe, the GEMM's Fp8GemmScaling: the
// scale of the step, fixed before it from the amax history (the first step, with no history
// yet, scales as the current recipe does: Transformer Engine starts from 1, which flushes the
// first step's gradients below E5M2's smallest subnormal), while the GEMM records its local
// amaxes for the step's reduction (Fp8DelayedRecipe::end_step). The amax is that of the whole
// tensor, whatever the layout:
// a weight's over the tensor group (its shards), an activation's or gradient's over the tensor
// and the context groups (its columns and its rows), so that every layout quantises with the
// same scales as one rank and stays within rounding of it. The quantised copies live in scratch
// held once; nothing is kept between forward and backward (the backward quantises again from the
// same tensors with the same scales, so the same values).
#include <cstdint>

#include "comm/comm.hpp"
#include "model/architecture.hpp"
#include "model/fp8_scaling.hpp"
#include "model/kernel_traits.hpp"
#include "tensor/device.hpp"

namespace trident {

template <class K>
class Fp8Linear {
 public:
  using T = typename K::T;
  using G = typename K::G;

  Fp8Linear(const Fp8Settings& settings, Communicator& tensor) : s_(settings), tensor_(&tensor) {}
  // Context parallelism: the group whose ranks hold the other rows of every activation.
  void set_context_group(Communicator* group) { context_ = group; }

  // `delayed`: the GEMM's state under the delayed recipe; nullptr for current scaling.
  void forward(K& k, Fp8GemmScaling* delayed, T* out, const T* x, const T* w, const T* b,
               int64_t N, int64_t C, int64_t OC) {
    const float sx = activation_scale(k, state(delayed, &Fp8GemmScaling::x), x, N * C,
                                      Fp8Format::E4M3);
    const float sw = weight_scale(k, state(delayed, &Fp8GemmScaling::w), w, OC * C);
    T* xq = scratch(k, xq_, N * C);
    T* wq = scratch(k, wq_, OC * C);
    k.fp8_quantize(xq, x, N * C, sx, Fp8Format::E4M3);
    k.fp8_quantize(wq, w, OC * C, sw, Fp8Format::E4M3);
    k.fp8_linear_forward(out, xq, wq, b, N, C, OC, 1.0f / (sx * sw));
  }
  // Any of dx, dw, db may be nullptr (the split backward), as in K::linear_backward; x is only
  // read for dw, w only for dx.
  void backward(K& k, Fp8GemmScaling* delayed, T* dx, G* dw, G* db, const T* dy, const T* x,
                const T* w, int64_t N, int64_t C, int64_t OC) {
    const float sg = activation_scale(k, state(delayed, &Fp8GemmScaling::dy), dy, N * OC,
                                      s_.grad_format);
    T* dyq = scratch(k, dyq_, N * OC);
    k.fp8_quantize(dyq, dy, N * OC, sg, s_.grad_format);
    float sx = 1.0f, sw = 1.0f;
    T* xq = nullptr;
    T* wq = nullptr;
    if (dw) {
      sx = activation_scale(k, state(delayed, &Fp8GemmScaling::x), x, N * C, Fp8Format::E4M3);
      xq = scratch(k, xq_, N * C);
      k.fp8_quantize(xq, x, N * C, sx, Fp8Format::E4M3);
    }
    if (dx) {
      sw = weight_scale(k, state(delayed, &Fp8GemmScaling::w), w, OC * C);
      wq = scratch(k, wq_, OC * C);
      k.fp8_quantize(wq, w, OC * C, sw, Fp8Format::E4M3);
    }
    k.fp8_linear_backward(dx, dw, db, dy, dyq, xq, wq, N, C, OC, 1.0f / (sg * sw),
                          1.0f / (sg * sx));
  }

 private:
  static Fp8DelayedScaling* state(Fp8GemmScaling* gemm,
                                  Fp8DelayedScaling Fp8GemmScaling::*operand) {
    return gemm ? &(gemm->*operand) : nullptr;
  }
  // The scale of a tensor: its delayed state's, once that has a history (the state observes
  // the local amax for the step's reduction); else from the whole tensor's amax, a weight's
  // over the tensor group, an activation's over the tensor and context groups (max of equal
  // values where a group holds copies).
  float weight_scale(K& k, Fp8DelayedScaling* delayed, const T* w, int64_t n) {
    return scale(k, delayed, w, n, Fp8Format::E4M3, nullptr);
  }
  float activation_scale(K& k, Fp8DelayedScaling* delayed, const T* x, int64_t n,
                         Fp8Format format) {
    return scale(k, delayed, x, n, format, context_);
  }
  float scale(K& k, Fp8DelayedScaling* delayed, const T* v, int64_t n, Fp8Format format,
              Communicator* rows) {
    float amax = k.abs_max(v, n);
    if (delayed) {
      delayed->observe(amax);
      if (delayed->recorded() > 0) return delayed->local_scale();
    }
    tensor_->all_reduce(&amax, 1, DType::F32, ReduceOp::Max);
    if (rows) rows->all_reduce(&amax, 1, DType::F32, ReduceOp::Max);
    return fp8_scale(amax, 1.0f, format, s_.margin);
  }
  // Grown to the largest call's size; the old buffer is freed first (its contents are not
  // needed), so growing never holds both.
  T* scratch(K& k, DeviceArray<T>& buf, int64_t n) {
    if (buf.size() < n) {
      buf = DeviceArray<T>();
      buf = DeviceArray<T>(k.device(), n);
    }
    return buf.data();
  }

  Fp8Settings s_;
  Communicator* tensor_;
  Communicator* context_ = nullptr;
  DeviceArray<T> xq_, wq_, dyq_;
};

}  // namespace trident

// The FP8 reference's pieces (train.precision = "fp8"): quantising a tensor on the CPU
// (kernels/cpu/ops.hpp: abs_max, fp8_quantize) and the per-tensor scales of the current and
// delayed recipes (model/fp8_scaling.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/cpu_kernels.hpp"
#include "model/fp8_linear.hpp"
#include "model/fp8_scaling.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

// n draws of a normal distribution times `scale`.
std::vector<float> normal_values(std::mt19937_64& rng, int64_t n, float scale) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * normal(rng);
  return v;
}

TEST(Fp8Quantize, ValuesLandOnTheScaledGridAndAmaxIsExact) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> x(4099);
  for (float& v : x) v = normal(rng);
  x[17] = -40.f;  // the amax
  EXPECT_EQ(cpu::abs_max(x.data(), static_cast<int64_t>(x.size())), 40.f);
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const float scale = fp8_scale(40.f, 1.f, f, 0);  // 40 -> the format's largest value
    std::vector<float> q(x.size());
    cpu::fp8_quantize(q.data(), x.data(), static_cast<int64_t>(x.size()), scale, f);
    const float step = f == Fp8Format::E4M3 ? 1.f / 16 : 1.f / 8;  // half an ulp, relative
    int64_t checked = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(q[i], fp8_to_float(float_to_fp8(q[i], f), f)) << "off the grid at " << i;
      if (std::fabs(x[i] * scale) >= fp8_spec(f).max_finite / 64) {  // normal range: relative
        EXPECT_LE(std::fabs(q[i] / scale - x[i]), step * std::fabs(x[i]) * 1.0001f) << i;
        ++checked;
      }
    }
    EXPECT_EQ(q[17], -fp8_spec(f).max_finite) << fp8_name(f);
    EXPECT_GT(checked, 3000) << fp8_name(f);
  }
  std::vector<float> with_nan = {1.f, std::nanf(""), 2.f};
  EXPECT_TRUE(std::isnan(cpu::abs_max(with_nan.data(), 3)));
  EXPECT_EQ(cpu::abs_max(with_nan.data(), 0), 0.f);
}

TEST(Fp8Scale, FormulaMarginAndTheValuesThatKeepThePreviousScale) {
  EXPECT_EQ(fp8_scale(448.f, 1.f, Fp8Format::E4M3, 0), 1.f);
  EXPECT_EQ(fp8_scale(2.f, 1.f, Fp8Format::E4M3, 0), 224.f);
  EXPECT_EQ(fp8_scale(2.f, 1.f, Fp8Format::E4M3, 2), 56.f);
  EXPECT_EQ(fp8_scale(57344.f, 1.f, Fp8Format::E5M2, 0), 1.f);
  EXPECT_EQ(fp8_scale(0.f, 3.f, Fp8Format::E4M3, 0), 3.f);
  EXPECT_EQ(fp8_scale(INFINITY, 3.f, Fp8Format::E4M3, 0), 3.f);
  EXPECT_EQ(fp8_scale(std::nanf(""), 3.f, Fp8Format::E4M3, 0), 3.f);
  EXPECT_EQ(fp8_scale(1e-45f, 3.f, Fp8Format::E4M3, 0), 3.f);  // the scale would overflow
}

TEST(Fp8DelayedScaling, TheScaleComesFromTheLastStepsAndNotFromTheCurrentOne) {
  Fp8DelayedScaling s(Fp8Format::E4M3, 3, 0);
  EXPECT_EQ(s.scale(), 1.f);  // no history yet
  const float amax[] = {4.f, 2.f, 8.f, 1.f, 0.5f, 0.25f};
  // The history's largest after each step, window of 3: 4, 4, 8, 8, 8, 1.
  const float window_max[] = {4.f, 4.f, 8.f, 8.f, 8.f, 1.f};
  for (int step = 0; step < 6; ++step) {
    const float before = s.scale();
    s.observe(amax[step] / 2);  // two uses in the step: the larger counts
    s.observe(amax[step]);
    EXPECT_EQ(s.step_amax(), amax[step]);
    EXPECT_EQ(s.scale(), before) << "a use inside the step changed its scale";
    s.end_step(s.step_amax());
    EXPECT_EQ(s.scale(), 448.f / window_max[step]) << "after step " << step;
    EXPECT_EQ(s.step_amax(), 0.f);
  }
  EXPECT_EQ(s.history(), (std::vector<float>{1.f, 0.5f, 0.25f}));
}

TEST(Fp8DelayedScaling, NotFiniteAndZeroAmaxesKeepTheScale) {
  Fp8DelayedScaling s(Fp8Format::E5M2, 2, 1);
  s.end_step(0.f);
  EXPECT_EQ(s.scale(), 1.f);
  s.end_step(4.f);
  EXPECT_EQ(s.scale(), 57344.f / 4 / 2);
  s.observe(std::nanf(""));
  s.observe(1.f);  // NaN is kept over a later finite use
  EXPECT_TRUE(std::isnan(s.step_amax()));
  s.end_step(s.step_amax());
  EXPECT_EQ(s.scale(), 57344.f / 4 / 2) << "the NaN step is left out of the maximum";
  s.end_step(1.f);  // the window now holds NaN and 1
  EXPECT_EQ(s.scale(), 57344.f / 1 / 2);
}

TEST(Fp8DelayedScaling, RestoredStateContinuesAsAnUnbrokenRun) {
  Fp8DelayedScaling whole(Fp8Format::E4M3, 4, 0), first(Fp8Format::E4M3, 4, 0);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(0.1f, 10.f);
  std::vector<float> amax(20);
  for (float& a : amax) a = u(rng);
  for (int i = 0; i < 7; ++i) {
    whole.end_step(amax[i]);
    first.end_step(amax[i]);
  }
  Fp8DelayedScaling resumed(Fp8Format::E4M3, 4, 0);
  resumed.restore(first.history(), first.scale());
  for (int i = 7; i < 20; ++i) {
    whole.end_step(amax[i]);
    resumed.end_step(amax[i]);
    EXPECT_EQ(resumed.scale(), whole.scale()) << "step " << i;
    EXPECT_EQ(resumed.history(), whole.history()) << "step " << i;
  }
  EXPECT_THROW(Fp8DelayedScaling(Fp8Format::E4M3, 2, 0).restore(whole.history(), 1.f), Error);
  EXPECT_THROW(Fp8DelayedScaling(Fp8Format::E4M3, 0, 0), Error);
  EXPECT_THROW(Fp8DelayedScaling(Fp8Format::E4M3, 2, -1), Error);
}

// A recipe's state through layer_state / restore_layer continues as an unbroken run, into the
// same history length and into a shorter one (the newest steps); the output gradients' local
// factor leaves the saved state layout-free; rows no layer_state writes are refused.
TEST(Fp8DelayedRecipe, SavedStateContinuesAsAnUnbrokenRunOnAnyLayout) {
  auto self = make_self_communicator("self");
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(0.01f, 10.f);
  Fp8DelayedRecipe whole(Fp8Format::E5M2, 4, 0), saved(Fp8Format::E5M2, 4, 0);
  whole.add_layer(5);
  saved.add_layer(5);
  saved.set_gradient_replicas(2);  // its output gradients are twice whole's
  auto step = [&](float x, float dy) {
    for (Fp8DelayedRecipe* r : {&whole, &saved}) r->begin_step();
    whole.gemm(5, Fp8Gemm::Up).x.observe(x);
    whole.gemm(5, Fp8Gemm::Up).dy.observe(dy);
    saved.gemm(5, Fp8Gemm::Up).x.observe(x);
    saved.gemm(5, Fp8Gemm::Up).dy.observe(2 * dy);
    for (Fp8DelayedRecipe* r : {&whole, &saved}) r->end_step({self.get(), nullptr});
  };
  for (int i = 0; i < 6; ++i) step(u(rng), u(rng));
  EXPECT_EQ(saved.layer_state(5), whole.layer_state(5)) << "the saved state is layout-free";
  EXPECT_EQ(saved.gemm(5, Fp8Gemm::Up).dy.local_scale(), whole.gemm(5, Fp8Gemm::Up).dy.scale() / 2);
  const std::vector<float> rows = saved.layer_state(5);
  ASSERT_EQ(rows.size(), static_cast<size_t>(Fp8DelayedRecipe::layer_rows(0) * 6));
  Fp8DelayedRecipe same(Fp8Format::E5M2, 4, 0), shorter(Fp8Format::E5M2, 2, 0);
  for (Fp8DelayedRecipe* r : {&same, &shorter}) {
    r->add_layer(5);
    r->restore_layer(5, rows, 4);
  }
  const auto& kept = shorter.gemm(5, Fp8Gemm::Up).x.history();
  const auto& all = whole.gemm(5, Fp8Gemm::Up).x.history();
  EXPECT_EQ(kept, std::vector<float>(all.end() - 2, all.end())) << "the newest steps";
  Fp8DelayedRecipe twin(Fp8Format::E5M2, 2, 0);  // an unbroken run with the shorter history
  twin.add_layer(5);
  twin.restore_layer(5, shorter.layer_state(5), 2);
  for (int i = 0; i < 5; ++i) {
    const float x = u(rng), dy = u(rng);
    step(x, dy);
    for (Fp8DelayedRecipe* r : {&same, &shorter}) {
      r->begin_step();
      r->gemm(5, Fp8Gemm::Up).x.observe(x);
      r->gemm(5, Fp8Gemm::Up).dy.observe(dy);
      r->end_step({self.get()});
    }
    EXPECT_EQ(same.layer_state(5), whole.layer_state(5)) << "step " << i;
  }
  EXPECT_EQ(same.gemm(5, Fp8Gemm::Down).w.recorded(), 4) << "every GEMM's state ends each step";
  std::vector<float> bad = rows;
  bad[0] = 0.f;  // a scale of 0
  EXPECT_THROW(same.restore_layer(5, bad, 4), Error);
  bad = rows;
  bad[1] = 2.5f;  // steps recorded
  EXPECT_THROW(same.restore_layer(5, bad, 4), Error);
  bad = rows;
  bad[1] = 5.f;  // more than the history holds
  EXPECT_THROW(same.restore_layer(5, bad, 4), Error);
  EXPECT_THROW(same.restore_layer(5, std::vector<float>(rows.begin(), rows.end() - 1), 4), Error);
  EXPECT_THROW(same.restore_layer(6, rows, 4), Error) << "a layer it does not hold";
}

// A step's NaN amax reaches the history as 0 (the scale kept): the state stays finite.
TEST(Fp8DelayedRecipe, ANotFiniteStepIsRecordedAsZero) {
  auto self = make_self_communicator("self");
  Fp8DelayedRecipe r(Fp8Format::E4M3, 3, 0);
  r.add_layer(1);
  r.begin_step();
  r.gemm(1, Fp8Gemm::Qkv).x.observe(2.f);
  r.end_step({self.get()});
  r.begin_step();
  r.gemm(1, Fp8Gemm::Qkv).x.observe(std::nanf(""));
  r.end_step({self.get()});
  EXPECT_EQ(r.gemm(1, Fp8Gemm::Qkv).x.history(), (std::vector<float>{2.f, 0.f}));
  EXPECT_EQ(r.gemm(1, Fp8Gemm::Qkv).x.scale(), 448.f / 2);
}

// Fp8Linear under the delayed recipe: with a history it quantises with the state's scale (not
// the tensor's current amax) and records the local amax for the step; without one (the first
// step) it scales as the current recipe does.
TEST(Fp8Linear, DelayedUsesTheStepsScaleAndRecordsTheAmax) {
  const int64_t N = 4, C = 8, OC = 3;
  std::vector<float> x(N * C), w(OC * C), b(OC, 0.f), out(N * OC), ref(N * OC);
  for (int64_t i = 0; i < N * C; ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
  for (int64_t i = 0; i < OC * C; ++i) w[i] = 0.1f * std::cos(1.3f * static_cast<float>(i));
  auto self = make_self_communicator("tensor");
  CpuKernels<float> k;
  Fp8Settings settings;
  settings.enabled = true;
  Fp8Linear<CpuKernels<float>> fp8(settings, *self);
  Fp8DelayedRecipe recipe(Fp8Format::E5M2, 2, 0);
  recipe.add_layer(0);
  Fp8GemmScaling& g = recipe.gemm(0, Fp8Gemm::Qkv);
  fp8.forward(k, &g, out.data(), x.data(), w.data(), b.data(), N, C, OC);
  fp8.forward(k, nullptr, ref.data(), x.data(), w.data(), b.data(), N, C, OC);
  EXPECT_EQ(out, ref) << "no history yet: current scaling";
  EXPECT_EQ(g.x.step_amax(), cpu::abs_max(x.data(), N * C));
  EXPECT_EQ(g.w.step_amax(), cpu::abs_max(w.data(), OC * C));
  // A history whose amaxes are 3 times the tensors': other scales, other FP8 values.
  g.x.restore({3 * cpu::abs_max(x.data(), N * C)}, 448.f / (3 * cpu::abs_max(x.data(), N * C)));
  g.w.restore({3 * cpu::abs_max(w.data(), OC * C)}, 448.f / (3 * cpu::abs_max(w.data(), OC * C)));
  fp8.forward(k, &g, out.data(), x.data(), w.data(), b.data(), N, C, OC);
  double worst = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double xq = fp8_to_float(float_to_fp8(x[n * C + c] * g.x.scale(), Fp8Format::E4M3),
                                       Fp8Format::E4M3) / g.x.scale();
        const double wq = fp8_to_float(float_to_fp8(w[o * C + c] * g.w.scale(), Fp8Format::E4M3),
                                       Fp8Format::E4M3) / g.w.scale();
        acc += xq * wq;
      }
      worst = std::max(worst, std::fabs(out[n * OC + o] - acc));
    }
  EXPECT_LE(worst, 1e-6);
  EXPECT_NE(out, ref) << "the history's scale, not the current amax's";
  EXPECT_EQ(g.x.step_amax(), cpu::abs_max(x.data(), N * C)) << "the step's own amax recorded";
}

// The delayed recipe with its amaxes kept in device slots (Fp8DelayedRecipe::keep_amaxes_on,
// what the trainer uses: the quantise pass takes the amax, the host reads the slots back once a
// step) against observing each use on the host (an abs_max pass per tensor): the same outputs,
// gradients, histories and scales, step after step, for a dense GEMM and the expert GEMMs;
// with a NaN in one step's input (recorded as 0 in both) and an evaluation's forward between
// steps (its amaxes dropped by begin_step in both). The slots are seen to be used: mid-step
// the slotted recipe's states have observed nothing, the other's have.
TEST(Fp8DelayedRecipe, AmaxesInDeviceSlotsAreTheHostObservedOnes) {
  const int64_t N = 6, C = 16, OC = 8, E = 2, sources = 1;
  const std::vector<int64_t> offsets = {0, 4, 6};  // expert 0: 4 rows, expert 1: 2
  auto self = make_self_communicator("tensor");
  CpuKernels<float> k;
  Fp8Settings settings;
  settings.enabled = true;
  Fp8DelayedRecipe slotted(Fp8Format::E5M2, 3, 0), host(Fp8Format::E5M2, 3, 0);
  for (Fp8DelayedRecipe* r : {&slotted, &host}) r->add_layer(0, E);
  slotted.keep_amaxes_on(k.device());
  EXPECT_NE(slotted.gemm(0, Fp8Gemm::Qkv).x.amax_slot(), nullptr);
  EXPECT_EQ(host.gemm(0, Fp8Gemm::Qkv).x.amax_slot(), nullptr);
  Fp8Linear<CpuKernels<float>> a(settings, *self), b(settings, *self);
  const ExpertBlocks blocks{offsets.data(), E, sources};
  std::mt19937_64 rng(17);
  int64_t compared = 0, slotted_uses = 0;
  for (int step = 0; step < 6; ++step) {
    const float grow = 1.0f + 0.5f * static_cast<float>(step);  // amaxes that change
    auto x = normal_values(rng, N * C, grow), dy = normal_values(rng, N * OC, 1e-3f * grow);
    const auto w = normal_values(rng, OC * C, 0.05f), we = normal_values(rng, E * OC * C, 0.05f);
    if (step == 3) x[5] = std::nanf("");
    for (Fp8DelayedRecipe* r : {&slotted, &host}) r->begin_step();
    std::vector<float> outs[2], grads[2];
    int i = 0;
    for (auto* pair : {&a, &b}) {
      Fp8DelayedRecipe& r = i == 0 ? slotted : host;
      Fp8GemmScaling& g = r.gemm(0, Fp8Gemm::Qkv);
      std::vector<float> out(N * OC), dx(N * C), dw(OC * C, 0.f), db(OC, 0.f), eo(N * OC),
          edx(N * C), edw(E * OC * C, 0.f), edb(E * OC, 0.f);
      pair->forward(k, &g, out.data(), x.data(), w.data(), nullptr, N, C, OC);
      pair->backward(k, &g, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N,
                     C, OC);
      Fp8GemmScaling* up = r.experts(0, Fp8Gemm::Up);
      pair->experts_forward(k, up, eo.data(), x.data(), we.data(), nullptr, blocks, C, OC);
      pair->experts_backward(k, up, edx.data(), edw.data(), edb.data(), dy.data(), x.data(),
                             we.data(), blocks, C, OC);
      if (i == 0 && step > 0) slotted_uses += g.x.step_amax() == 0.f && up[1].w.step_amax() == 0.f;
      for (auto* v : {&out, &eo}) outs[i].insert(outs[i].end(), v->begin(), v->end());
      for (auto* v : {&dx, &dw, &db, &edx, &edw, &edb})
        grads[i].insert(grads[i].end(), v->begin(), v->end());
      ++i;
    }
    if (step > 0) EXPECT_NE(host.gemm(0, Fp8Gemm::Qkv).x.step_amax(), 0.f) << step;
    // NaN compares unequal: compare the bits.
    auto bits = [](const std::vector<float>& v) {
      std::vector<uint32_t> u(v.size());
      for (size_t j = 0; j < v.size(); ++j) u[j] = std::bit_cast<uint32_t>(v[j]);
      return u;
    };
    EXPECT_EQ(bits(outs[0]), bits(outs[1])) << "step " << step;
    EXPECT_EQ(bits(grads[0]), bits(grads[1])) << "step " << step;
    compared += static_cast<int64_t>(outs[0].size() + grads[0].size());
    for (Fp8DelayedRecipe* r : {&slotted, &host}) r->end_step({self.get()});
    EXPECT_EQ(slotted.layer_state(0), host.layer_state(0)) << "step " << step;
    if (step == 3)
      EXPECT_EQ(slotted.gemm(0, Fp8Gemm::Qkv).x.history().back(), 0.f) << "the NaN step: 0";
    if (step == 1) {  // an evaluation's forward: observed, then dropped by the next begin_step
      std::vector<float> out(N * OC);
      const auto big = normal_values(rng, N * C, 1e4f);
      a.forward(k, &slotted.gemm(0, Fp8Gemm::Qkv), out.data(), big.data(), w.data(), nullptr, N,
                C, OC);
      b.forward(k, &host.gemm(0, Fp8Gemm::Qkv), out.data(), big.data(), w.data(), nullptr, N,
                C, OC);
    }
  }
  EXPECT_EQ(slotted_uses, 5) << "with a history, the slotted states observed nothing mid-step";
  EXPECT_GT(compared, 0);
  EXPECT_EQ(compared, 6 * (N * OC * 2 + N * C * 2 + OC * C + OC + E * OC * C + E * OC));
}

// The CPU reference with the GPU kernel set's backward layouts (kernels_fp8_transposed_backward):
// the input and the weight quantised transposed, the output gradient row-major and transposed
// in one call; its backward turns them back and runs the reference's. What it proves is
// Fp8Linear's plumbing of those layouts (which buffer, which offset, which block of rows).
struct TransposingFp8Kernels : CpuKernels<float> {
  static constexpr bool fp8_backward_transposed = true;
  int64_t transposed_calls = 0;
  static std::vector<float> transposed(const float* v, int64_t rows, int64_t cols) {
    std::vector<float> t(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = v[r * cols + c];
    return t;
  }
  void fp8_quantize_transposed(float* out_t, float* rowmajor, const float* x, int64_t rows,
                               int64_t cols, Fp8Scale scale, Fp8Format format, float* amax) {
    std::vector<float> q(static_cast<size_t>(rows * cols));
    fp8_quantize(q.data(), x, rows * cols, scale, format, amax);
    const std::vector<float> t = transposed(q.data(), rows, cols);
    std::copy(t.begin(), t.end(), out_t);
    if (rowmajor) std::copy(q.begin(), q.end(), rowmajor);
    ++transposed_calls;
  }
  void fp8_linear_backward_transposed(float* dx, float* dw, float* db, const float* dy,
                                      const float* dyq, const float* dyt, const float* xt,
                                      const float* wt, int64_t N, int64_t C, int64_t OC,
                                      Fp8Dequant inv_dx, Fp8Dequant inv_dw, Fp8Format format) {
    if (dx) {
      const std::vector<float> w = transposed(wt, C, OC);
      fp8_linear_backward(dx, nullptr, db, dy, dyq, nullptr, w.data(), N, C, OC, inv_dx, inv_dw,
                          format);
    }
    if (dw) {
      const std::vector<float> x = transposed(xt, C, N), g = transposed(dyt, OC, N);
      fp8_linear_backward(nullptr, dw, dx ? nullptr : db, dy, g.data(), x.data(), nullptr, N, C,
                          OC, inv_dx, inv_dw, format);
    }
  }
};

// The GPU kernel set's other difference, on top of its layouts (what the GPU runs): the current
// recipe's amaxes and scales formed in the kernel set's memory (kernels_fp8_device_scales; host
// memory here), the quantise passes and GEMMs reading the scales from there.
struct GpuLikeFp8Kernels : TransposingFp8Kernels {
  static constexpr bool fp8_scales_on_device = true;
  int64_t scales_formed = 0;
  void abs_max_into(float* amax, const float* x, int64_t n) { *amax = abs_max(x, n); }
  void fp8_scales(float* scale, const float* amax, int64_t n, Fp8Format format, int margin) {
    for (int64_t i = 0; i < n; ++i) scale[i] = fp8_scale(amax[i], 1.0f, format, margin);
    scales_formed += n;
  }
};

// Fp8Linear on kernel set K against the reference's bits: dense and expert GEMMs, forward, the
// whole backward and each half of the split one (dx only, dw and db only), current scaling and
// the delayed recipe with its device slots, three steps. Returns the values compared.
template <class K>
int64_t expect_the_references_bits(K& k) {
  const int64_t N = 7, C = 16, OC = 24, E = 2, sources = 2;
  const std::vector<int64_t> offsets = {0, 3, 3, 9, 11};  // an empty block among them
  const int64_t R = offsets.back();
  auto self = make_self_communicator("tensor");
  Fp8Settings settings;
  settings.enabled = true;
  const ExpertBlocks blocks{offsets.data(), E, sources};
  std::mt19937_64 rng(23);
  int64_t compared = 0;
  for (const bool delayed : {false, true}) {
    CpuKernels<float> ref_k;
    Fp8DelayedRecipe ref_recipe(Fp8Format::E5M2, 2, 0), recipe(Fp8Format::E5M2, 2, 0);
    ref_recipe.add_layer(0, E);
    recipe.add_layer(0, E);
    ref_recipe.keep_amaxes_on(ref_k.device());
    recipe.keep_amaxes_on(k.device());
    Fp8Linear<CpuKernels<float>> ref(settings, *self);
    Fp8Linear<K> fp8(settings, *self);
    for (int step = 0; step < 3; ++step) {
      const auto x = normal_values(rng, R * C, 2.f), dy = normal_values(rng, R * OC, 1e-3f);
      const auto w = normal_values(rng, E * OC * C, 0.05f);
      for (Fp8DelayedRecipe* r : {&ref_recipe, &recipe}) r->begin_step();
      for (const int halves : {3, 1, 2}) {  // 1: dx only, 2: dw and db only, 3: both
        const bool want_dx = halves & 1, want_dw = halves & 2;
        std::vector<float> got[2];
        for (int which = 0; which < 2; ++which) {
          std::vector<float> out(N * OC), eout(R * OC), dx(R * C, 0.f), dw(E * OC * C, 0.f),
              db(E * OC, 0.f), edx(R * C, 0.f), edw(E * OC * C, 0.f), edb(E * OC, 0.f);
          Fp8DelayedRecipe& r = which == 0 ? ref_recipe : recipe;
          Fp8GemmScaling* g = delayed ? &r.gemm(0, Fp8Gemm::Qkv) : nullptr;
          Fp8GemmScaling* down = delayed ? r.experts(0, Fp8Gemm::Down) : nullptr;
          auto run = [&](auto& layer, auto& kernels) {
            layer.forward(kernels, g, out.data(), x.data(), w.data(), nullptr, N, C, OC);
            layer.backward(kernels, g, want_dx ? dx.data() : nullptr,
                           want_dw ? dw.data() : nullptr, want_dw ? db.data() : nullptr,
                           dy.data(), x.data(), w.data(), N, C, OC);
            layer.experts_forward(kernels, down, eout.data(), x.data(), w.data(), nullptr,
                                  blocks, C, OC);
            layer.experts_backward(kernels, down, want_dx ? edx.data() : nullptr,
                                   want_dw ? edw.data() : nullptr, want_dw ? edb.data() : nullptr,
                                   dy.data(), x.data(), w.data(), blocks, C, OC);
          };
          if (which == 0)
            run(ref, ref_k);
          else
            run(fp8, k);
          for (auto* v : {&out, &eout, &dx, &dw, &db, &edx, &edw, &edb})
            got[which].insert(got[which].end(), v->begin(), v->end());
        }
        EXPECT_EQ(got[1], got[0]) << "delayed " << delayed << " step " << step << " halves "
                                  << halves;
        compared += static_cast<int64_t>(got[0].size());
      }
      for (Fp8DelayedRecipe* r : {&ref_recipe, &recipe}) r->end_step({self.get()});
      EXPECT_EQ(recipe.layer_state(0), ref_recipe.layer_state(0)) << step;
    }
  }
  EXPECT_EQ(compared, 2 * 3 * 3 * (N * OC + R * OC + 2 * R * C + 2 * (E * OC * C + E * OC)));
  return compared;
}

// Fp8Linear on the transposing kernel set gives the reference's bits.
TEST(Fp8Linear, TheBackwardsTransposedOperandsAreTheReferencesBitForBit) {
  TransposingFp8Kernels k;
  EXPECT_GT(expect_the_references_bits(k), 0);
  EXPECT_GT(k.transposed_calls, 0);
}

// ... and with the current recipe's scales formed in the kernel set's memory as well (the GPU's
// two differences together): the same scales (fp8_scale of the same amaxes), so the same bits.
TEST(Fp8Linear, ScalesFormedInTheKernelSetsMemoryAreTheReferencesBitForBit) {
  GpuLikeFp8Kernels k;
  EXPECT_GT(expect_the_references_bits(k), 0);
  EXPECT_GT(k.scales_formed, 0);
  EXPECT_GT(k.transposed_calls, 0);
}

// Fp8Linear on one rank against its formulas evaluated in double on the quantised values:
//   out = (xq wq^T) / (sx sw) + b,  dx = (dyq wq) / (sg sw),  dw += (dyq^T xq) / (sg sx),
//   db += sum_n dy; each scale max / amax of its tensor, dy in E5M2.
TEST(Fp8Linear, ForwardAndBackwardAreTheirFormulas) {
  const int64_t N = 37, C = 24, OC = 40;
  std::mt19937_64 rng(3);
  auto draw = [&](int64_t n, float s) { return normal_values(rng, n, s); };
  const auto x = draw(N * C, 2.f), w = draw(OC * C, 0.05f), b = draw(OC, 0.1f),
             dy = draw(N * OC, 1e-3f);
  auto self = make_self_communicator("tensor");
  CpuKernels<float> k;
  Fp8Settings settings;
  settings.enabled = true;
  Fp8Linear<CpuKernels<float>> fp8(settings, *self);
  std::vector<float> out(N * OC), dx(N * C), dw(OC * C, 0.5f), db(OC, 0.25f);
  fp8.forward(k, nullptr, out.data(), x.data(), w.data(), b.data(), N, C, OC);
  fp8.backward(k, nullptr, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C,
               OC);
  auto quantised = [](const std::vector<float>& v, Fp8Format f, float& scale) {
    scale = fp8_scale(cpu::abs_max(v.data(), static_cast<int64_t>(v.size())), 1.f, f, 0);
    std::vector<double> q(v.size());
    for (size_t i = 0; i < v.size(); ++i) q[i] = fp8_to_float(float_to_fp8(v[i] * scale, f), f);
    return q;
  };
  float sx, sw, sg;
  const auto xq = quantised(x, Fp8Format::E4M3, sx), wq = quantised(w, Fp8Format::E4M3, sw),
             gq = quantised(dy, Fp8Format::E5M2, sg);
  double worst = 0;
  int64_t compared = 0;
  auto check = [&](double got, double want, double scale) {
    worst = std::max(worst, std::fabs(got - want) / scale);
    ++compared;
  };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += xq[n * C + c] * wq[o * C + c];
      check(out[n * OC + o], acc / (double(sx) * sw) + b[o], 1.0);
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t o = 0; o < OC; ++o) acc += gq[n * OC + o] * wq[o * C + c];
      check(dx[n * C + c], acc / (double(sg) * sw), 1e-3);
    }
  for (int64_t o = 0; o < OC; ++o) {
    double bias = 0.25;
    for (int64_t n = 0; n < N; ++n) bias += dy[n * OC + o];
    check(db[o], bias, 1.0);  // (on top of 0.25: the float's rounding there)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += gq[n * OC + o] * xq[n * C + c];
      check(dw[o * C + c], 0.5 + acc / (double(sg) * sx), 1.0);  // (on top of 0.5)
    }
  }
  EXPECT_EQ(compared, N * OC + N * C + OC + OC * C);
  EXPECT_LE(worst, 1e-6);  // fp32 accumulation of exact products, against double
}

// Fp8Linear's expert GEMMs: each block of rows (one expert's rows from one source) is a
// tensor of its own and each expert's weight too, so every block's output, input gradient and
// weight-gradient contribution are, to the bit, those of the dense FP8 layer run on that block
// alone with its expert's weight (what one rank computes for that micro-batch and expert,
// whichever rank holds the expert). Two experts, two sources, one empty block, and blocks
// whose amaxes differ by 100x, which a scale per expert would quantise otherwise.
TEST(Fp8Linear, ExpertBlocksAreTheDenseLayerOnEachBlockAlone) {
  const int64_t E = 2, sources = 2, C = 24, OC = 40;
  const std::vector<int64_t> offsets = {0, 5, 5, 12, 15};  // blocks of 5, 0, 7 and 3 rows
  const int64_t R = offsets.back();
  std::mt19937_64 rng(11);
  auto draw = [&](int64_t n, float s) { return normal_values(rng, n, s); };
  auto x = draw(R * C, 2.f), dy = draw(R * OC, 1e-3f);
  const auto w = draw(E * OC * C, 0.05f), b = draw(E * OC, 0.1f);
  for (int64_t i = 12 * C; i < 15 * C; ++i) x[i] *= 0.01f;  // block 3's inputs smaller
  for (int64_t i = 7 * OC; i < 9 * OC; ++i) dy[i] *= 300.f;  // block 2's gradients larger
  auto self = make_self_communicator("tensor");
  CpuKernels<float> k;
  Fp8Settings settings;
  settings.enabled = true;
  const ExpertBlocks blocks{offsets.data(), E, sources};
  Fp8Linear<CpuKernels<float>> experts(settings, *self), dense(settings, *self);
  std::vector<float> out(R * OC), dx(R * C), dw(E * OC * C, 0.5f), db(E * OC, 0.25f);
  experts.experts_forward(k, nullptr, out.data(), x.data(), w.data(), b.data(), blocks, C, OC);
  experts.experts_backward(k, nullptr, dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                           w.data(), blocks, C, OC);
  std::vector<float> want_out(R * OC), want_dx(R * C), want_dw(E * OC * C, 0.5f),
      want_db(E * OC, 0.25f);
  int64_t blocks_run = 0;
  for (int64_t s = 0; s < blocks.count(); ++s) {
    const int64_t r0 = offsets[s], rows = offsets[s + 1] - offsets[s], e = s / sources;
    if (rows == 0) continue;
    dense.forward(k, nullptr, want_out.data() + r0 * OC, x.data() + r0 * C,
                  w.data() + e * OC * C, b.data() + e * OC, rows, C, OC);
    dense.backward(k, nullptr, want_dx.data() + r0 * C, want_dw.data() + e * OC * C,
                   want_db.data() + e * OC, dy.data() + r0 * OC, x.data() + r0 * C,
                   w.data() + e * OC * C, rows, C, OC);
    ++blocks_run;
  }
  EXPECT_EQ(blocks_run, 3);
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(dx, want_dx);
  EXPECT_EQ(dw, want_dw);
  EXPECT_EQ(db, want_db);
  // The blocks were scaled apart: one scale for the whole of an expert's rows gives others.
  std::vector<float> together(R * OC);
  const std::vector<int64_t> merged = {0, 5, 15};  // one source: each expert's rows as one
  experts.experts_forward(k, nullptr, together.data(), x.data(), w.data(), b.data(),
                          ExpertBlocks{merged.data(), E, 1}, C, OC);
  EXPECT_NE(together, out);
}

// A MoE layer's delayed state: qkv's and the attention output's GEMMs, then every expert's up
// and down GEMMs (layer_rows(E) rows), saved and restored like a dense layer's; its MLP's states
// are the experts' (gemm() refuses Up and Down there). Under Fp8Linear's experts_*: without a
// history the blocks scale as the current recipe does and each expert's state records the
// largest amax of its blocks; with one, every block of expert e takes e's scale of the step.
TEST(Fp8DelayedRecipe, ExpertsHaveAStateEachAndTheirBlocksShareIt) {
  const int64_t E = 2, sources = 2, C = 8, OC = 6;
  Fp8DelayedRecipe recipe(Fp8Format::E5M2, 3, 0);
  recipe.add_layer(2, E);
  EXPECT_EQ(recipe.layer_state(2).size(), static_cast<size_t>((3 * (2 + 2 * E)) * 5));
  EXPECT_THROW(recipe.gemm(2, Fp8Gemm::Up), Error);
  EXPECT_THROW(recipe.experts(2, Fp8Gemm::Qkv), Error);
  Fp8GemmScaling* up = recipe.experts(2, Fp8Gemm::Up);
  EXPECT_EQ(recipe.experts(2, Fp8Gemm::Down), up + E);
  EXPECT_EQ(&recipe.gemm(2, Fp8Gemm::Proj) + 1, up) << "the checkpoint's row order";

  const std::vector<int64_t> offsets = {0, 3, 5, 9, 10};  // expert 0: 3 + 2 rows, 1: 4 + 1
  const int64_t R = offsets.back();
  std::vector<float> x(R * C), w(E * OC * C), b(E * OC, 0.f), out(R * OC), want(R * OC);
  for (int64_t i = 0; i < R * C; ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * (1 + i / 20);
  for (int64_t i = 0; i < E * OC * C; ++i) w[i] = 0.1f * std::cos(1.3f * static_cast<float>(i));
  auto self = make_self_communicator("tensor");
  CpuKernels<float> k;
  Fp8Settings settings;
  settings.enabled = true;
  Fp8Linear<CpuKernels<float>> fp8(settings, *self);
  const ExpertBlocks blocks{offsets.data(), E, sources};
  fp8.experts_forward(k, up, out.data(), x.data(), w.data(), b.data(), blocks, C, OC);
  fp8.experts_forward(k, nullptr, want.data(), x.data(), w.data(), b.data(), blocks, C, OC);
  EXPECT_EQ(out, want) << "no history yet: current scaling";
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[e * sources], r1 = offsets[(e + 1) * sources];
    EXPECT_EQ(up[e].x.step_amax(), cpu::abs_max(x.data() + r0 * C, (r1 - r0) * C)) << e;
    EXPECT_EQ(up[e].w.step_amax(), cpu::abs_max(w.data() + e * OC * C, OC * C)) << e;
  }
  // A step ends (one rank: nothing to reduce); the experts' states now scale the next one.
  recipe.end_step({self.get()});
  Fp8DelayedRecipe twin(Fp8Format::E5M2, 3, 0);
  twin.add_layer(2, E);
  twin.restore_layer(2, recipe.layer_state(2), 3);
  fp8.experts_forward(k, up, out.data(), x.data(), w.data(), b.data(), blocks, C, OC);
  Fp8Linear<CpuKernels<float>> dense(settings, *self);
  int64_t compared = 0;
  for (int64_t s = 0; s < blocks.count(); ++s) {
    const int64_t r0 = offsets[s], rows = offsets[s + 1] - offsets[s], e = s / sources;
    dense.forward(k, twin.experts(2, Fp8Gemm::Up) + e, want.data() + r0 * OC, x.data() + r0 * C,
                  w.data() + e * OC * C, b.data() + e * OC, rows, C, OC);
    ++compared;
  }
  EXPECT_EQ(compared, 4);
  EXPECT_EQ(out, want) << "each block with its expert's scale of the step";
  EXPECT_NE(up[0].x.scale(), up[1].x.scale());
}

}  // namespace

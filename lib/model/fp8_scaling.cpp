#include "model/fp8_scaling.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "util/error.hpp"

namespace trident {

Fp8DelayedScaling::Fp8DelayedScaling(Fp8Format format, int history, int margin)
    : format_(format), capacity_(history), margin_(margin) {
  if (history < 1) throw Error("FP8 delayed scaling: an amax history of " +
                               std::to_string(history) + " steps (at least 1)");
  if (margin < 0) throw Error("FP8 scaling: a negative margin (" + std::to_string(margin) + ")");
  ring_.reserve(static_cast<size_t>(capacity_));
}

void Fp8DelayedScaling::observe(float amax) {
  amax /= factor_;
  // NaN wins (std::max would drop it): the step's amax is then not finite and keeps the scale.
  if (std::isnan(amax) || amax > step_amax_) step_amax_ = amax;
}

void Fp8DelayedScaling::end_step(float reduced_amax) {
  if (!std::isfinite(reduced_amax)) reduced_amax = 0.0f;  // left out of the maximum
  const size_t slot = static_cast<size_t>(steps_ % capacity_);
  if (ring_.size() < static_cast<size_t>(capacity_))
    ring_.push_back(reduced_amax);
  else
    ring_[slot] = reduced_amax;
  ++steps_;
  float amax = 0.0f;  // the history's largest; 0 (all steps empty or bad) keeps the scale
  for (float a : ring_) amax = std::max(amax, a);
  scale_ = fp8_scale(amax, scale_, format_, margin_);
  step_amax_ = 0.0f;
}

std::vector<float> Fp8DelayedScaling::history() const {
  std::vector<float> out;
  const int64_t n = static_cast<int64_t>(ring_.size());
  for (int64_t i = 0; i < n; ++i)  // oldest first
    out.push_back(ring_[static_cast<size_t>((steps_ - n + i) % capacity_)]);
  return out;
}

void Fp8DelayedScaling::restore(const std::vector<float>& history, float scale) {
  if (history.size() > static_cast<size_t>(capacity_))
    throw Error("FP8 delayed scaling: a saved amax history of " + std::to_string(history.size()) +
                " steps does not fit a history of " + std::to_string(capacity_));
  for (float a : history)
    if (!std::isfinite(a) || a < 0.0f)
      throw Error("FP8 delayed scaling: a saved amax of " + std::to_string(a) +
                  " (finite and >= 0)");
  if (!std::isfinite(scale) || !(scale > 0.0f))
    throw Error("FP8 delayed scaling: a saved scale of " + std::to_string(scale) +
                " (finite and > 0)");
  ring_ = history;  // oldest first: slot i for step i
  steps_ = static_cast<int64_t>(history.size());
  scale_ = scale;
  step_amax_ = 0.0f;
}

Fp8DelayedRecipe::Fp8DelayedRecipe(Fp8Format grad_format, int history, int margin)
    : grad_format_(grad_format), history_(history), margin_(margin) {
  (void)Fp8DelayedScaling(grad_format, history, margin);  // the arguments' checks
}

void Fp8DelayedRecipe::add_layer(int64_t layer, int64_t experts) {
  if (experts < 0)
    throw Error("FP8 delayed scaling: layer " + std::to_string(layer) + " with " +
                std::to_string(experts) + " experts");
  LayerStates l;
  l.experts = experts;
  for (int64_t g = 0; g < layer_rows(experts) / 3; ++g)
    l.gemms.push_back({{Fp8Format::E4M3, history_, margin_},
                       {Fp8Format::E4M3, history_, margin_},
                       {grad_format_, history_, margin_}});
  for (Fp8GemmScaling& g : l.gemms) g.dy.set_local_factor(static_cast<float>(gradient_replicas_));
  layers_.insert_or_assign(layer, std::move(l));
  if (device_) assign_amax_slots();
}

Fp8GemmScaling& Fp8DelayedRecipe::gemm(int64_t layer, Fp8Gemm kind) {
  LayerStates& l = states(layer);
  if (l.experts > 0 && (kind == Fp8Gemm::Up || kind == Fp8Gemm::Down))
    throw Error("FP8 delayed scaling: layer " + std::to_string(layer) +
                "'s MLP is its experts' (Fp8DelayedRecipe::experts)");
  return l.gemms[static_cast<size_t>(kind)];
}

Fp8GemmScaling* Fp8DelayedRecipe::experts(int64_t layer, Fp8Gemm kind) {
  LayerStates& l = states(layer);
  if (l.experts == 0 || (kind != Fp8Gemm::Up && kind != Fp8Gemm::Down))
    throw Error("FP8 delayed scaling: layer " + std::to_string(layer) +
                " has no experts' GEMMs of that kind");
  return l.gemms.data() + 2 + (kind == Fp8Gemm::Down ? l.experts : 0);
}

namespace {

template <class F>
void for_each_state(std::vector<Fp8GemmScaling>& gemms, F&& f) {
  for (Fp8GemmScaling& g : gemms)
    for (Fp8DelayedScaling* s : {&g.x, &g.w, &g.dy}) f(*s);
}

}  // namespace

void Fp8DelayedRecipe::set_gradient_replicas(int replicas) {
  gradient_replicas_ = replicas;
  for (auto& entry : layers_)
    for (Fp8GemmScaling& g : entry.second.gemms)
      g.dy.set_local_factor(static_cast<float>(replicas));
}

void Fp8DelayedRecipe::keep_amaxes_on(Device& device) {
  device_ = &device;
  assign_amax_slots();
}

void Fp8DelayedRecipe::assign_amax_slots() {
  int64_t n = 0;
  for (auto& entry : layers_) n += static_cast<int64_t>(3 * entry.second.gemms.size());
  amaxes_ = n > 0 ? DeviceArray<float>(*device_, n) : DeviceArray<float>();
  zero_amax_slots();
  float* slot = amaxes_.data();
  for (auto& entry : layers_)
    for_each_state(entry.second.gemms, [&](auto& s) { s.set_amax_slot(slot++); });
}

void Fp8DelayedRecipe::take_device_amaxes() {
  if (amaxes_.size() == 0) return;
  std::vector<float> amax(static_cast<size_t>(amaxes_.size()));
  device_->to_host(amax.data(), amaxes_.data(), amaxes_.bytes());
  size_t i = 0;
  for (auto& entry : layers_)
    for_each_state(entry.second.gemms, [&](auto& s) { s.observe(amax[i++]); });
  zero_amax_slots();
}

void Fp8DelayedRecipe::zero_amax_slots() {
  if (amaxes_.size() > 0) device_->fill_zero(amaxes_.data(), amaxes_.bytes());
}

void Fp8DelayedRecipe::begin_step() {
  zero_amax_slots();  // an evaluation's uses
  for (auto& entry : layers_)
    for_each_state(entry.second.gemms, [](auto& s) { s.discard_step(); });
}

void Fp8DelayedRecipe::end_step(std::initializer_list<Communicator*> groups) {
  take_device_amaxes();
  std::vector<float> amax;
  for (auto& entry : layers_)
    for_each_state(entry.second.gemms, [&](auto& s) {
      const float a = s.step_amax();
      amax.push_back(std::isnan(a) ? INFINITY : a);  // MPI's max may drop a NaN
    });
  for (Communicator* group : groups)
    if (group && !amax.empty())
      group->all_reduce(amax.data(), static_cast<int64_t>(amax.size()), DType::F32,
                        ReduceOp::Max);
  size_t i = 0;
  for (auto& entry : layers_)
    for_each_state(entry.second.gemms, [&](auto& s) { s.end_step(amax[i++]); });
}

std::vector<float> Fp8DelayedRecipe::layer_state(int64_t layer) const {
  const LayerStates& l = states(layer);
  std::vector<float> rows(static_cast<size_t>(layer_rows(l.experts) * row_length()), 0.0f);
  size_t row = 0;
  for (const Fp8GemmScaling& g : l.gemms)
    for (const Fp8DelayedScaling* s : {&g.x, &g.w, &g.dy}) {
      float* out = rows.data() + row++ * static_cast<size_t>(row_length());
      const std::vector<float> history = s->history();
      out[0] = s->scale();
      out[1] = static_cast<float>(history.size());
      std::copy(history.begin(), history.end(), out + 2);
    }
  return rows;
}

void Fp8DelayedRecipe::restore_layer(int64_t layer, std::span<const float> rows,
                                     int64_t stored_history) {
  const auto length = static_cast<size_t>(stored_history + 2);
  LayerStates& l = states(layer);
  const auto expected_rows = static_cast<size_t>(layer_rows(l.experts));
  if (stored_history < 1 || rows.size() != expected_rows * length)
    throw Error("FP8 delayed scaling: layer " + std::to_string(layer) + "'s saved state has " +
                std::to_string(rows.size()) + " values, not " + std::to_string(expected_rows) +
                " rows of an amax history + 2");
  size_t row = 0;
  for (Fp8GemmScaling& g : l.gemms)
    for (Fp8DelayedScaling* s : {&g.x, &g.w, &g.dy}) {
      const float* in = rows.data() + row++ * length;
      const float recorded = in[1];
      if (!(recorded >= 0.0f && recorded <= static_cast<float>(stored_history)) ||
          recorded != std::floor(recorded))
        throw Error("FP8 delayed scaling: layer " + std::to_string(layer) + " records " +
                    std::to_string(recorded) + " steps of an amax history of " +
                    std::to_string(stored_history));
      const auto n = static_cast<int64_t>(recorded);
      const int64_t kept = std::min<int64_t>(n, history_);  // the newest that fit
      s->restore(std::vector<float>(in + 2 + (n - kept), in + 2 + n), in[0]);
    }
}

const Fp8DelayedRecipe::LayerStates& Fp8DelayedRecipe::states(int64_t layer) const {
  auto it = layers_.find(layer);
  if (it == layers_.end())
    throw Error("FP8 delayed scaling: layer " + std::to_string(layer) + " has no FP8 GEMMs here");
  return it->second;
}

}  // namespace trident

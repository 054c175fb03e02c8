// Dataset blends: parsing, Megatron's blending rule, the blended sampler; see blend.hpp and
// docs/data.md. This file is compiled with -ffp-contract=off (lib/CMakeLists.txt): the rule's
// w * max(p, 1) - count must round twice, as in Megatron and in Python, not once as a fused
// multiply-add would, or a near-tie could be broken differently from data_tools/inspect_shard.py.
#include "data/blend.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <utility>

#include "util/error.hpp"

namespace trident {

namespace {

// "data.train[1] = "0.7:x": CAUSE" (one line: a control character would not be in a path
// anyone means, but an entry is printed as given, so it is quoted).
[[noreturn]] void bad_entry(std::string_view key, size_t i, const std::string& entry,
                            const std::string& cause) {
  throw Error(std::string(key) + "[" + std::to_string(i) + "] = \"" + entry + "\": " + cause);
}

// The weight before the first colon, if the whole of that text is a number.
std::optional<double> leading_weight(const std::string& entry) {
  const size_t colon = entry.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  double w = 0;
  const char* end = entry.data() + colon;
  const auto [ptr, ec] = std::from_chars(entry.data(), end, w);
  if (ptr != end || (ec != std::errc() && ec != std::errc::result_out_of_range))
    return std::nullopt;
  if (ec == std::errc::result_out_of_range) return std::nan("");  // reported as not finite
  return w;
}

std::string weight_text(double w) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", w);
  return buf;
}

}  // namespace

std::vector<BlendComponent> parse_blend(const std::vector<std::string>& entries,
                                        std::string_view key) {
  std::vector<BlendComponent> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& entry = entries[i];
    const std::optional<double> weight = leading_weight(entry);
    BlendComponent c;
    if (!weight) {
      // A single entry is a plain source (today's form); in a blend every entry needs a weight.
      if (entries.size() > 1)
        bad_entry(key, i, entry, "expected WEIGHT:PATH (a weight, a colon, a shard path or glob "
                                 "or an indexed dataset's prefix)");
      c.source = entry;
    } else {
      if (!std::isfinite(*weight)) bad_entry(key, i, entry, "the weight is not a finite number");
      if (*weight <= 0) bad_entry(key, i, entry, "the weight must be > 0");
      c.weight = *weight;
      c.source = entry.substr(entry.find(':') + 1);
    }
    if (c.source.empty())
      bad_entry(key, i, entry, weight ? "no dataset after the weight" : "empty entry");
    if (!seen.insert(c.source).second)
      bad_entry(key, i, entry, "the dataset '" + c.source + "' is already in the blend");
    out.push_back(std::move(c));
  }
  // Finite weights whose sum is not (1e308 + 1e308) would normalise to zeros.
  double sum = 0;
  for (const BlendComponent& c : out) sum += c.weight;
  if (!std::isfinite(sum))
    throw Error(std::string(key) + ": the weights' sum overflows a double; scale them down");
  return out;
}

std::vector<double> normalised_weights(const std::vector<BlendComponent>& components) {
  double sum = 0;
  for (const BlendComponent& c : components) sum += c.weight;
  std::vector<double> out;
  for (const BlendComponent& c : components) out.push_back(c.weight / sum);
  return out;
}

uint64_t blend_dataset_seed(uint64_t seed, int64_t dataset) {
  return seed ^ (0xD1B54A32D192ED03ULL * static_cast<uint64_t>(dataset));
}

// ---------------------------------------------------------------------------------------------
// BlendSchedule

BlendSchedule::BlendSchedule(std::vector<double> normalised_weights, int64_t mark_stride)
    : weights_(std::move(normalised_weights)),
      mark_stride_(std::max<int64_t>(mark_stride, 1)),
      counts_(weights_.size(), 0),
      mark_counts_(weights_.size(), 0) {
  if (weights_.empty()) throw Error("blend: no dataset");
}

int64_t BlendSchedule::choose() const {
  // Megatron's build_blending_indices: the dataset furthest behind its share; max(p, 1) as
  // there (position 0 and 1 both use 1). Strict '>': a tie goes to the lowest index.
  const double p = std::max(static_cast<double>(position_), 1.0);
  size_t best = 0;
  double best_error = weights_[0] * p - static_cast<double>(counts_[0]);
  for (size_t d = 1; d < weights_.size(); ++d) {
    const double error = weights_[d] * p - static_cast<double>(counts_[d]);
    if (error > best_error) {
      best_error = error;
      best = d;
    }
  }
  return static_cast<int64_t>(best);
}

void BlendSchedule::seek(int64_t position) const {
  if (position < position_) {
    // Behind: restart from the mark when it is not past the target, else from the start.
    if (mark_position_ <= position) {
      position_ = mark_position_;
      counts_ = mark_counts_;
    } else {
      position_ = 0;
      std::fill(counts_.begin(), counts_.end(), 0);
      mark_position_ = 0;
      mark_counts_ = counts_;
    }
  }
  // The next multiple of the stride, kept rather than a division per position.
  int64_t next_mark = (position_ / mark_stride_ + 1) * mark_stride_;
  while (position_ < position) {
    ++counts_[static_cast<size_t>(choose())];
    if (++position_ == next_mark) {
      mark_position_ = position_;
      mark_counts_ = counts_;
      next_mark += mark_stride_;
    }
  }
}

BlendSchedule::Draw BlendSchedule::draw(int64_t position) const {
  if (position < 0) throw Error("blend: negative stream position " + std::to_string(position));
  if (weights_.size() == 1) return {0, position};
  seek(position);
  const int64_t d = choose();
  return {d, counts_[static_cast<size_t>(d)]};
}

std::vector<int64_t> BlendSchedule::counts_before(int64_t position) const {
  if (position < 0) throw Error("blend: negative stream position " + std::to_string(position));
  if (weights_.size() == 1) return {position};
  seek(position);
  return counts_;
}

// ---------------------------------------------------------------------------------------------
// BlendedSampler

BlendedSampler::BlendedSampler(const std::vector<int64_t>& num_windows,
                               std::vector<double> normalised_weights, int64_t global_batch,
                               bool shuffle, uint64_t seed)
    : global_batch_(global_batch), schedule_(std::move(normalised_weights), global_batch) {
  if (num_windows.size() != schedule_.size())
    throw Error("blend: " + std::to_string(num_windows.size()) + " datasets but " +
                std::to_string(schedule_.size()) + " weights");
  if (global_batch <= 0)
    throw Error("batch sampler: global_batch must be positive, got " +
                std::to_string(global_batch));
  for (size_t d = 0; d < num_windows.size(); ++d)
    per_dataset_.emplace_back(num_windows[d], 1, shuffle,
                              blend_dataset_seed(seed, static_cast<int64_t>(d)));
}

BlendedSampler::Sample BlendedSampler::sample(int64_t step, int64_t i) const {
  // The same range and overflow checks as an unblended order.
  const int64_t position = BatchSampler::position(step, i, global_batch_);
  const BlendSchedule::Draw draw = schedule_.draw(position);
  return {draw.dataset, per_dataset_[static_cast<size_t>(draw.dataset)].window_at(draw.index)};
}

// ---------------------------------------------------------------------------------------------
// BlendedDataset

BlendedDataset::BlendedDataset(const std::vector<BlendComponent>& components, int64_t seq_len,
                               int64_t vocab_size, int64_t global_batch, bool shuffle,
                               uint64_t seed)
    : components_(components), shares_(normalised_weights(components)) {
  std::vector<int64_t> windows;
  for (const BlendComponent& c : components_) {
    datasets_.push_back(std::make_unique<TokenDataset>(c.source, seq_len, vocab_size));
    windows.push_back(datasets_.back()->num_windows());
  }
  sampler_ = std::make_unique<BlendedSampler>(windows, shares_, global_batch, shuffle, seed);
}

void BlendedDataset::window(int64_t step, int64_t i, int32_t* inputs, int32_t* targets) const {
  const BlendedSampler::Sample s = sampler_->sample(step, i);
  datasets_[static_cast<size_t>(s.dataset)]->window(s.window, inputs, targets);
}

std::string BlendedDataset::describe(std::string_view key) const {
  std::string out;
  char buf[64];
  for (size_t d = 0; d < datasets_.size(); ++d) {
    std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * shares_[d]);
    out += std::string(key) + " [" + std::to_string(d) + "] '" + components_[d].source +
           "': weight " + weight_text(components_[d].weight) + ", share " + buf + ", " +
           std::to_string(datasets_[d]->num_windows()) + " windows\n";
  }
  return out;
}

std::string BlendedDataset::describe_counts(int64_t position) const {
  const std::vector<int64_t> counts = sampler_->counts_before(position);
  std::string out;
  char buf[96];
  for (size_t d = 0; d < counts.size(); ++d) {
    const double got = position > 0 ? 100.0 * static_cast<double>(counts[d]) /
                                          static_cast<double>(position)
                                    : 0.0;
    std::snprintf(buf, sizeof buf, "%s[%zu] %lld (%.2f%%, target %.2f%%)", d ? ", " : "", d,
                  static_cast<long long>(counts[d]), got, 100.0 * shares_[d]);
    out += buf;
  }
  return out;
}

}  // namespace trident

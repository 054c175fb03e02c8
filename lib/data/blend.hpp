#pragma once
// Dataset blends: data.train / data.val as several datasets with weights, e.g.
// ["0.7:data/web/part", "0.3:data/code/train_*.bin"]. docs/data.md specifies the syntax and the
// order precisely enough to reimplement it (data_tools/inspect_shard.py --order does, and
// tests/test_data_blend.cpp checks both agree).
//
// Order: stream position p = step * G + i draws from the dataset chosen by Megatron-LM's rule
// (megatron/core/datasets/helpers.cpp, build_blending_indices): the largest error
// w[d] * max(p, 1) - count[d] (double arithmetic, ties: the lowest d), count[d] = samples d
// got before p; that dataset's own sample k = count[d] is its window BatchSampler-style
// (epochs, Fisher-Yates) with the seed blend_dataset_seed(train.seed, d).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.hpp"

namespace trident {

// One entry of a blend: its weight as written (not normalised) and the dataset (a shard path or
// glob, or an indexed dataset's prefix, as for a plain data.train).
struct BlendComponent {
  double weight = 1.0;
  std::string source;
};

// Parses the entries of `key` ("data.train"): each "WEIGHT:SOURCE", WEIGHT a finite decimal
// number > 0 (strtod syntax, whole text before the first colon). A single entry without a
// weight is a plain source of weight 1 (the single-dataset form). Throws trident::Error
// "KEY[i] = "ENTRY": CAUSE" (the caller prefixes the file) on bad syntax, a non-positive or
// non-finite weight, an empty source, or a source given twice.
std::vector<BlendComponent> parse_blend(const std::vector<std::string>& entries,
                                        std::string_view key);

// The weights divided by their sum (summed in entry order), as Megatron normalises them.
std::vector<double> normalised_weights(const std::vector<BlendComponent>& components);

// The shuffle seed of dataset d of a blend: seed ^ (0xD1B54A32D192ED03 * d) modulo 2^64, so
// dataset 0 (and an unblended dataset) keeps train.seed and its order is the one of a plain
// data.train.
uint64_t blend_dataset_seed(uint64_t seed, int64_t dataset);

// Which dataset each stream position draws from (Megatron's greedy rule above). Incremental:
// it keeps the counts at the furthest position reached and a restart mark at the last multiple
// of `mark_stride` (the global batch) it passed, so reading positions in order costs O(K) per
// position (K datasets), a query behind the mark restarts from 0, and a resumed run at position
// P pays O(P * K) once (measured 8 ns per position for K = 2 on a loaded 2-core machine:
// 50 million positions, step 97 656 at G = 512, in 0.4 s). One dataset: closed form
// (dataset 0, index p), O(1). Not thread-safe (mutable cache).
class BlendSchedule {
 public:
  BlendSchedule(std::vector<double> normalised_weights, int64_t mark_stride);
  struct Draw {
    int64_t dataset;
    int64_t index;  // the dataset's own sample number: how many it had drawn before p
  };
  Draw draw(int64_t position) const;
  // Samples each dataset drew at positions [0, position).
  std::vector<int64_t> counts_before(int64_t position) const;
  size_t size() const { return weights_.size(); }

 private:
  void seek(int64_t position) const;  // counts_ := counts before `position`
  int64_t choose() const;             // the dataset position_ draws from
  std::vector<double> weights_;
  int64_t mark_stride_;
  mutable int64_t position_ = 0, mark_position_ = 0;
  mutable std::vector<int64_t> counts_, mark_counts_;
};

// The blended order: sample i of step s is (dataset, window).
class BlendedSampler {
 public:
  BlendedSampler(const std::vector<int64_t>& num_windows, std::vector<double> normalised_weights,
                 int64_t global_batch, bool shuffle, uint64_t seed);
  struct Sample {
    int64_t dataset;
    int64_t window;
  };
  Sample sample(int64_t step, int64_t i) const;
  std::vector<int64_t> counts_before(int64_t position) const {
    return schedule_.counts_before(position);
  }

 private:
  int64_t global_batch_;
  BlendSchedule schedule_;
  std::vector<BatchSampler> per_dataset_;  // global batch 1: sample k is the dataset's position k
};

// The datasets of a blend (each a TokenDataset) and their blended order.
class BlendedDataset {
 public:
  BlendedDataset(const std::vector<BlendComponent>& components, int64_t seq_len,
                 int64_t vocab_size, int64_t global_batch, bool shuffle, uint64_t seed);
  // inputs[T], targets[T] of sample i of step s.
  void window(int64_t step, int64_t i, int32_t* inputs, int32_t* targets) const;
  size_t size() const { return datasets_.size(); }
  const TokenDataset& dataset(size_t d) const { return *datasets_[d]; }
  const std::vector<BlendComponent>& components() const { return components_; }
  const std::vector<double>& shares() const { return shares_; }
  const BlendedSampler& sampler() const { return *sampler_; }
  // One line per dataset: its source, weight, share and windows (logged at start).
  std::string describe(std::string_view key) const;
  // The samples each dataset drew at positions [0, position), with the share of the total and
  // the target share: "[0] 700 (70.00%, target 70.00%), [1] ...".
  std::string describe_counts(int64_t position) const;

 private:
  std::vector<BlendComponent> components_;
  std::vector<double> shares_;
  std::vector<std::unique_ptr<TokenDataset>> datasets_;
  std::unique_ptr<BlendedSampler> sampler_;
};

}  // namespace trident

#include "optim/grad_sync.hpp"

#include <algorithm>
#include <cstring>

namespace trident {

std::vector<FlatRange> make_buckets(const std::vector<ParamInfo>& params, int64_t buffer_size,
                                    int64_t bucket_elems) {
  // Parameter starts, descending: the candidate cut points.
  std::vector<int64_t> starts;
  for (const ParamInfo& p : params) starts.push_back(p.offset);
  std::sort(starts.rbegin(), starts.rend());
  std::vector<FlatRange> buckets;
  int64_t end = buffer_size;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t begin = starts[i];
    const bool last = i + 1 == starts.size();
    // Close the bucket at this start if taking the next parameter would overflow it.
    if (last || end - starts[i + 1] > bucket_elems) {
      if (last) {
        buckets.push_back({0, end});
      } else {
        buckets.push_back({begin, end});
        end = begin;
      }
    }
  }
  if (buckets.empty() && buffer_size > 0) buckets.push_back({0, buffer_size});
  return buckets;
}

FlatRange zero_slice(const FlatRange& bucket, int rank, int size) {
  const int64_t slice = (bucket.size() + size - 1) / size;
  const int64_t begin = std::min(bucket.end, bucket.begin + rank * slice);
  const int64_t end = std::min(bucket.end, begin + slice);
  return {begin, end};
}

GradientSync::GradientSync(const std::vector<ParamInfo>& params, int64_t buffer_size,
                           Communicator& data, double bucket_mb, bool zero)
    : data_(data), zero_(zero && data.size() > 1) {
  const int64_t bucket_elems =
      std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / sizeof(float)));
  buckets_ = make_buckets(params, buffer_size, bucket_elems);
  if (zero_) {
    int64_t largest = 0;
    for (const FlatRange& b : buckets_) {
      owned_.push_back(zero_slice(b, data.rank(), data.size()));
      largest = std::max(largest, b.size());
    }
    const int64_t slice = (largest + data.size() - 1) / data.size();
    staging_.resize(slice * data.size());
    slice_.resize(slice);
    std::sort(owned_.begin(), owned_.end(),
              [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  } else {
    owned_.push_back({0, buffer_size});
  }
}

void GradientSync::grads_final_from(float* grads, int64_t watermark) {
  if (zero_ || data_.size() == 1) return;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].begin >= watermark) {
    const FlatRange& b = buckets_[next_bucket_++];
    pending_.push_back(data_.iall_reduce(grads + b.begin, b.size(), DType::F32, ReduceOp::Sum));
  }
  for (auto& request : pending_) request->test();  // nudge MPI's progress engine
}

void GradientSync::finish(float* grads) {
  const int dp = data_.size();
  if (dp == 1) return;
  const float inv = 1.0f / static_cast<float>(dp);
  if (!zero_) {
    grads_final_from(grads, 0);
    for (auto& request : pending_) request->wait();
    pending_.clear();
    next_bucket_ = 0;
    const int64_t n = owned_[0].end;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) grads[i] *= inv;
    return;
  }
  for (const FlatRange& b : buckets_) {
    const int64_t slice = (b.size() + dp - 1) / dp;
    std::memcpy(staging_.data(), grads + b.begin, sizeof(float) * b.size());
    std::fill(staging_.begin() + b.size(), staging_.begin() + slice * dp, 0.0f);
    data_.reduce_scatter(staging_.data(), slice_.data(), slice, DType::F32);
    const FlatRange mine = zero_slice(b, data_.rank(), dp);
    for (int64_t i = 0; i < mine.size(); ++i) grads[mine.begin + i] = slice_[i] * inv;
  }
}

void GradientSync::all_gather_weights(float* weights) {
  if (!zero_) return;
  const int dp = data_.size();
  for (const FlatRange& b : buckets_) {
    const int64_t slice = (b.size() + dp - 1) / dp;
    const FlatRange mine = zero_slice(b, data_.rank(), dp);
    std::memcpy(slice_.data(), weights + mine.begin, sizeof(float) * mine.size());
    std::fill(slice_.begin() + mine.size(), slice_.begin() + slice, 0.0f);
    data_.all_gather(slice_.data(), staging_.data(), slice, DType::F32);
    std::memcpy(weights + b.begin, staging_.data(), sizeof(float) * b.size());
  }
}

}  // namespace trident

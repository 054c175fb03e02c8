#include "optim/grad_sync.hpp"

#include <algorithm>
#include <cstring>

namespace trident {

namespace {
int64_t bytes(int64_t floats) { return floats * static_cast<int64_t>(sizeof(float)); }
}  // namespace

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
                           Communicator& data, double bucket_mb, bool zero, Device& device)
    : data_(data), device_(device), zero_(zero && data.size() > 1) {
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
    staging_ = DeviceArray<float>(device, slice * data.size());
    slice_ = DeviceArray<float>(device, slice);
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
    device_.scale(grads, owned_[0].end, inv);
    return;
  }
  for (const FlatRange& b : buckets_) {
    const int64_t slice = (b.size() + dp - 1) / dp;
    device_.copy(staging_.data(), grads + b.begin, bytes(b.size()));
    device_.fill_zero(staging_.data() + b.size(), bytes(slice * dp - b.size()));
    data_.reduce_scatter(staging_.data(), slice_.data(), slice, DType::F32);
    const FlatRange mine = zero_slice(b, data_.rank(), dp);
    device_.copy(grads + mine.begin, slice_.data(), bytes(mine.size()));
    device_.scale(grads + mine.begin, mine.size(), inv);
  }
}

void GradientSync::all_gather_weights(float* weights) {
  if (!zero_) return;
  const int dp = data_.size();
  for (const FlatRange& b : buckets_) {
    const int64_t slice = (b.size() + dp - 1) / dp;
    const FlatRange mine = zero_slice(b, data_.rank(), dp);
    device_.copy(slice_.data(), weights + mine.begin, bytes(mine.size()));
    device_.fill_zero(slice_.data() + mine.size(), bytes(slice - mine.size()));
    data_.all_gather(slice_.data(), staging_.data(), slice, DType::F32);
    device_.copy(weights + b.begin, staging_.data(), bytes(b.size()));
  }
}

}  // namespace trident

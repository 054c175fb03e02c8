#include "optim/grad_sync.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "optim/adamw.hpp"

namespace trident {

namespace {
int64_t bytes(int64_t floats) { return floats * static_cast<int64_t>(sizeof(float)); }
}  // namespace

std::vector<FlatRange> make_buckets(const std::vector<ParamInfo>& params, int64_t buffer_size,
                                    int64_t bucket_elems,
                                    const std::function<bool(const ParamInfo&)>& select) {
  // Parameters by descending offset: backward's completion order.
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return params[a].offset > params[b].offset; });
  std::vector<FlatRange> buckets;
  FlatRange open{0, 0};  // the bucket being filled (empty: none)
  int64_t extent_end = buffer_size;
  for (size_t i = 0; i < order.size(); ++i) {
    const ParamInfo& p = params[order[i]];
    const int64_t begin = i + 1 == order.size() ? 0 : p.offset;
    const FlatRange extent{begin, extent_end};
    extent_end = begin;
    if (select && !select(p)) {  // a bucket never spans a rejected parameter
      if (open.size() > 0) buckets.push_back(open);
      open = {0, 0};
      continue;
    }
    // Join the open bucket if it stays within bucket_elems, else start a new one.
    if (open.size() > 0 && open.begin == extent.end && open.end - extent.begin <= bucket_elems) {
      open.begin = extent.begin;
    } else {
      if (open.size() > 0) buckets.push_back(open);
      open = extent;
    }
  }
  if (open.size() > 0) buckets.push_back(open);
  if (params.empty() && buffer_size > 0 && !select) buckets.push_back({0, buffer_size});
  return buckets;
}

GradientSync::GradientSync(const std::vector<ParamInfo>& params, int64_t buffer_size,
                           ReplicaGroups groups, double bucket_mb, int zero_stage,
                           Device& device)
    : data_(*groups.data), device_(device), stage_(zero_stage) {
  const int64_t bucket_elems =
      std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / sizeof(float)));
  const bool split_experts = groups.expert != nullptr && groups.expert->size() > 1;
  parts_.emplace_back().comm = groups.data;
  if (split_experts) {
    Part& experts = parts_.emplace_back();
    experts.comm = groups.expert_data;
    experts.experts = true;
  }
  // ZeRO-1 and 2: the largest bucket padded to a multiple of its group, and one rank's slice of
  // it (the reduce-scatter's and the weights' all-gather's staging; stage 3 needs neither).
  int64_t staging = 0, slice = 0;
  const std::vector<ParamUnit> units =
      zero_stage >= 2 ? param_units(params, buffer_size) : std::vector<ParamUnit>{};
  for (Part& part : parts_) {
    const bool experts_part = part.experts;
    if (zero_stage >= 2) {
      for (const ParamUnit& u : units)
        if (!split_experts || u.expert == experts_part) part.buckets.push_back(u.range);
      std::reverse(part.buckets.begin(), part.buckets.end());  // backward's order
    } else {
      const auto in_part = [&](const ParamInfo& p) { return p.expert == experts_part; };
      part.buckets = split_experts ? make_buckets(params, buffer_size, bucket_elems, in_part)
                                   : make_buckets(params, buffer_size, bucket_elems);
    }
    const int size = part.comm->size();
    part.zero = zero_stage >= 1 && size > 1;
    if (part.zero) {
      for (const FlatRange& b : part.buckets) {
        part.owned.push_back(zero_slice(b, part.comm->rank(), size));
        if (zero_stage == 3) continue;
        staging = std::max(staging, (b.size() + size - 1) / size * size);
        slice = std::max(slice, (b.size() + size - 1) / size);
      }
    } else {
      part.owned = coalesced(part.buckets);
    }
    buckets_.insert(buckets_.end(), part.buckets.begin(), part.buckets.end());
    owned_.insert(owned_.end(), part.owned.begin(), part.owned.end());
  }
  owned_ = coalesced(owned_);
  grad_store_ = zero_stage >= 2 ? FlatStore{owned_} : FlatStore::whole(buffer_size);
  if (staging > 0) {
    staging_ = DeviceArray<float>(device, staging);
    slice_ = DeviceArray<float>(device, slice);
  }
}

const GradientSync::Part& GradientSync::part_of(const ParamInfo& p) const {
  return p.expert && parts_.size() > 1 ? parts_[1] : parts_[0];
}

void GradientSync::grads_final_from(float* grads, int64_t watermark) {
  if (stage_ >= 2) return;  // the model reduced each unit as its backward ended
  for (Part& part : parts_) {
    if (part.zero || part.comm->size() == 1) continue;
    while (part.next_bucket < part.buckets.size() &&
           part.buckets[part.next_bucket].begin >= watermark) {
      const FlatRange& b = part.buckets[part.next_bucket++];
      part.pending.push_back(
          part.comm->iall_reduce(grads + b.begin, b.size(), DType::F32, ReduceOp::Sum));
    }
    for (auto& request : part.pending) request->test();  // nudge MPI's progress engine
  }
}

void GradientSync::finish(float* grads) {
  const int dp = data_.size();
  if (dp == 1) return;
  // Every part averages over all the replicas of the batch: an expert's gradient already sums
  // the tokens of its expert group (they came to it by all-to-all).
  const float inv = 1.0f / static_cast<float>(dp);
  if (stage_ >= 2) {  // the model's reduce-scatters left the sums of the owned slices, packed
    device_.scale(grads, grad_store_.size(), inv);
    return;
  }
  grads_final_from(grads, 0);
  for (Part& part : parts_) {
    if (part.zero) {
      reduce_scatter_buckets(part, grads);
    } else {
      for (auto& request : part.pending) request->wait();
      part.pending.clear();
      part.next_bucket = 0;
    }
    for (const FlatRange& r : part.owned) device_.scale(grads + r.begin, r.size(), inv);
  }
}

void GradientSync::reduce_scatter_buckets(Part& part, float* grads) {
  Communicator& comm = *part.comm;
  const int size = comm.size();
  for (const FlatRange& b : part.buckets) {
    const int64_t slice = (b.size() + size - 1) / size;
    device_.copy(staging_.data(), grads + b.begin, bytes(b.size()));
    device_.fill_zero(staging_.data() + b.size(), bytes(slice * size - b.size()));
    comm.reduce_scatter(staging_.data(), slice_.data(), slice, DType::F32);
    const FlatRange mine = zero_slice(b, comm.rank(), size);
    device_.copy(grads + mine.begin, slice_.data(), bytes(mine.size()));
  }
}

void GradientSync::all_gather_weights(float* weights) {
  if (stage_ == 3) return;
  for (Part& part : parts_) {
    if (!part.zero) continue;
    Communicator& comm = *part.comm;
    const int size = comm.size();
    for (const FlatRange& b : part.buckets) {
      const int64_t slice = (b.size() + size - 1) / size;
      const FlatRange mine = zero_slice(b, comm.rank(), size);
      device_.copy(slice_.data(), weights + mine.begin, bytes(mine.size()));
      device_.fill_zero(slice_.data() + mine.size(), bytes(slice - mine.size()));
      comm.all_gather(slice_.data(), staging_.data(), slice, DType::F32);
      device_.copy(weights + b.begin, staging_.data(), bytes(b.size()));
    }
  }
}

Communicator& GradientSync::host_comm(const Part& part, const ReplicaGroups& host) const {
  return part.experts ? *host.expert_data : *host.data;
}

void GradientSync::sum_over_holders(const ParamInfo& p, double* values, int64_t n,
                                    const ReplicaGroups& host) const {
  const Part& part = part_of(p);
  if (part.experts) host.expert->all_reduce_sum(values, n);
  if (part.zero) host_comm(part, host).all_reduce_sum(values, n);
}

double GradientSync::square_sum(const std::vector<ParamInfo>& params, const float* grads,
                                const ReplicaGroups& host) const {
  double total = 0.0;
  for (const Part& part : parts_) {
    double sum = grad_square_sum(params, grads, grad_store_, part.owned, device_, norm_parts_);
    if (part.experts) host.expert->all_reduce_sum(&sum, 1);
    if (part.zero) host_comm(part, host).all_reduce_sum(&sum, 1);
    total += sum;
  }
  return total;
}

int GradientSync::replica_of(const ParamInfo& p) const { return part_of(p).comm->rank(); }

}  // namespace trident

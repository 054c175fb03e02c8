#pragma once
// Data-parallel gradient synchronisation, optionally with ZeRO-1 optimizer sharding.
//
// The flat gradient buffer is cut into buckets of about parallel.dp_bucket_mb at parameter
// boundaries, from the end: backward finishes parameters in reverse registration order, so the
// last bucket is final first. On the last micro-batch's backward the model reports a
// watermark ("every gradient at offset >= w is final") and each bucket above it is reduced at
// once with a non-blocking all-reduce, overlapping the rest of the backward where the MPI
// library progresses it. finish() reduces what is left (the bucket holding offset 0 — the tied
// embedding, whose copies are summed over the embedding group first), waits, and averages.
//
// ZeRO-1 (optim.zero_stage = 1): each data-parallel rank owns an even slice of every bucket
// (the bucket padded to a multiple of DP): gradients are reduce-scattered so each rank holds
// the average of its slices only, the optimizer keeps moments for those slices only, and the
// updated weights are all-gathered back.
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace trident {

struct FlatRange {
  int64_t begin = 0, end = 0;  // [begin, end) of the flat parameter/gradient buffer
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

// Pure: buckets of at most `bucket_elems` elements (a single larger parameter gets a bucket of
// its own), split at parameter boundaries, covering [0, buffer_size), ordered from the END of
// the buffer (the order in which backward completes them).
std::vector<FlatRange> make_buckets(const std::vector<ParamInfo>& params, int64_t buffer_size,
                                    int64_t bucket_elems);
// Pure: the slice of `bucket` that data-parallel rank `rank` of `size` owns under ZeRO-1
// (slices of ceil(len/size) elements; the last ones may be short or empty).
FlatRange zero_slice(const FlatRange& bucket, int rank, int size);

class GradientSync {
 public:
  GradientSync(const std::vector<ParamInfo>& params, int64_t buffer_size, Communicator& data,
               double bucket_mb, bool zero, Device& device);

  // Every gradient at flat offset >= watermark is final for this step: start reducing the
  // buckets that lie entirely above it (not under ZeRO-1, which reduces in finish()).
  void grads_final_from(float* grads, int64_t watermark);
  // Reduces the remaining buckets, waits for all, averages over the data-parallel group.
  // Afterwards the gradients of owned() are the global-batch average.
  void finish(float* grads);
  // ZeRO-1: gather every rank's updated slices so all replicas hold the same weights again.
  void all_gather_weights(float* weights);

  // The ranges whose averaged gradients this rank holds and whose optimizer state it keeps:
  // the whole buffer without ZeRO-1, this rank's bucket slices with it.
  const std::vector<FlatRange>& owned() const { return owned_; }
  const std::vector<FlatRange>& buckets() const { return buckets_; }
  bool zero() const { return zero_; }

 private:
  Communicator& data_;
  Device& device_;
  bool zero_;
  std::vector<FlatRange> buckets_;
  std::vector<FlatRange> owned_;
  size_t next_bucket_ = 0;  // buckets_[0, next_bucket_) have been launched this step
  std::vector<std::unique_ptr<CommRequest>> pending_;
  DeviceArray<float> staging_, slice_;
};

}  // namespace trident

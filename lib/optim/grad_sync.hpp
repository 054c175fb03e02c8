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
//
// ZeRO-2 and ZeRO-3 (optim.zero_stage = 2, 3): the buckets are the model's units
// (param_units) and the model reduce-scatters each unit's gradient as backward finishes it
// (model/zero_shards.hpp), so that the model's grads() already hold the sums of this rank's
// slices, packed (grad_store()); finish() only averages them. At stage 2 the updated slices are
// all-gathered back into the whole weights as under ZeRO-1; at stage 3 the weights stay sharded
// (the model gathers a unit's compute copy when it reads it).
//
// Expert parallelism: a rank's experts are replicated over its expert-data group only, so
// their buckets are reduced (and sliced under ZeRO-1) over that group; the rest over the data
// group as above.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace trident {

// Pure: buckets of at most `bucket_elems` elements (a single larger parameter gets a bucket of
// its own), split at parameter boundaries, ordered from the END of the buffer (the order in
// which backward completes them). A parameter's extent runs from its offset to the next
// parameter's (the last one's to buffer_size; the first one's from 0): with every parameter
// selected the buckets cover [0, buffer_size). `select` (if given) keeps only the extents of the
// parameters it accepts; a bucket never spans a parameter it rejects.
std::vector<FlatRange> make_buckets(const std::vector<ParamInfo>& params, int64_t buffer_size,
                                    int64_t bucket_elems,
                                    const std::function<bool(const ParamInfo&)>& select = {});

// The groups over which a rank's parameters are replicated: the data group and, under expert
// parallelism (parallel.expert > 1; grid/grid.hpp), the expert group (different experts on
// each rank) and the expert-data group (the replicas of this rank's experts); both nullptr
// without expert parallelism.
struct ReplicaGroups {
  Communicator* data = nullptr;
  Communicator* expert = nullptr;
  Communicator* expert_data = nullptr;
};

class GradientSync {
 public:
  // Under expert parallelism the stacked experts (ParamInfo::expert) are reduced over the
  // expert-data group (their ZeRO-1 slices too) and everything else over `data`; both are
  // averaged over the whole data-parallel dimension (data's size: the replicas of the batch).
  // `groups`: the communicators of the gradients' memory (`data` required).
  // `zero_stage`: optim.zero_stage (0 to 3).
  GradientSync(const std::vector<ParamInfo>& params, int64_t buffer_size, ReplicaGroups groups,
               double bucket_mb, int zero_stage, Device& device);

  // Every gradient at flat offset >= watermark is final for this step: start reducing the
  // buckets that lie entirely above it (not under ZeRO, which reduces elsewhere).
  void grads_final_from(float* grads, int64_t watermark);
  // Reduces the remaining buckets, waits for all, averages over the data-parallel group.
  // Afterwards the gradients of owned() are the global-batch average. `grads` is stored as
  // grad_store() says.
  void finish(float* grads);
  // ZeRO-1 and 2: gather every rank's updated slices so all replicas hold the same weights
  // again (nothing at stage 3, whose weights stay sharded).
  void all_gather_weights(float* weights);
  // How the gradients it reduces are stored: the whole buffer, or at ZeRO-2/3 owned() packed.
  const FlatStore& grad_store() const { return grad_store_; }
  // ZeRO-1 and 2: the reduce-scatter's and all-gather's staging (the largest bucket, padded,
  // and one slice of it).
  int64_t staging_bytes() const { return staging_.bytes() + slice_.bytes(); }

  // The ranges whose averaged gradients this rank holds and whose optimizer state it keeps,
  // sorted: the whole buffer without ZeRO-1, this rank's bucket slices with it.
  const std::vector<FlatRange>& owned() const { return owned_; }
  // Every bucket (the experts' after the others' under expert parallelism).
  const std::vector<FlatRange>& buckets() const { return buckets_; }
  // ZeRO-1 over the data group (the parameters that are not experts).
  bool zero() const { return parts_.front().zero; }
  // Whether this rank keeps only a slice of p's optimizer state (ZeRO over p's group).
  bool zero_for(const ParamInfo& p) const { return part_of(p).zero; }
  // Whether this rank keeps only a slice of p's weights (ZeRO-3 over p's group).
  bool weights_sharded_for(const ParamInfo& p) const { return stage_ == 3 && part_of(p).zero; }
  // Sums `n` host values in place over the data-parallel ranks that hold different owned
  // elements of p: none without ZeRO-1 (every replica holds all of p), the data group with it;
  // for an expert tensor under expert parallelism, the expert group, and the expert-data group
  // too under ZeRO-1. `host`: the host-memory communicators of the same groups (the ones this
  // sync reduces gradients over may be a GPU's). The parity tests complete their sums with it.
  void sum_over_holders(const ParamInfo& p, double* values, int64_t n,
                        const ReplicaGroups& host) const;
  // The sum of squared owned gradients of the counted parameters (grad_square_sum), completed
  // over the data-parallel dimension through `host`: the caller sums it over the
  // model-parallel group.
  double square_sum(const std::vector<ParamInfo>& params, const float* grads,
                    const ReplicaGroups& host) const;
  // The data-parallel rank index among the replicas of p (0: the one that writes p to a
  // checkpoint): the data rank, or for an expert tensor the expert-data rank.
  int replica_of(const ParamInfo& p) const;

 private:
  // The parameters one communicator reduces (all of them without expert parallelism).
  struct Part {
    Communicator* comm = nullptr;
    bool experts = false;  // the stacked experts (ParamInfo::expert)
    bool zero = false;
    std::vector<FlatRange> buckets, owned;
    size_t next_bucket = 0;  // buckets[0, next_bucket) have been launched this step
    std::vector<std::unique_ptr<CommRequest>> pending;
  };
  const Part& part_of(const ParamInfo& p) const;
  // The host communicator of `part`'s group among `host`.
  Communicator& host_comm(const Part& part, const ReplicaGroups& host) const;
  void reduce_scatter_buckets(Part& part, float* grads);

  Communicator& data_;
  Device& device_;
  int stage_;
  FlatStore grad_store_;
  std::vector<Part> parts_;
  std::vector<FlatRange> buckets_, owned_;
  DeviceArray<float> staging_, slice_;
  mutable std::vector<Device::Range> norm_parts_;  // square_sum's ranges, kept for the next step
};

}  // namespace trident

#pragma once
// A mixture of experts' figures of one training step (StepMetrics::moe...; docs/moe.md): the
// load-balancing and z losses, the experts' load spread and the tokens dropped, summed over the
// pipeline stages' layers and the data-parallel replicas so that every rank logs the same.
#include <cstdint>
#include <vector>

#include "model/moe.hpp"
#include "train/metrics_log.hpp"

namespace trident {

class ParallelDims;

class MoeStepMetrics {
 public:
  // Fills m.moe... from `step`, this rank's layers' statistics of the step's micro-batches
  // (`micro_batches` per replica), for `experts` experts. Collective over the pipeline and data
  // groups; nothing (and no communication) when experts is 0.
  void fill(const MoeStats& step, int64_t experts, int64_t micro_batches,
            const ParallelDims& groups, StepMetrics& m);

 private:
  std::vector<double> sums_;  // [aux, z, dropped, load_0 .. load_E-1]: kept, no allocation a step
};

}  // namespace trident

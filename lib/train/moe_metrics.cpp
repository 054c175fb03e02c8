#include "train/moe_metrics.hpp"

#include <algorithm>
#include <cmath>

#include "grid/parallel_dims.hpp"

namespace trident {

void MoeStepMetrics::fill(const MoeStats& step, int64_t E, int64_t micro_batches,
                          const ParallelDims& groups, StepMetrics& m) {
  if (E == 0) return;
  // [aux, z, dropped, load_0 .. load_E-1]: summed over the stages' layers and the replicas
  // (the tensor ranks of a stage hold the same figures). The losses are sums over micro-batches
  // of the per-micro-batch means: / micro-batches / replicas is the global batch's mean.
  std::vector<double>& v = sums_;
  v.assign(static_cast<size_t>(3 + E), 0.0);
  v[0] = step.aux_loss_sum;
  v[1] = step.z_loss_sum;
  v[2] = static_cast<double>(step.dropped);
  for (int64_t e = 0; e < E && e < static_cast<int64_t>(step.load.size()); ++e)
    v[3 + e] = static_cast<double>(step.load[e]);
  const int64_t n = static_cast<int64_t>(v.size());
  if (groups.pipeline().size > 1) groups.pipeline().host->all_reduce_sum(v.data(), n);
  // The replicas: data x context (a context rank's loads are its rows' assignments, its
  // losses the sequences' load-balancing loss and its rows' mean z-loss).
  const DimGroup& replicas = groups.grad_reduce();
  if (replicas.size > 1) replicas.host->all_reduce_sum(v.data(), n);
  const double replicas_microbatches =
      static_cast<double>(replicas.size) * static_cast<double>(micro_batches);
  double total = 0.0, lo = INFINITY, hi = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    total += v[3 + e];
    lo = std::min(lo, v[3 + e]);
    hi = std::max(hi, v[3 + e]);
  }
  m.moe = true;
  m.moe_aux_loss = v[0] / replicas_microbatches;
  m.moe_z_loss = v[1] / replicas_microbatches;
  m.moe_load_min = total > 0 ? lo / total : 0.0;
  m.moe_load_max = total > 0 ? hi / total : 0.0;
  m.moe_dropped = total > 0 ? v[2] / total : 0.0;
}

}  // namespace trident

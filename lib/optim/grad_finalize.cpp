#include "optim/grad_finalize.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "util/error.hpp"

namespace trident {

void sum_split_gradients(const std::vector<ParamInfo>& params, float* grads,
                         const SplitGradientGroups& groups) {
  sum_split_gradients(params, grads, FlatStore::whole(INT64_MAX), groups);
}

void sum_split_gradients(const std::vector<ParamInfo>& params, float* grads,
                         const FlatStore& grads_at, const SplitGradientGroups& groups) {
  const auto sum_over = [&](Communicator& group, const ParamInfo& p) {
    grads_at.for_each_stored(p.offset, p.offset + p.numel(), [&](int64_t, int64_t at, int64_t n) {
      group.all_reduce_sum(grads + at, n);
    });
  };
  for (const ParamInfo& p : params)
    if (p.tensor_partial_grad) sum_over(*groups.tensor, p);
  if (groups.embedding == nullptr) return;
  const auto wte = std::find_if(params.begin(), params.end(), [](const ParamInfo& p) {
    return p.name == "embedding.token.weight";
  });
  if (wte == params.end())
    throw Error("sum_split_gradients: an embedding group but no embedding.token.weight");
  sum_over(*groups.embedding, *wte);
}

double global_grad_norm(const GradientSync& sync, const std::vector<ParamInfo>& params,
                        const float* grads, const ReplicaGroups& host,
                        Communicator& model_parallel) {
  double square_sum = sync.square_sum(params, grads, host);
  model_parallel.all_reduce_sum(&square_sum, 1);
  return std::sqrt(square_sum);
}

double clip_scale(double grad_norm, double clip) {
  return (clip > 0.0 && grad_norm > clip) ? clip / (grad_norm + 1e-6) : 1.0;
}

}  // namespace trident

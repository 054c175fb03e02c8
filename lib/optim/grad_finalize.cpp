#include "optim/grad_finalize.hpp"

#include <algorithm>
#include <cmath>

#include "util/error.hpp"

namespace trident {

void sum_split_gradients(const std::vector<ParamInfo>& params, float* grads,
                         const SplitGradientGroups& groups) {
  for (const ParamInfo& p : params)
    if (p.tensor_partial_grad) groups.tensor->all_reduce_sum(grads + p.offset, p.numel());
  if (groups.embedding == nullptr) return;
  const auto wte = std::find_if(params.begin(), params.end(), [](const ParamInfo& p) {
    return p.name == "embedding.token.weight";
  });
  if (wte == params.end())
    throw Error("sum_split_gradients: an embedding group but no embedding.token.weight");
  groups.embedding->all_reduce_sum(grads + wte->offset, wte->numel());
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

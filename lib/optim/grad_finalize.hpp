#pragma once
// Finishing a step's gradients beside the data-parallel reduction (optim/grad_sync.hpp): the
// sums over the model-parallel groups that make each rank's gradients whole, and the global
// norm that clipping scales them by. The trainer calls them in this order: backward,
// sum_split_gradients, GradientSync::finish, global_grad_norm, clip_scale, the update.
#include <vector>

#include "comm/comm.hpp"
#include "model/params.hpp"
#include "optim/grad_sync.hpp"

namespace trident {

// The groups over which parts of one gradient lie on different ranks.
struct SplitGradientGroups {
  // Sequence parallelism: each tensor rank's gradients of the norms
  // (ParamInfo::tensor_partial_grad) cover its rows of the sequence only.
  Communicator* tensor = nullptr;
  // The tied embedding across pipeline stages: its lookup (first stage) and LM head (last stage)
  // each hold part of its gradient. nullptr where it is not tied across stages (one stage,
  // untied, or a middle stage).
  Communicator* embedding = nullptr;
};

// Collective over the groups: sums the partial gradients in `grads` (device memory, the flat
// buffer of `params`) so that every copy of a parameter holds the whole gradient and takes the
// same update: the tensor_partial_grad parameters over `tensor`, the tied embedding
// ("embedding.token.weight", at offset 0: in the bucket data parallelism reduces last) over
// `embedding`.
void sum_split_gradients(const std::vector<ParamInfo>& params, float* grads,
                         const SplitGradientGroups& groups);
// The same over gradients stored as `grads_at` says (ZeRO-2/3: the rank's slices, packed; every
// rank of a group holds the same slices of these tensors, so the sums are element for element).
void sum_split_gradients(const std::vector<ParamInfo>& params, float* grads,
                         const FlatStore& grads_at, const SplitGradientGroups& groups);

// Collective: the global gradient norm, every parameter counted once: sharded tensors summed
// over the tensor group, replicated ones on tensor rank 0 only, stages over the pipeline group,
// the tied embedding on the first stage only (ParamInfo::counted_in_norm); under ZeRO-1 the
// slices over the data group too, and different experts over the expert group
// (GradientSync::square_sum through the host communicators `host`); `model_parallel` (tensor x
// pipeline) sums the rest.
double global_grad_norm(const GradientSync& sync, const std::vector<ParamInfo>& params,
                        const float* grads, const ReplicaGroups& host,
                        Communicator& model_parallel);

// The factor the update scales gradients by for optim.grad_clip = `clip`: clip / (norm + 1e-6)
// when clip > 0 and the norm exceeds it, else 1.
double clip_scale(double grad_norm, double clip);

}  // namespace trident

#include "pipeline/stage_split.hpp"

#include "model/architecture.hpp"
#include "model/model_stats.hpp"
#include "pipeline/schedule.hpp"

namespace trident {

std::vector<int64_t> stage_split(const ModelConfig& m, int stages,
                                 const std::vector<int64_t>& explicit_counts,
                                 const std::string& balance) {
  if (!explicit_counts.empty() || balance != "flops")
    return stage_layer_counts(m.layers, stages, explicit_counts);
  // Training FLOPs per token: a layer's linear layers and attention; the LM head's forward and
  // backward (3 forwards: both run in the training forward, nothing is recomputed).
  const TrainingFlopsParts parts = training_flops_parts(m, padded_vocab_size(m, 1));
  return balanced_stage_layer_counts(m.layers, stages, parts.layer_linear + parts.layer_attention,
                                     parts.head);
}

}  // namespace trident

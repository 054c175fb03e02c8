#include "model/model_stats.hpp"

namespace trident {

int64_t parameter_count(const ModelConfig& m) {
  const int64_t C = m.width, L = m.layers;
  return m.vocab_size * C + m.seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

double training_flops_per_token(const ModelConfig& m, int64_t padded_vocab) {
  const double C = static_cast<double>(m.width), L = static_cast<double>(m.layers);
  const double T = static_cast<double>(m.seq_len), V = static_cast<double>(padded_vocab);
  return 3.0 * (L * (24.0 * C * C + 4.0 * T * C) + 2.0 * C * V);
}

}  // namespace trident

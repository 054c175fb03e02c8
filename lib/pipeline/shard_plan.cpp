#include "pipeline/shard_plan.hpp"

#include "pipeline/schedule.hpp"
#include "pipeline/stage_split.hpp"
#include "util/error.hpp"

namespace trident {

ModelShard plan_model_shard(const Config& config, const ShardCoord& coord) {
  const ModelConfig& m = config.model;
  const ParallelConfig& par = config.parallel;
  const bool sequence_parallel = par.sequence_parallel && coord.tp_size > 1;
  const int64_t rows = config.train.micro_batch * (m.seq_len / coord.cp_size);
  if (sequence_parallel && rows % coord.tp_size != 0)
    throw Error(config.source + ": parallel.sequence_parallel = true needs train.micro_batch * "
                "model.seq_len" + std::string(coord.cp_size > 1 ? " / parallel.context" : "") +
                " (" + std::to_string(rows) + ") divisible by parallel.tensor (" +
                std::to_string(coord.tp_size) + ")");
  const auto counts = stage_split(m, coord.pp_size, par.pipeline_layers, par.pipeline_balance);
  const auto [layer_begin, layer_end] = stage_layer_range(counts, coord.pp_rank);
  ModelShard shard;
  shard.tp_rank = coord.tp_rank;
  shard.tp_size = coord.tp_size;
  shard.layer_begin = layer_begin;
  shard.layer_end = layer_end;
  shard.has_embedding = coord.pp_rank == 0;
  shard.has_head = coord.pp_rank == coord.pp_size - 1;
  shard.sequence_parallel = sequence_parallel;
  shard.recompute = parse_recompute(config.train.recompute);
  shard.zero_stage = static_cast<int>(config.optim.zero_stage);
  shard.lm_head_chunk_rows = config.train.lm_head_chunk_rows;
  shard.tp_overlap = par.tp_overlap;
  shard.ep_rank = coord.ep_rank;
  shard.ep_size = coord.ep_size;
  shard.cp_rank = coord.cp_rank;
  shard.cp_size = coord.cp_size;
  if (config.data.document_mask) shard.document_eod = static_cast<int32_t>(config.data.eod_id);
  shard.deterministic = config.train.deterministic;
  shard.attention_kernel = config.train.attention_kernel;
  shard.fused_bias_gelu = config.train.fused_bias_gelu;
  shard.fp8 = fp8_settings(config.train);
  // Interleaved: the stage's model chunks (virtual stages) in place of one range.
  if (par.schedule == "interleaved")
    shard.chunks = stage_layer_chunks(m.layers, coord.pp_size,
                                      static_cast<int>(par.virtual_stages), coord.pp_rank);
  return shard;
}

}  // namespace trident

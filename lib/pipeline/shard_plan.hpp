#pragma once
// The part of the model one rank holds, planned from the config and the rank's place in the
// grid alone: the trainer builds its model shard from it, and tests check it without ranks.
#include "config/config.hpp"
#include "model/architecture.hpp"

namespace trident {

// A rank's coordinates in the dimensions that cut the model.
struct ShardCoord {
  int tp_rank = 0, tp_size = 1;  // tensor parallelism
  int pp_rank = 0, pp_size = 1;  // pipeline stage
  int ep_rank = 0, ep_size = 1;  // expert parallelism
  int cp_rank = 0, cp_size = 1;  // context parallelism
};

// Pure: the shard of the model `config` describes that the rank at `coord` holds. Its layers
// are pipeline stage pp_rank's (pipeline/stage_split.hpp: parallel.pipeline_layers or
// parallel.pipeline_balance; the interleaved schedule's chunks of parallel.virtual_stages); the
// first stage holds the embedding, the last the head; tensor and expert shards from the
// coordinates; sequence parallelism (parallel.sequence_parallel, with tensor parallelism only),
// train.recompute, train.lm_head_chunk_rows and parallel.tp_overlap from the config. Throws
// trident::Error naming config.source when sequence parallelism cannot cut a micro-batch's
// rows (train.micro_batch * model.seq_len / parallel.context) evenly over the tensor ranks, and as
// stage_layer_counts / stage_layer_chunks do for a layer split that does not fit.
ModelShard plan_model_shard(const Config& config, const ShardCoord& coord);

}  // namespace trident

#pragma once
// The process grid. rank = ((dp * PP + pp) * CP + cp) * TP + tp: tensor ranks are fastest (a
// tensor group is contiguous and sits inside a node), then context ranks (CP = 1 until context
// parallelism comes), pipeline ranks cross nodes, data replicas on top. The pure part
// (coordinates, group membership, layout validation) is separate from the MPI part
// (communicators) so it can be unit-tested without MPI. The groups themselves, one named entry
// per dimension, are grid/parallel_dims.hpp's table.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"

namespace trident {

struct GridShape {
  int tp = 1, pp = 1, dp = 1;
  // Expert parallelism (parallel.expert): EP ranks taken from inside the data-parallel
  // dimension (expert_group below); not a fourth factor of the world size. Divides dp.
  int ep = 1;
  // Context parallelism: the sequence split over CP ranks. 1 until it is built (no config key
  // yet); carried so that the rank order and the groups already have their place for it.
  int cp = 1;
  int world() const { return tp * cp * pp * dp; }
};

// Where a rank sits among the nodes, as the process grid found them (detected or simulated):
// the one node detection of the job. ParallelDims carries it to the GPU backend, which takes
// the node-local rank from it to choose this rank's GPU.
struct NodePlacement {
  int node = 0, num_nodes = 1;
  int local_rank = 0, local_size = 1;  // rank within the node, ranks on the node
  bool simulated = false;              // parallel.ranks_per_node / TRIDENT_RANKS_PER_NODE
};

struct GridCoord {
  int tp = 0, pp = 0, dp = 0;
  int cp = 0;  // last, so that {tp, pp, dp} still reads as before
  bool operator==(const GridCoord&) const = default;
};

int rank_of(const GridShape& shape, const GridCoord& c);
GridCoord coord_of(const GridShape& shape, int rank);

// Global ranks of each group containing `rank`, in group-rank order.
std::vector<int> tensor_group(const GridShape& shape, int rank);     // same cp, pp, dp
std::vector<int> context_group(const GridShape& shape, int rank);    // same tp, pp, dp
std::vector<int> pipeline_group(const GridShape& shape, int rank);   // same tp, cp, dp
std::vector<int> data_group(const GridShape& shape, int rank);       // same tp, cp, pp
std::vector<int> model_group(const GridShape& shape, int rank);      // same cp, dp (tp x pp)
// The gradient reduction of a replicated parameter: data x context (same tp, pp), group rank
// dp * CP + cp. The data group itself while CP = 1.
std::vector<int> grad_reduce_group(const GridShape& shape, int rank);
// First and last pipeline stage with the same tp, cp, dp (one rank when PP == 1). For a rank of a
// middle stage this is its column's group, which does not contain `rank` (not a member).
std::vector<int> embedding_group(const GridShape& shape, int rank);

// Expert parallelism (parallel.expert = EP, docs/moe.md): the EP ranks of an expert group are
// taken from inside the data-parallel dimension, consecutive data ranks [g*EP, (g+1)*EP) of
// one (tp, pp) column; expert rank = dp % EP holds experts [e*E/EP, (e+1)*E/EP). Tokens cross
// the expert group (all-to-all); an expert's gradient is reduced over the expert-data group,
// the DP/EP ranks of the column with the same expert rank, times their CP context ranks
// (group rank (dp / EP) * CP + cp). Both throw trident::Error naming parallel.expert when EP
// does not divide DP.
std::vector<int> expert_group(const GridShape& shape, int ep, int rank);  // same tp,cp,pp, dp/EP
std::vector<int> expert_data_group(const GridShape& shape, int ep, int rank);  // tp,pp,dp%EP

// The vocabulary size rounded up to a multiple of vocab_multiple * tp (the embedding and the
// output layer hold padded/tp rows per tensor rank). Throws trident::Error if any value is < 1.
int64_t padded_vocab(int64_t vocab_size, int64_t vocab_multiple, int64_t tp);

// Throws trident::Error with a message naming the offending setting when the layout cannot
// run: world size != TP*PP*DP, heads or FFN width not divisible by TP, TP not dividing
// ranks_per_node (a tensor group would cross a node), vocabulary padding impossible, more
// pipeline stages than layers, an expert-parallel degree not dividing DP or the experts.
// ranks_per_node <= 0: the node check is skipped (not known yet).
// The message is one line and depends only on the arguments, so every rank throws the same.
void validate_layout(const GridShape& shape, int world_size, int ranks_per_node,
                     const ModelConfig& model);

}  // namespace trident

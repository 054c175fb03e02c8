#pragma once
// The MPI side of the 3D process grid: node detection, layout validation, one communicator per
// process group, and each rank's share of its machine's cores. Rank layout, group order and
// validation rules: grid/grid.hpp and docs/parallelism.md.
//
// Nodes. ranks_per_node > 0 (the config's parallel.ranks_per_node) or else the environment
// variable TRIDENT_RANKS_PER_NODE (> 0) simulates nodes of that many consecutive world ranks
// (node = world_rank / ranks_per_node), e.g. to test a multi-node layout on one machine.
// Otherwise nodes are detected with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): node ids number
// the shared-memory groups in the order of their lowest world rank.
//
// Construction is collective over `world`. Every layout error (trident::Error) is thrown on
// every rank with the same message, and before any collective that could hang: the checks that
// need only the arguments run before any MPI call, the node checks after one all-gather that
// every rank of `world` joins.
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/mpi_comm.hpp"
#include "config/config.hpp"
#include "grid/core_share.hpp"
#include "grid/grid.hpp"
#include "grid/parallel_dims.hpp"

namespace trident {

class ProcessGrid {
 public:
  // world: usually MPI_COMM_WORLD (duplicated; the grid never communicates on the caller's
  // communicator). ranks_per_node: 0 = TRIDENT_RANKS_PER_NODE if set, else detect.
  ProcessGrid(MPI_Comm world, const GridShape& shape, int ranks_per_node,
              const ModelConfig& model);
  // Shape and ranks_per_node from config.parallel, validated against config.model.
  ProcessGrid(MPI_Comm world, const Config& config);
  ~ProcessGrid();
  ProcessGrid(const ProcessGrid&) = delete;
  ProcessGrid& operator=(const ProcessGrid&) = delete;

  int rank() const { return rank_; }              // world rank
  int world_size() const { return shape_.world(); }
  const GridShape& shape() const { return shape_; }
  const GridCoord& coord() const { return coord_; }
  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == shape_.pp - 1; }

  int node() const { return node_; }              // 0 .. num_nodes()-1
  int num_nodes() const { return num_nodes_; }
  int local_rank() const { return local_rank_; }  // rank within the node
  int ranks_per_node() const { return ranks_per_node_; }  // ranks on this rank's node
  bool nodes_simulated() const { return simulated_; }
  NodePlacement placement() const {
    return {node_, num_nodes_, local_rank_, ranks_per_node_, simulated_};
  }
  const std::string& host() const;                // MPI_Get_processor_name of this rank
  // This rank's share of its machine's cores (grid/core_share.hpp): the physical cores of its
  // affinity mask over the ranks of the machine whose masks hold any of them. Its threads are
  // the default of train.threads.
  const CoreShare& core_share() const { return core_share_; }

  // This rank's table of parallel dimensions (grid/parallel_dims.hpp): every group's size, index,
  // ranks and communicator, the MPI world and the node placement. The communicators are the
  // grid's: a copy of the table is valid while the grid lives.
  const ParallelDims& dims() const { return dims_; }

  // Group communicators; group rank order = grid.hpp's *_group() order.
  Communicator& world() { return *world_; }       // all ranks
  // The MPI communicator behind world() (the grid's duplicate of the caller's), for what
  // needs MPI itself: collective parallel-HDF5 checkpoint I/O and the GPU selection.
  MPI_Comm world_mpi() const { return world_->comm(); }
  Communicator& tensor() { return *dims_.tensor().host; }      // rank = tp
  Communicator& pipeline() { return *dims_.pipeline().host; }  // rank = pp
  Communicator& data() { return *dims_.data().host; }          // rank = dp
  Communicator& model() { return *dims_.model().host; }        // rank = pp * TP + tp
  // First and last stage of this rank's (tp, dp) column (tied embedding gradients): rank 0 =
  // first stage, 1 = last stage; a one-rank group when PP == 1. nullptr on a middle stage,
  // which is not a member.
  Communicator* embedding() { return dims_.embedding().host; }
  bool in_embedding_group() const { return dims_.embedding().host != nullptr; }
  // Expert parallelism (shape().ep > 1; grid.hpp): the expert group (rank = dp % EP: the
  // expert rank) and the expert-data group (same tp, pp, dp % EP; rank = dp / EP). nullptr
  // when EP = 1.
  Communicator* expert() { return dims_.expert().host; }
  Communicator* expert_data() { return dims_.expert_data().host; }

  // Every communicator of the table once, in table order (world, tensor, pipeline, data, model,
  // embedding when a member, expert and expert_data when EP > 1).
  std::vector<Communicator*> communicators() { return dims_.host_communicators(); }
  std::vector<const Communicator*> communicators() const;
  void reset_stats();

  // The rank map gathered at construction ("rank -> node, host, local rank, tp, pp, dp"), one
  // line per rank after a header line. Not collective: rank 0 prints it at start.
  std::string describe() const;
  // This rank's communication counters: one line per group and operation used
  // (calls, MB = 10^6 bytes, seconds). Not collective.
  std::string stats_table() const;

 private:
  struct RankInfo;
  void init(MPI_Comm world, const GridShape& shape, int ranks_per_node,
            const ModelConfig& model);

  GridShape shape_;
  GridCoord coord_;
  int rank_ = 0;
  int node_ = 0, num_nodes_ = 1, local_rank_ = 0, ranks_per_node_ = 1;
  bool simulated_ = false;
  CoreShare core_share_;
  std::string node_source_;            // how the nodes were found (for describe())
  std::vector<int> node_of_;           // world rank -> node id
  std::vector<int> local_of_;          // world rank -> rank within node
  std::vector<std::string> host_of_;   // world rank -> processor name
  ParallelDims dims_;
  // The communicators the table points to, in table order (freed in reverse, world last).
  std::vector<std::unique_ptr<Communicator>> owned_;
  MpiCommunicator* world_ = nullptr;  // owned_[0]
};

// A table of the counters of `comms` (one line per group and operation with calls > 0:
// group, op, calls, MB, seconds). Used by ProcessGrid::stats_table() at the end of a run.
std::string format_comm_stats(const std::vector<const Communicator*>& comms);

}  // namespace trident

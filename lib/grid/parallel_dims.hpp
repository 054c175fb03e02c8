#pragma once
// The table of parallel dimensions: every group a rank communicates in is one named entry, with
// its size, this rank's index in it, its world ranks, its host communicator and (once a device
// backend is built) the communicator of its device buffers. Whatever goes over all groups (the
// communication table, the straggler report's timing, the watchdog, timeline traces, the device
// communicators of the GPU backend, teardown) iterates this table instead of naming groups.
//
// A new dimension is one row of dim_specs() (parallel_dims.cpp), its membership rule in
// membership() (from the pure group functions of grid/grid.hpp) and its coordinate in
// GridShape/GridCoord; the rest follows from the table.
//
// Table order is the order of communicators(), of the communication table's lines, and of the
// device communicators' creation (NCCL initialisation is collective over each group, so every
// rank must create them in the same order); communicators are freed in the reverse order.
#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "grid/grid.hpp"

namespace trident {

// In table order. World is the whole job; Model (tensor x pipeline: the gradient norm's sum),
// Embedding (first and last stage: the tied embedding), ExpertData (the replicas of an expert)
// and GradReduce (data x context: a replicated gradient's reduction) are derived from the others.
enum class Dim : uint8_t {
  World,
  Tensor,
  Context,
  Pipeline,
  Data,
  Model,
  Embedding,
  Expert,
  ExpertData,
  GradReduce,
};
inline constexpr size_t kDimCount = 10;
constexpr size_t dim_index(Dim d) { return static_cast<size_t>(d); }

// What device buffers cross a group: none (host scalars only), collectives, or sends and
// receives only (the GPU backend makes its NCCL communicator accordingly).
enum class DeviceUse : uint8_t { None, Collectives, PointToPoint };

struct DimSpec {
  Dim dim;
  const char* name;     // the communicator's name: communication table, watchdog, traces
  const char* setting;  // the config key of its size; "" for a derived group
  DeviceUse device;
  // Must not cross a node (its traffic is every layer's): checked once the nodes are known.
  bool inside_node;
};

// Every dimension, in table order.
const std::array<DimSpec, kDimCount>& dim_specs();
const DimSpec& dim_spec(Dim d);
// The dimension named `name`, nullptr when there is none.
const DimSpec* find_dim(const std::string& name);
// "world, tensor, ...": the names, for messages.
std::string dim_names();

// Where `rank` stands in dimension `d` of a grid of `shape` (pure, no MPI).
struct DimMembership {
  std::vector<int> ranks;  // world ranks of the group, in group-rank order
  int index = 0;           // this rank's place in `ranks`; -1: not a member (middle stage)
  // Whether the group gets a communicator at this shape: expert groups only for EP > 1,
  // context groups only for CP > 1 (size, index and ranks hold either way).
  bool formed = true;
  // The earlier dimension whose communicator this one is, where both have the same ranks by
  // construction (grad_reduce = data while CP = 1); `d` itself otherwise.
  Dim shares = Dim::World;
};
DimMembership membership(const GridShape& shape, Dim d, int rank);

// Throws trident::Error (one line, the same on every rank) when a group of a dimension that
// must stay inside a node (DimSpec::inside_node) spans two nodes. node_of, host_of: per world
// rank.
void check_inside_nodes(const GridShape& shape, const std::vector<int>& node_of,
                        const std::vector<std::string>& host_of);

// One entry of a rank's table.
struct DimGroup {
  Dim dim = Dim::World;
  const char* name = "";
  int size = 1;
  int index = 0;           // -1: not a member
  std::vector<int> ranks;  // world ranks, group-rank order
  bool formed = true;      // has a communicator at this shape (DimMembership::formed)
  Communicator* host = nullptr;    // nullptr: not a member, or not formed at this shape
  Communicator* device = nullptr;  // device buffers (ParallelDims::set_device); else nullptr
  // The earlier entry whose communicators these are (DimMembership::shares); dim: its own.
  Dim shares = Dim::World;
  bool member() const { return index >= 0; }
  bool shared() const { return shares != dim; }
};

// Per dimension (dim_index), the communicator of its device buffers; nullptr where none.
using DeviceComms = std::array<Communicator*, kDimCount>;

// A rank's table. A value: copied into whoever uses the groups; the communicators are owned by
// the process grid (or SelfGroups) and the device backend, which outlive the copies.
class ParallelDims {
 public:
  // The memberships of `rank` in a grid of `shape`; no communicator yet.
  ParallelDims(const GridShape& shape, int rank);
  ParallelDims() : ParallelDims(GridShape{}, 0) {}

  const GridShape& shape() const { return shape_; }
  DimGroup& operator[](Dim d) { return groups_[dim_index(d)]; }
  const DimGroup& operator[](Dim d) const { return groups_[dim_index(d)]; }
  auto begin() { return groups_.begin(); }
  auto end() { return groups_.end(); }
  auto begin() const { return groups_.begin(); }
  auto end() const { return groups_.end(); }

  const DimGroup& world() const { return (*this)[Dim::World]; }
  const DimGroup& tensor() const { return (*this)[Dim::Tensor]; }
  const DimGroup& context() const { return (*this)[Dim::Context]; }
  const DimGroup& pipeline() const { return (*this)[Dim::Pipeline]; }
  const DimGroup& data() const { return (*this)[Dim::Data]; }
  const DimGroup& model() const { return (*this)[Dim::Model]; }
  const DimGroup& embedding() const { return (*this)[Dim::Embedding]; }
  const DimGroup& expert() const { return (*this)[Dim::Expert]; }
  const DimGroup& expert_data() const { return (*this)[Dim::ExpertData]; }
  const DimGroup& grad_reduce() const { return (*this)[Dim::GradReduce]; }

  // Every host communicator of the table once (shared entries skipped), in table order.
  std::vector<Communicator*> host_communicators() const;
  // Every device communicator once that is not also a host one (the CPU backend's are the
  // groups' own), in table order.
  std::vector<Communicator*> device_communicators() const;
  // The device backend's communicators into the entries (a shared entry takes its owner's).
  void set_device(const DeviceComms& comms);

  // The job's ranks as MPI sees them, for collective checkpoint I/O and the GPU selection.
  MPI_Comm mpi_world = MPI_COMM_SELF;
  // This rank's node and node-local rank, as the grid found them; one node for SelfGroups.
  NodePlacement placement;

 private:
  GridShape shape_;
  std::array<DimGroup, kDimCount> groups_;
};

// The table of a single-rank run (the reference run of parity tests): a self communicator for
// every dimension formed at one rank.
class SelfGroups {
 public:
  SelfGroups();
  ParallelDims groups() const { return dims_; }

 private:
  std::vector<std::unique_ptr<Communicator>> owned_;
  ParallelDims dims_;
};

}  // namespace trident

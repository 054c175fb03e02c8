// The table of parallel dimensions (see parallel_dims.hpp).
#include "grid/parallel_dims.hpp"

#include <algorithm>
#include <sstream>

#include "util/error.hpp"

namespace trident {

namespace {

constexpr std::array<DimSpec, kDimCount> kSpecs = {{
    {Dim::World, "world", "", DeviceUse::None, false},
    {Dim::Tensor, "tensor", "parallel.tensor", DeviceUse::Collectives, true},
    {Dim::Context, "context", "parallel.context", DeviceUse::Collectives, false},
    {Dim::Pipeline, "pipeline", "parallel.pipeline", DeviceUse::PointToPoint, false},
    {Dim::Data, "data", "parallel.data", DeviceUse::Collectives, false},
    {Dim::Model, "model", "", DeviceUse::None, false},
    {Dim::Embedding, "embedding", "", DeviceUse::Collectives, false},
    {Dim::Expert, "expert", "parallel.expert", DeviceUse::Collectives, false},
    {Dim::ExpertData, "expert_data", "", DeviceUse::Collectives, false},
    {Dim::GradReduce, "grad_reduce", "", DeviceUse::Collectives, false},
}};

constexpr bool specs_in_enum_order() {
  for (size_t i = 0; i < kSpecs.size(); ++i)
    if (dim_index(kSpecs[i].dim) != i) return false;
  return true;
}
static_assert(specs_in_enum_order(), "dim_specs() must list the dimensions in Dim's order");

std::vector<int> world_group(const GridShape& shape) {
  std::vector<int> g(static_cast<size_t>(shape.world()));
  for (int r = 0; r < shape.world(); ++r) g[static_cast<size_t>(r)] = r;
  return g;
}

std::vector<int> ranks_of(const GridShape& shape, Dim d, int rank) {
  switch (d) {
    case Dim::World: return world_group(shape);
    case Dim::Tensor: return tensor_group(shape, rank);
    case Dim::Context: return context_group(shape, rank);
    case Dim::Pipeline: return pipeline_group(shape, rank);
    case Dim::Data: return data_group(shape, rank);
    case Dim::Model: return model_group(shape, rank);
    case Dim::Embedding: return embedding_group(shape, rank);
    case Dim::Expert: return expert_group(shape, shape.ep, rank);
    case Dim::ExpertData: return expert_data_group(shape, shape.ep, rank);
    case Dim::GradReduce: return grad_reduce_group(shape, rank);
  }
  throw Error("unknown parallel dimension " + std::to_string(dim_index(d)));
}

}  // namespace

const std::array<DimSpec, kDimCount>& dim_specs() { return kSpecs; }

const DimSpec& dim_spec(Dim d) { return kSpecs[dim_index(d)]; }

const DimSpec* find_dim(const std::string& name) {
  for (const DimSpec& s : kSpecs)
    if (name == s.name) return &s;
  return nullptr;
}

std::string dim_names() {
  std::string out;
  for (const DimSpec& s : kSpecs) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

DimMembership membership(const GridShape& shape, Dim d, int rank) {
  DimMembership m;
  m.ranks = ranks_of(shape, d, rank);
  const auto it = std::find(m.ranks.begin(), m.ranks.end(), rank);
  m.index = it == m.ranks.end() ? -1 : static_cast<int>(it - m.ranks.begin());
  m.formed = !(d == Dim::Expert || d == Dim::ExpertData) || shape.ep > 1;
  if (d == Dim::Context) m.formed = shape.cp > 1;
  m.shares = d == Dim::GradReduce && shape.cp == 1 ? Dim::Data : d;
  return m;
}

void check_inside_nodes(const GridShape& shape, const std::vector<int>& node_of,
                        const std::vector<std::string>& host_of) {
  for (const DimSpec& spec : kSpecs) {
    if (!spec.inside_node) continue;
    for (int r = 0; r < shape.world(); ++r) {
      const std::vector<int> g = ranks_of(shape, spec.dim, r);
      const int first = g.front(), last = g.back();
      if (node_of[r] == node_of[first]) continue;
      std::ostringstream m;
      m << spec.setting << " = " << g.size() << ": the " << spec.name
        << "-parallel group of ranks " << first << "-" << last << " spans node "
        << node_of[first] << " (" << host_of[first] << ") and node " << node_of[r] << " ("
        << host_of[r] << "); a " << spec.name
        << " group must not cross a node (place ranks node by node, each node holding a "
           "multiple of "
        << spec.setting << " ranks)";
      throw Error(m.str());
    }
  }
}

ParallelDims::ParallelDims(const GridShape& shape, int rank) : shape_(shape) {
  for (const DimSpec& spec : kSpecs) {
    DimMembership m = membership(shape, spec.dim, rank);
    DimGroup& g = (*this)[spec.dim];
    g.dim = spec.dim;
    g.name = spec.name;
    g.size = static_cast<int>(m.ranks.size());
    g.index = m.index;
    g.ranks = std::move(m.ranks);
    g.formed = m.formed;
    g.shares = m.shares;
  }
}

std::vector<Communicator*> ParallelDims::host_communicators() const {
  std::vector<Communicator*> out;
  for (const DimGroup& g : groups_)
    if (g.host && !g.shared()) out.push_back(g.host);
  return out;
}

std::vector<Communicator*> ParallelDims::device_communicators() const {
  std::vector<Communicator*> out;
  for (const DimGroup& g : groups_)
    if (g.device && !g.shared() && g.device != g.host) out.push_back(g.device);
  return out;
}

void ParallelDims::set_device(const DeviceComms& comms) {
  for (DimGroup& g : groups_) g.device = comms[dim_index(g.dim)];
}

SelfGroups::SelfGroups() {
  for (DimGroup& g : dims_) {
    if (!g.formed) continue;
    if (g.shared()) {
      g.host = dims_[g.shares].host;
      continue;
    }
    owned_.push_back(make_self_communicator(g.name));
    g.host = owned_.back().get();
  }
}

}  // namespace trident

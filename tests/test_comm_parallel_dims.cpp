// The table of parallel dimensions (grid/parallel_dims.hpp), without MPI: every entry's ranks and
// index are the pure group functions' (grid/grid.hpp), derived groups share or form their
// communicators as documented, the single-rank table has one self communicator per formed
// group, and the node check names the dimension's setting.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "grid/grid.hpp"
#include "grid/parallel_dims.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

std::vector<GridShape> shapes() {
  std::vector<GridShape> v;
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2, 3})
      for (int dp : {1, 2, 4})
        for (int ep : {1, 2})
          if (dp % ep == 0) v.push_back({tp, pp, dp, ep});
  return v;
}

std::vector<int> expected_ranks(const GridShape& s, Dim d, int r) {
  switch (d) {
    case Dim::World: {
      std::vector<int> all(s.world());
      for (int i = 0; i < s.world(); ++i) all[i] = i;
      return all;
    }
    case Dim::Tensor: return tensor_group(s, r);
    case Dim::Context: return context_group(s, r);
    case Dim::Pipeline: return pipeline_group(s, r);
    case Dim::Data: return data_group(s, r);
    case Dim::Model: return model_group(s, r);
    case Dim::Embedding: return embedding_group(s, r);
    case Dim::Expert: return expert_group(s, s.ep, r);
    case Dim::ExpertData: return expert_data_group(s, s.ep, r);
    case Dim::GradReduce: return grad_reduce_group(s, r);
  }
  return {};
}

TEST(ParallelDims, EveryDimensionHasOneNameInTableOrder) {
  std::set<std::string> names;
  size_t i = 0;
  for (const DimSpec& s : dim_specs()) {
    EXPECT_EQ(dim_index(s.dim), i++);
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    ASSERT_NE(find_dim(s.name), nullptr) << s.name;
    EXPECT_EQ(find_dim(s.name)->dim, s.dim);
  }
  EXPECT_EQ(find_dim("nosuch"), nullptr);
  // The communication table's order of today's groups.
  EXPECT_EQ(dim_names(),
            "world, tensor, context, pipeline, data, model, embedding, expert, expert_data, "
            "grad_reduce");
}

TEST(ParallelDims, EntriesAreTheGridsGroups) {
  for (const GridShape& s : shapes()) {
    for (int r = 0; r < s.world(); ++r) {
      const ParallelDims dims(s, r);
      for (const DimGroup& g : dims) {
        SCOPED_TRACE(std::string(g.name) + " of rank " + std::to_string(r) + " in TP=" +
                     std::to_string(s.tp) + " PP=" + std::to_string(s.pp) +
                     " DP=" + std::to_string(s.dp) + " EP=" + std::to_string(s.ep));
        const std::vector<int> want = expected_ranks(s, g.dim, r);
        ASSERT_EQ(g.ranks, want);
        ASSERT_EQ(g.size, static_cast<int>(want.size()));
        const auto it = std::find(want.begin(), want.end(), r);
        ASSERT_EQ(g.index, it == want.end() ? -1 : static_cast<int>(it - want.begin()));
        EXPECT_EQ(g.host, nullptr);  // no communicator before the grid makes them
      }
      // The coordinates the trainer reads from the table.
      const GridCoord c = coord_of(s, r);
      EXPECT_EQ(dims.tensor().index, c.tp);
      EXPECT_EQ(dims.pipeline().index, c.pp);
      EXPECT_EQ(dims.data().index, c.dp);
      EXPECT_EQ(dims.expert().index, c.dp % s.ep);
      EXPECT_EQ(dims.expert().size, s.ep);
      EXPECT_EQ(dims.world().index, r);
      EXPECT_EQ(dims.embedding().member(), c.pp == 0 || c.pp == s.pp - 1);
    }
  }
}

TEST(ParallelDims, DerivedGroupsFormOnlyWhereTheyDiffer) {
  const ParallelDims ep1(GridShape{2, 2, 2}, 5), ep2(GridShape{1, 2, 4, 2}, 3);
  // CP = 1: no context communicator, and the gradient reduction over data x context is the
  // data group's communicator.
  EXPECT_FALSE(ep1.context().formed);
  EXPECT_EQ(ep1.context().size, 1);
  EXPECT_EQ(ep1.grad_reduce().shares, Dim::Data);
  EXPECT_EQ(ep1.grad_reduce().ranks, ep1.data().ranks);
  EXPECT_FALSE(ep1.expert().formed);
  EXPECT_FALSE(ep1.expert_data().formed);
  EXPECT_TRUE(ep2.expert().formed);
  EXPECT_TRUE(ep2.expert_data().formed);
  for (const DimGroup& g : ep2)
    if (g.dim != Dim::GradReduce) EXPECT_FALSE(g.shared()) << g.name;
}

TEST(ParallelDims, ContextRanksSitBetweenTensorAndPipeline) {
  // CP = 2: the rank map, the groups, and validate_layout's chunk rule.
  GridShape s{2, 2, 2};
  s.cp = 2;
  ASSERT_EQ(s.world(), 16);
  for (int r = 0; r < s.world(); ++r) {
    const GridCoord c = coord_of(s, r);
    ASSERT_EQ(r, ((c.dp * s.pp + c.pp) * s.cp + c.cp) * s.tp + c.tp);
    ASSERT_EQ(rank_of(s, c), r);
  }
  EXPECT_EQ(context_group(s, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(tensor_group(s, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(pipeline_group(s, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(data_group(s, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(grad_reduce_group(s, 5), (std::vector<int>{5, 7, 13, 15}));
  // An expert's replicas: the same expert rank (dp % EP) on every context rank.
  EXPECT_EQ(expert_data_group(s, 2, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(expert_data_group(s, 1, 5), (std::vector<int>{5, 7, 13, 15}));
  const ParallelDims dims(s, 7);  // tp 1, cp 1, pp 1, dp 0
  EXPECT_TRUE(dims.context().formed);
  EXPECT_EQ(dims.context().index, 1);
  EXPECT_FALSE(dims.grad_reduce().shared());
  EXPECT_EQ(dims.grad_reduce().index, 0 * 2 + 1);  // dp * CP + cp
  ModelConfig m;
  m.seq_len = 36;  // 2 * CP = 4 chunks of 9
  EXPECT_NO_THROW(validate_layout(s, 16, 0, m));
  m.seq_len = 34;
  EXPECT_THROW(validate_layout(s, 16, 0, m), Error);
  EXPECT_THROW(validate_layout(s, 8, 0, ModelConfig{}), Error);  // TP*CP*PP*DP = 16 ranks
}

TEST(SelfGroups, OneSelfCommunicatorPerFormedGroup) {
  SelfGroups self;
  const ParallelDims dims = self.groups();
  std::vector<std::string> names;
  for (Communicator* c : dims.host_communicators()) {
    names.push_back(c->name());
    EXPECT_EQ(c->size(), 1);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"world", "tensor", "pipeline", "data", "model",
                                             "embedding"}));
  EXPECT_EQ(dims.grad_reduce().host, dims.data().host);
  EXPECT_EQ(dims.expert().host, nullptr);
  EXPECT_EQ(dims.context().host, nullptr);
  EXPECT_EQ(dims.placement.local_size, 1);
}

TEST(ParallelDims, DeviceCommunicatorsAreListedOnceAndNotTheHostOnes) {
  SelfGroups self;
  ParallelDims dims = self.groups();
  auto device_tensor = make_self_communicator("tensor");
  DeviceComms comms{};
  comms[dim_index(Dim::Tensor)] = device_tensor.get();
  comms[dim_index(Dim::Data)] = dims.data().host;  // a CPU backend's: the group's own
  comms[dim_index(Dim::GradReduce)] = dims.data().host;
  dims.set_device(comms);
  EXPECT_EQ(dims.tensor().device, device_tensor.get());
  EXPECT_EQ(dims.device_communicators(), std::vector<Communicator*>{device_tensor.get()});
}

TEST(ParallelDims, NodeCheckNamesTheSettingAndTheRanks) {
  // Four ranks on two nodes placed round-robin: the tensor group 0-1 spans both.
  const GridShape s{2, 1, 2};
  try {
    check_inside_nodes(s, {0, 1, 0, 1}, {"a", "b", "a", "b"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "parallel.tensor = 2: the tensor-parallel group of ranks 0-1 spans node 0 (a) and "
              "node 1 (b); a tensor group must not cross a node (place ranks node by node, each "
              "node holding a multiple of parallel.tensor ranks)");
  }
  EXPECT_NO_THROW(check_inside_nodes(s, {0, 0, 1, 1}, {"a", "a", "b", "b"}));
}

}  // namespace
}  // namespace trident

// ProcessGrid on 8 ranks, TP=2 PP=2 DP=2 on two simulated nodes of 4 ranks. Kept to a handful
// of collectives: on a small machine MPICH busy-polls and one collective at 8 ranks costs tens
// of milliseconds. Membership is checked locally (MPI_Group_translate_ranks), not by messages.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "grid/grid.hpp"
#include "grid/process_grid.hpp"

namespace trident {
namespace {

std::vector<int> members(Communicator& c) {
  auto& m = dynamic_cast<MpiCommunicator&>(c);
  MPI_Group g, w;
  MPI_Comm_group(m.comm(), &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  int n = 0;
  MPI_Group_size(g, &n);
  std::vector<int> in(n), out(n);
  std::iota(in.begin(), in.end(), 0);
  MPI_Group_translate_ranks(g, n, in.data(), w, out.data());
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return out;
}

TEST(Grid8, Grid222OnTwoSimulatedNodes) {
  setenv("TRIDENT_RANKS_PER_NODE", "4", 1);
  const GridShape s{2, 2, 2};
  ProcessGrid grid(MPI_COMM_WORLD, s, 0, ModelConfig{});
  unsetenv("TRIDENT_RANKS_PER_NODE");
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);

  EXPECT_EQ(grid.coord(), coord_of(s, r));
  EXPECT_EQ(grid.node(), r / 4);
  EXPECT_EQ(grid.local_rank(), r % 4);
  EXPECT_EQ(grid.num_nodes(), 2);
  EXPECT_EQ(grid.ranks_per_node(), 4);

  EXPECT_EQ(members(grid.world()).size(), 8u);
  EXPECT_EQ(members(grid.tensor()), tensor_group(s, r));
  EXPECT_EQ(members(grid.pipeline()), pipeline_group(s, r));
  EXPECT_EQ(members(grid.data()), data_group(s, r));
  EXPECT_EQ(members(grid.model()), model_group(s, r));
  ASSERT_TRUE(grid.in_embedding_group());  // PP = 2: every rank is a first or last stage
  EXPECT_EQ(members(*grid.embedding()), embedding_group(s, r));
  EXPECT_EQ(grid.tensor().rank(), grid.coord().tp);
  EXPECT_EQ(grid.pipeline().rank(), grid.coord().pp);
  EXPECT_EQ(grid.data().rank(), grid.coord().dp);
  EXPECT_EQ(grid.model().rank(), grid.coord().pp * 2 + grid.coord().tp);

  // One collective on a group, to see traffic flows inside it: data group {r%4, r%4+4}.
  int64_t x = r;
  grid.data().stats().keep_all_reduce_counts = true;
  grid.data().all_reduce(&x, 1, DType::I64, ReduceOp::Sum);
  EXPECT_EQ(x, 2 * (r % 4) + 4);
  EXPECT_EQ(grid.data().stats().all_reduce_counts, std::vector<int64_t>{1});

  if (r == 0) {
    std::string d = grid.describe();
    EXPECT_NE(d.find("8 ranks on 2 nodes (simulated by TRIDENT_RANKS_PER_NODE)"),
              std::string::npos)
        << d;
  }
}

}  // namespace
}  // namespace trident

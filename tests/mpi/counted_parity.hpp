#pragma once
// check_parity (parity.hpp) that also counts the gradient elements it compared, for any
// schedule: every gradient after step 1 and 20 losses within 1e-5 relative of the single-rank
// run, and every element of the global model compared at least once per layout group (a
// comparison of nothing fails). Used by the interleaved and ZB-H1 parity tests.
#include <gtest/gtest.h>
#include <mpi.h>

#include "parity.hpp"

namespace trident::test {

inline void check_counted_parity(const ParityLayout& l, std::vector<std::string> extra,
                                 ParityData data = ParityData::Shards) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const auto dir = shared_corpus("parity_counted");
  const Config config = parity_config(dir, l, extra, data);
  const Reference ref = reference_run(config, kParitySteps);
  double worst_grad = 0.0, worst_loss = 0.0;
  int64_t compared = 0;
  std::string worst_name;
  on_layout(config, [&](Trainer& t, ProcessGrid& grid) {
    ASSERT_EQ(t.model().chunk_count(), config.parallel.virtual_stages);
    for (int64_t s = 0; s < kParitySteps; ++s) {
      const double loss = t.forward_backward(s);
      if (s == 0) worst_grad = worst_grad_error(t, ref, grid, &worst_name, &compared);
      t.apply_update(s, loss);
      worst_loss = std::max(worst_loss, std::abs(loss - ref.losses[s]) / std::abs(ref.losses[s]));
    }
  });
  EXPECT_LE(worst_grad, 1e-5) << l.name() << ": " << worst_name;
  EXPECT_LE(worst_loss, 1e-5) << l.name();
  worst_grad = max_over_world(worst_grad);
  worst_loss = max_over_world(worst_loss);
  // Every element of the global model (vocabulary padding excluded) is compared at least once
  // per layout group (replicated tensors once per tensor rank, data-parallel replicas and the
  // tied embedding's two copies each).
  int64_t global = 0;
  for (const ParamInfo& p : global_parameters(config.model)) {
    int64_t n = 1;
    for (const int64_t d : p.global_shape) n *= d;
    global += n;
  }
  int64_t all = compared;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  const int64_t groups = world_size / config.parallel.world_size();
  EXPECT_GE(all / groups, global);
  const std::string schedule =
      config.parallel.schedule + (config.parallel.virtual_stages > 1
                                      ? " v=" + std::to_string(config.parallel.virtual_stages)
                                      : "");
  if (world_rank == 0)
    std::printf("[ measured ] %s %s%s on %s: %lld gradient elements compared "
                "(%lld global), worst relative error after step 1 %.3e; %lld losses worst "
                "relative error %.3e (final loss %.6f)\n",
                schedule.c_str(), l.name().c_str(),
                config.parallel.sequence_parallel ? " SP" : "", data_name(data),
                static_cast<long long>(all / groups), static_cast<long long>(global), worst_grad,
                static_cast<long long>(kParitySteps), worst_loss, ref.losses.back());
}

}  // namespace trident::test

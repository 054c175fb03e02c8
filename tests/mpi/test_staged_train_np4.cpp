// The GPU's MPI path (parallel.comm = "mpi": device buffers staged through host memory by
// comm/staged_comm.hpp) driven by the real trainer on the CPU: the CPU model's tensor,
// pipeline, data and embedding communicators are replaced by staged communicators over the
// host device, so every activation, gradient and weight message takes the staged path the GPU
// ranks take (posting, copy-back on wait/test, ZeRO-1 reduce-scatter and all-gather, the
// data-parallel overlap hook). Staging only copies, so the losses must equal the plain MPI
// run's bit for bit, on TP2xPP2, PP2xDP2 with ZeRO-1 and TP2xDP2, and for the Llama
// architecture with sequence parallelism on TP2xPP2 and TP2xDP2 with ZeRO-1, and a mixture of
// experts on TP2xPP2 and with expert parallelism (EP 2 of DP 4, ZeRO-1); ZeRO-3 on PP2xDP2 and
// ZeRO-2 with Llama's sequence parallelism on TP2xDP2.
// The device is a strict tracking device (tests/host_device.hpp), and the groups of one rank
// get device self communicators, as on a GPU: any host memory handed to a communicator, or
// copied as if it were device memory, fails the test as a GPU would refuse it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "comm/staged_comm.hpp"
#include "host_device.hpp"
#include "parity.hpp"

using namespace trident;
using namespace trident::test;

namespace {

// What the GPU backend (cuda/cuda_backend.cpp, parallel.comm = "mpi") builds, over a strict
// tracking device instead of a GPU.
Backend staged_cpu_backend(const Config& config, const ParallelDims& groups,
                           const ModelShard& shard) {
  Backend b;
  b.device = std::make_unique<testing_support::TrackingDevice>(/*strict=*/true);
  make_device_comms(config, groups, b, [&](Communicator& group, DeviceUse) {
    b.owned.push_back(make_device_communicator(group, *b.device));
    return b.owned.back().get();
  });
  b.model = make_cpu_stage_model(config.model, shard, *b.comm(Dim::Tensor), *b.device);
  return b;
}

std::vector<double> losses_on(const Config& config, bool staged, int64_t steps) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::vector<double> losses;
  {
    ProcessGrid grid(MPI_COMM_WORLD, config);
    const ParallelDims& groups = grid.dims();
    Trainer t = staged ? Trainer(config, groups, staged_cpu_backend) : Trainer(config, groups);
    for (int64_t s = 0; s < steps; ++s) losses.push_back(t.train_step(s).loss);
    if (staged) {
      // The staged communicators carried the traffic.
      int64_t calls = 0;
      for (const auto& c : t.device_communicators())
        for (const auto& [op, st] : c->stats().ops) calls += st.calls;
      EXPECT_GT(calls, 0);
    }
  }
  return losses;
}

void check(const std::string& label, std::vector<std::string> layout) {
  const auto dir = shared_corpus("staged_train");
  std::vector<std::string> overrides = {"train.steps=5", "eval.interval=0", "model.layers=4",
                                        "model.vocab_size=250", "log.dir=" + (dir / "run").string()};
  overrides.insert(overrides.end(), layout.begin(), layout.end());
  const Config config = parse_config(tiny_config(dir), "staged.toml", overrides);
  const auto plain = losses_on(config, false, 5);
  const auto staged = losses_on(config, true, 5);
  ASSERT_EQ(plain.size(), staged.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_EQ(plain[i], staged[i]) << label << " step " << i + 1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("[ measured ] %s staged vs MPI: step-5 loss %.17g vs %.17g\n", label.c_str(),
                staged.back(), plain.back());
}

TEST(StagedTrain, TensorAndPipelineMatchMpiBitwise) {
  check("TP2xPP2", {"parallel.tensor=2", "parallel.pipeline=2"});
}

TEST(StagedTrain, PipelineAndZeroDataParallelMatchMpiBitwise) {
  check("PP2xDP2 ZeRO-1", {"parallel.pipeline=2", "parallel.data=2", "optim.zero_stage=1"});
}

TEST(StagedTrain, TensorAndDataParallelMatchMpiBitwise) {
  check("TP2xDP2", {"parallel.tensor=2", "parallel.data=2", "parallel.dp_bucket_mb=0.01"});
}

const std::vector<std::string> kLlama = {"model.arch=llama", "model.heads=8", "model.kv_heads=4",
                                         "model.ffn_width=64", "parallel.sequence_parallel=true"};

std::vector<std::string> llama(std::vector<std::string> layout) {
  layout.insert(layout.end(), kLlama.begin(), kLlama.end());
  return layout;
}

TEST(StagedTrain, LlamaSequenceParallelTensorAndPipelineMatchMpiBitwise) {
  check("llama SP TP2xPP2", llama({"parallel.tensor=2", "parallel.pipeline=2"}));
}

TEST(StagedTrain, LlamaSequenceParallelTensorAndZeroDataParallelMatchMpiBitwise) {
  check("llama SP TP2xDP2 ZeRO-1",
        llama({"parallel.tensor=2", "parallel.data=2", "optim.zero_stage=1"}));
}

// A mixture of experts (every layer, 4 experts, top-2, dropping): the gate weights' gradient
// all-reduce over the tensor group and the MoE statistics take the staged path too.
TEST(StagedTrain, MoeTensorAndPipelineMatchMpiBitwise) {
  check("MoE TP2xPP2", {"parallel.tensor=2", "parallel.pipeline=2", "model.moe_experts=4",
                        "model.moe_top_k=2", "model.moe_capacity_factor=1.25"});
}

// Expert parallelism: the token all-to-alls and the experts' reduce-scatter and all-gather over
// the expert-data group take the staged path as the GPU's MPI path does.
TEST(StagedTrain, MoeExpertParallelZeroMatchesMpiBitwise) {
  check("MoE EP2 of DP4 ZeRO-1", {"parallel.data=4", "parallel.expert=2", "optim.zero_stage=1",
                                  "model.moe_experts=4", "model.moe_top_k=2",
                                  "model.moe_capacity_factor=1.25"});
}

// ZeRO-3's gathers of weight units (non-blocking, into slots) and ZeRO-2/3's reduce-scatters of
// gradient windows take the staged path too.
TEST(StagedTrain, Zero3PipelineDataParallelMatchesMpiBitwise) {
  check("PP2xDP2 ZeRO-3", {"parallel.pipeline=2", "parallel.data=2", "optim.zero_stage=3"});
}
TEST(StagedTrain, LlamaSequenceParallelZero2MatchesMpiBitwise) {
  check("llama SP TP2xDP2 ZeRO-2",
        llama({"parallel.tensor=2", "parallel.data=2", "optim.zero_stage=2"}));
}

}  // namespace

// The pipeline executor on one stage (self communicators, the CPU model): ZB-H1's split
// backward against 1F1B's whole one, and the schedule it does not run. The multi-stage runs are
// in tests/mpi/test_parity_zb_np4.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "kernel_vectors.hpp"
#include "model/stage_model.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/schedule.hpp"
#include "util/error.hpp"

using namespace trident;
using trident::test::token_sequence;

namespace {

// test_model_transformer.cpp's llama: grouped-query attention, an untied (deferred) head.
ModelConfig tiny_llama() {
  ModelConfig m;
  m.arch = "llama";
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.width = 16;
  m.ffn_width = 12;
  m.vocab_size = 11;
  m.vocab_multiple = 4;
  m.seq_len = 5;
  m.tie_embeddings = false;
  m.rope_theta = 100.0;
  return m;
}


}  // namespace

// The executor on one stage: ZB-H1 (F, BI, W per micro-batch) gives 1F1B's losses and gradients
// to the bit, holding schedule_peak_bound micro-batches at once; the interleaved schedule on a
// model of one chunk is refused with a line naming parallel.virtual_stages.
TEST(PipelineExecutorOneStage, ZeroBubbleMatchesOneFOneBAndOneChunkInterleavedIsRefused) {
  const ModelConfig m = tiny_llama();
  auto tensor = make_self_communicator("tensor"), pipe = make_self_communicator("pipeline");
  auto device = make_cpu_device();
  const int64_t B = 2, M = 4, N = B * m.seq_len;
  const PipelineExecutor::LoadFn load = [&](int64_t micro, int32_t* tokens, int32_t* targets) {
    const auto t = token_sequence(N, m.vocab_size, micro), g = token_sequence(N, m.vocab_size, micro + 5);
    std::copy(t.begin(), t.end(), tokens);
    std::copy(g.begin(), g.end(), targets);
  };
  std::map<ScheduleKind, std::vector<float>> grads;
  std::map<ScheduleKind, double> losses;
  for (const ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1}) {
    auto model = make_cpu_stage_model(m, ModelShard::whole(m), *tensor, *device);
    model->init_weights(3);
    model->zero_grads();
    PipelineExecutor executor(*model, *pipe, kind, B);
    losses[kind] = executor.train(M, load);
    grads[kind].assign(model->grads(), model->grads() + model->flat_size());
    EXPECT_EQ(executor.stats().peak_in_flight, schedule_peak_bound(kind, 0, 1, M))
        << to_string(kind);
  }
  const auto& a = grads[ScheduleKind::OneFOneB];
  const auto& b = grads[ScheduleKind::ZeroBubbleH1];
  ASSERT_EQ(a.size(), b.size());
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differing;
  EXPECT_EQ(differing, 0) << "of " << a.size() << " gradients";
  EXPECT_GT(losses[ScheduleKind::OneFOneB], 0.0);
  EXPECT_EQ(losses[ScheduleKind::OneFOneB], losses[ScheduleKind::ZeroBubbleH1]);

  // The interleaved schedule needs a model of several chunks and two or more stages: one
  // chunk on one stage is refused by the schedule's own check, naming the key.
  auto model = make_cpu_stage_model(m, ModelShard::whole(m), *tensor, *device);
  try {
    PipelineExecutor executor(*model, *pipe, ScheduleKind::Interleaved, B);
    ADD_FAILURE() << "the interleaved schedule was accepted on one chunk";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.virtual_stages = 1"), std::string::npos)
        << e.what();
  }
}

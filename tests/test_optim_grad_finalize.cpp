// Gradient finalisation (lib/optim/grad_finalize.hpp): which gradients the model-parallel sums
// touch, the global norm (counted parameters only, summed over the model-parallel group) and
// the clipping factor. One process: a two-rank group is played by a communicator whose peer
// holds the same values (a sum doubles them).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "optim/grad_finalize.hpp"
#include "tensor/device.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

class MirrorComm final : public Communicator {
 public:
  MirrorComm() : Communicator("mirror") {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce(void* data, int64_t n, DType type, ReduceOp op) override {
    ASSERT_EQ(op, ReduceOp::Sum);
    reduced.push_back(n);
    for (int64_t i = 0; i < n; ++i) {
      if (type == DType::F32) static_cast<float*>(data)[i] *= 2;
      if (type == DType::F64) static_cast<double*>(data)[i] *= 2;
    }
  }
  std::unique_ptr<CommRequest> iall_reduce(void*, int64_t, DType, ReduceOp) override {
    ADD_FAILURE() << "not used";
    return nullptr;
  }
  void all_gather(const void*, void*, int64_t, DType) override { ADD_FAILURE(); }
  void reduce_scatter(const void*, void*, int64_t, DType) override { ADD_FAILURE(); }
  void broadcast(void*, int64_t, DType, int) override { ADD_FAILURE(); }
  std::unique_ptr<CommRequest> isend(const void*, int64_t, DType, int, int) override {
    ADD_FAILURE();
    return nullptr;
  }
  std::unique_ptr<CommRequest> irecv(void*, int64_t, DType, int, int) override {
    ADD_FAILURE();
    return nullptr;
  }
  void barrier() override { ADD_FAILURE(); }

  std::vector<int64_t> reduced;  // the element count of each all-reduce
};

ParamInfo param(const std::string& name, int64_t n, int64_t offset) {
  ParamInfo p;
  p.name = name;
  p.global_shape = p.local_shape = {n};
  p.offset = offset;
  return p;
}

// [embedding.token.weight: 4][ln.weight: 2, partial under sequence parallelism][fc.weight: 3]
std::vector<ParamInfo> three_params() {
  std::vector<ParamInfo> params = {param("embedding.token.weight", 4, 0),
                                   param("ln.weight", 2, 4), param("fc.weight", 3, 6)};
  params[1].tensor_partial_grad = true;
  return params;
}

}  // namespace

TEST(GradFinalize, SumsThePartialNormsOverTensorAndTheTiedEmbeddingOverItsGroup) {
  const std::vector<ParamInfo> params = three_params();
  MirrorComm tensor, embedding;
  std::vector<float> grads(9, 1.0f);
  sum_split_gradients(params, grads.data(), {&tensor, &embedding});
  EXPECT_EQ(grads, (std::vector<float>{2, 2, 2, 2, 2, 2, 1, 1, 1}));
  EXPECT_EQ(tensor.reduced, (std::vector<int64_t>{2}));
  EXPECT_EQ(embedding.reduced, (std::vector<int64_t>{4}));

  // Not tied across stages: the embedding's gradient is this rank's alone.
  std::vector<float> untied(9, 1.0f);
  sum_split_gradients(params, untied.data(), {&tensor, nullptr});
  EXPECT_EQ(untied, (std::vector<float>{1, 1, 1, 1, 2, 2, 1, 1, 1}));
}

TEST(GradFinalize, AnEmbeddingGroupWithoutTheEmbeddingIsAnError) {
  std::vector<ParamInfo> params = three_params();
  params.erase(params.begin());
  MirrorComm tensor, embedding;
  std::vector<float> grads(9, 1.0f);
  EXPECT_THROW(sum_split_gradients(params, grads.data(), {&tensor, &embedding}), Error);
}

TEST(GradFinalize, GlobalNormCountsEachParameterOnceOverTheModelParallelGroup) {
  std::vector<ParamInfo> params = {param("a", 2, 0), param("b", 1, 2)};
  params[1].counted_in_norm = false;  // a copy another rank counts
  const std::vector<float> grads = {3, 4, 100};
  auto device = make_cpu_device();
  auto data = make_self_communicator("data");
  GradientSync sync(params, 3, {data.get()}, 1.0, false, *device);
  MirrorComm model_parallel;  // the other stage's squares: the same 25
  const double norm = global_grad_norm(sync, params, grads.data(), {data.get()}, model_parallel);
  EXPECT_DOUBLE_EQ(norm, std::sqrt(50.0));
  EXPECT_EQ(model_parallel.reduced, (std::vector<int64_t>{1}));
}

TEST(GradFinalize, ClipScaleShrinksOnlyNormsAboveTheLimit) {
  EXPECT_EQ(clip_scale(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_scale(1.0, 1.0), 1.0) << "at the limit: untouched";
  EXPECT_DOUBLE_EQ(clip_scale(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_scale(4.0, 0.0), 1.0) << "optim.grad_clip = 0: no clipping";
}

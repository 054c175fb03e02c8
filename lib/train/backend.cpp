#include "train/backend.hpp"

#include "train/trainer.hpp"
#include "util/error.hpp"

#ifdef TRIDENT_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace trident {

Backend make_backend(const Config& config, const TrainerGroups& groups,
                     const ModelShard& shard) {
  if (config.train.device == "cuda") {
#ifdef TRIDENT_HAVE_CUDA
    return make_cuda_backend(config, groups, shard);
#else
    throw Error(config.source + ": train.device = \"cuda\", but this trident was built without "
                "CUDA (nvcc was not found when it was configured; see docs/gpu.md)");
#endif
  }
  if (config.train.precision != "fp32")
    throw Error(config.source + ": train.precision = \"" + config.train.precision +
                "\" needs train.device = \"cuda\"; the CPU backend computes in fp32");
  Backend b;
  b.device = make_cpu_device();
  b.tensor = groups.tensor;
  b.pipeline = groups.pipeline;
  b.data = groups.data;
  b.embedding = groups.embedding;
  b.expert = groups.expert;
  b.expert_data = groups.expert_data;
  b.model = make_cpu_stage_model(config.model, shard, *groups.tensor, *b.device);
  return b;
}

}  // namespace trident

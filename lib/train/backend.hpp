#pragma once
// The device a rank computes on, its model shard there, and the communicators that carry that
// device's buffers. The trainer talks to host-memory communicators (TrainerGroups) for scalars
// (losses, norms, stop flags) and to these for weights, gradients and activations.
//
//   train.device = "cpu":  host memory, the CPU transformer; the device communicators ARE the groups'.
//   train.device = "cuda": one GPU (lib/cuda), fp32 or bf16 compute; NCCL communicators
//                          (parallel.comm = "nccl") or the groups' MPI communicators staged
//                          through host memory (parallel.comm = "mpi").
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_watch.hpp"
#include "config/config.hpp"
#include "model/stage_model.hpp"
#include "tensor/device.hpp"

namespace trident {

struct TrainerGroups;

struct Backend {
  std::unique_ptr<Device> device;
  // Communicators for device buffers; embedding is nullptr where the groups' is.
  Communicator* tensor = nullptr;
  Communicator* pipeline = nullptr;
  Communicator* data = nullptr;
  Communicator* embedding = nullptr;
  Communicator* expert = nullptr;       // expert parallelism only (grid/grid.hpp)
  Communicator* expert_data = nullptr;
  std::vector<std::unique_ptr<Communicator>> owned;  // those not borrowed from the groups
  std::unique_ptr<StageModel> model;
  // GPU runs: the communicators whose work the device's stream carries (comm/comm_watch.hpp),
  // shared with the device, its memory and the NCCL communicators; nullptr on the CPU.
  std::shared_ptr<CommWatch> watch;

  // Teardown, in this order: while an exception unwinds, the communicators are aborted FIRST
  // (a kernel of theirs may wait for a peer that is gone, and freeing device memory or
  // synchronising would wait for it); then the model (device memory), the communicators, and
  // the device they all use. Device memory held elsewhere (the trainer's optimizer and
  // gradient buffers, destroyed before the backend) is freed through the same watch, which
  // aborts before the first free.
  ~Backend() { release(); }
  Backend() = default;
  Backend(Backend&&) = default;
  Backend& operator=(Backend&& other) {
    release();
    device = std::move(other.device);
    tensor = other.tensor;
    pipeline = other.pipeline;
    data = other.data;
    embedding = other.embedding;
    expert = other.expert;
    expert_data = other.expert_data;
    owned = std::move(other.owned);
    model = std::move(other.model);
    watch = std::move(other.watch);
    return *this;
  }

 private:
  void release() {
    if (watch) watch->before_teardown();
    model.reset();
    owned.clear();
    device.reset();
  }
};

// Builds the backend train.device and train.precision name; throws trident::Error (naming the
// key and config.source) for a combination this build or machine cannot run.
Backend make_backend(const Config& config, const TrainerGroups& groups, const ModelShard& shard);

#ifdef TRIDENT_HAVE_CUDA
// The C function `symbol` of the GPU module (<dir of the executable>/../lib/libtrident_cuda.so,
// cuda/cuda_backend.hpp), loaded on first use and kept; a module that is missing, lacks the
// symbol or was built from other sources is one Error line beginning with `who`.
void* cuda_module_function(const std::string& who, const char* symbol);
#endif

}  // namespace trident

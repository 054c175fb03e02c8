#pragma once
// The device a rank computes on, its model shard there, and the communicators that carry that
// device's buffers, one per dimension of the table (grid/parallel_dims.hpp). The trainer talks
// to the table's host communicators for scalars (losses, norms, stop flags) and to these for
// weights, gradients and activations.
//
// lib/runtime/ sits between the grid, the model and the GPU module (lib/cuda) below, and the
// trainer above: what the GPU module and the trainer both need of a rank's device (this header)
// lives here, so that nothing below lib/train/ includes it.
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
#include "grid/parallel_dims.hpp"
#include "model/stage_model.hpp"
#include "tensor/device.hpp"

namespace trident {

struct Backend {
  std::unique_ptr<Device> device;
  // Per dimension, the communicator of its device buffers (carries_device_buffers), nullptr
  // where the table has none; ParallelDims::set_device hands them to the table.
  DeviceComms comms{};
  std::vector<std::unique_ptr<Communicator>> owned;  // those not borrowed from the groups
  std::unique_ptr<StageModel> model;
  // GPU runs: the communicators whose work the device's stream carries (comm/comm_watch.hpp),
  // shared with the device, its memory and the NCCL communicators; nullptr on the CPU.
  std::shared_ptr<CommWatch> watch;

  Communicator* comm(Dim d) const { return comms[dim_index(d)]; }

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
    comms = other.comms;
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

// Whether dimension `d` carries device buffers under `config`: its DeviceUse, and for the
// embedding group a tied embedding (untied, it is idle).
inline bool carries_device_buffers(Dim d, const Config& config) {
  if (dim_spec(d).device == DeviceUse::None) return false;
  return d != Dim::Embedding || config.model.tie_embeddings;
}

// Fills backend.comms from the table: `make(group, use)` gives the device communicator of a
// group that carries device buffers and has a communicator, in table order (the same on every
// rank: NCCL's initialisation is collective over each group); a shared entry takes its owner's.
template <typename Make>
void make_device_comms(const Config& config, const ParallelDims& dims, Backend& backend,
                       Make make) {
  for (const DimGroup& g : dims) {
    Communicator*& c = backend.comms[dim_index(g.dim)];
    if (g.shared())
      c = backend.comms[dim_index(g.shares)];
    else if (g.host && carries_device_buffers(g.dim, config))
      c = make(*g.host, dim_spec(g.dim).device);
  }
}

// Builds the backend train.device and train.precision name; throws trident::Error (naming the
// key and config.source) for a combination this build or machine cannot run.
Backend make_backend(const Config& config, const ParallelDims& dims, const ModelShard& shard);

// train.precision = "bf16" on the CPU: whether train.cpu_bf16_gemm, resolved on this core,
// runs the linear layers' products through oneDNN's bf16 matmul (else fp32 FMAs on the bf16
// values); throws trident::Error naming the key where "onednn" cannot run here.
bool cpu_bf16_uses_onednn(const Config& config);
// The same choice in words, for the start-up line: what multiplies, and what the core has.
std::string cpu_bf16_gemm_text(const Config& config);

// train.cpu_bf16_gemm = "auto" decided by the ranks of `comm` together (collective: every rank
// calls it), so that one engine computes the whole job's products, whatever each core measured:
// the config as given where every rank's choice is the same, else with "fma" (the engine every
// core runs) and `note` saying so; any other config unchanged, with no communication.
Config agree_cpu_bf16_gemm(const Config& config, MPI_Comm comm, std::string* note);

#ifdef TRIDENT_HAVE_CUDA
// The C function `symbol` of the GPU module (<dir of the executable>/../lib/libtrident_cuda.so,
// cuda/cuda_backend.hpp), loaded on first use and kept; a module that is missing, lacks the
// symbol or was built from other sources is one Error line beginning with `who`.
void* cuda_module_function(const std::string& who, const char* symbol);
#endif

}  // namespace trident

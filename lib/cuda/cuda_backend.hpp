#pragma once
// train.device = "cuda": picks this rank's GPU, builds the device communicators and the model.
// Built into the module libtrident_cuda.so (lib/cuda/plugin/cuda_plugin.cpp), which
// make_backend (lib/runtime/backend.cpp) loads on demand; the GPU tests link it directly.
#include <cstdint>

#include "config/config.hpp"
#include "cuda/cuda_bench_hw.hpp"
#include "grid/parallel_dims.hpp"
#include "runtime/backend.hpp"

namespace trident {

// The GPU is the rank's index within its node (ParallelDims::placement, the grid's) modulo the
// visible devices; with parallel.comm = "nccl" every rank of a node needs a GPU of its own.
// Communicators, for every group of the table that carries device buffers
// (carries_device_buffers): parallel.comm = "nccl": one NCCL communicator per group of more
// than one rank (the unique id broadcast over the group's MPI communicator); "mpi": the group's
// MPI communicator, staged through host memory. Groups of one rank need no communication at all.
Backend make_cuda_backend(const Config& config, const ParallelDims& dims,
                          const ModelShard& shard);

// The module's file name and its two C symbols. It is looked up beside the executable's
// directory: <dir of the executable>/../lib/libtrident_cuda.so (build/app/trident and
// build/tests/* find build/lib/; an installed bin/trident finds lib/).
inline constexpr const char* kCudaModuleFile = "libtrident_cuda.so";
inline constexpr const char* kCudaModuleLayoutSymbol = "trident_cuda_backend_layout";
inline constexpr const char* kCudaModuleMakeSymbol = "trident_make_cuda_backend";
using CudaModuleLayoutFn = uint64_t (*)();
using CudaModuleMakeFn = void (*)(const Config&, const ParallelDims&, const ModelShard&,
                                  Backend&);

// The sizes of the types that cross into the module (bench-hw's GpuBenchResult too), packed: a
// module built from other sources than the executable that loads it is refused in one line
// instead of misreading them.
inline uint64_t backend_layout_tag() {
  return (uint64_t{sizeof(GpuBenchResult)} << 52) ^ (uint64_t{sizeof(Config)} << 40) ^
         (uint64_t{sizeof(ModelConfig)} << 28) ^ (uint64_t{sizeof(ParallelDims)} << 16) ^
         (uint64_t{sizeof(ModelShard)} << 8) ^ uint64_t{sizeof(Backend)};
}

}  // namespace trident

// libtrident_cuda.so: the GPU backend (lib/cuda, lib/kernels/cuda, cuBLAS, NCCL) as a module
// that lib/runtime/backend.cpp loads with dlopen when, and only when, train.device = "cuda". A CPU
// run never maps the CUDA libraries (libcublasLt alone is ~150 MB of resident memory at load),
// and a machine without them runs the CPU backend. The module carries its own copy of the
// trident code the backend uses (static libraries, symbols kept local by --exclude-libs):
// nothing in that code is process-wide state, and what the backend needs of the job comes in
// through its arguments (ParallelDims::placement, not an MPI attribute of a copy's own).
#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_bench_hw.hpp"
#include "runtime/backend.hpp"

extern "C" {

__attribute__((visibility("default"))) uint64_t trident_cuda_backend_layout() {
  return trident::backend_layout_tag();
}

__attribute__((visibility("default"))) void trident_make_cuda_backend(
    const trident::Config& config, const trident::ParallelDims& dims,
    const trident::ModelShard& shard, trident::Backend& out) {
  out = trident::make_cuda_backend(config, dims, shard);
}

// trident bench-hw --device cuda (app/cmd_bench_hw.cpp).
__attribute__((visibility("default"))) void trident_cuda_bench_hw(MPI_Comm comm,
                                                                  trident::GpuBenchResult& out) {
  trident::measure_gpu(comm, out);
}

}  // extern "C"

#pragma once
// `trident bench-hw --device cuda` (app/cmd_bench_hw.cpp): what the GPU module measures on each
// rank's GPU, for the hardware file of `trident plan` (docs/plan.md). Plain types only: the
// struct crosses from libtrident_cuda.so into trident, which links no CUDA library. Every rate
// is the best of its repetitions, the slowest rank's.
#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/hardware.hpp"

namespace trident {

struct GpuBenchResult {
  std::string device;                    // cuda::device_summary() of rank 0's GPU
  std::vector<MeasuredGemm> bf16, fp32;  // cubes n x n x n: the trainer's GEMM (cuBLASLt)
  // As the CPU measures them (app/cmd_bench_hw.cpp), bf16: a linear layer's training GEMMs
  // (cuda::linear_forward and linear_backward) over volumes, the fused attention's forward and
  // backward over (T, head size), and the optimizer pass (CudaDevice) over parameter counts.
  std::vector<MeasuredGemm> training;
  // The same step by rows x in x out (DeviceSpec::gemm_efficiency_shapes): [rows, in, out,
  // GFLOP/s].
  std::vector<std::array<double, 4>> shapes;
  std::vector<MeasuredAttention> attention;
  std::vector<MeasuredOptimizer> optimizer;
  double bandwidth = 0;        // bytes/s: the trainer's bf16 GELU forward + backward, per GPU
  double memory_bytes = 0;     // the GPU's memory (cudaMemGetInfo total)
  double reserved_bytes = 0;   // taken before the trainer allocates: context, cuBLAS workspace
  // bytes/s: the trainer's device-to-host copy (CudaDevice::to_host) into pinned memory
  // (allocate_host), as a checkpoint stages the rank's state: device.host_link_gbs.
  double host_link = 0;
  // NCCL between the ranks' GPUs, when there are 2 or more ranks and each has a GPU of its own:
  // (message bytes, best seconds of the slowest rank) per operation; empty otherwise, with
  // links_note saying why.
  std::vector<double> message_bytes, send_recv, all_reduce, all_gather, reduce_scatter;
  std::string links_note;
};

// Collective over `comm`: every rank measures its GPU (the node-local rank's, modulo the
// visible devices) and joins the NCCL timings; throws Error (one line) without a GPU.
void measure_gpu(MPI_Comm comm, GpuBenchResult& out);

inline constexpr const char* kCudaModuleBenchSymbol = "trident_cuda_bench_hw";
using CudaModuleBenchFn = void (*)(MPI_Comm, GpuBenchResult&);

}  // namespace trident

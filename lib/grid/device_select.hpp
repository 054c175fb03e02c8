#pragma once
// Which GPU a rank uses, decided by the identity of the GPUs, not by counting them.
//
// 1. Choice (select_device, local to a rank). A rank uses, among the GPUs visible to it
//    (whatever CUDA_VISIBLE_DEVICES, srun --gpus-per-task / --gpu-bind or the launcher left
//    it), the one of index node_local_rank % visible. One GPU visible (one GPU per task): that
//    GPU. All of a node's GPUs visible to all its ranks: one each while there are enough.
//    The node-local rank is the process grid's (grid/process_grid.hpp: detected, or simulated
//    with parallel.ranks_per_node / TRIDENT_RANKS_PER_NODE); nothing detects nodes again.
// 2. Check (check_gpu_sharing, on what every rank reports). The ranks all-gather the identity of
//    the GPU each chose: its UUID (cudaDeviceProp::uuid, "GPU-xxxxxxxx-..."; globally unique,
//    so ranks of different nodes never compare equal), or its PCI bus id qualified by the host
//    where no UUID is available. Two ranks with the same identity share a GPU:
//      parallel.comm = "mpi":  allowed (device buffers are staged through host memory);
//      parallel.comm = "nccl": refused, on every rank with the same one-line message naming
//                              the ranks, their host and the GPU (NCCL cannot put two ranks of
//                              one communicator on one GPU).
//    Ranks of one GPU each are fine under both, however many GPUs each rank can see.
//
// Every function here is pure (unit-tested in tests/test_comm_grid.cpp without MPI or a GPU);
// lib/cuda/cuda_backend.cpp does the all-gather.
#include <cstdint>
#include <string>
#include <vector>

namespace trident {

// The index among the `visible` GPUs of the rank `local_rank` of `local_size` ranks on its node:
// local_rank % visible. Throws trident::Error when visible is 0 ("no CUDA device visible to this
// rank ...") and for arguments out of range (local_rank not in [0, local_size), negative
// visible).
int select_device(int local_rank, int local_size, int visible);

// What one rank reports about the GPU it chose.
struct GpuClaim {
  std::string host;  // where the rank runs (MPI_Get_processor_name), for messages and PCI ids
  std::string uuid;  // "GPU-..." (format_gpu_uuid); "" when the device has none
  std::string pci;   // "0000:17:00.0" (cudaDeviceGetPCIBusId)
  int ordinal = 0;   // its index among the GPUs visible to the rank
  int visible = 0;   // how many GPUs the rank sees
};

// The identity two ranks compare: the UUID, else "<host>/pci:<bus id>".
std::string gpu_identity(const GpuClaim& claim);

// "GPU-1a2b3c4d-...-..." (nvidia-smi's form) from the 16 bytes of cudaDeviceProp::uuid; ""
// when all 16 are zero (no UUID).
std::string format_gpu_uuid(const unsigned char bytes[16]);

// The sharing found in the claims of every rank (index = world rank).
struct GpuSharing {
  int gpus = 0;                           // distinct GPUs in the job
  int max_ranks_per_gpu = 0;              // 1: every rank has a GPU of its own
  std::vector<std::vector<int>> sharers;  // per rank: the ranks on its GPU (itself included)
  // "own GPU" or "shared by ranks 0, 1 (parallel.comm = \"mpi\": staged through host memory)"
  std::string describe(int rank) const;
};

// Groups the ranks by GPU identity. nccl (parallel.comm = "nccl"): throws trident::Error when
// two ranks claim one GPU, e.g.
//   parallel.comm = "nccl": ranks 0 and 2 (host a) both use GPU GPU-1a2b...: NCCL needs a GPU of
//   its own for every rank; bind one GPU per rank (srun --gpus-per-task=1, --gpu-bind or
//   CUDA_VISIBLE_DEVICES; docs/gpu.md) or use parallel.comm = "mpi" to share GPUs
// (one line, the same on every rank; further shared GPUs are counted, not listed).
// Throws for an empty list or a claim with no identity at all.
GpuSharing check_gpu_sharing(const std::vector<GpuClaim>& claims, bool nccl);

}  // namespace trident

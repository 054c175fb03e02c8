#include "cuda/cuda_backend.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/comm_watch.hpp"
#include "comm/staged_comm.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/nccl_comm.hpp"
#include "grid/device_select.hpp"
#include "grid/grid.hpp"
#include "grid/parallel_dims.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("GPU selection: ") + call + " failed: " + std::string(text, len));
}

// What a rank sends in the GPU all-gather (fixed size).
struct ClaimRecord {
  int32_t ok;       // 0: this rank could not choose a GPU (its error is thrown on every rank)
  int32_t ordinal;
  int32_t visible;
  char uuid[48];
  char pci[32];
  char host[MPI_MAX_PROCESSOR_NAME];
  char error[512];  // why it could not (ok = 0)
};

void copy_text(char* dst, size_t size, const std::string& src) {
  std::memset(dst, 0, size);
  std::memcpy(dst, src.data(), std::min(size - 1, src.size()));
}

// The GPU of this rank: chosen from the node-local rank (the grid's), then checked against the
// GPUs every other rank chose (one all-gather over `world`), and for `needs_fp8` that it has FP8
// tensor cores. The same error on every rank.
struct Choice {
  int ordinal = 0;
  std::string identity;  // "GPU-..., own GPU"
};

Choice choose_gpu(MPI_Comm world, const NodePlacement& place, bool nccl, bool needs_fp8) {
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(world, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(world, &size), "MPI_Comm_size");
  ClaimRecord mine{};
  int visible = 0;
  if (!cuda::device_available() || cudaGetDeviceCount(&visible) != cudaSuccess) {
    cudaGetLastError();
    visible = 0;
  }
  try {
    mine.ordinal = select_device(place.local_rank, place.local_size, visible);
    mine.visible = visible;
    cudaDeviceProp prop{};
    char pci[32] = {0};
    if (cudaGetDeviceProperties(&prop, mine.ordinal) != cudaSuccess ||
        cudaDeviceGetPCIBusId(pci, sizeof pci, mine.ordinal) != cudaSuccess) {
      cudaGetLastError();
      throw Error("cannot read the properties of CUDA device " + std::to_string(mine.ordinal));
    }
    // FP8 tensor cores: compute capability 8.9 (Ada) and later (Hopper 9.0, ...).
    if (needs_fp8 && prop.major * 10 + prop.minor < 89)
      throw Error("train.precision = \"fp8\" needs FP8 tensor cores (compute capability 8.9 "
                  "or later), but CUDA device " + std::to_string(mine.ordinal) + " (" +
                  prop.name + ") is " + std::to_string(prop.major) + "." +
                  std::to_string(prop.minor) + " (use train.precision = \"bf16\")");
    copy_text(mine.uuid, sizeof mine.uuid,
              format_gpu_uuid(reinterpret_cast<const unsigned char*>(prop.uuid.bytes)));
    copy_text(mine.pci, sizeof mine.pci, pci);
    mine.ok = 1;
  } catch (const Error& e) {
    copy_text(mine.error, sizeof mine.error, e.what());  // sent to every rank
    mine.ok = 0;
  }
  int len = 0;
  MPI_Get_processor_name(mine.host, &len);
  mine.host[std::min(len, MPI_MAX_PROCESSOR_NAME - 1)] = '\0';

  std::vector<ClaimRecord> all(size);
  check_mpi(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, world),
            "MPI_Allgather");
  // The first failing rank's reason, on every rank (rank 0 prints it and ends the job).
  for (int r = 0; r < size; ++r) {
    if (!all[r].ok) {
      all[r].error[sizeof all[r].error - 1] = '\0';
      throw Error("rank " + std::to_string(r) + " (host " + all[r].host + "): " + all[r].error);
    }
  }
  std::vector<GpuClaim> claims(size);
  for (int r = 0; r < size; ++r)
    claims[r] = {all[r].host, all[r].uuid, all[r].pci, all[r].ordinal, all[r].visible};
  const GpuSharing sharing = check_gpu_sharing(claims, nccl);
  return {mine.ordinal, gpu_identity(claims[rank]) + ", " + sharing.describe(rank)};
}

}  // namespace

Backend make_cuda_backend(const Config& config, const ParallelDims& dims,
                          const ModelShard& shard) {
  const bool nccl = config.parallel.comm == "nccl";
  Choice gpu_choice;
  try {
    gpu_choice = choose_gpu(dims.mpi_world, dims.placement, nccl,
                            config.train.precision == "fp8");
  } catch (const Error& e) {
    throw Error(config.source + ": train.device = \"cuda\": " + e.what());
  }

  Backend b;
  // The communicators whose work the device's stream carries: its waits are bounded by them.
  b.watch = std::make_shared<CommWatch>(dims.world().host->rank(),
                                        comm_timeout_seconds(config.parallel.comm_timeout_s));
  auto device = std::make_unique<CudaDevice>(gpu_choice.ordinal, b.watch);
  CudaDevice& gpu = *device;
  gpu.set_identity(gpu_choice.identity);
  b.device = std::move(device);
  // NCCL for a group of several ranks under parallel.comm = "nccl"; else staged, or a device
  // self communicator for a group of one rank (the decoder all-gathers its logits at TP 1 too).
  // In table order on every rank: NCCL's initialisation is collective over each group. Only
  // what is used is created: the pipeline group only sends and receives (its channels, no
  // communicator for collectives); the others only run collectives; the embedding group of an
  // untied embedding is idle (carries_device_buffers).
  make_device_comms(config, dims, b, [&](Communicator& group, DeviceUse use) {
    const NcclUse nccl_use =
        use == DeviceUse::PointToPoint ? NcclUse::PointToPoint : NcclUse::Collectives;
    std::unique_ptr<Communicator> c =
        nccl && group.size() > 1
            ? make_nccl_communicator(group, group.name(), gpu.stream(), nccl_use, b.watch)
            : make_device_communicator(group, gpu);
    b.owned.push_back(std::move(c));
    return b.owned.back().get();
  });
  b.model = make_cuda_stage_model(config.model, shard, *b.comm(Dim::Tensor), gpu,
                                  config.train.bf16_activations());
  return b;
}

}  // namespace trident

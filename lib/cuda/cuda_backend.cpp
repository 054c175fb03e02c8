#include "cuda/cuda_backend.hpp"

#include "comm/mpi_comm.hpp"
#include "comm/staged_comm.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/nccl_comm.hpp"
#include "grid/device_select.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

MPI_Comm mpi_comm_of(Communicator& group) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&group);
  if (mpi == nullptr)
    throw Error("communicator '" + group.name() + "' is not an MPI communicator; NCCL needs one "
                "to exchange its unique id");
  return mpi->comm();
}

}  // namespace

Backend make_cuda_backend(const Config& config, const TrainerGroups& groups,
                          const ModelShard& shard) {
  const bool nccl = config.parallel.comm == "nccl";
  int devices = 0;
  if (!cuda::device_available() || cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  int local_size = 1;
  const int local_rank = node_local_rank(groups.mpi_world, &local_size);
  int ordinal = 0;
  try {
    ordinal = select_device(local_rank, local_size, devices, nccl);
  } catch (const Error& e) {
    throw Error(config.source + ": train.device = \"cuda\": " + e.what());
  }

  Backend b;
  auto device = std::make_unique<CudaDevice>(ordinal);
  CudaDevice& gpu = *device;
  b.device = std::move(device);
  // A group of one rank keeps the groups' own communicator: the model only all-reduces over
  // it, which is the identity there and touches no memory.
  auto for_device = [&](Communicator* group, bool point_to_point) -> Communicator* {
    if (group == nullptr || group->size() == 1) return group;
    std::unique_ptr<Communicator> c =
        nccl ? make_nccl_communicator(mpi_comm_of(*group), group->name(), gpu.stream(),
                                      point_to_point)
             : make_staged_communicator(*group, gpu, group->name());
    b.owned.push_back(std::move(c));
    return b.owned.back().get();
  };
  // The same order on every rank: NCCL's initialisation is collective over each group.
  b.tensor = for_device(groups.tensor, false);
  b.pipeline = for_device(groups.pipeline, true);  // the only group with messages
  b.data = for_device(groups.data, false);
  // The embedding group sums the gradient of a tied embedding's two copies; untied, it is idle.
  b.embedding = config.model.tie_embeddings ? for_device(groups.embedding, false) : nullptr;
  b.model = make_cuda_stage_model(config.model, shard, *b.tensor, gpu,
                                  config.train.precision == "bf16");
  return b;
}

}  // namespace trident

#pragma once
// train.device = "cuda": picks this rank's GPU, builds the device communicators and the model.
#include "config/config.hpp"
#include "train/backend.hpp"

namespace trident {

struct TrainerGroups;

// The GPU is the rank's index within its node (MPI_COMM_TYPE_SHARED) modulo the visible
// devices; with parallel.comm = "nccl" every rank of a node needs a GPU of its own.
// Communicators: parallel.comm = "nccl": one NCCL communicator per group of more than one
// rank (the unique id broadcast over the group's MPI communicator); "mpi": the group's MPI
// communicator, staged through host memory. Groups of one rank need no communication at all.
Backend make_cuda_backend(const Config& config, const TrainerGroups& groups,
                          const ModelShard& shard);

}  // namespace trident

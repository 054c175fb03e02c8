#pragma once
// Which GPU a rank uses. Ranks of a node take the node's GPUs round-robin by node-local rank
// (local_rank % device_count), so with as many ranks as GPUs each rank has its own GPU and with
// more ranks than GPUs they share evenly. Sharing only works with the MPI communication path
// (device buffers staged through the host, comm/staged_comm.hpp): NCCL refuses a communicator
// in which two ranks use the same GPU, so the NCCL path needs one GPU per rank and is refused
// here, before any GPU or NCCL call, with a message that says what to change.
//
// select_device is a pure function (unit-tested without MPI or a GPU); node_local_rank finds
// the node-local rank with MPI.
#include <mpi.h>

namespace trident {

// The CUDA device index for the rank `local_rank` of `local_size` ranks on its node, given the
// node's `device_count` GPUs: local_rank % device_count. one_rank_per_device (the NCCL path)
// additionally requires local_size <= device_count. Throws trident::Error when device_count is
// 0, when one_rank_per_device and local_size > device_count, and for arguments out of range
// (local_rank not in [0, local_size), negative device_count).
int select_device(int local_rank, int local_size, int device_count, bool one_rank_per_device);

// This rank's rank among the ranks of `world` that share its node (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED, ordered by rank in `world`); the number of them in *local_size (when
// local_size is not nullptr). Collective over `world`; throws trident::Error on MPI failure.
int node_local_rank(MPI_Comm world, int* local_size);

}  // namespace trident

// GPU selection (see device_select.hpp).
#include "grid/device_select.hpp"

#include <string>

#include "util/error.hpp"

namespace trident {

int select_device(int local_rank, int local_size, int device_count, bool one_rank_per_device) {
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size) {
    throw Error("select_device: node-local rank " + std::to_string(local_rank) +
                " is not in [0, " + std::to_string(local_size) + ")");
  }
  if (device_count < 0) {
    throw Error("select_device: device count " + std::to_string(device_count) +
                " is negative");
  }
  if (device_count == 0) {
    throw Error("no CUDA device visible to this rank (node-local rank " +
                std::to_string(local_rank) + "): train.device = \"cuda\" needs a GPU; check "
                "CUDA_VISIBLE_DEVICES and the job's GPU allocation");
  }
  if (one_rank_per_device && local_size > device_count) {
    throw Error(std::to_string(local_size) + " ranks on this node but only " +
                std::to_string(device_count) +
                " GPUs: parallel.comm = \"nccl\" needs one GPU per rank; use parallel.comm = "
                "\"mpi\" to share GPUs");
  }
  return local_rank % device_count;
}

int node_local_rank(MPI_Comm world, int* local_size) {
  int rank = 0;
  MPI_Comm shm = MPI_COMM_NULL;
  int rc = MPI_Comm_rank(world, &rank);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm);
  }
  int local = 0, size = 0;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(shm, &local);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(shm, &size);
  if (shm != MPI_COMM_NULL) MPI_Comm_free(&shm);
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw Error("node_local_rank: MPI failed: " + std::string(text, len));
  }
  if (local_size != nullptr) *local_size = size;
  return local;
}

}  // namespace trident

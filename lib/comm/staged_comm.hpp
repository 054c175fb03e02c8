#pragma once
// A Communicator over DEVICE memory that moves every message through host memory and a host
// communicator (MPI). Why: NCCL refuses a communicator in which two ranks use the same GPU, so
// when several ranks share one GPU (more ranks per node than GPUs, parallel.comm = "mpi") the
// GPU trainer's buffers are communicated by copying them to the host, running the MPI
// operation there, and copying the result back.
//
// Every call: Device::to_host (blocking: it returns once all device work queued before it has
// finished, so no extra synchronisation is needed), the same operation on `host` on host
// staging memory, Device::from_host of the result (blocking). Only the bytes an operation
// reads are copied to the host and only the bytes it writes are copied back (a broadcast's
// receivers copy nothing up, its root nothing back). all_to_all_v copies the packed send
// blocks up and the packed receive blocks down (one copy each, none when its total is 0) around
// the host communicator's all_to_all_v.
//
// Staging memory: blocking calls reuse one growing host buffer owned by the communicator (no
// allocation once it has reached the largest message). Non-blocking calls (iall_reduce, isend,
// irecv) allocate a host buffer that their request owns:
//   isend        copies the device data to its buffer when it is posted (the device buffer may
//                be reused as soon as isend returns);
//   irecv,       copy the result to the device buffer exactly once: in wait(), or in the first
//   iall_reduce  test() that reports completion (later wait()/test() calls copy nothing).
// A request destroyed before it completed releases its host operation (MPI frees it, cancelling
// a receive) but deliberately leaks its staging buffer: MPI may still be reading or writing it,
// and this only happens while an error unwinds. Requests must be waited on or destroyed before
// the communicator, which in turn must not outlive `host` or `device`.
//
// Counting (stats(), separate from the host communicator's own counters, which also count):
// the op names and rules of MpiCommunicator (comm/mpi_comm.hpp): calls +1 per call (isend,
// irecv, iall_reduce when posted), bytes += count * dtype size of the count argument, every
// all-reduce appends its count to all_reduce_counts (if kept); seconds = host wall time inside
// the call including the staging copies (non-blocking calls: inside wait(), and inside the
// test() that copies the result back). rank() and size() are the host communicator's. Argument errors
// (negative count, bad peer or root) throw trident::Error naming this communicator before any
// copy or communication, and a rejected call is not counted.
#include <memory>
#include <string>

#include "comm/comm.hpp"
#include "tensor/device.hpp"

namespace trident {

// `host`: a communicator over host memory (usually an MpiCommunicator of the same group);
// `device`: the device whose memory every buffer passed to the returned communicator lives in.
std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, Device& device,
                                                       std::string name);

// What a group of a GPU run gets without NCCL (and a one-rank group with it): a one-rank group
// a device self communicator (comm.hpp: its copies are the device's, its all-reduces touch
// nothing), a larger one the group staged through host memory as above. The group's own
// communicator would hand device pointers to MPI.
std::unique_ptr<Communicator> make_device_communicator(Communicator& group, Device& device);

}  // namespace trident

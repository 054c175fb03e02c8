#pragma once
// The NCCL implementation of Communicator, for the GPU trainer with one GPU per rank
// (parallel.comm = "nccl"). Buffers are DEVICE memory of the current CUDA device. Why NCCL and
// not MPI: collectives run as GPU kernels, ordered on the compute stream with no host round
// trip and no host staging copies. Several ranks sharing a GPU is refused by NCCL; that case
// uses comm/staged_comm.hpp over MPI (grid/device_select.hpp picks the device and refuses it).
//
// Construction (make_nccl_communicator) is collective over `host`, a host communicator of the
// same ranks in the same order (the process grid's MPI group: NCCL bootstraps over whatever
// the group already is, so nothing here reaches for MPI): rank 0 creates the NCCL unique ids
// and broadcasts them over `host` (a failure there is thrown on every rank), then every rank
// joins ncclCommInitRank. The NCCL communicator takes its rank and size from `host`, which
// must outlive it. The current CUDA device must already be this rank's device.
//
// Streams. Every blocking collective (all_reduce, all_gather, reduce_scatter, broadcast) is
// enqueued on `stream`, the caller's compute stream, and returns without waiting: work enqueued
// on `stream` afterwards sees the result, so no host synchronisation is needed; host code that
// reads the result must synchronise `stream` first. all_to_all_v is one NCCL group on `stream`
// over the collectives' communicator: a ncclSend and a ncclRecv per peer with its counts (zero
// counts skipped), this rank's own block a device copy (its send and receive counts must be
// equal). barrier() is a host barrier: it waits for
// `stream` (bounded, see below), then runs `host`'s barrier.
//
// Non-blocking operations (iall_reduce, isend, irecv) run on private streams: each records an
// event on `stream` that its private stream waits for (so it sees everything enqueued before
// the call), and records a completion event on its private stream. Its request's wait() makes
// `stream` wait for that event (cudaStreamWaitEvent: the host never blocks, and work enqueued
// on `stream` after wait() sees the result); test() is cudaEventQuery (and throws if NCCL
// reports an asynchronous error). The buffers must stay valid until the operation has
// completed on the GPU (after wait(), work on `stream` is ordered after it, so stream-ordered
// freeing on `stream` is safe). A request destroyed without wait() leaves its operation to
// complete on its own, with `stream` not ordered after it.
//
// Point-to-point (pipeline). A send on one stream blocks that stream until the peer's matching
// receive runs, so two ranks each sending to the other before receiving on one serialized
// stream deadlock. Messages therefore travel on channels, each its own NCCL communicator and
// stream: one for messages from a lower to a higher rank, one for the other direction; in
// groups of more than 2 ranks each direction is split again by the parity of the lower rank
// of the pair (4 channels), so that a rank's receive from its lower neighbour and its send to
// its upper neighbour never wait for each other either (in a pipeline every pair of adjacent
// stages then has channels of its own, in each direction). Within one channel operations run
// in the order they are posted, and messages between two ranks in one direction are matched in
// posting order: TAGS ARE NOT USED FOR MATCHING (NCCL has none), so both sides must post their
// messages of one direction in the same order. A message to oneself is refused (Error).
// Groups of one rank create no channels.
//
// Only the NCCL communicators a group uses are created (NcclUse): Collectives (tensor, data,
// embedding groups: one communicator, no channels; a p2p call throws), PointToPoint (the
// pipeline group: the channels only, no communicator for collectives; a collective throws), or
// Both. NCCL communicators per rank: 1 per collective group of more than one rank, plus 2 (two
// ranks) or 4 channels for the pipeline group.
//
// Counting: the op names and rules of MpiCommunicator (comm/mpi_comm.hpp): calls and bytes
// when a call is posted, all_reduce_counts per all-reduce (if kept); seconds = host time inside
// the call (enqueueing; for non-blocking operations inside wait()), not GPU time.
//
// Errors: argument errors (negative count, bad peer or root) throw trident::Error before
// anything is enqueued; every NCCL failure throws trident::Error naming the communicator, the
// NCCL call and ncclGetErrorString (plus ncclGetLastError's detail); CUDA failures throw
// through CUDA_CHECK. Types: F32, F64, I32, I64, BF16 (ncclBfloat16, reduced by NCCL).
//
// Failure and teardown (comm/comm_watch.hpp). The communicator joins `watch` (the device's): its
// asynchronous errors (ncclCommGetAsyncError on each of its NCCL communicators) are polled by
// every bounded wait of the device, its abort (ncclCommAbort of each) is called on failure, and
// it records each operation posted (for the error message). test() throws (after aborting every
// communicator of the watch) on an asynchronous error; barrier() waits for `stream` bounded.
// Once aborted, every call throws. Destruction: after an abort, or while an exception unwinds
// (a peer may be gone, so waiting could hang), it aborts what is left and never synchronises;
// otherwise it waits for its streams (bounded, no throw) and ncclCommDestroy's its
// communicators. Requests must be waited on or destroyed first. `stream` must outlive the
// communicator.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "comm/comm.hpp"
#include "comm/comm_watch.hpp"

namespace trident {

enum class NcclUse { Collectives, PointToPoint, Both };

// watch nullptr: a watch of its own (rank = the rank in `host`).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, std::string name,
                                                     cudaStream_t stream,
                                                     NcclUse use = NcclUse::Both,
                                                     std::shared_ptr<CommWatch> watch = nullptr);

// The NCCL communicators make_nccl_communicator creates for a group of `size` ranks.
int nccl_handle_count(int size, NcclUse use);

}  // namespace trident

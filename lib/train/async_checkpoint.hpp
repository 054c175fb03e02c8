#pragma once
// Asynchronous checkpoint saves (checkpoint.async; docs/reliability.md, "Asynchronous saves").
//
// A save is started at a step boundary and training goes on. Its content is this rank's
// weights and AdamW moments as they are at that boundary, copied into a host staging buffer
// owned here (kept for the run: a second host copy of the rank's state):
//   * on a GPU at once, by the main thread: one device-to-host copy into pinned memory;
//   * on the CPU by the writer thread, while the main thread runs the next step's forward and
//     backward passes, which read the weights and moments but do not change them; the trainer
//     calls wait_staged() before the optimizer update that would (a stall only when a step is
//     shorter than the copy).
// The writer thread then writes the file exactly as a synchronous save does
// (write_training_checkpoint: same schema, checksums, atomic commit, `latest`), over its own
// duplicate of the world communicator, so that its collectives never meet training's (MPI
// must give MPI_THREAD_MULTIPLE; the start-up checks refuse checkpoint.async otherwise).
//
// At most one save is in flight: start() first waits for the previous one. A failed save
// (disk full, permissions) leaves the directory as before (`latest` names the previous
// checkpoint); every rank's writer ends with the same error (the write's errors are agreed
// collectively), which the trainer takes at a step boundary: failed() on every rank, agreed by
// one all-reduce, then finish() throws it on every rank. HDF5 is used by one thread at a time:
// the trainer calls finish() before it reads a checkpoint.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "train/training_checkpoint.hpp"

namespace trident {

class CommWatchdog;

class AsyncCheckpointer {
 public:
  // Collective over `world`: duplicates it for the writer. `report`: this rank prints the
  // written line and prunes (rank 0).
  AsyncCheckpointer(MPI_Comm world, bool report);
  // Waits for the save in flight (its error, if any, is dropped: the trainer is unwinding or
  // has taken it), then frees the communicator.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // What training waited for one save, in seconds: for the previous save to end (start), for
  // the staging copy (start on a GPU; wait_staged on the CPU).
  struct Stall {
    int64_t step = 0;
    double previous_save = 0, staging = 0;
  };

  // The watchdog (not owned; may be null) that watches each write from now on.
  void set_watchdog(CommWatchdog* watchdog) { watchdog_ = watchdog; }
  // Host staging for `state`'s weights and moments, allocated and touched now (made before
  // training: the memory is had, or refused, at start-up, and the first touch of fresh pages
  // — seconds for gigabytes — does not land in the first save).
  void reserve(const CheckpointedState& state);

  // Starts saving `content` (plan_checkpoint's; its buffers are set here to the staging
  // copy) of `state`: waits for the save in flight, throwing its error (see finish); stages
  // (or has the writer stage) the state; starts the writer. `resumed_from`: the checkpoint
  // pruning keeps.
  void start(CheckpointContent content, const CheckpointedState& state,
             const std::string& resumed_from);
  // Call before anything changes the state the last start() was given: blocks until its copy
  // is complete. The stall of that save when it was still waiting for this (once per save),
  // else nullopt.
  std::optional<Stall> wait_staged();
  // A save started whose write has not ended yet.
  bool in_flight() const {
    return done_.valid() &&
           done_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  }
  // The step of the last save started.
  int64_t step() const { return content_.progress.step; }
  // The save in flight has ended with an error (does not wait).
  bool failed() const;
  // Waits for the save in flight, if any, to end; throws its error (trident::Error, naming the
  // file, the same line on every rank). Returns the seconds waited.
  double finish();

 private:
  using Clock = std::chrono::steady_clock;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool report_ = false;
  CommWatchdog* watchdog_ = nullptr;
  std::shared_ptr<void> staging_;  // weights, exp_avg, exp_avg_sq back to back
  int64_t staging_floats_ = 0;
  CheckpointContent content_;      // of the save in flight
  std::thread thread_;
  std::future<void> staged_;       // ready once the copy is complete
  std::shared_future<std::string> done_;  // the write's error, "" when it committed
  std::optional<Stall> stall_;     // of the save in flight, until wait_staged reports it
};

}  // namespace trident

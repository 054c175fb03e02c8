#pragma once
// The timeline trace (log.trace, docs/pipeline.md "Timeline trace"): what every rank did during
// a few chosen steps, written as one Chrome trace-event JSON file (the "traceEvents" format of
// Perfetto and chrome://tracing) that data_tools/plot_timeline.py draws.
//
// One track per rank (pid = tid = world rank), named with the rank's (tp, pp, dp) coordinates.
// Complete-event slices ("ph": "X", times in microseconds from a common origin: the moment rank
// 0 left a barrier, carried to every rank's clock by measured clock offsets):
//   cat "pipeline"    every operation of the step's schedule (name "F3", "RB0", "W2:1", as
//                     pipeline/schedule.hpp's to_string; args kind, micro, chunk, step);
//   cat "comm"        every call of a communicator (name: the operation, "all_reduce",
//                     "recv", ...; args group, bytes, step), nested in the op that made it;
//   cat "optimizer"   the optimizer step (norm, clipping, update and weight all-gather);
//   cat "checkpoint"  a checkpoint save.
// Only the steps log.trace_steps names are kept in memory; write() gathers every rank's slices
// on world rank 0, which writes the file.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "pipeline/schedule.hpp"

namespace trident {

class TimelineTrace final : public CommRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // Collective over `world` (the common origin: common_origin()). Records steps [first_step,
  // last_step] (1-based). `track_name`: this rank's, e.g. "rank 3 (tp 1, pp 1, dp 0)".
  TimelineTrace(MPI_Comm world, int64_t first_step, int64_t last_step, std::string track_name);
  ~TimelineTrace() override;
  TimelineTrace(const TimelineTrace&) = delete;
  TimelineTrace& operator=(const TimelineTrace&) = delete;

  // Records the calls of `comm` from now until this trace is destroyed (which uninstalls it).
  void install_on(Communicator& comm);
  // The 1-based step about to run: slices are kept while it is in [first, last].
  void set_step(int64_t step);
  bool recording() const { return recording_; }
  int64_t last_step() const { return last_step_; }
  bool written() const { return written_; }

  void add_op(const PipeOp& op, Clock::time_point start, Clock::time_point end);
  void add_slice(const std::string& name, const std::string& category, Clock::time_point start,
                 Clock::time_point end);
  void record(const Communicator& comm, const std::string& op, int64_t bytes,
              Clock::time_point start, Clock::time_point end) override;

  // Collective over the world: stops recording, gathers every rank's slices on rank 0 and
  // writes them to `path` (a temporary file renamed into place). A failed write is an error on
  // every rank (trident::Error naming the path). Later calls do nothing.
  void write(const std::string& path);

 private:
  struct Slice {
    std::string name, category;
    double start_us, length_us;
    std::string args;  // the JSON object's members, without braces
  };
  Clock::time_point common_origin() const;
  void add(std::string name, std::string category, Clock::time_point start, Clock::time_point end,
           std::string args);
  // This rank's metadata events and slices (ordered by start time, the enclosing slice of two
  // that start together first), comma-separated.
  std::string events_text() const;

  MPI_Comm world_;
  int rank_ = 0;
  int64_t first_step_, last_step_;
  std::string track_name_;
  Clock::time_point origin_;
  int64_t step_ = 0;
  bool recording_ = false;
  bool written_ = false;
  std::vector<Slice> slices_;
  std::vector<Communicator*> installed_;
};

}  // namespace trident

#pragma once
// log.trace for a training rank (docs: the timeline trace of log.trace_steps): the recorder of
// timeline_trace.hpp installed on every communicator of the table of dimensions and on the
// pipeline executor, and the file written once the traced steps are over.
#include <cstdint>
#include <memory>

#include "config/config.hpp"
#include "train/timeline_trace.hpp"

namespace trident {

class ParallelDims;
class PipelineExecutor;
class RankLog;

// A trace of steps log.trace_steps on every host and device communicator of `groups` and on
// `executor`'s operations, in a track named after this rank's place in the grid. The trace must
// go before the communicators and the executor do.
std::unique_ptr<TimelineTrace> start_run_trace(const LogConfig& log, const ParallelDims& groups,
                                               PipelineExecutor& executor);
// Collective over the world: writes log.dir/trace.json once the last traced step is done (or the
// run is over, `run_over`) and says so on the logging rank. Nothing without a trace or once the
// file is written.
void finish_run_trace(TimelineTrace* trace, const LogConfig& log, int64_t steps_done,
                      bool run_over, const RankLog& out);

}  // namespace trident

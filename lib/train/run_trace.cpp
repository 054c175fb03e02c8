#include "train/run_trace.hpp"

#include <filesystem>
#include <string>

#include "grid/parallel_dims.hpp"
#include "pipeline/executor.hpp"
#include "util/rank_log.hpp"

namespace trident {

std::unique_ptr<TimelineTrace> start_run_trace(const LogConfig& log, const ParallelDims& groups,
                                               PipelineExecutor& executor) {
  const std::string track = "rank " + std::to_string(groups.world().host->rank()) + " (tp " +
                            std::to_string(groups.tensor().index) + ", pp " +
                            std::to_string(groups.pipeline().index) + ", dp " +
                            std::to_string(groups.data().index) + ")";
  auto trace = std::make_unique<TimelineTrace>(groups.mpi_world, log.trace_steps[0],
                                               log.trace_steps[1], track);
  for (Communicator* comm : groups.host_communicators()) trace->install_on(*comm);
  for (Communicator* comm : groups.device_communicators()) trace->install_on(*comm);
  executor.set_op_observer(
      [recorder = trace.get()](const PipeOp& op, TimelineTrace::Clock::time_point start,
                               TimelineTrace::Clock::time_point end) {
        recorder->add_op(op, start, end);
      });
  return trace;
}

void finish_run_trace(TimelineTrace* trace, const LogConfig& log, int64_t steps_done,
                      bool run_over, const RankLog& out) {
  if (!trace || trace->written() || (steps_done < trace->last_step() && !run_over)) return;
  const std::string path = (std::filesystem::path(log.dir) / "trace.json").string();
  trace->write(path);
  out.print("timeline trace of steps %lld-%lld (those run): %s\n",
            static_cast<long long>(log.trace_steps[0]), static_cast<long long>(log.trace_steps[1]),
            path.c_str());
}

}  // namespace trident

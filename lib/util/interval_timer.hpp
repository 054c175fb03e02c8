#pragma once
// Time measured where the work runs. On a GPU the host enqueues and runs ahead, so host wall
// time around a pipeline wait (which under NCCL only enqueues a stream wait) reads near zero;
// an IntervalTimer marks points on the device's stream instead (CUDA events) and measures the
// time the STREAM took between them.
//
// Device::make_interval_timer (tensor/device.hpp) gives one where the device runs ahead of the
// host (the GPU); the host device gives none and the pipeline executor keeps the host wall
// clock (on the CPU host time is device time).
#include <memory>

namespace trident {

class IntervalTimer {
 public:
  virtual ~IntervalTimer() = default;
  // Marks the start and the end of one interval on the stream (asynchronous; intervals do not
  // nest).
  virtual void begin() = 0;
  virtual void end() = 0;
  // The summed seconds of every interval marked since the last call; waits (bounded, see
  // comm/comm_watch.hpp) until the stream has passed the last mark.
  virtual double take_seconds() = 0;
};

}  // namespace trident

#pragma once
// Time measured where the work runs. On a GPU the host enqueues and runs ahead, so host wall
// time around a pipeline wait (which under NCCL only enqueues a stream wait) reads near zero;
// an IntervalTimer marks points on the device's stream instead (CUDA events) and measures the
// time the STREAM took between them.
//
// A Device that can time its stream also derives from TimedDevice (cuda/cuda_device.hpp); the
// pipeline executor asks for one with dynamic_cast and keeps the host wall clock otherwise (the
// CPU path, where host time is device time).
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

class TimedDevice {
 public:
  virtual ~TimedDevice() = default;
  virtual std::unique_ptr<IntervalTimer> make_interval_timer() = 0;
};

}  // namespace trident

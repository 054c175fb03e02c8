#include "train/async_checkpoint.hpp"

#include <cstring>
#include <exception>

#include "model/stage_model.hpp"
#include "optim/adamw.hpp"
#include "tensor/device.hpp"
#include "util/elapsed.hpp"
#include "util/error.hpp"

namespace trident {

AsyncCheckpointer::AsyncCheckpointer(MPI_Comm world, bool report) : report_(report) {
  MPI_Comm_dup(world, &comm_);
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (thread_.joinable()) thread_.join();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void AsyncCheckpointer::reserve(const CheckpointedState& state) {
  const int64_t floats = checkpoint_buffers(state).total();
  if (floats <= staging_floats_) return;
  const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
  staging_ = state.model.device().allocate_host(bytes);
  std::memset(staging_.get(), 0, static_cast<size_t>(bytes));  // the first touch, now
  staging_floats_ = floats;
}

void AsyncCheckpointer::start(CheckpointContent content, const CheckpointedState& state,
                              const std::string& resumed_from) {
  const auto t0 = Clock::now();
  finish();  // at most one save in flight; throws the previous one's error
  Stall stall;
  stall.step = content.progress.step;
  stall.previous_save = seconds_since(t0);

  const CheckpointBuffers b = checkpoint_buffers(state);
  Device& device = state.model.device();
  reserve(state);
  float* staging = static_cast<float*>(staging_.get());
  content.weights = {staging, static_cast<size_t>(b.size[0])};
  content.exp_avg = {staging + b.size[0], static_cast<size_t>(b.size[1])};
  content.exp_avg_sq = {staging + b.size[0] + b.size[1], static_cast<size_t>(b.size[2])};
  content_ = std::move(content);

  std::promise<void> staged;
  staged_ = staged.get_future();
  std::promise<std::string> done;
  done_ = done.get_future().share();
  const bool copy_now = !device.is_host();
  if (copy_now) {  // a GPU: one device-to-host copy per buffer into pinned memory, now
    const auto c0 = Clock::now();
    float* at = staging;
    for (int i = 0; i < CheckpointBuffers::kCount; ++i) {
      device.to_host(at, b.data[i], b.size[i] * static_cast<int64_t>(sizeof(float)));
      at += b.size[i];
    }
    stall.staging = seconds_since(c0);
    staged.set_value();
  }
  stall_ = stall;
  thread_ = std::thread([this, b, copy_now, resumed_from, staged = std::move(staged),
                         done = std::move(done)]() mutable {
    if (!copy_now) {  // the CPU: the copy runs beside the next step's forward and backward
      float* at = static_cast<float*>(staging_.get());
      for (int i = 0; i < CheckpointBuffers::kCount; ++i) {
        std::memcpy(at, b.data[i], static_cast<size_t>(b.size[i]) * sizeof(float));
        at += b.size[i];
      }
      staged.set_value();
    }
    std::string error;
    try {
      write_training_checkpoint(content_, comm_, report_, resumed_from, watchdog_,
                                ", asynchronous");
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "unknown error";
    }
    done.set_value(error);
  });
}

std::optional<AsyncCheckpointer::Stall> AsyncCheckpointer::wait_staged() {
  if (!stall_) return std::nullopt;
  const auto t0 = Clock::now();
  staged_.wait();
  Stall stall = *stall_;
  stall.staging += seconds_since(t0);
  stall_.reset();
  return stall;
}

bool AsyncCheckpointer::failed() const {
  return done_.valid() && done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
         !done_.get().empty();
}

double AsyncCheckpointer::finish() {
  if (!thread_.joinable()) return 0;
  const auto t0 = Clock::now();
  stall_.reset();
  const std::string error = done_.get();
  thread_.join();
  done_ = {};
  const double waited = seconds_since(t0);
  if (!error.empty())
    throw Error("asynchronous checkpoint save of step " + std::to_string(content_.progress.step) +
                " failed: " + error + " (the previous checkpoint stays 'latest' in " +
                content_.config.checkpoint.dir + ")");
  return waited;
}

}  // namespace trident

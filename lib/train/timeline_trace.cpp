#include "train/timeline_trace.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/ckpt_mpi.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

std::string quoted(const std::string& text) { return nlohmann::json(text).dump(); }

void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw Error(std::string("timeline trace: ") + call + " failed");
}

}  // namespace

TimelineTrace::TimelineTrace(MPI_Comm world, int64_t first_step, int64_t last_step,
                             std::string track_name)
    : world_(world),
      first_step_(first_step),
      last_step_(last_step),
      track_name_(std::move(track_name)) {
  check_mpi(MPI_Comm_rank(world_, &rank_), "MPI_Comm_rank");
  origin_ = common_origin();
}

// The moment rank 0 leaves a barrier, on this rank's clock. A barrier alone is not enough:
// ranks leave it up to milliseconds apart on a loaded machine, and the clocks of two nodes
// differ. So rank 0 measures each rank's clock offset from a few round trips (Cristian's
// method: of kRounds, the shortest round trip bounds the error by half of it) and tells it.
TimelineTrace::Clock::time_point TimelineTrace::common_origin() const {
  constexpr int kRounds = 8, kTag = 7301;
  const auto seconds = [] {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  };
  int size = 1;
  check_mpi(MPI_Comm_size(world_, &size), "MPI_Comm_size");
  check_mpi(MPI_Barrier(world_), "MPI_Barrier");
  double origin = seconds();  // rank 0's; on rank r, rank 0's plus r's offset
  if (rank_ == 0) {
    for (int r = 1; r < size; ++r) {
      double best_trip = 1e300, offset = 0;
      for (int i = 0; i < kRounds; ++i) {
        double theirs = 0;
        const double sent = seconds();
        check_mpi(MPI_Send(&sent, 1, MPI_DOUBLE, r, kTag, world_), "MPI_Send");
        check_mpi(MPI_Recv(&theirs, 1, MPI_DOUBLE, r, kTag, world_, MPI_STATUS_IGNORE), "MPI_Recv");
        const double back = seconds();
        if (back - sent < best_trip) {
          best_trip = back - sent;
          offset = theirs - (sent + back) / 2;  // their clock minus ours
        }
      }
      const double their_origin = origin + offset;
      check_mpi(MPI_Send(&their_origin, 1, MPI_DOUBLE, r, kTag, world_), "MPI_Send");
    }
  } else {
    for (int i = 0; i < kRounds; ++i) {
      double ping = 0;
      check_mpi(MPI_Recv(&ping, 1, MPI_DOUBLE, 0, kTag, world_, MPI_STATUS_IGNORE), "MPI_Recv");
      const double now = seconds();
      check_mpi(MPI_Send(&now, 1, MPI_DOUBLE, 0, kTag, world_), "MPI_Send");
    }
    check_mpi(MPI_Recv(&origin, 1, MPI_DOUBLE, 0, kTag, world_, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(origin)));
}

TimelineTrace::~TimelineTrace() {
  for (Communicator* comm : installed_) comm->set_recorder(nullptr);
}

void TimelineTrace::install_on(Communicator& comm) {
  if (std::find(installed_.begin(), installed_.end(), &comm) != installed_.end()) return;
  comm.set_recorder(this);
  installed_.push_back(&comm);
}

void TimelineTrace::set_step(int64_t step) {
  step_ = step;
  recording_ = !written_ && step >= first_step_ && step <= last_step_;
}

void TimelineTrace::add(std::string name, std::string category, Clock::time_point start,
                        Clock::time_point end, std::string args) {
  if (!recording_) return;
  const auto us = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  };
  if (!args.empty()) args += ",";
  args += "\"step\":" + std::to_string(step_);
  slices_.push_back({std::move(name), std::move(category), us(start),
                     std::max(0.0, us(end) - us(start)), std::move(args)});
}

void TimelineTrace::add_op(const PipeOp& op, Clock::time_point start, Clock::time_point end) {
  add(to_string(op), "pipeline", start, end,
      std::string("\"kind\":\"") + to_string(op.kind) +
          "\",\"micro\":" + std::to_string(op.micro) + ",\"chunk\":" + std::to_string(op.chunk));
}

void TimelineTrace::add_slice(const std::string& name, const std::string& category,
                              Clock::time_point start, Clock::time_point end) {
  add(name, category, start, end, "");
}

void TimelineTrace::record(const Communicator& comm, const std::string& op, int64_t bytes,
                           Clock::time_point start, Clock::time_point end) {
  add(op, "comm", start, end,
      "\"group\":" + quoted(comm.name()) + ",\"bytes\":" + std::to_string(bytes));
}

std::string TimelineTrace::events_text() const {
  std::vector<const Slice*> order;
  for (const Slice& s : slices_) order.push_back(&s);
  // By start; of two that start together the longer (the enclosing one) first, so that every
  // track's events are monotone and properly nested.
  std::stable_sort(order.begin(), order.end(), [](const Slice* a, const Slice* b) {
    if (a->start_us != b->start_us) return a->start_us < b->start_us;
    return a->length_us > b->length_us;
  });
  const std::string id = "\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(rank_);
  std::string out;
  for (const char* what : {"process_name", "thread_name"})
    out += "{\"ph\":\"M\",\"name\":\"" + std::string(what) + "\"," + id +
           ",\"args\":{\"name\":" + quoted(track_name_) + "}},\n";
  out += "{\"ph\":\"M\",\"name\":\"process_sort_index\"," + id +
         ",\"args\":{\"sort_index\":" + std::to_string(rank_) + "}}";
  char times[96];
  for (const Slice* s : order) {
    std::snprintf(times, sizeof times, "\"ts\":%.3f,\"dur\":%.3f", s->start_us, s->length_us);
    out += ",\n{\"ph\":\"X\",\"name\":" + quoted(s->name) + ",\"cat\":" + quoted(s->category) +
           "," + id + "," + times + ",\"args\":{" + s->args + "}}";
  }
  return out;
}

void TimelineTrace::write(const std::string& path) {
  if (written_) return;
  recording_ = false;
  written_ = true;
  const std::string mine = events_text();
  std::string problem = mine.size() > INT_MAX
                            ? "timeline trace: rank " + std::to_string(rank_) +
                                  " holds more than 2 GB of events; trace fewer steps "
                                  "(log.trace_steps)"
                            : "";
  ckpt::agree_or_throw(world_, problem);
  int size = 0;
  check_mpi(MPI_Comm_size(world_, &size), "MPI_Comm_size");
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(rank_ == 0 ? size : 0), offsets(lengths.size());
  check_mpi(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, world_), "MPI_Gather");
  std::string all;
  if (rank_ == 0) {
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      if (total + lengths[r] > INT_MAX) problem = "timeline trace: more than 2 GB of events";
      offsets[r] = static_cast<int>(std::min<int64_t>(total, INT_MAX));
      total += lengths[r];
    }
    if (problem.empty()) all.resize(static_cast<size_t>(total));
  }
  ckpt::agree_or_throw(world_, problem);
  check_mpi(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                        MPI_CHAR, 0, world_),
            "MPI_Gatherv");
  if (rank_ == 0) {
    const std::string temporary = path + ".tmp";
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
      for (int r = 0; r < size; ++r) {
        if (r > 0) out << ",\n";
        out.write(all.data() + offsets[r], lengths[r]);
      }
      out << "\n]}\n";
      out.flush();
      if (!out) problem = "timeline trace: cannot write " + temporary;
    }
    std::error_code ec;
    if (problem.empty()) std::filesystem::rename(temporary, path, ec);
    if (ec)
      problem = "timeline trace: cannot rename " + temporary + " to " + path + ": " + ec.message();
  }
  ckpt::agree_or_throw(world_, problem);
  slices_.clear();
  slices_.shrink_to_fit();
}

}  // namespace trident

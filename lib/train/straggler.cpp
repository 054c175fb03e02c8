// The straggler report (see straggler.hpp).
#include "train/straggler.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "grid/parallel_dims.hpp"
#include "train/metrics_log.hpp"
#include "util/error.hpp"
#include "util/test_hooks.hpp"

namespace trident {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// TRIDENT_TEST_SLOW_RANK = "rank:ms": the delay for world rank `rank` (0 for the others).
int slow_ms_from_env(int rank) {
  const std::string v = test_hook(TestHook::SlowRank);
  if (v.empty()) return 0;
  int r = -1, ms = -1;
  char extra = 0;
  if (std::sscanf(v.c_str(), "%d:%d%c", &r, &ms, &extra) != 2 || r < 0 || ms < 0)
    throw Error(std::string(test_hook_variable(TestHook::SlowRank)) + "='" + v +
                "' is not rank:milliseconds");
  return r == rank ? ms : 0;
}

void append_ranks(std::ostringstream& s, const std::vector<RankScore>& ranked, int shown) {
  for (int i = 0; i < std::min<int>(shown, static_cast<int>(ranked.size())); ++i) {
    char part[96];
    std::snprintf(part, sizeof part, "%srank %d x%.2f (%.1f)", i ? ", " : "", ranked[i].rank,
                  ranked[i].score, ranked[i].ms);
    s << part;
  }
}

}  // namespace

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<RankScore> rank_by_score(const std::vector<double>& ms_per_rank) {
  const double median = median_of(ms_per_rank);
  std::vector<RankScore> out;
  for (size_t r = 0; r < ms_per_rank.size(); ++r)
    out.push_back({static_cast<int>(r), ms_per_rank[r],
                   median > 0 ? ms_per_rank[r] / median : 1.0});
  std::stable_sort(out.begin(), out.end(),
                   [](const RankScore& a, const RankScore& b) { return a.score > b.score; });
  return out;
}

std::string format_straggler_line(int64_t first_step, int64_t last_step,
                                  const std::vector<double>& compute_ms,
                                  const std::vector<double>& comm_ms, int shown) {
  std::ostringstream s;
  char head[160];
  std::snprintf(head, sizeof head,
                "straggler report, steps %lld-%lld (ms per step): compute median %.1f, slowest ",
                static_cast<long long>(first_step), static_cast<long long>(last_step),
                median_of(compute_ms));
  s << head;
  append_ranks(s, rank_by_score(compute_ms), shown);
  char mid[96];
  std::snprintf(mid, sizeof mid, "; communication median %.1f, most ", median_of(comm_ms));
  s << mid;
  append_ranks(s, rank_by_score(comm_ms), shown);
  return s.str();
}

nlohmann::json straggler_record(int64_t last_step, int64_t steps,
                                const std::vector<double>& compute_ms,
                                const std::vector<double>& comm_ms, int shown) {
  nlohmann::json slowest = nlohmann::json::array();
  const auto ranked = rank_by_score(compute_ms);
  for (int i = 0; i < std::min<int>(shown, static_cast<int>(ranked.size())); ++i)
    slowest.push_back({{"rank", ranked[i].rank}, {"score", ranked[i].score}});
  return {{"type", "straggler"},     {"step", last_step},   {"steps", steps},
          {"compute_ms", compute_ms}, {"comm_ms", comm_ms}, {"slowest", slowest}};
}

std::vector<const Communicator*> timed_communicators(const ParallelDims& groups,
                                                     const Config& config) {
  std::vector<const Communicator*> out;
  for (const Communicator* c : groups.host_communicators()) out.push_back(c);
  if (config.train.device == "cuda" && config.parallel.comm == "nccl")
    for (const Communicator* c : groups.device_communicators()) out.push_back(c);
  return out;
}

StragglerReport::StragglerReport(int64_t interval, Communicator& world,
                                 std::vector<const Communicator*> comms, MetricsLog* log)
    : interval_(interval),
      world_(world),
      comms_(std::move(comms)),
      log_(log),
      slow_ms_(slow_ms_from_env(world.rank())),
      window_start_(now_seconds()),
      comm_at_start_(comm_seconds()) {}

double StragglerReport::comm_seconds() const {
  double s = 0;
  for (const Communicator* c : comms_)
    for (const auto& [op, st] : c->stats().ops) s += st.seconds;
  return s;
}

void StragglerReport::step_done(int64_t step) {
  if (slow_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
  if (interval_ <= 0) return;
  if (first_step_ < 0) first_step_ = step;
  if ((step + 1) % interval_ != 0) return;
  const double steps = static_cast<double>(step + 1 - first_step_);
  const double comm = comm_seconds() - comm_at_start_;
  const double wall = now_seconds() - window_start_;
  const double mine[2] = {1e3 * std::max(0.0, wall - comm) / steps, 1e3 * comm / steps};
  std::vector<double> all(2 * static_cast<size_t>(world_.size()));
  world_.all_gather(mine, all.data(), 2, DType::F64);
  if (log_) {
    std::vector<double> compute_ms, comm_ms;
    for (int r = 0; r < world_.size(); ++r) {
      compute_ms.push_back(all[2 * r]);
      comm_ms.push_back(all[2 * r + 1]);
    }
    std::printf("%s\n", format_straggler_line(first_step_ + 1, step + 1, compute_ms, comm_ms)
                            .c_str());
    std::fflush(stdout);
    log_->write_record(straggler_record(step + 1, step + 1 - first_step_, compute_ms, comm_ms));
  }
  // The next window starts after this report (its own gather is counted in neither).
  first_step_ = -1;
  window_start_ = now_seconds();
  comm_at_start_ = comm_seconds();
}

}  // namespace trident

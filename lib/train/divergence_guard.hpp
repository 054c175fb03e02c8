#pragma once
// The divergence guard: step by step, whether training has gone bad (a non-finite gradient
// norm, or a loss spike against the recent good steps), and when enough bad steps in a row ask
// for a rollback to a checkpoint from before the streak. Pure: the trainer feeds it the step's
// loss and gradient norm, which are the same on every rank, and acts on what it says
// (docs/reliability.md, "Divergence guard and rollback").
//
// The skip list: global batches a run leaves out (train.skip_batches, and the batches of the
// bad steps a rollback skipped). Step s reads the s-th global batch index not in the list, so
// the data order stays a pure function of the step and the list.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace trident {

struct DivergenceSettings {
  double spike_factor = 0;    // a loss above spike_factor x the window's median is a spike; 0: off
  int64_t spike_window = 20;  // good steps whose losses form the median
  int64_t max_bad_steps = 0;  // bad steps in a row that ask for a rollback; 0: never
};

class DivergenceGuard {
 public:
  explicit DivergenceGuard(const DivergenceSettings& settings) : settings_(settings) {}

  // Whether a step with this mean loss and global gradient norm is bad: the norm is not
  // finite; or, with spike_factor > 0, the loss is not finite or, once the window holds
  // spike_window good losses, above spike_factor x their median.
  bool is_bad(double loss, double grad_norm) const;
  // Counts a step in: a good step's loss enters the window (the oldest leaves; a non-finite
  // one, possible with spike_factor 0, is no reference and stays out) and ends the streak of
  // bad steps; a bad one lengthens it.
  void record(double loss, bool bad);
  // The window's losses, oldest first: with bad_streak(), what a checkpoint records of the
  // guard (attributes guard_losses, guard_bad_streak).
  std::vector<double> losses() const { return {window_.begin(), window_.end()}; }
  // A resume's guard: the window and streak its checkpoint recorded (the last spike_window of
  // `losses`), so that spikes are caught from the first step after the resume on and a streak
  // cut by a stop goes on counting.
  void restore(const std::vector<double>& losses, int64_t bad_streak);
  int64_t bad_streak() const { return bad_streak_; }
  bool rollback_due() const {
    return settings_.max_bad_steps > 0 && bad_streak_ >= settings_.max_bad_steps;
  }
  // After a rollback: the streak starts again (the window keeps its good losses, still the
  // best reference for the steps that follow).
  void clear_streak() { bad_streak_ = 0; }
  // The median of the window's losses; 0 while it is empty.
  double median() const;
  const DivergenceSettings& settings() const { return settings_; }

 private:
  DivergenceSettings settings_;
  std::deque<double> window_;  // the last spike_window good steps' losses, oldest first
  int64_t bad_streak_ = 0;
};

// The global batch index step `step` reads when the batches in `skipped` (sorted, unique) are
// left out: the step-th index (0-based) not in `skipped`.
int64_t batch_of_step(int64_t step, const std::vector<int64_t>& skipped);
// The sorted union of two lists, without duplicates.
std::vector<int64_t> merged_skip_list(const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b);
// The entries of a sorted list below `position`: the skips that decided which batches the
// steps before `position` read.
std::vector<int64_t> skips_below(const std::vector<int64_t>& skipped, int64_t position);
// "[7, 8]" and back (the checkpoint attribute skipped_batches). Parsing throws trident::Error
// naming `what` on anything but a list of non-negative integers.
std::string skip_list_text(const std::vector<int64_t>& skipped);
std::vector<int64_t> parse_skip_list(const std::string& text, const std::string& what);
// "[3.25, 3.5]" and back (the checkpoint attribute guard_losses; each value round-trips
// exactly). Parsing throws trident::Error naming `what` on anything but a list of finite
// numbers.
std::string loss_list_text(const std::vector<double>& losses);
std::vector<double> parse_loss_list(const std::string& text, const std::string& what);

}  // namespace trident

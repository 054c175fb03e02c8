#pragma once
// The decisions of a rollback after a streak of bad steps (train.max_bad_steps), apart from
// the collective work the trainer does with them: which checkpoint steps may be gone back to,
// which global batches to leave out from then on, and the lines and records that say so.
// Pure: no I/O, no communication (docs/reliability.md, "Rollback").
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident {

struct RollbackPlan {
  int64_t step = 0;       // the last bad step (0-based)
  int64_t first_bad = 0;  // the streak's first step (0-based): also the steps done before it
  // The newest checkpoint step the rollback may go back to: the streak's first step, or one
  // before it when that checkpoint is passed over (passes_over).
  int64_t max_step = 0;
  // The streak began at the very step the last rollback went back to: that checkpoint led
  // straight into bad steps again on other batches, so its weights are suspect (an update that
  // looked good, its loss taken before it, made them).
  bool passes_over = false;
  std::vector<int64_t> bad_batches;  // the streak's global batches, left out from now on
  std::string what;                  // "3 bad steps in a row (steps 8 to 10, ...)"
  std::string passed_over;           // "; passed over step N, ..." or ""
};

// The plan after bad step `step` ended a streak of `streak` steps; `rolled_back_to`: the step
// of the last rollback's checkpoint (-1: none yet); `batch_of`: the global batch a step reads.
RollbackPlan plan_rollback(int64_t step, int64_t streak, int64_t rolled_back_to,
                           int64_t max_bad_steps, const std::function<int64_t(int64_t)>& batch_of);

// Why no rollback can be taken ("" when one can): train.max_rollbacks used up, or no
// committed checkpoint (`target` empty) in `dir` at or before plan.max_step.
std::string rollback_refusal(const RollbackPlan& plan, int64_t rollbacks, int64_t max_rollbacks,
                             const std::string& target, const std::string& dir);

// The metrics log's line and record of a run that diverged with no rollback: `saved` is the
// rollback save's path ("" when none was written), `save_failure` why it failed ("" if not).
std::string diverged_line(const RollbackPlan& plan, const std::string& refusal,
                          const std::string& saved, const std::string& save_failure);
nlohmann::json diverged_record(const RollbackPlan& plan, const std::string& refusal,
                               int64_t rollbacks, const std::string& saved);

// The line and record of rollback number `rollbacks` (of at most `max_rollbacks`) to
// checkpoint `target` of step `to_step`, after which `skipped` are the run's skipped batches.
std::string rollback_line(const RollbackPlan& plan, int64_t rollbacks, int64_t max_rollbacks,
                          const std::string& target, int64_t to_step);
nlohmann::json rollback_record(const RollbackPlan& plan, int64_t rollbacks, int64_t to_step,
                               const std::string& target, const std::vector<int64_t>& skipped,
                               double lr_scale);

}  // namespace trident

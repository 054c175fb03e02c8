#include "train/rollback_plan.hpp"

#include "train/divergence_guard.hpp"

namespace trident {

RollbackPlan plan_rollback(int64_t step, int64_t streak, int64_t rolled_back_to,
                           int64_t max_bad_steps, const std::function<int64_t(int64_t)>& batch_of) {
  RollbackPlan p;
  p.step = step;
  p.first_bad = step + 1 - streak;
  for (int64_t s = p.first_bad; s <= step; ++s) p.bad_batches.push_back(batch_of(s));
  p.passes_over = rolled_back_to >= 0 && p.first_bad == rolled_back_to;
  p.max_step = p.passes_over ? p.first_bad - 1 : p.first_bad;
  p.what = std::to_string(streak) + " bad steps in a row (steps " +
           std::to_string(p.first_bad + 1) + " to " + std::to_string(step + 1) +
           ", global batches " + skip_list_text(p.bad_batches) +
           "; train.max_bad_steps = " + std::to_string(max_bad_steps) + ")";
  if (p.passes_over)
    p.passed_over = "; passed over step " + std::to_string(rolled_back_to) +
                    ", whose first step was bad again after the last rollback to it";
  return p;
}

std::string rollback_refusal(const RollbackPlan& plan, int64_t rollbacks, int64_t max_rollbacks,
                             const std::string& target, const std::string& dir) {
  if (rollbacks >= max_rollbacks)
    return "train.max_rollbacks = " + std::to_string(max_rollbacks) + " rollbacks taken";
  if (target.empty())
    return "no committed checkpoint in checkpoint.dir '" + dir + "' at or before step " +
           std::to_string(plan.max_step) + plan.passed_over;
  return "";
}

std::string diverged_line(const RollbackPlan& plan, const std::string& refusal,
                          const std::string& saved, const std::string& save_failure) {
  const std::string save =
      saved.empty() ? "" : "; the weights of step " + std::to_string(plan.first_bad) +
                               " (before the bad steps) saved as " + saved + " (a rollback save)";
  return "training diverged: " + plan.what + ", and no rollback: " + refusal + save +
         save_failure + "; exit code 77";
}

nlohmann::json diverged_record(const RollbackPlan& plan, const std::string& refusal,
                               int64_t rollbacks, const std::string& saved) {
  nlohmann::json record = {{"type", "event"},        {"event", "diverged"},
                           {"step", plan.step + 1},  {"bad_batches", plan.bad_batches},
                           {"rollbacks", rollbacks}, {"reason", refusal}};
  if (!saved.empty()) record["rollback_save"] = saved;
  return record;
}

std::string rollback_line(const RollbackPlan& plan, int64_t rollbacks, int64_t max_rollbacks,
                          const std::string& target, int64_t to_step) {
  return "rollback " + std::to_string(rollbacks) + " of at most " +
         std::to_string(max_rollbacks) + ": " + plan.what + "; back to " + target + " (step " +
         std::to_string(to_step) + plan.passed_over + "), skipping global batches " +
         skip_list_text(plan.bad_batches) + " from now on";
}

nlohmann::json rollback_record(const RollbackPlan& plan, int64_t rollbacks, int64_t to_step,
                               const std::string& target, const std::vector<int64_t>& skipped,
                               double lr_scale) {
  return {{"type", "event"},           {"event", "rollback"},
          {"step", plan.step + 1},     {"to_step", to_step},
          {"checkpoint", target},      {"bad_batches", plan.bad_batches},
          {"skipped_batches", skipped}, {"rollbacks", rollbacks},
          {"lr_scale", lr_scale}};
}

}  // namespace trident

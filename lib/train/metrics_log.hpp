#pragma once
// The run's log: one Megatron-style line per logged step on stdout and one JSON object per
// logged step in <log.dir>/metrics.jsonl. Only the rank that owns the logger writes.
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace trident {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of optimizer steps done after this one
  int64_t total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double ms_per_step = 0, tokens_per_s = 0, gflops_per_rank = 0;
  int64_t skipped_steps = 0;
  std::optional<double> val_loss;
};

class MetricsLog {
 public:
  // Opens (appends to) dir/metrics.jsonl. Throws trident::Error naming the path on failure.
  explicit MetricsLog(const std::string& dir);
  void write(const StepMetrics& m);
  static std::string format_line(const StepMetrics& m);

 private:
  std::ofstream jsonl_;
};

}  // namespace trident

#pragma once
// The run's log: one Megatron-style line per logged step on stdout and one JSON object per
// logged step in <log.dir>/metrics.jsonl (and, with log.tensorboard, the same numbers as
// TensorBoard scalars in <log.dir>/events.out.tfevents.*). Only the rank that owns the logger
// writes.
//
// A failed write (a full disk, a file-size limit) does not stop training: it is reported once
// per destination on stderr, a metrics.jsonl line that was only partly written is removed again
// (the file only ever holds whole lines) and nothing more is appended to it (so it holds the
// steps before the first failure, without gaps), and failure() says what was lost so that the
// run can end with a non-zero exit code.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <vector>
#include <string>

namespace trident {

namespace tensorboard {
class EventWriter;
}

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of optimizer steps done after this one
  int64_t total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double ms_per_step = 0, tokens_per_s = 0, gflops_per_rank = 0;
  int64_t skipped_steps = 0;
  std::optional<double> val_loss;
  // With a data.train blend: the samples each dataset gave in steps [0, step) (jsonl only).
  std::vector<int64_t> data_counts;
  // With parallel.pipeline > 1: per stage, the fraction of its pipeline time since the previous
  // logged step (or the start) that the stage waited in pipeline messages, the measured bubble
  // (jsonl only, "pipeline_bubble").
  std::vector<double> pipeline_bubble;
  // A mixture of experts (model.moe_experts > 0; docs/moe.md): the step's load-balancing and
  // z-loss (mean over the global batch's sequences, summed over the MoE layers), the smallest
  // and largest expert's share of the routed assignments (1/E each when balanced), and the
  // fraction of assignments dropped by the capacity.
  // checkpoint.async: an asynchronous save was being written when the step began (jsonl only,
  // "checkpoint_in_flight", written when true): the steps whose time it may have slowed.
  bool checkpoint_in_flight = false;
  bool moe = false;
  double moe_aux_loss = 0, moe_z_loss = 0, moe_load_min = 0, moe_load_max = 0, moe_dropped = 0;
};

class MetricsLog {
 public:
  // Opens (appends to) dir/metrics.jsonl. Throws trident::Error naming the path on failure.
  explicit MetricsLog(const std::string& dir);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // From now on every write() also goes to a new TensorBoard event file in the directory,
  // which starts with `config_toml` as a text summary ("config"). Throws trident::Error
  // naming the file when it cannot be created.
  void enable_tensorboard(const std::string& config_toml);
  void write(const StepMetrics& m);
  // One more metrics.jsonl line that is no step's metrics (it carries a "type", e.g. the
  // straggler report, train/straggler.hpp), with write()'s whole-line and failure rules; not
  // echoed to stdout or TensorBoard. `record` must hold an integer "step".
  void write_record(const nlohmann::json& record);
  // An event of the run (a rollback): `line` on stdout and `record` (an object with "event"
  // and "step") as one metrics.jsonl line, with the same failure handling as write() (write_record).
  void write_event(const std::string& line, const nlohmann::json& record);
  static std::string format_line(const StepMetrics& m);
  // "" while every line reached both destinations; else one line: how many lines of which
  // destination were lost, and the first error.
  std::string failure() const;
  const std::string& path() const { return path_; }

 private:
  struct Losses {
    int64_t lines = 0;
    int64_t first_step = 0;
    std::string first_error;
  };
  // Counts a failed write of step `step` to `what`; reports the first one on stderr.
  void lost(Losses& losses, const std::string& what, int64_t step, int err);

  // One metrics.jsonl line's numbers as TensorBoard scalars at its step.
  void write_tensorboard(const nlohmann::json& line);

  std::string dir_;
  std::string path_;
  int fd_ = -1;
  int64_t lines_ = 0;
  Losses jsonl_, stdout_, tensorboard_;
  std::unique_ptr<tensorboard::EventWriter> events_;
};

}  // namespace trident

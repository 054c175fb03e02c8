#include "train/metrics_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "train/tensorboard.hpp"
#include "util/append_whole.hpp"
#include "util/error.hpp"

namespace trident {

MetricsLog::MetricsLog(const std::string& dir) : dir_(dir), path_(dir + "/metrics.jsonl") {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("log.dir '" + dir + "': cannot create directory: " + ec.message());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd_ < 0) throw Error("cannot open '" + path_ + "' for writing: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error("cannot open '" + path_ + "' for writing: not a regular file");
  }
  // A file cut mid-line (by an older build on a full disk) gets its line ended, so that the
  // lines appended now stay whole.
  char last = '\n';
  if (st.st_size > 0 && ::pread(fd_, &last, 1, st.st_size - 1) == 1 && last != '\n') {
    const ssize_t ignored = ::write(fd_, "\n", 1);  // if it fails, so will the first line
    (void)ignored;
  }
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

std::string MetricsLog::format_line(const StepMetrics& m) {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf,
                        "step %6lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %8.1f ms/step | "
                        "%9.0f tokens/s | %7.2f GFLOP/s",
                        static_cast<long long>(m.step), static_cast<long long>(m.total_steps),
                        m.loss, m.lr, m.grad_norm, m.ms_per_step, m.tokens_per_s,
                        m.gflops_per_rank);
  std::string line(buf, n);
  if (m.skipped_steps > 0) line += " | skipped steps " + std::to_string(m.skipped_steps);
  if (m.val_loss) {
    std::snprintf(buf, sizeof buf, " | val loss %.6f", *m.val_loss);
    line += buf;
  }
  if (m.moe) {
    std::snprintf(buf, sizeof buf, " | aux loss %.4f | expert load min %.3f max %.3f",
                  m.moe_aux_loss, m.moe_load_min, m.moe_load_max);
    line += buf;
  }
  return line;
}

void MetricsLog::lost(Losses& losses, const std::string& what, int64_t step, int err) {
  if (losses.lines++ > 0) return;
  losses.first_step = step;
  losses.first_error = std::strerror(err);
  std::fprintf(stderr,
               "trident: warning: cannot write %s (step %lld): %s; training continues, and the "
               "run will end with exit code 1\n",
               what.c_str(), static_cast<long long>(step), losses.first_error.c_str());
  std::fflush(stderr);
}

void MetricsLog::enable_tensorboard(const std::string& config_toml) {
  events_ = std::make_unique<tensorboard::EventWriter>(dir_);
  // TensorBoard's text plugin renders Markdown: indented by four spaces, the TOML stays as it
  // is (a code block).
  std::string block;
  size_t begin = 0;
  while (begin < config_toml.size()) {
    size_t end = config_toml.find('\n', begin);
    if (end == std::string::npos) end = config_toml.size();
    block += "    " + config_toml.substr(begin, end - begin) + "\n";
    begin = end + 1;
  }
  if (const int err = events_->write_event(
          tensorboard::text_event(tensorboard::wall_time_now(), 0, "config", block));
      err != 0)
    throw Error("cannot write '" + events_->path() + "': " + std::strerror(err));
}

void MetricsLog::write_tensorboard(const nlohmann::json& line) {
  // Every number of the metrics.jsonl line, under its name (data_counts, an array, is not one).
  std::vector<tensorboard::Scalar> scalars;
  for (auto it = line.begin(); it != line.end(); ++it)
    if (it.key() != "step" && it.value().is_number())
      scalars.push_back({it.key(), it.value().get<float>()});
  const int64_t step = line.at("step").get<int64_t>();
  const int err =
      events_->write_event(tensorboard::scalars_event(tensorboard::wall_time_now(), step, scalars));
  if (err != 0) lost(tensorboard_, "'" + events_->path() + "'", step, err);
}

void MetricsLog::write(const StepMetrics& m) {
  ++lines_;
  const std::string line = format_line(m) + "\n";
  errno = 0;
  std::fwrite(line.data(), 1, line.size(), stdout);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    lost(stdout_, "the log to standard output", m.step, errno ? errno : EIO);
    std::clearerr(stdout);
  }

  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"ms_per_step", m.ms_per_step},
                      {"tokens_per_s", m.tokens_per_s},
                      {"gflops_per_rank", m.gflops_per_rank},
                      {"skipped_steps", m.skipped_steps}};
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (!m.data_counts.empty()) j["data_counts"] = m.data_counts;
  if (!m.pipeline_bubble.empty()) j["pipeline_bubble"] = m.pipeline_bubble;
  if (m.checkpoint_in_flight) j["checkpoint_in_flight"] = true;
  if (m.moe) {
    j["moe_aux_loss"] = m.moe_aux_loss;
    j["moe_z_loss"] = m.moe_z_loss;
    j["moe_load_min"] = m.moe_load_min;
    j["moe_load_max"] = m.moe_load_max;
    j["moe_dropped"] = m.moe_dropped;
  }
  if (events_) write_tensorboard(j);
  // After a failed write the file is not appended to any more: a later, shorter line could
  // fit where the failed one did not (a full disk's last page), and the file would then have
  // a gap. It holds the steps before the first failure; the rest are counted as lost.
  if (jsonl_.lines > 0) {
    lost(jsonl_, "'" + path_ + "'", m.step, ENOSPC);
    return;
  }
  // The file holds whole lines only (append_whole cuts a partly written one off again).
  if (const int err = append_whole(fd_, j.dump() + "\n"))
    lost(jsonl_, "'" + path_ + "'", m.step, err);
}

void MetricsLog::write_event(const std::string& line, const nlohmann::json& record) {
  ++lines_;
  errno = 0;
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    lost(stdout_, "the log to standard output", record.at("step").get<int64_t>(),
         errno ? errno : EIO);
    std::clearerr(stdout);
  }
  write_record(record);
}

void MetricsLog::write_record(const nlohmann::json& record) {
  const int64_t step = record.at("step").get<int64_t>();
  if (jsonl_.lines > 0) {  // after a failed write, as write(): nothing more is appended
    lost(jsonl_, "'" + path_ + "'", step, ENOSPC);
    return;
  }
  if (const int err = append_whole(fd_, record.dump() + "\n"))
    lost(jsonl_, "'" + path_ + "'", step, err);
}

std::string MetricsLog::failure() const {
  std::string out;
  auto add = [&](const Losses& l, const std::string& what) {
    if (l.lines == 0) return;
    if (!out.empty()) out += "; ";
    out += std::to_string(l.lines) + " of " + std::to_string(lines_) + " log lines were not " +
           "written to " + what + " (first at step " + std::to_string(l.first_step) + ": " +
           l.first_error + ")";
  };
  add(jsonl_, "'" + path_ + "'");
  add(stdout_, "standard output");
  if (events_) add(tensorboard_, "'" + events_->path() + "'");
  return out;
}

}  // namespace trident

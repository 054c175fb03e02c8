#include "train/metrics_log.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace trident {

MetricsLog::MetricsLog(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("log.dir '" + dir + "': cannot create directory: " + ec.message());
  const std::string path = dir + "/metrics.jsonl";
  jsonl_.open(path, std::ios::app);
  if (!jsonl_) throw Error("cannot open '" + path + "' for writing: " + std::strerror(errno));
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
  return line;
}

void MetricsLog::write(const StepMetrics& m) {
  std::cout << format_line(m) << std::endl;
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"ms_per_step", m.ms_per_step},
                      {"tokens_per_s", m.tokens_per_s},
                      {"gflops_per_rank", m.gflops_per_rank},
                      {"skipped_steps", m.skipped_steps}};
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  jsonl_ << j.dump() << '\n';
  jsonl_.flush();
}

}  // namespace trident

#include "train/divergence_guard.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace trident {

namespace {

// The attribute's text as an error shows it: quoted with its control characters escaped and
// cut to 60 bytes, so the error stays one line whatever the file holds.
std::string shown_text(const std::string& text) {
  return nlohmann::json(text.substr(0, 60))
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         (text.size() > 60 ? " (cut)" : "");
}

}  // namespace

bool DivergenceGuard::is_bad(double loss, double grad_norm) const {
  if (!std::isfinite(grad_norm)) return true;
  if (settings_.spike_factor <= 0) return false;
  if (!std::isfinite(loss)) return true;
  // Too few good steps yet (the start of a run, the first after a resume): no reference.
  if (static_cast<int64_t>(window_.size()) < settings_.spike_window) return false;
  return loss > settings_.spike_factor * median();
}

void DivergenceGuard::record(double loss, bool bad) {
  if (bad) {
    ++bad_streak_;
    return;
  }
  bad_streak_ = 0;
  if (!std::isfinite(loss)) return;
  window_.push_back(loss);
  while (static_cast<int64_t>(window_.size()) > settings_.spike_window) window_.pop_front();
}

void DivergenceGuard::restore(const std::vector<double>& losses, int64_t bad_streak) {
  const size_t keep = std::min(losses.size(), static_cast<size_t>(settings_.spike_window));
  window_.assign(losses.end() - static_cast<std::ptrdiff_t>(keep), losses.end());
  bad_streak_ = bad_streak;
}

double DivergenceGuard::median() const {
  if (window_.empty()) return 0;
  std::vector<double> sorted(window_.begin(), window_.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

int64_t batch_of_step(int64_t step, const std::vector<int64_t>& skipped) {
  // Walking the sorted list: every skipped index at or below the candidate pushes it one on.
  int64_t batch = step;
  for (int64_t s : skipped) {
    if (s > batch) break;
    ++batch;
  }
  return batch;
}

std::vector<int64_t> merged_skip_list(const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b) {
  std::vector<int64_t> out(a);
  out.insert(out.end(), b.begin(), b.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int64_t> skips_below(const std::vector<int64_t>& skipped, int64_t position) {
  std::vector<int64_t> out;
  for (int64_t s : skipped)
    if (s < position) out.push_back(s);
  return out;
}

std::string skip_list_text(const std::vector<int64_t>& skipped) {
  std::string out = "[";
  for (size_t i = 0; i < skipped.size(); ++i)
    out += (i > 0 ? ", " : "") + std::to_string(skipped[i]);
  return out + "]";
}

std::vector<int64_t> parse_skip_list(const std::string& text, const std::string& what) {
  auto fail = [&] {
    throw Error(what + " = " + shown_text(text) +
                " is not a list of non-negative integers like [7, 8]");
  };
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') fail();
  std::vector<int64_t> out;
  size_t i = 1;
  const size_t end = text.size() - 1;
  auto skip_spaces = [&] {
    while (i < end && text[i] == ' ') ++i;
  };
  skip_spaces();
  while (i < end) {
    const size_t start = i;
    int64_t value = 0;
    while (i < end && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (value > (INT64_MAX - 9) / 10) fail();
      value = value * 10 + (text[i++] - '0');
    }
    if (i == start) fail();
    out.push_back(value);
    skip_spaces();
    if (i < end) {
      if (text[i] != ',') fail();
      ++i;
      skip_spaces();
      if (i == end) fail();
    }
  }
  return merged_skip_list(out, {});
}

std::string loss_list_text(const std::vector<double>& losses) {
  // nlohmann writes the shortest text that reads back to the same double.
  return nlohmann::json(losses).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<double> parse_loss_list(const std::string& text, const std::string& what) {
  const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
  std::vector<double> out;
  bool ok = parsed.is_array();
  for (size_t i = 0; ok && i < parsed.size(); ++i) {
    ok = parsed[i].is_number() && std::isfinite(parsed[i].get<double>());
    if (ok) out.push_back(parsed[i].get<double>());
  }
  if (!ok)
    throw Error(what + " = " + shown_text(text) +
                " is not a list of finite numbers like [3.25, 3.5]");
  return out;
}

}  // namespace trident

// Hardware descriptions: reading, checking and writing configs/hardware/*.toml, and the two
// formulas every cost uses (GEMM efficiency, collective time).
#include "plan/hardware.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "config/schema.hpp"
#include "config/toml_nesting.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace trident {
namespace {

// Reads typed keys of one table, naming the file and the dotted key in every error.
class Reader {
 public:
  Reader(const toml::table& root, const std::string& source) : root_(root), source_(source) {}

  const toml::node& node(const std::string& key) const {
    const toml::node* n = root_.at_path(key).node();
    if (n == nullptr) fail(key, "is missing");
    return *n;
  }
  double number(const std::string& key, double min_exclusive) const {
    const toml::node& n = node(key);
    double v = 0.0;
    if (auto i = n.as_integer()) v = static_cast<double>(i->get());
    else if (auto f = n.as_floating_point()) v = f->get();
    else fail(key, "must be a number");
    if (!std::isfinite(v) || v <= min_exclusive)
      fail(key, "= " + text(v) + " must be greater than " + text(min_exclusive));
    return v;
  }
  int64_t integer(const std::string& key, int64_t min_exclusive) const {
    const auto i = node(key).as_integer();
    if (!i) fail(key, "must be a whole number (a TOML integer)");
    if (i->get() <= min_exclusive)
      fail(key, "= " + std::to_string(i->get()) + " must be greater than " +
                    std::to_string(min_exclusive));
    return i->get();
  }
  double non_negative(const std::string& key) const {
    const toml::node& n = node(key);
    if (!n.is_number()) fail(key, "must be a number");
    const double v = n.is_integer() ? static_cast<double>(n.as_integer()->get())
                                    : n.as_floating_point()->get();
    if (!std::isfinite(v) || v < 0.0) fail(key, "= " + text(v) + " must be >= 0");
    return v;
  }
  double fraction(const std::string& key) const {
    const double v = number(key, 0.0);
    if (v > 1.0) fail(key, "= " + text(v) + " must be in (0, 1]");
    return v;
  }
  std::string string(const std::string& key) const {
    auto s = node(key).as_string();
    if (!s) fail(key, "must be a string");
    return s->get();
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error("hardware file " + source_ + ": " + key + " " + what);
  }
  static std::string text(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }
  const std::string& source() const { return source_; }

 private:
  const toml::table& root_;
  std::string source_;
};

const std::set<std::string>& known_keys() {
  static const std::set<std::string> keys = {
      "name", "devices_per_node",
      "device.kind", "device.peak_tflops_fp32", "device.peak_tflops_bf16",
      "device.peak_tflops_fp8", "device.gemm_efficiency", "device.gemm_efficiency_shapes",
      "device.gemm_efficiency_shapes_bf16",
      "device.attention_efficiency", "device.attention_efficiency_bf16",
      "device.attention_forward_share", "device.attention_forward_share_bf16",
      "device.memory_gib", "device.reserved_gib",
      "device.memory_bandwidth_gbs", "device.memory_efficiency", "device.optimizer_bandwidth_gbs",
      "device.host_link_gbs",
      "intra_node.bandwidth_gbs", "intra_node.efficiency", "intra_node.latency_us",
      "inter_node.bandwidth_gbs", "inter_node.efficiency", "inter_node.latency_us",
      "collectives.all_reduce", "collectives.all_gather", "collectives.reduce_scatter",
      "collectives.send_recv", "storage.write_gbs", "storage.dataset_ms"};
  return keys;
}

// Every leaf key of the file is one the schema knows: a misspelt key is an error, never a
// silently used default.
void check_unknown_keys(const toml::table& t, const std::string& prefix, const Reader& r) {
  for (const auto& [k, v] : t) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = v.as_table()) {
      check_unknown_keys(*sub, key, r);
      continue;
    }
    if (!known_keys().count(key)) r.fail(key, "is not a hardware key (docs/plan.md lists them)");
  }
}

// A curve of [size, value] points, sizes increasing; values in (0, 1] (fractions of a peak) or,
// with `rates`, any positive number (GB/s).
std::vector<std::pair<double, double>> read_curve(const Reader& r, const std::string& key,
                                                  bool rates = false) {
  const char* what = rates ? "[parameters, GB/s]" : "[size, fraction]";
  const toml::array* a = r.node(key).as_array();
  if (a == nullptr || a->empty()) r.fail(key, std::string("must be a non-empty array of ") + what);
  std::vector<std::pair<double, double>> curve;
  for (const toml::node& point : *a) {
    const toml::array* p = point.as_array();
    auto num = [&](const toml::node& n, double& out) {
      if (auto i = n.as_integer()) out = static_cast<double>(i->get());
      else if (auto f = n.as_floating_point()) out = f->get();
      else return false;
      return std::isfinite(out);
    };
    double size = 0.0, frac = 0.0;
    if (p == nullptr || p->size() != 2 || !num((*p)[0], size) || !num((*p)[1], frac))
      r.fail(key, std::string("must hold ") + what + " pairs of numbers");
    if (size <= 0.0 || frac <= 0.0 || (!rates && frac > 1.0))
      r.fail(key, "point [" + Reader::text(size) + ", " + Reader::text(frac) +
                      (rates ? "]: parameters and GB/s must be > 0"
                             : "]: size must be > 0 and fraction in (0, 1]"));
    if (!curve.empty() && size <= curve.back().first)
      r.fail(key, "sizes must increase (" + Reader::text(size) + " after " +
                      Reader::text(curve.back().first) + ")");
    curve.emplace_back(size, frac);
  }
  return curve;
}

// An optional forward-share curve: read_curve's points (empty where the key is absent), each
// share below 1 (a backward takes time).
std::vector<std::pair<double, double>> read_share_curve(const Reader& r, const toml::table& root,
                                                        const std::string& key) {
  if (root.at_path(key).node() == nullptr) return {};
  std::vector<std::pair<double, double>> curve = read_curve(r, key);
  for (const auto& [size, share] : curve)
    if (share >= 1.0)
      r.fail(key, "point [" + Reader::text(size) + ", " + Reader::text(share) +
                      "]: a forward's share of forward + backward must be below 1");
  return curve;
}

// [rows, in, out, fraction] points on a full grid: positive sizes, fractions in (0, 1], every
// combination of the sizes present exactly once (what gemm_efficiency interpolates).
std::vector<std::array<double, 4>> read_shape_grid(const Reader& r, const std::string& key) {
  const toml::array* a = r.node(key).as_array();
  if (a == nullptr || a->empty())
    r.fail(key, "must be a non-empty array of [rows, in, out, fraction]");
  std::vector<std::array<double, 4>> points;
  std::set<double> axes[3];
  std::set<std::array<double, 3>> seen;
  for (const toml::node& point : *a) {
    const toml::array* p = point.as_array();
    if (p == nullptr || p->size() != 4)
      r.fail(key, "must be a non-empty array of [rows, in, out, fraction]");
    std::array<double, 4> v{};
    for (size_t i = 0; i < 4; ++i) {
      const auto x = (*p)[i].value<double>();
      if (!x || !std::isfinite(*x) || *x <= 0.0)
        r.fail(key, "holds a point that is not four positive numbers");
      v[i] = *x;
    }
    if (v[3] > 1.0) r.fail(key, "holds a fraction of " + Reader::text(v[3]) + " (at most 1)");
    if (!seen.insert({v[0], v[1], v[2]}).second)
      r.fail(key, "holds [" + Reader::text(v[0]) + ", " + Reader::text(v[1]) + ", " +
                      Reader::text(v[2]) + "] twice");
    for (int d = 0; d < 3; ++d) axes[d].insert(v[d]);
    points.push_back(v);
  }
  if (points.size() != axes[0].size() * axes[1].size() * axes[2].size())
    r.fail(key, "is not a full grid: " + std::to_string(points.size()) + " points for " +
                    std::to_string(axes[0].size()) + " x " + std::to_string(axes[1].size()) +
                    " x " + std::to_string(axes[2].size()) + " sizes");
  std::sort(points.begin(), points.end());
  return points;
}

// An optional key of a GPU's only: its value, 0 where absent. One meaning per key: a CPU file
// with it is refused, `cpu_instead` saying what a CPU does in its place.
double gpu_only_number(const toml::table& root, const Reader& r, const std::string& kind,
                       const std::string& key, const std::string& cpu_instead) {
  if (root.at_path(key).node() == nullptr) return 0.0;
  if (kind == "cpu") r.fail(key, "is for a GPU: on device.kind = \"cpu\" " + cpu_instead);
  return r.number(key, 0.0);
}

LinkSpec read_link(const Reader& r, const std::string& table) {
  LinkSpec link;
  link.bandwidth_gbs = r.number(table + ".bandwidth_gbs", 0.0);
  link.efficiency = r.fraction(table + ".efficiency");
  link.latency_us = r.non_negative(table + ".latency_us");
  return link;
}

}  // namespace

HardwareSpec parse_hardware(const std::string& toml_text, const std::string& source) {
  toml::table root;
  if (const TomlNesting deep = toml_nesting_past(toml_text); deep.line > 0)
    throw Error("hardware file " + source + ": line " + std::to_string(deep.line) + ": " +
                deep.what);
  try {
    root = toml::parse(std::string_view(toml_text), std::string_view(source));
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw Error("hardware file " + source + ": TOML syntax error at line " +
                std::to_string(where.line) + ": " + std::string(e.description()));
  }
  const Reader r(root, source);
  check_unknown_keys(root, "", r);
  HardwareSpec hw;
  hw.source = source;
  hw.name = r.string("name");
  // A TOML integer, at most the 2^20 devices a plan models (kPlanMaxDevices): 1e300 or 2^63-1
  // wrapped to a negative count in the nodes x devices product that --nodes was blamed for.
  hw.devices_per_node = r.integer("devices_per_node", 0);
  if (hw.devices_per_node > (int64_t{1} << 20))
    r.fail("devices_per_node", "= " + std::to_string(hw.devices_per_node) +
                                   " is more than the 1048576 devices a plan models");
  hw.device.kind = r.string("device.kind");
  if (hw.device.kind != "gpu" && hw.device.kind != "cpu")
    r.fail("device.kind", "= \"" + hw.device.kind + "\" must be \"gpu\" or \"cpu\"");
  hw.device.peak_tflops_fp32 = r.number("device.peak_tflops_fp32", 0.0);
  hw.device.peak_tflops_bf16 = r.number("device.peak_tflops_bf16", 0.0);
  // A CPU's FP8 GEMMs are the reference's fp32 ones.
  hw.device.peak_tflops_fp8 = gpu_only_number(
      root, r, hw.device.kind, "device.peak_tflops_fp8",
      "the trainer's FP8 GEMMs run at the fp32 rate (docs/plan.md \"FP8\")");
  hw.device.gemm_efficiency = read_curve(r, "device.gemm_efficiency");
  if (root.at_path("device.gemm_efficiency_shapes").node() != nullptr)
    hw.device.gemm_efficiency_shapes = read_shape_grid(r, "device.gemm_efficiency_shapes");
  if (root.at_path("device.gemm_efficiency_shapes_bf16").node() != nullptr)
    hw.device.gemm_efficiency_shapes_bf16 =
        read_shape_grid(r, "device.gemm_efficiency_shapes_bf16");
  if (root.at_path("device.attention_efficiency").node() != nullptr)
    hw.device.attention_efficiency = read_curve(r, "device.attention_efficiency");
  if (root.at_path("device.attention_efficiency_bf16").node() != nullptr)
    hw.device.attention_efficiency_bf16 = read_curve(r, "device.attention_efficiency_bf16");
  hw.device.attention_forward_share = read_share_curve(r, root, "device.attention_forward_share");
  hw.device.attention_forward_share_bf16 =
      read_share_curve(r, root, "device.attention_forward_share_bf16");
  hw.device.memory_gib = r.number("device.memory_gib", 0.0);
  hw.device.reserved_gib = r.non_negative("device.reserved_gib");
  if (hw.device.reserved_gib >= hw.device.memory_gib)
    r.fail("device.reserved_gib", "must be less than device.memory_gib");
  hw.device.memory_bandwidth_gbs = r.number("device.memory_bandwidth_gbs", 0.0);
  if (root.at_path("device.memory_efficiency").node() != nullptr)
    hw.device.memory_efficiency = r.fraction("device.memory_efficiency");
  if (root.at_path("device.optimizer_bandwidth_gbs").node() != nullptr)
    hw.device.optimizer_bandwidth_gbs = read_curve(r, "device.optimizer_bandwidth_gbs", true);
  hw.device.host_link_gbs = gpu_only_number(
      root, r, hw.device.kind, "device.host_link_gbs",
      "a checkpoint's staging copy runs at device.memory_bandwidth_gbs (docs/plan.md "
      "\"Checkpoints\")");
  hw.intra_node = read_link(r, "intra_node");
  hw.inter_node = read_link(r, "inter_node");
  hw.collectives.all_reduce = r.number("collectives.all_reduce", 0.0);
  hw.collectives.all_gather = r.number("collectives.all_gather", 0.0);
  hw.collectives.reduce_scatter = r.number("collectives.reduce_scatter", 0.0);
  hw.collectives.send_recv = r.number("collectives.send_recv", 0.0);
  if (root.at_path("storage.write_gbs").node() != nullptr)
    hw.storage_write_gbs = r.number("storage.write_gbs", 0.0);
  if (root.at_path("storage.dataset_ms").node() != nullptr) {
    if (hw.storage_write_gbs <= 0.0)
      r.fail("storage.dataset_ms", "needs storage.write_gbs (a checkpoint's bytes are its rest)");
    hw.storage_dataset_ms = r.non_negative("storage.dataset_ms");
  }
  return hw;
}

HardwareSpec load_hardware(const std::string& path) {
  return parse_hardware(read_input_file(path, {path, "hardware", int64_t{16} << 20,
                                               "--hardware needs a TOML file"}), path);
}

double HardwareSpec::peak_flops(const std::string& precision) const {
  if (precision == "fp32") return device.peak_tflops_fp32 * 1e12;
  if (precision == "bf16") return device.peak_tflops_bf16 * 1e12;
  if (precision == "fp8") return peak_flops(fp8_base_precision());
  throw Error("train.precision = \"" + precision + "\": the plan knows fp32, bf16 and fp8");
}

std::string HardwareSpec::fp8_base_precision() const {
  return device.kind == "gpu" ? "bf16" : "fp32";
}

double HardwareSpec::fp8_gemm_flops() const {
  if (device.kind != "gpu") return peak_flops("fp32");
  if (device.peak_tflops_fp8 <= 0.0)
    throw Error("hardware file " + source + ": device.peak_tflops_fp8 is missing: "
                "train.precision = \"fp8\" needs the device's dense FP8 tensor-core rate, "
                "10^12 FLOP/s (docs/plan.md \"FP8\")");
  return device.peak_tflops_fp8 * 1e12;
}

double HardwareSpec::fp8_element_bytes() const { return device.kind == "gpu" ? 1.0 : 4.0; }

namespace {
// The curve c at size, linearly interpolated in log(size), flat beyond its ends.
double curve_at(const std::vector<std::pair<double, double>>& c, double size) {
  if (size <= c.front().first) return c.front().second;
  if (size >= c.back().first) return c.back().second;
  size_t i = 1;
  while (c[i].first < size) ++i;
  const double t = std::log(size / c[i - 1].first) / std::log(c[i].first / c[i - 1].first);
  return c[i - 1].second + t * (c[i].second - c[i - 1].second);
}

// The grid's value at `at` (parse_hardware checked it is full and sorted it by rows, in, out):
// trilinear in the logs of the three sizes between the grid values around each, flat beyond
// the grid's ends. The axes are read off the sorted points (point (i, j, k) is at
// (i n1 + j) n2 + k), so a lookup allocates nothing: the plan makes one per GEMM of a layout.
double grid_at(const std::vector<std::array<double, 4>>& grid, const std::array<double, 3>& at) {
  size_t n2 = 0, n12 = 0;
  while (n12 < grid.size() && grid[n12][0] == grid[0][0]) ++n12;
  while (n2 < n12 && grid[n2][1] == grid[0][1]) ++n2;
  const size_t count[3] = {grid.size() / n12, n12 / n2, n2};
  const size_t stride[3] = {n12, n2, 1};
  size_t lo[3], hi[3];
  double t[3];
  for (int d = 0; d < 3; ++d) {
    auto axis = [&](size_t i) { return grid[i * stride[d]][d]; };
    const double x = std::clamp(at[d], axis(0), axis(count[d] - 1));
    hi[d] = 0;
    while (hi[d] + 1 < count[d] && axis(hi[d]) < x) ++hi[d];
    lo[d] = hi[d] > 0 && axis(hi[d]) > x ? hi[d] - 1 : hi[d];
    t[d] = lo[d] == hi[d] ? 0.0 : std::log(x / axis(lo[d])) / std::log(axis(hi[d]) / axis(lo[d]));
  }
  double v = 0.0;
  for (int corner = 0; corner < 8; ++corner) {
    size_t index = 0;
    double w = 1.0;
    for (int d = 0; d < 3; ++d) {
      const bool upper = corner & (1 << d);
      index += (upper ? hi[d] : lo[d]) * stride[d];
      w *= upper ? t[d] : 1.0 - t[d];
    }
    v += w * grid[index][3];
  }
  return v;
}
}  // namespace

double HardwareSpec::gemm_efficiency(double rows, double in, double out,
                                     const std::string& precision) const {
  rows = std::max(rows, 1.0), in = std::max(in, 1.0), out = std::max(out, 1.0);
  if (precision == "bf16" && !device.gemm_efficiency_shapes_bf16.empty())
    return grid_at(device.gemm_efficiency_shapes_bf16, {rows, in, out});
  if (device.gemm_efficiency_shapes.empty())
    return curve_at(device.gemm_efficiency, std::cbrt(rows * in * out));
  return grid_at(device.gemm_efficiency_shapes, {rows, in, out});
}

namespace {
// Where the attention curves place (T, head size): the cube root of T T HS.
double attention_curve_size(double T, double HS) {
  return std::cbrt(std::max(T, 1.0) * std::max(T, 1.0) * std::max(HS, 1.0));
}
}  // namespace

double HardwareSpec::attention_efficiency(double T, double HS,
                                          const std::string& precision) const {
  const double size = attention_curve_size(T, HS);
  if (precision == "bf16" && !device.attention_efficiency_bf16.empty())
    return curve_at(device.attention_efficiency_bf16, size);
  if (device.attention_efficiency.empty()) return gemm_efficiency(T, HS, T, precision);
  return curve_at(device.attention_efficiency, size);
}

double HardwareSpec::attention_forward_share(double T, double HS,
                                             const std::string& precision) const {
  const double size = attention_curve_size(T, HS);
  const bool bf16_curve = precision == "bf16" && !device.attention_efficiency_bf16.empty();
  const auto& shares =
      bf16_curve ? device.attention_forward_share_bf16 : device.attention_forward_share;
  if (shares.empty()) return 1.0 / 3.0;
  return curve_at(shares, size);
}

double HardwareSpec::memory_bytes_per_s() const {
  return device.memory_bandwidth_gbs * 1e9 * device.memory_efficiency;
}

double HardwareSpec::optimizer_bytes_per_s(double parameters) const {
  if (device.optimizer_bandwidth_gbs.empty()) return memory_bytes_per_s();
  return curve_at(device.optimizer_bandwidth_gbs, std::max(parameters, 1.0)) * 1e9;
}

double measured_efficiency(double gflops, double peak_gflops) {
  return std::clamp(gflops / peak_gflops, 1e-3, 1.0);
}

std::vector<std::pair<double, double>> attention_curve(
    double peak_gflops, const std::vector<MeasuredAttention>& attention) {
  std::vector<std::pair<double, double>> curve;
  for (const MeasuredAttention& p : attention)
    curve.emplace_back(attention_curve_size(static_cast<double>(p.T),
                                            static_cast<double>(p.head_size)),
                       measured_efficiency(p.gflops, peak_gflops));
  return curve;
}

std::vector<std::pair<double, double>> attention_share_curve(
    const std::vector<MeasuredAttention>& attention) {
  std::vector<std::pair<double, double>> curve;
  for (const MeasuredAttention& p : attention) {
    if (!(p.forward_share > 0.0)) return {};
    curve.emplace_back(attention_curve_size(static_cast<double>(p.T),
                                            static_cast<double>(p.head_size)),
                       std::clamp(p.forward_share, 0.05, 0.95));
  }
  return curve;
}

void set_measured_curves(DeviceSpec& device, double peak_gflops,
                         const std::vector<MeasuredGemm>& training,
                         const std::vector<MeasuredAttention>& attention,
                         const std::vector<MeasuredOptimizer>& optimizer) {
  device.gemm_efficiency.clear();
  for (const MeasuredGemm& p : training)
    device.gemm_efficiency.emplace_back(p.size, measured_efficiency(p.gflops, peak_gflops));
  device.attention_efficiency = attention_curve(peak_gflops, attention);
  device.attention_forward_share = attention_share_curve(attention);
  device.optimizer_bandwidth_gbs.clear();
  for (const MeasuredOptimizer& p : optimizer)
    device.optimizer_bandwidth_gbs.emplace_back(static_cast<double>(p.parameters),
                                                p.bytes_per_s / 1e9);
}

double collective_seconds(const HardwareSpec& hw, const LinkSpec& link, Collective c, int64_t n,
                          double bytes) {
  if (c == Collective::SendRecv)
    return link.latency_us * 1e-6 + hw.collectives.send_recv * bytes / link.bytes_per_s();
  if (n <= 1 || bytes <= 0.0) return 0.0;
  const double share = static_cast<double>(n - 1) / static_cast<double>(n);
  double factor = hw.collectives.all_gather;
  if (c == Collective::AllReduce) factor = hw.collectives.all_reduce;
  if (c == Collective::ReduceScatter) factor = hw.collectives.reduce_scatter;
  // A ring runs factor * (n-1) steps, each one message latency.
  const double steps = factor * static_cast<double>(n - 1);
  return steps * link.latency_us * 1e-6 + factor * share * bytes / link.bytes_per_s();
}

double all_to_all_seconds(const HardwareSpec& hw, const LinkSpec& link, int64_t n, double bytes) {
  if (n <= 1 || bytes <= 0.0) return 0.0;
  const double share = static_cast<double>(n - 1) / static_cast<double>(n);
  return static_cast<double>(n - 1) * link.latency_us * 1e-6 +
         hw.collectives.send_recv * share * bytes / link.bytes_per_s();
}

std::string hardware_to_toml(const HardwareSpec& hw, const std::vector<std::string>& comment) {
  std::ostringstream o;
  // A comment line with a newline in it (a device's name) stays one line.
  for (const std::string& line : comment) o << "# " << printable_line(line) << "\n";
  // Six digits (measured figures), but whole numbers (sizes, parameter counts) exactly.
  auto num = [](double v) {
    char b[40];
    if (v == std::floor(v) && std::fabs(v) < 1e15)
      std::snprintf(b, sizeof b, "%.1f", v);
    else
      std::snprintf(b, sizeof b, "%.6g", v);
    std::string s = b;
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  };
  o << "name = " << config::toml_string(hw.name) << "\n";  // bench-hw --name: any text
  o << "devices_per_node = " << hw.devices_per_node << "\n\n[device]\n";
  o << "kind = \"" << hw.device.kind << "\"\n";
  o << "peak_tflops_fp32 = " << num(hw.device.peak_tflops_fp32) << "\n";
  o << "peak_tflops_bf16 = " << num(hw.device.peak_tflops_bf16) << "\n";
  if (hw.device.peak_tflops_fp8 > 0.0)
    o << "peak_tflops_fp8 = " << num(hw.device.peak_tflops_fp8) << "\n";
  auto curve = [&](const char* key, const std::vector<std::pair<double, double>>& c) {
    o << key << " = [";
    for (size_t i = 0; i < c.size(); ++i)
      o << (i ? ", " : "") << "[" << num(c[i].first) << ", " << num(c[i].second) << "]";
    o << "]\n";
  };
  curve("gemm_efficiency", hw.device.gemm_efficiency);
  auto grid = [&](const char* key, const std::vector<std::array<double, 4>>& g) {
    if (g.empty()) return;
    o << key << " = [";
    for (size_t i = 0; i < g.size(); ++i)
      o << (i ? ",\n  " : "\n  ") << "[" << num(g[i][0]) << ", " << num(g[i][1]) << ", "
        << num(g[i][2]) << ", " << num(g[i][3]) << "]";
    o << "]\n";
  };
  grid("gemm_efficiency_shapes", hw.device.gemm_efficiency_shapes);
  grid("gemm_efficiency_shapes_bf16", hw.device.gemm_efficiency_shapes_bf16);
  if (!hw.device.attention_efficiency.empty())
    curve("attention_efficiency", hw.device.attention_efficiency);
  if (!hw.device.attention_efficiency_bf16.empty())
    curve("attention_efficiency_bf16", hw.device.attention_efficiency_bf16);
  if (!hw.device.attention_forward_share.empty())
    curve("attention_forward_share", hw.device.attention_forward_share);
  if (!hw.device.attention_forward_share_bf16.empty())
    curve("attention_forward_share_bf16", hw.device.attention_forward_share_bf16);
  o << "memory_gib = " << num(hw.device.memory_gib) << "\n";
  o << "reserved_gib = " << num(hw.device.reserved_gib) << "\n";
  o << "memory_bandwidth_gbs = " << num(hw.device.memory_bandwidth_gbs) << "\n";
  if (hw.device.memory_efficiency != 1.0)
    o << "memory_efficiency = " << num(hw.device.memory_efficiency) << "\n";
  if (!hw.device.optimizer_bandwidth_gbs.empty())
    curve("optimizer_bandwidth_gbs", hw.device.optimizer_bandwidth_gbs);
  if (hw.device.host_link_gbs > 0.0)
    o << "host_link_gbs = " << num(hw.device.host_link_gbs) << "\n";
  auto link = [&](const char* name, const LinkSpec& l) {
    o << "\n[" << name << "]\nbandwidth_gbs = " << num(l.bandwidth_gbs)
      << "\nefficiency = " << num(l.efficiency) << "\nlatency_us = " << num(l.latency_us) << "\n";
  };
  link("intra_node", hw.intra_node);
  link("inter_node", hw.inter_node);
  o << "\n[collectives]\nall_reduce = " << num(hw.collectives.all_reduce)
    << "\nall_gather = " << num(hw.collectives.all_gather)
    << "\nreduce_scatter = " << num(hw.collectives.reduce_scatter)
    << "\nsend_recv = " << num(hw.collectives.send_recv) << "\n";
  if (hw.storage_write_gbs > 0.0)
    o << "\n[storage]\nwrite_gbs = " << num(hw.storage_write_gbs) << "\ndataset_ms = "
      << num(hw.storage_dataset_ms) << "\n";
  return o.str();
}

}  // namespace trident

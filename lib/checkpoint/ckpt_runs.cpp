#include "checkpoint/ckpt_runs.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "util/error.hpp"

namespace trident {

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("negative dimension in shape " + shape_string(shape));
    if (d != 0 && n > INT64_MAX / d) throw Error("shape " + shape_string(shape) + " overflows");
    n *= d;
  }
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ']';
  return s.str();
}

namespace {

// Boxes of flat range [b, e) of the sub-array of dims d.. whose outer coordinates (dims < d)
// are prefix; inner[d] = product of shape[d+1..].
void decompose(const std::vector<int64_t>& shape, const std::vector<int64_t>& inner, size_t d,
               std::vector<int64_t>& prefix, int64_t b, int64_t e, std::vector<Box>& out) {
  if (b >= e) return;
  const int64_t in = inner[d];
  auto block = [&](int64_t first_row, int64_t rows) {
    Box box;
    box.start = prefix;
    box.count.assign(d, 1);
    box.start.push_back(first_row);
    box.count.push_back(rows);
    for (size_t k = d + 1; k < shape.size(); ++k) {
      box.start.push_back(0);
      box.count.push_back(shape[k]);
    }
    out.push_back(std::move(box));
  };
  auto partial = [&](int64_t row, int64_t pb, int64_t pe) {
    prefix.push_back(row);
    decompose(shape, inner, d + 1, prefix, pb, pe, out);
    prefix.pop_back();
  };
  int64_t first = b / in, off_b = b % in;
  const int64_t last = (e - 1) / in, off_e = e - last * in;  // off_e in (0, in]
  if (first == last) {
    if (off_b == 0 && off_e == in) block(first, 1);
    else partial(first, off_b, off_e);
    return;
  }
  if (off_b != 0) {
    partial(first, off_b, in);
    ++first;
  }
  const int64_t full_end = off_e == in ? last + 1 : last;
  if (full_end > first) block(first, full_end - first);
  if (off_e != in) partial(last, 0, off_e);
}

// a and b differ in exactly one dim d, where b directly follows a; identical elsewhere.
bool merge_into(Box& a, const Box& b) {
  int diff = -1;
  for (size_t k = 0; k < a.start.size(); ++k) {
    if (a.start[k] == b.start[k] && a.count[k] == b.count[k]) continue;
    if (diff >= 0) return false;
    diff = static_cast<int>(k);
  }
  if (diff < 0) return false;  // identical boxes never occur for disjoint runs
  if (b.start[diff] != a.start[diff] + a.count[diff]) return false;
  a.count[diff] += b.count[diff];
  return true;
}

std::string run_string(const Run& r) {
  std::ostringstream s;
  s << "{local " << r.local_offset << ", global " << r.global_offset << ", length " << r.length
    << '}';
  return s.str();
}

}  // namespace

std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin,
                                  int64_t length) {
  const int64_t numel = shape_numel(shape);
  if (shape.empty() || begin < 0 || length < 0 || begin > numel - length) {
    std::ostringstream m;
    m << "flat range [" << begin << ", " << begin + length << ") outside shape "
      << shape_string(shape);
    throw Error(m.str());
  }
  std::vector<Box> out;
  if (length == 0) return out;
  std::vector<int64_t> inner(shape.size(), 1);
  for (size_t d = shape.size() - 1; d > 0; --d) inner[d - 1] = inner[d] * shape[d];
  std::vector<int64_t> prefix;
  decompose(shape, inner, 0, prefix, begin, begin + length, out);
  return out;
}

std::vector<Box> runs_to_boxes(const std::vector<int64_t>& shape, const std::vector<Run>& runs) {
  std::vector<Box> out;
  for (const Run& r : runs) {
    for (Box& b : flat_range_boxes(shape, r.global_offset, r.length)) {
      out.push_back(std::move(b));
      // Merge the new box into its predecessor, then that one into its own, as far as it goes
      // (the boxes of rows of a column block merge, then the blocks of a 3-D slab).
      while (out.size() >= 2 && merge_into(out[out.size() - 2], out.back())) out.pop_back();
    }
  }
  return out;
}

std::string normalize_runs(std::vector<Run>& runs, int64_t numel, int64_t local_size,
                           bool local_disjoint) {
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    std::ostringstream m;
    if (r.local_offset < 0 || r.global_offset < 0 || r.length < 0) {
      m << "run " << i << ' ' << run_string(r) << " has a negative offset or length";
    } else if (r.global_offset > numel - r.length) {
      m << "run " << i << ' ' << run_string(r) << " goes past the dataset's " << numel
        << " elements";
    } else if (r.local_offset > local_size - r.length) {
      m << "run " << i << ' ' << run_string(r) << " goes past the local buffer's " << local_size
        << " elements";
    }
    if (!m.str().empty()) return m.str();
  }
  std::erase_if(runs, [](const Run& r) { return r.length == 0; });
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return a.global_offset < b.global_offset; });
  for (size_t i = 1; i < runs.size(); ++i) {
    if (runs[i].global_offset < runs[i - 1].global_offset + runs[i - 1].length) {
      return "runs " + run_string(runs[i - 1]) + " and " + run_string(runs[i]) +
             " overlap in the dataset";
    }
  }
  if (local_disjoint && runs.size() > 1) {
    std::vector<Run> by_local = runs;
    std::sort(by_local.begin(), by_local.end(),
              [](const Run& a, const Run& b) { return a.local_offset < b.local_offset; });
    for (size_t i = 1; i < by_local.size(); ++i) {
      if (by_local[i].local_offset < by_local[i - 1].local_offset + by_local[i - 1].length) {
        return "runs " + run_string(by_local[i - 1]) + " and " + run_string(by_local[i]) +
               " overlap in the local buffer";
      }
    }
  }
  std::vector<Run> merged;
  merged.reserve(runs.size());
  for (const Run& r : runs) {
    if (!merged.empty()) {
      Run& p = merged.back();
      if (p.global_offset + p.length == r.global_offset &&
          p.local_offset + p.length == r.local_offset) {
        p.length += r.length;
        continue;
      }
    }
    merged.push_back(r);
  }
  runs = std::move(merged);
  return "";
}

int64_t runs_length(const std::vector<Run>& runs) {
  int64_t n = 0;
  for (const Run& r : runs) n += r.length;
  return n;
}

std::string runs_subset(const std::vector<Run>& inner, const std::vector<Run>& outer) {
  for (const Run& r : inner) {
    if (r.length < 0) return "run " + run_string(r) + " has a negative length";
    int64_t g = r.global_offset, l = r.local_offset, left = r.length;
    while (left > 0) {
      // The outer run containing global element g (outer is sorted and disjoint).
      auto it = std::upper_bound(outer.begin(), outer.end(), g,
                                 [](int64_t x, const Run& o) { return x < o.global_offset; });
      bool ok = it != outer.begin();
      if (ok) {
        --it;
        ok = g < it->global_offset + it->length &&
             l - it->local_offset == g - it->global_offset;
      }
      if (!ok) {
        return "counted run " + run_string(r) +
               " covers elements that are not read to the same local positions";
      }
      const int64_t n = std::min(left, it->global_offset + it->length - g);
      g += n;
      l += n;
      left -= n;
    }
  }
  return "";
}

uint64_t checksum_range(const float* values, int64_t global_offset, int64_t n) {
  uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n > (int64_t{1} << 20))
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    sum += checksum_element(global_offset + i, bits);
  }
  return sum;
}

uint64_t checksum_runs(std::span<const float> local, const std::vector<Run>& runs) {
  uint64_t sum = 0;
  for (const Run& r : runs) sum += checksum_range(local.data() + r.local_offset, r.global_offset, r.length);
  return sum;
}

namespace {

// Index of the first element of values[0, n) that fails `check` (n if none).
int64_t first_failing(const float* values, int64_t n, ValueCheck check) {
  if (check == ValueCheck::Any) return n;
  const bool non_negative = check == ValueCheck::FiniteNonNegative;
  int64_t first = n;
#pragma omp parallel for reduction(min : first) schedule(static) if (n > (int64_t{1} << 20))
  for (int64_t i = 0; i < n; ++i) {
    const float v = values[i];
    if (!std::isfinite(v) || (non_negative && v < 0.0f)) first = std::min(first, i);
  }
  return first;
}

std::string describe_failure(float v, int64_t global_index) {
  std::ostringstream out;
  out << "holds ";
  if (std::isnan(v)) {
    out << "nan";
  } else if (std::isinf(v)) {
    out << (v < 0 ? "-inf" : "inf");
  } else {
    out.precision(9);
    out << v;
  }
  out << " at element " << global_index;
  if (std::isfinite(v)) out << " (must be >= 0)";
  return out.str();
}

}  // namespace

std::string check_values(const float* values, int64_t global_offset, int64_t n,
                         ValueCheck check) {
  const int64_t i = first_failing(values, n, check);
  return i == n ? "" : describe_failure(values[i], global_offset + i);
}

std::string check_values_runs(std::span<const float> local, const std::vector<Run>& runs,
                              ValueCheck check) {
  // The failing element of lowest global index, whatever the order of the runs.
  int64_t best = -1;
  float value = 0;
  for (const Run& r : runs) {
    const int64_t i = first_failing(local.data() + r.local_offset, r.length, check);
    if (i < r.length && (best < 0 || r.global_offset + i < best)) {
      best = r.global_offset + i;
      value = local[static_cast<size_t>(r.local_offset + i)];
    }
  }
  return best < 0 ? "" : describe_failure(value, best);
}

}  // namespace trident

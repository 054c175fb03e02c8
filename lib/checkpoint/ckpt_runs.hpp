#pragma once
// Runs: how a rank's local buffer maps onto a checkpoint dataset's global row-major flat index
// space, the N-D boxes (hyperslabs) a run covers, and the order-independent checksum.
// Pure functions without MPI or HDF5 (tests/test_checkpoint_commit.cpp tests them).
// docs/checkpoint-format.md specifies the checksum so tools outside Trident can recompute it.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace trident {

// local[local_offset .. +length) holds global flat elements [global_offset .. +length) of a
// dataset (row-major over the dataset's global shape).
struct Run {
  int64_t local_offset = 0;
  int64_t global_offset = 0;
  int64_t length = 0;
  bool operator==(const Run&) const = default;
};

// An N-D box of a row-major array: elements start[d] .. start[d] + count[d] - 1 in every dim d.
struct Box {
  std::vector<int64_t> start;
  std::vector<int64_t> count;
  bool operator==(const Box&) const = default;
};

// Product of the dims (1 for rank 0). Throws trident::Error on a negative dim or on overflow.
int64_t shape_numel(const std::vector<int64_t>& shape);
std::string shape_string(const std::vector<int64_t>& shape);  // "[37, 10]"

// The boxes covering global flat elements [begin, begin + length) of an array of `shape`
// (rank >= 1), in increasing order: at most 2 * rank - 1 boxes (2-D: partial first row, block
// of full rows, partial last row). The range must lie inside the array.
std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin,
                                  int64_t length);

// The boxes of several runs, sorted by global offset and disjoint (normalize_runs' output),
// with boxes adjacent along one dim merged (a column block split by rows over many runs
// becomes one box). Their union is exactly the runs' elements.
std::vector<Box> runs_to_boxes(const std::vector<int64_t>& shape, const std::vector<Run>& runs);

// Checks `runs` against a dataset of `numel` elements and a local buffer of `local_size`
// elements and brings them to canonical form: empty runs dropped, sorted by global offset,
// runs adjacent in both spaces merged. Returns "" if valid, else what is wrong (one line).
// Invalid: negative offset or length, a run outside the dataset or the local buffer, two runs
// overlapping in the global space, and (local_disjoint, for reads) in the local space.
std::string normalize_runs(std::vector<Run>& runs, int64_t numel, int64_t local_size,
                           bool local_disjoint);

// Sum of the run lengths.
int64_t runs_length(const std::vector<Run>& runs);

// "" if every element of `inner` (runs over the same local buffer) is also an element of
// `outer` (normalized) at the same local position; else what is wrong.
std::string runs_subset(const std::vector<Run>& inner, const std::vector<Run>& outer);

// ---- checksum: sum over a dataset's elements, mod 2^64, of
//   mix64(uint64(global_index) * 0x9E3779B97F4A7C15 ^ uint64(bits of the float32 value)),
// mix64 being SplitMix64's finalizer. A sum, so ranks add up the parts they own in any order.
inline uint64_t checksum_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t checksum_element(int64_t global_index, uint32_t float_bits) {
  return checksum_mix64(static_cast<uint64_t>(global_index) * 0x9E3779B97F4A7C15ull ^
                        static_cast<uint64_t>(float_bits));
}
// Partial checksum of the elements the runs cover (values read from `local`).
uint64_t checksum_runs(std::span<const float> local, const std::vector<Run>& runs);
// Partial checksum of global elements [global_offset, +n) holding values[0, n).
uint64_t checksum_range(const float* values, int64_t global_offset, int64_t n);

// ---- value checks: what a reader requires of the values it reads, besides the checksum.
enum class ValueCheck {
  Any,                // nothing
  Finite,             // no NaN or infinity
  FiniteNonNegative,  // and no negative value (-0.0 is allowed)
};
// "" if values[0, n) (global elements [global_offset, +n)) pass `check`, else what the first
// offending element is: "holds nan at element 123" / "holds -0.5 at element 7 (must be >= 0)".
std::string check_values(const float* values, int64_t global_offset, int64_t n,
                         ValueCheck check);
// The same for the elements the runs cover (values read from `local`).
std::string check_values_runs(std::span<const float> local, const std::vector<Run>& runs,
                              ValueCheck check);

}  // namespace trident

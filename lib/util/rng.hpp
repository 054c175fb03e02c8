#pragma once
// Counter-based random numbers: a value is a pure function of (key, index), so any rank can
// generate exactly its shard of a tensor and every parallel layout starts from the same weights.
#include <cmath>
#include <cstdint>
#include <string_view>

namespace trident {

// SplitMix64's output function: a bijective 64-bit mixer with good avalanche.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// FNV-1a of a name, mixed with the seed: the key of one tensor's random stream.
constexpr uint64_t stream_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ULL;
  return mix64(h ^ mix64(seed + 0x9E3779B97F4A7C15ULL));
}

// Uniform in (0, 1), never exactly 0 (safe for log).
constexpr double uniform01(uint64_t key, uint64_t counter) {
  uint64_t bits = mix64(key ^ mix64(counter * 0x9E3779B97F4A7C15ULL + 0xD1B54A32D192ED03ULL));
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal for element `index` of the stream `key` (Box-Muller on two counters).
inline double normal01(uint64_t key, uint64_t index) {
  const double u1 = uniform01(key, 2 * index);
  const double u2 = uniform01(key, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace trident

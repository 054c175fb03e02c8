#pragma once
// Vectors for the kernel tests: uniform random fill, a bit-for-bit comparison, and the document
// starts of packed sequences.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace trident::test {

template <typename T>
std::vector<T> random_vec(std::mt19937_64& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(u(rng));
  return v;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

// n token ids below vocab, a fixed pattern per salt (no generator: the same on every platform).
inline std::vector<int32_t> token_sequence(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7 + salt * 3 + i * i) % vocab);
  return v;
}

// Packed documents: each row's document start (model/documents.hpp's doc_start) of sequences
// cut into documents of the given lengths, one list per sequence (each summing to its length).
inline std::vector<int32_t> document_starts_of(const std::vector<std::vector<int32_t>>& lengths) {
  std::vector<int32_t> starts;
  for (const auto& sequence : lengths) {
    int32_t first = 0;
    for (int32_t len : sequence) {
      starts.insert(starts.end(), static_cast<size_t>(len), first);
      first += len;
    }
  }
  return starts;
}

}  // namespace trident::test

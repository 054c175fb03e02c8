#pragma once
// Vectors for the kernel tests: uniform random fill and a bit-for-bit comparison.
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

}  // namespace trident::test

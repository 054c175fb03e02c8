#pragma once
// The context-parallel attention tests' simulated ring (the CPU and the GPU kernels'): the shape
// of N context ranks' rows, and rank i's rows taken from and put back into the whole sequence,
// in model/context_parallel.hpp's chunk layout.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace trident::test {

struct RingShape {
  int64_t B, T, N, NH, KVH, HS;
  int64_t Tc() const { return T / (2 * N); }
  int64_t Tl() const { return 2 * Tc(); }
  int64_t CQ() const { return (NH + 2 * KVH) * HS; }
  int64_t C() const { return NH * HS; }
  int64_t KVC() const { return 2 * KVH * HS; }
  // The position in the sequence of rank i's local row r: chunk i, then chunk 2N-1-i.
  int64_t global_row(int64_t i, int64_t r) const {
    const int64_t chunk = r < Tc() ? i : 2 * N - 1 - i;
    return chunk * Tc() + r % Tc();
  }
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " N=" + std::to_string(N) +
           " NH=" + std::to_string(NH) + " KVH=" + std::to_string(KVH) +
           " HS=" + std::to_string(HS);
  }
};

// Rows [B, T, width] -> rank i's rows [B, Tl, width].
template <typename F>
std::vector<F> to_local(const std::vector<F>& global, const RingShape& s, int64_t i,
                        int64_t width) {
  std::vector<F> local(s.B * s.Tl() * width);
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t r = 0; r < s.Tl(); r++)
      std::copy_n(global.begin() + (b * s.T + s.global_row(i, r)) * width, width,
                  local.begin() + (b * s.Tl() + r) * width);
  return local;
}

// Rank i's rows back into the global [B, T, width].
template <typename F>
void from_local(std::vector<F>& global, const std::vector<F>& local, const RingShape& s,
                int64_t i, int64_t width) {
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t r = 0; r < s.Tl(); r++)
      std::copy_n(local.begin() + (b * s.Tl() + r) * width, width,
                  global.begin() + (b * s.T + s.global_row(i, r)) * width);
}

// lse [B, NH, Tl] of rank i into the global [B, NH, T].
template <typename F>
void lse_from_local(std::vector<F>& global, const std::vector<F>& local, const RingShape& s,
                    int64_t i) {
  for (int64_t bh = 0; bh < s.B * s.NH; bh++)
    for (int64_t r = 0; r < s.Tl(); r++)
      global[bh * s.T + s.global_row(i, r)] = local[bh * s.Tl() + r];
}

// Rank i's query rows and the keys of rank j's block they see (j != i): j < i, both chunks of i
// follow chunk j and precede chunk 2N-1-j, so all local rows see keys [0, Tc); j > i, chunk i
// precedes both chunks of j and chunk 2N-1-i follows both, so rows [Tc, Tl) see all of them.
struct BlockPair {
  int64_t q0, Tq, k0, Tk;
};
inline BlockPair block_pair(const RingShape& s, int64_t i, int64_t j) {
  if (j < i) return {0, s.Tl(), 0, s.Tc()};
  return {s.Tc(), s.Tc(), 0, s.Tl()};
}

}  // namespace trident::test

#pragma once
// Host-side bfloat16 <-> float conversion, bit for bit what the GPU does (__float2bfloat16_rn):
// bf16 is the upper 16 bits of an IEEE float. Host code needs it wherever bf16 data is touched
// without a GPU: the MPI reduction operators on BF16 buffers (comm/mpi_comm.cpp), tests that
// build bf16 inputs or check bf16 results, and checkpoint conversion.
//
//   float_to_bf16: round to nearest, ties to even (not truncation, which biases every sum
//                  downwards); overflow rounds to +-inf like any IEEE rounding; NaN stays NaN
//                  (quieted, sign kept), never turned into inf by the rounding carry.
//   bf16_to_float: exact (every bf16 value is a float).
//
// Header-only and free of C++20 library features (memcpy rather than std::bit_cast) so that it
// also compiles in C++17 CUDA translation units.
#include <cstdint>
#include <cstring>

namespace trident {

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign and the top payload bits, force the quiet bit so that a payload living
    // only in the dropped low bits cannot turn the result into an infinity.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace trident

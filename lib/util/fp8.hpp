#pragma once
// Host-side 8-bit floating point (OCP OFP8 v1.0, the formats of NVIDIA Hopper's FP8 tensor
// cores, cuda_fp8.h's __nv_fp8_e4m3 / __nv_fp8_e5m2) <-> float, bit for bit what the GPU's
// saturating conversion does (__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)): the CPU reference
// of train.precision = "fp8" quantises with these.
//
//   E4M3 (sign, 4 exponent bits with bias 7, 3 mantissa bits): no infinities; S.1111.111 is
//        NaN; largest finite 448 (S.1111.110); smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2 (sign, 5 exponent bits with bias 15, 2 mantissa bits): IEEE-like, S.11111.00 is
//        infinity and S.11111.xx (xx != 0) NaN; largest finite 57344; smallest normal 2^-14,
//        smallest subnormal 2^-16.
//
//   float_to_fp8: round to nearest, ties to even, subnormals included; saturating: anything
//                 beyond the largest finite value (infinities too) becomes +-that value, so a
//                 scaled tensor never turns into infinities or NaN by overflowing; NaN becomes
//                 the canonical NaN 0x7F (sign dropped); -0 stays -0 (0x80).
//   fp8_to_float: exact (every fp8 value is a float).
//   fp8_round:    the two in one for float, on the float's bits (the quantiser's fast path).
//
// Header-only and C++17 (cmath, no bit_cast), like util/bf16.hpp.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace trident {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

struct Fp8Spec {
  int mantissa_bits;
  int exponent_bias;
  int min_exponent;   // of the normal values: 1 - bias
  float max_finite;
  uint8_t max_code;   // the largest finite value's code (positive)
};

inline Fp8Spec fp8_spec(Fp8Format format) {
  return format == Fp8Format::E4M3 ? Fp8Spec{3, 7, -6, 448.0f, 0x7E}
                                   : Fp8Spec{2, 15, -14, 57344.0f, 0x7B};
}

inline const char* fp8_name(Fp8Format format) {
  return format == Fp8Format::E4M3 ? "e4m3" : "e5m2";
}

constexpr uint8_t kFp8NaN = 0x7F;

// The per-tensor scale of FP8 training (model/fp8_scaling.hpp): max_finite / amax / 2^margin,
// so that the tensor's largest magnitude lands 2^margin below the format's largest value; an
// amax of 0, not finite, or so small that the scale overflows keeps `previous`.
inline float fp8_scale(float amax, float previous, Fp8Format format, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  const float scale = fp8_spec(format).max_finite / amax / std::ldexp(1.0f, margin);
  return std::isfinite(scale) ? scale : previous;  // a subnormal amax would overflow it
}

// A tensor's FP8 scale as a kernel set takes it (model/fp8_linear.hpp): `value` where the host
// knows it (the delayed recipe's), or `device`, where the kernel set formed it in its own
// memory (the current recipe's: no wait for the amax), `value` then unused.
struct Fp8Scale {
  float value = 1.0f;
  const float* device = nullptr;
  float get() const { return device ? *device : value; }  // where device is host memory
};

// The factor an FP8 GEMM multiplies its product by: 1 / (a b) of its operands' scales, formed
// where they are (the same expression, 1.0f / (a * b), on the host or in the kernel set's
// memory).
struct Fp8Dequant {
  Fp8Scale a, b;
  bool on_device() const { return a.device != nullptr; }
  float get() const { return 1.0f / (a.get() * b.get()); }  // where device is host memory
};

inline uint8_t float_to_fp8(float x, Fp8Format format) {
  const Fp8Spec s = fp8_spec(format);
  if (std::isnan(x)) return kFp8NaN;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a == 0.0f) return sign;
  if (!(a <= s.max_finite)) return static_cast<uint8_t>(sign | s.max_code);  // saturate
  // a in [2^e, 2^(e+1)); below the normal range the spacing stays that of the smallest binade.
  int e = 0;
  std::frexp(a, &e);
  e -= 1;
  if (e < s.min_exponent) e = s.min_exponent;
  // Units of the spacing 2^(e - m): the division by a power of two is exact, nearbyint rounds
  // to nearest even (the default rounding mode), and the product is exact again.
  const float units = std::nearbyint(std::ldexp(a, s.mantissa_bits - e));
  const float r = std::ldexp(units, e - s.mantissa_bits);
  if (r > s.max_finite) return static_cast<uint8_t>(sign | s.max_code);
  if (r == 0.0f) return sign;
  int e2 = 0;
  std::frexp(r, &e2);
  e2 -= 1;
  if (e2 < s.min_exponent)  // subnormal: exponent field 0, the mantissa counts 2^(emin - m)
    return static_cast<uint8_t>(sign | static_cast<int>(units));
  const int mantissa =
      static_cast<int>(std::ldexp(r, s.mantissa_bits - e2)) - (1 << s.mantissa_bits);
  return static_cast<uint8_t>(sign | ((e2 + s.exponent_bias) << s.mantissa_bits) | mantissa);
}

inline float fp8_to_float(uint8_t code, Fp8Format format) {
  const Fp8Spec s = fp8_spec(format);
  const int m = s.mantissa_bits;
  const int bits = code & 0x7F;
  const int exponent = bits >> m, mantissa = bits & ((1 << m) - 1);
  float v;
  if (format == Fp8Format::E4M3 && bits == 0x7F) return std::nanf("");
  if (format == Fp8Format::E5M2 && exponent == 31) {
    if (mantissa != 0) return std::nanf("");
    v = INFINITY;
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), s.min_exponent - m);
  } else {
    v = std::ldexp(static_cast<float>(mantissa + (1 << m)), exponent - s.exponent_bias - m);
  }
  return (code & 0x80) ? -v : v;
}

// fp8_to_float(float_to_fp8(x * 1, format)) without the codes, for float: the value of the FP8
// grid nearest x (ties to even), saturated at +-the largest finite value, NaN for NaN. The
// quantiser's fast path: adding C = 2^(e - m + 23), whose float ulp is the grid's spacing
// 2^(e - m) around x, makes the FPU round x to that spacing (ties to even), and subtracting C
// is exact.
inline float fp8_round(float x, Fp8Format format) {
  const Fp8Spec s = fp8_spec(format);
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return x;  // NaN
  float a;
  std::memcpy(&a, &mag, sizeof a);
  if (a > s.max_finite) return sign ? -s.max_finite : s.max_finite;  // saturate (infinities too)
  int e = static_cast<int>(mag >> 23) - 127;  // float subnormals: -127, below every fp8 binade
  if (e < s.min_exponent) e = s.min_exponent;
  const uint32_t c_bits = static_cast<uint32_t>(e - s.mantissa_bits + 23 + 127) << 23;
  float c;
  std::memcpy(&c, &c_bits, sizeof c);
  float r = (a + c) - c;  // (IEEE arithmetic: the compiler may not fold it without fast-math)
  if (r > s.max_finite) r = s.max_finite;
  uint32_t r_bits;
  std::memcpy(&r_bits, &r, sizeof r_bits);
  r_bits |= sign;
  std::memcpy(&r, &r_bits, sizeof r);
  return r;
}

}  // namespace trident

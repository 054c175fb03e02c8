// util/fp8.hpp: every code of both formats decoded and encoded back, the OCP table's values,
// round-to-nearest-even at every midpoint, subnormals, saturation and NaN. The independent
// check against ml_dtypes' float8 types is tests/tools/test_fp8_reference.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "util/fp8.hpp"

using namespace trident;

namespace {

const Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};

bool is_nan_code(uint8_t c, Fp8Format f) {
  const int bits = c & 0x7F;
  return f == Fp8Format::E4M3 ? bits == 0x7F : (bits >> 2) == 31 && (bits & 3) != 0;
}
bool is_inf_code(uint8_t c, Fp8Format f) { return f == Fp8Format::E5M2 && (c & 0x7F) == 0x7C; }

TEST(Fp8, EveryCodeDecodesAndEncodesBack) {
  for (Fp8Format f : kFormats) {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      const float v = fp8_to_float(code, f);
      if (is_nan_code(code, f)) {
        EXPECT_TRUE(std::isnan(v)) << fp8_name(f) << " " << c;
        EXPECT_EQ(float_to_fp8(v, f), kFp8NaN) << fp8_name(f) << " " << c;
      } else if (is_inf_code(code, f)) {
        EXPECT_TRUE(std::isinf(v)) << c;
        EXPECT_EQ(float_to_fp8(v, f), (code & 0x80) | 0x7B) << "infinity saturates";
      } else {
        EXPECT_TRUE(std::isfinite(v)) << fp8_name(f) << " " << c;
        EXPECT_EQ(float_to_fp8(v, f), code) << fp8_name(f) << " " << c << " = " << v;
        ++finite;
      }
    }
    EXPECT_EQ(finite, f == Fp8Format::E4M3 ? 254 : 248) << fp8_name(f);
  }
}

TEST(Fp8, TheFormatsTable) {
  struct Row {
    Fp8Format f;
    uint8_t code;
    float value;
  };
  const Row rows[] = {
      {Fp8Format::E4M3, 0x00, 0.0f},       {Fp8Format::E4M3, 0x80, -0.0f},
      {Fp8Format::E4M3, 0x01, 0.001953125f},  // 2^-9, smallest subnormal
      {Fp8Format::E4M3, 0x07, 0.013671875f},  // 7 * 2^-9, largest subnormal
      {Fp8Format::E4M3, 0x08, 0.015625f},     // 2^-6, smallest normal
      {Fp8Format::E4M3, 0x38, 1.0f},       {Fp8Format::E4M3, 0x39, 1.125f},
      {Fp8Format::E4M3, 0x7E, 448.0f},     {Fp8Format::E4M3, 0xFE, -448.0f},
      {Fp8Format::E4M3, 0x78, 256.0f},     {Fp8Format::E4M3, 0xB8, -1.0f},
      {Fp8Format::E5M2, 0x01, 1.52587890625e-05f},  // 2^-16
      {Fp8Format::E5M2, 0x03, 4.57763671875e-05f},  // 3 * 2^-16
      {Fp8Format::E5M2, 0x04, 6.103515625e-05f},    // 2^-14
      {Fp8Format::E5M2, 0x3C, 1.0f},       {Fp8Format::E5M2, 0x3D, 1.25f},
      {Fp8Format::E5M2, 0x7B, 57344.0f},   {Fp8Format::E5M2, 0xFB, -57344.0f},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(fp8_to_float(r.code, r.f), r.value) << fp8_name(r.f) << " " << int(r.code);
    EXPECT_EQ(std::signbit(fp8_to_float(r.code, r.f)), std::signbit(r.value));
    EXPECT_EQ(float_to_fp8(r.value, r.f), r.code) << fp8_name(r.f) << " " << r.value;
  }
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7F, Fp8Format::E4M3)));
  EXPECT_TRUE(std::isnan(fp8_to_float(0xFF, Fp8Format::E4M3)));
  EXPECT_EQ(fp8_to_float(0x7C, Fp8Format::E5M2), INFINITY);
  EXPECT_EQ(fp8_to_float(0xFC, Fp8Format::E5M2), -INFINITY);
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF})
    EXPECT_TRUE(std::isnan(fp8_to_float(static_cast<uint8_t>(c), Fp8Format::E5M2))) << c;
}

// Between every two neighbouring finite values of the same sign: the midpoint goes to the code
// with the even mantissa, a float either side of it to the nearer neighbour.
TEST(Fp8, RoundsToNearestEvenAtEveryMidpoint) {
  for (Fp8Format f : kFormats) {
    const uint8_t max = fp8_spec(f).max_code;
    int checked = 0;
    for (int sign : {0x00, 0x80}) {
      for (int c = 0; c < max; ++c) {
        const uint8_t lo = static_cast<uint8_t>(sign | c), hi = static_cast<uint8_t>(sign | (c + 1));
        const float a = fp8_to_float(lo, f), b = fp8_to_float(hi, f);
        const float mid = (a + b) / 2;  // exact: fp8 values have few significant bits
        const uint8_t even = (c & 1) == 0 ? lo : hi;
        EXPECT_EQ(float_to_fp8(mid, f), even) << fp8_name(f) << " between " << a << " and " << b;
        EXPECT_EQ(float_to_fp8(std::nextafter(mid, a), f), lo) << fp8_name(f) << " " << a;
        EXPECT_EQ(float_to_fp8(std::nextafter(mid, b), f), hi) << fp8_name(f) << " " << b;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 2 * max) << fp8_name(f);
  }
}

TEST(Fp8, SaturatesUnderflowsAndKeepsNaN) {
  for (Fp8Format f : kFormats) {
    const Fp8Spec s = fp8_spec(f);
    for (float big : {std::nextafter(s.max_finite, INFINITY), s.max_finite * 1.0625f,
                      s.max_finite * 1.2f, 1e30f, std::numeric_limits<float>::max(), INFINITY}) {
      EXPECT_EQ(float_to_fp8(big, f), s.max_code) << fp8_name(f) << " " << big;
      EXPECT_EQ(float_to_fp8(-big, f), 0x80 | s.max_code) << fp8_name(f) << " " << -big;
    }
    const float tiny = fp8_to_float(0x01, f);  // smallest subnormal
    EXPECT_EQ(float_to_fp8(tiny / 2, f), 0x00) << "half the smallest subnormal ties to 0 (even)";
    EXPECT_EQ(float_to_fp8(-tiny / 2, f), 0x80);
    EXPECT_EQ(float_to_fp8(std::nextafter(tiny / 2, 1.0f), f), 0x01);
    EXPECT_EQ(float_to_fp8(tiny * 1.5f, f), 0x02) << "1.5 units ties to 2 (even)";
    EXPECT_EQ(float_to_fp8(std::numeric_limits<float>::denorm_min(), f), 0x00);
    EXPECT_EQ(float_to_fp8(std::nanf(""), f), kFp8NaN);
    EXPECT_EQ(float_to_fp8(-std::nanf(""), f), kFp8NaN);
  }
}

// The quantiser's fast path against the codes, over every 61st float bit pattern (70 million
// values: every binade, subnormals, infinities and NaNs) and both formats.
TEST(Fp8, RoundIsTheCodesValueForEveryFloat) {
  for (Fp8Format f : kFormats) {
    int64_t checked = 0, differ = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 61) {
      const uint32_t b32 = static_cast<uint32_t>(bits);
      float x;
      std::memcpy(&x, &b32, sizeof x);
      const float want = fp8_to_float(float_to_fp8(x, f), f);
      const float got = fp8_round(x, f);
      const bool same = std::isnan(want) ? std::isnan(got)
                                         : (got == want && std::signbit(got) == std::signbit(want));
      if (!same && differ++ < 5)
        ADD_FAILURE() << fp8_name(f) << " " << x << ": round " << got << ", code " << want;
      ++checked;
    }
    EXPECT_EQ(differ, 0) << fp8_name(f);
    EXPECT_GT(checked, 70000000) << fp8_name(f);
  }
}

}  // namespace

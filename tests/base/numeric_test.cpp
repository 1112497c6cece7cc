// Scalar conversions: fp8 e4m3fn decoding of all 256 codes, bf16 and f16 both ways, checked against independent
// arithmetic in double precision and hand-computed bit patterns.
#include "base/numeric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kestrel {
namespace {

// e4m3fn by the OCP FP8 definition, evaluated with pow in double: bias 7, subnormals at exponent 0, and only
// S.1111.111 is NaN (the all-ones exponent otherwise holds normal numbers up to 448).
double e4m3_reference(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude =
      exponent == 0 ? std::pow(2.0, -6) * (mantissa / 8.0) : std::pow(2.0, exponent - 7) * (1.0 + mantissa / 8.0);
  return sign ? -magnitude : magnitude;
}

TEST(NumericTest, Fp8E4m3AllCodesMatchReference) {
  for (int code = 0; code < 256; ++code) {
    const double expected = e4m3_reference(static_cast<uint8_t>(code));
    const float actual = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << "code " << code;
    } else {
      EXPECT_EQ(static_cast<double>(actual), expected) << "code " << code;
      EXPECT_EQ(std::signbit(actual), code >= 0x80) << "code " << code;
    }
  }
}

TEST(NumericTest, Fp8E4m3KnownValues) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal, 2^-9
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 0.013671875f);  // largest subnormal, 7 * 2^-9
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0.015625f);     // smallest normal, 2^-6
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xc0), -2.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);  // the maximum
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
}

// The code nearest to `value` by brute force over the finite codes, ties to the even code (mantissa bit 0 clear),
// saturating at ±448: what the encoder must give.
uint8_t e4m3_nearest(double value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::fabs(value);
  uint8_t best = 0;
  for (int code = 1; code < 0x7f; ++code) {
    const double distance = std::fabs(e4m3_reference(static_cast<uint8_t>(code)) - magnitude);
    const double best_distance = std::fabs(e4m3_reference(best) - magnitude);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) best = static_cast<uint8_t>(code);
  }
  return static_cast<uint8_t>(sign | best);
}

// f32_to_fp8_e4m3 against the brute-force nearest code: every code itself, every midpoint between neighbours (the
// ties), points just either side of them, and the saturating and NaN cases.
TEST(NumericTest, Fp8E4m3EncodingRoundsToNearestEven) {
  std::vector<float> values;
  for (int code = 0; code < 0x7e; ++code) {
    const double low = e4m3_reference(static_cast<uint8_t>(code));
    const double high = e4m3_reference(static_cast<uint8_t>(code + 1));
    const auto middle = static_cast<float>((low + high) / 2);
    values.insert(values.end(), {static_cast<float>(low), middle, std::nextafter(middle, 0.0f),
                                 std::nextafter(middle, 1000.0f)});
  }
  values.push_back(448.0f);
  for (const float value : values) {
    for (const float signed_value : {value, -value}) {
      EXPECT_EQ(f32_to_fp8_e4m3(signed_value), e4m3_nearest(signed_value)) << "value " << signed_value;
      EXPECT_EQ(std::signbit(fp8_e4m3_to_f32(f32_to_fp8_e4m3(signed_value))), std::signbit(signed_value))
          << "value " << signed_value;
    }
  }
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(code))), code) << "code " << code;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(463.99f), 0x7e);  // would round to 448 anyway
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(1e-30f), 0x00);  // underflows to zero
}

TEST(NumericTest, Fp8E4m3PositiveCodesAreIncreasing) {
  for (int code = 1; code < 0x7f; ++code) {
    EXPECT_LT(fp8_e4m3_to_f32(static_cast<uint8_t>(code - 1)), fp8_e4m3_to_f32(static_cast<uint8_t>(code)))
        << "code " << code;
  }
}

TEST(NumericTest, Bf16ToF32IsTheHighHalf) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7fc0)));
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
}

TEST(NumericTest, Bf16RoundTripsEveryNonNanCode) {
  for (uint32_t code = 0; code <= 0xffff; ++code) {
    const auto bits = static_cast<uint16_t>(code);
    const float value = bf16_to_f32(bits);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(value)))) << code;
    } else {
      EXPECT_EQ(f32_to_bf16(value), bits) << code;
    }
  }
}

TEST(NumericTest, Bf16RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);                                // bf16 spacing in [1, 2)
  EXPECT_EQ(f32_to_bf16(1.0f + ulp / 2), 0x3f80);                        // tie, 0x3f80 is even: down
  EXPECT_EQ(f32_to_bf16(1.0f + ulp + ulp / 2), 0x3f82);                  // tie, 0x3f81 is odd: up
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3f81);  // just above the tie: up
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + ulp / 2, 0.0f)), 0x3f80);  // just below: down
  EXPECT_EQ(f32_to_bf16(-(1.0f + ulp + ulp / 2)), 0xbf82);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(NumericTest, Bf16KeepsNanQuiet) {
  // A signalling NaN whose payload lies only in the low 16 bits would truncate to infinity.
  const uint16_t bits = f32_to_bf16(f32_from_bits(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(bits)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

// IEEE binary16 by definition, in double: bias 15, subnormals at exponent 0.
double f16_reference(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return sign ? -magnitude : magnitude;
}

TEST(NumericTest, F16ToF32MatchesReferenceForEveryCode) {
  for (uint32_t code = 0; code <= 0xffff; ++code) {
    const double expected = f16_reference(static_cast<uint16_t>(code));
    const float actual = f16_to_f32(static_cast<uint16_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(actual), expected) << code;
      EXPECT_EQ(std::signbit(actual), code >= 0x8000) << code;
    }
  }
}

TEST(NumericTest, F16RoundTripsEveryNonNanCode) {
  for (uint32_t code = 0; code <= 0xffff; ++code) {
    const float value = f16_to_f32(static_cast<uint16_t>(code));
    if (!std::isnan(value)) {
      EXPECT_EQ(f32_to_f16(value), code) << code;
    }
  }
}

TEST(NumericTest, F32ToF16EdgeValues) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway, ties to even = infinity
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);         // tie with 0: even
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 quanta: tie, to even 2
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);         // underflow
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);      // largest subnormal + half rounds into normals
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie at 1, even: down
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie at 1 + 2^-10, odd: up
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

}  // namespace
}  // namespace kestrel

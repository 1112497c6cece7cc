#include "base/numeric.h"

#include <cmath>
#include <limits>

namespace kestrel {

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));
  return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float value) {
  const uint32_t bits = bits_from_f32(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (magnitude >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (magnitude < 6.103515625e-05f) {
    // Subnormal range: quantum 2^-24, round half to even via nearbyint (default rounding mode).
    const auto quanta = static_cast<uint32_t>(std::nearbyint(magnitude * 16777216.0f));
    return static_cast<uint16_t>(sign | quanta);
  }
  uint32_t rounded = bits & 0x7fffffffu;
  rounded += 0x0fffu + ((rounded >> 13) & 1u);
  return static_cast<uint16_t>(sign | (((rounded >> 23) - 112u) << 10) | ((rounded >> 13) & 0x3ffu));
}

float fp8_e4m3_to_f32(uint8_t bits) {
  const bool negative = bits & 0x80u;
  const uint32_t exponent = (bits >> 3) & 0x0fu;
  const uint32_t mantissa = bits & 0x07u;
  float magnitude;
  if (exponent == 0x0f && mantissa == 0x07) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, static_cast<int>(exponent) - 7);
  }
  return negative ? -magnitude : magnitude;
}

uint8_t f32_to_fp8_e4m3(float value) {
  const auto sign = static_cast<uint8_t>((bits_from_f32(value) >> 24) & 0x80u);
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7fu);
  const float magnitude = std::fabs(value);
  if (magnitude >= 448.0f) return static_cast<uint8_t>(sign | 0x7eu);
  if (magnitude < 0.015625f) {
    // Subnormal range: quantum 2^-9; 8 quanta is the smallest normal, code 0x08, so the count is the code.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f)));
  }
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent)
  // Eighths of the leading power of two, 8..16; 16 carries into the next exponent (below 448 that stays finite).
  auto eighths = static_cast<uint32_t>(std::nearbyint(std::ldexp(magnitude, 4 - exponent)));
  int biased = exponent - 1 + 7;
  if (eighths == 16) {
    eighths = 8;
    ++biased;
  }
  return static_cast<uint8_t>(sign | (biased << 3) | (eighths - 8));
}

}  // namespace kestrel

// Scalar number formats stored in checkpoints: bf16, fp16 and fp8 e4m3 (the "fn" variant: no infinities,
// 0x7f/0xff are NaN), converted to and from float32 exactly as PyTorch does.
#pragma once

#include <cstdint>
#include <cstring>

namespace kestrel {

inline float f32_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline uint32_t bits_from_f32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float bf16_to_f32(uint16_t bits) { return f32_from_bits(static_cast<uint32_t>(bits) << 16); }

// Round to nearest even, NaN kept quiet (torch's float -> bfloat16 cast).
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits = bits_from_f32(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

// fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; subnormals; max 448; 0x7f/0xff NaN.
float fp8_e4m3_to_f32(uint8_t bits);
// Round to nearest even, saturating to ±448 (CUDA's __NV_SATFINITE: infinities too); NaN stays NaN.
uint8_t f32_to_fp8_e4m3(float value);

}  // namespace kestrel

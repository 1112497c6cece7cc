// Cache row formats (--kv-cache-dtype): the flag's names, each format's row size (fp8 rows the packed 512 + 16 bytes
// of vLLM's fp8_ds_mla without its rope part), and what encode_row / decode_row keep of a row — bf16 rounding, fp8
// with one scale per 128 values, so that a group of small values keeps its precision beside a group of large ones.
#include "engine/cache_row_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../formats/expect_error.h"
#include "base/numeric.h"

namespace kestrel {
namespace {

TEST(CacheRowFormat, FlagNamesFollowVllm) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), CacheDtype::float32);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16"), CacheDtype::bf16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), CacheDtype::fp8_e4m3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), CacheDtype::fp8_e4m3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_ds_mla"), CacheDtype::fp8_e4m3);
  testing::expect_error([] { parse_kv_cache_dtype("fp8_e5m2"); }, {"--kv-cache-dtype fp8_e5m2", "auto", "fp8"});
  testing::expect_error([] { parse_kv_cache_dtype(""); }, {"--kv-cache-dtype"});
}

TEST(CacheRowFormat, RowBytes) {
  EXPECT_EQ((RowFormat{.dtype = CacheDtype::float32, .width = 512}).row_bytes(), 2048);
  EXPECT_EQ((RowFormat{.dtype = CacheDtype::bf16, .width = 512}).row_bytes(), 1024);
  EXPECT_EQ((RowFormat{.dtype = CacheDtype::fp8_e4m3, .width = 512}).row_bytes(), 528);  // 512 values, 4 scales
  EXPECT_EQ((RowFormat{.dtype = CacheDtype::float32, .width = 3}).row_bytes(), 12);      // float32 rows unpadded
  EXPECT_EQ((RowFormat{.dtype = CacheDtype::bf16, .width = 3}).row_bytes(), 16);
  // 130 values: padded to 132, then two scales; 140 bytes padded to 144.
  const RowFormat odd{.dtype = CacheDtype::fp8_e4m3, .width = 130};
  EXPECT_EQ(odd.scale_offset(), 132);
  EXPECT_EQ(odd.num_scales(), 2);
  EXPECT_EQ(odd.row_bytes(), 144);
}

std::vector<float> random_row(int64_t width, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> row(static_cast<size_t>(width));
  for (float& value : row) value = normal(rng);
  return row;
}

std::vector<float> round_trip(const RowFormat& format, const std::vector<float>& values) {
  std::vector<std::byte> row(static_cast<size_t>(format.row_bytes()));
  encode_row(format, values.data(), row.data());
  std::vector<float> decoded(values.size());
  decode_row(format, row.data(), decoded.data());
  return decoded;
}

TEST(CacheRowFormat, Float32AndBf16RoundTrips) {
  const std::vector<float> values = random_row(77, 1, 3.0f);
  EXPECT_EQ(round_trip(RowFormat{.dtype = CacheDtype::float32, .width = 77}, values), values);
  const std::vector<float> bf16 = round_trip(RowFormat{.dtype = CacheDtype::bf16, .width = 77}, values);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(bf16[i], bf16_to_f32(f32_to_bf16(values[i]))) << i;
}

// Each group of 128 values is scaled so that its largest magnitude is e4m3's 448: that value comes back within a
// float rounding, every other one within half an e4m3 step (1/16 of its magnitude, or 2^-10 of the scale in the
// subnormal range); the stored scale is the group's amax / 448.
TEST(CacheRowFormat, Fp8KeepsEachGroupsPrecision) {
  const RowFormat format{.dtype = CacheDtype::fp8_e4m3, .width = 300};  // groups of 128, 128 and 44
  std::vector<float> values = random_row(300, 2, 1e-3f);                 // group 0: tiny values
  for (size_t i = 128; i < 256; ++i) values[i] *= 1e6f;                  // group 1: large ones (about 1e3)
  values[5] = 0.0f;
  std::vector<std::byte> row(static_cast<size_t>(format.row_bytes()));
  encode_row(format, values.data(), row.data());
  std::vector<float> decoded(values.size());
  decode_row(format, row.data(), decoded.data());
  for (int64_t g = 0; g < format.num_scales(); ++g) {
    const size_t first = static_cast<size_t>(g * 128), end = std::min<size_t>(first + 128, values.size());
    float amax = 0.0f;
    for (size_t i = first; i < end; ++i) amax = std::max(amax, std::fabs(values[i]));
    float scale;
    std::memcpy(&scale, row.data() + format.scale_offset() + 4 * g, sizeof scale);
    EXPECT_EQ(scale, amax / 448.0f) << "group " << g;
    for (size_t i = first; i < end; ++i) {
      const float bound = std::max(std::fabs(values[i]) / 16.0f, scale * std::ldexp(1.0f, -10));
      EXPECT_LE(std::fabs(decoded[i] - values[i]), bound) << "value " << i;
      if (std::fabs(values[i]) == amax) {
        EXPECT_NEAR(decoded[i], values[i], amax * 1e-6f) << "value " << i;
      }
    }
  }
  EXPECT_EQ(decoded[5], 0.0f);
  // An all-zero row (a scale of 1, not a division by zero) comes back as zeros.
  const std::vector<float> zeros(300, 0.0f);
  EXPECT_EQ(round_trip(format, zeros), zeros);
}

// The decoded row is a fixed point: encoding it again gives the same bytes, so a row copied through the format twice
// (a prefix block read and written back) does not drift.
TEST(CacheRowFormat, Fp8DecodedRowsEncodeToTheSameBytes) {
  const RowFormat format{.dtype = CacheDtype::fp8_e4m3, .width = 512};
  const std::vector<float> values = random_row(512, 3, 2.0f);
  std::vector<std::byte> first(static_cast<size_t>(format.row_bytes())), second(first.size());
  encode_row(format, values.data(), first.data());
  std::vector<float> decoded(values.size());
  decode_row(format, first.data(), decoded.data());
  encode_row(format, decoded.data(), second.data());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), static_cast<size_t>(format.scale_offset())), 0);
}

}  // namespace
}  // namespace kestrel

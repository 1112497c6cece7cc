#include "engine/cache_row_format.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/numeric.h"

namespace kestrel {

CacheDtype parse_kv_cache_dtype(std::string_view flag) {
  if (flag == "auto") return CacheDtype::float32;
  if (flag == "bfloat16") return CacheDtype::bf16;
  if (flag == "fp8" || flag == "fp8_e4m3" || flag == "fp8_ds_mla") return CacheDtype::fp8_e4m3;
  fail("--kv-cache-dtype {} is not supported (choose auto, bfloat16, fp8, fp8_e4m3 or fp8_ds_mla)", flag);
}

std::string_view cache_dtype_name(CacheDtype dtype) {
  switch (dtype) {
    case CacheDtype::float32: return "float32";
    case CacheDtype::bf16: return "bfloat16";
    case CacheDtype::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

int64_t RowFormat::row_bytes() const {
  const auto padded = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
  switch (dtype) {
    case CacheDtype::float32: return 4 * width;
    case CacheDtype::bf16: return padded(2 * width);
    case CacheDtype::fp8_e4m3: return padded(scale_offset() + 4 * num_scales());
  }
  return 0;
}

namespace {

// Scale of one group of fp8 values: its largest magnitude maps to 448, e4m3's largest.
float fp8_group_scale(const float* values, int64_t count) {
  float amax = 0.0f;
  for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(values[i]));
  return amax > 0.0f ? amax / 448.0f : 1.0f;
}

const std::array<float, 256>& fp8_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (int code = 0; code < 256; ++code) {
      values[static_cast<size_t>(code)] = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    }
    return values;
  }();
  return table;
}

}  // namespace

void encode_row(const RowFormat& format, const float* values, std::byte* row) {
  const int64_t width = format.width;
  switch (format.dtype) {
    case CacheDtype::float32:
      std::memcpy(row, values, static_cast<size_t>(width) * sizeof(float));
      return;
    case CacheDtype::bf16:
      for (int64_t i = 0; i < width; ++i) {
        const uint16_t bits = f32_to_bf16(values[i]);
        std::memcpy(row + 2 * i, &bits, sizeof bits);
      }
      return;
    case CacheDtype::fp8_e4m3:
      for (int64_t g = 0; g < format.num_scales(); ++g) {
        const int64_t first = g * RowFormat::kScaleGroup, count = std::min(RowFormat::kScaleGroup, width - first);
        const float scale = fp8_group_scale(values + first, count);
        std::memcpy(row + format.scale_offset() + 4 * g, &scale, sizeof scale);
        for (int64_t i = first; i < first + count; ++i) row[i] = std::byte{f32_to_fp8_e4m3(values[i] / scale)};
      }
      return;
  }
}

void decode_row(const RowFormat& format, const std::byte* row, float* values) {
  const int64_t width = format.width;
  switch (format.dtype) {
    case CacheDtype::float32:
      std::memcpy(values, row, static_cast<size_t>(width) * sizeof(float));
      return;
    case CacheDtype::bf16:
      for (int64_t i = 0; i < width; ++i) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, sizeof bits);
        values[i] = bf16_to_f32(bits);
      }
      return;
    case CacheDtype::fp8_e4m3: {
      const std::array<float, 256>& table = fp8_values();
      for (int64_t g = 0; g < format.num_scales(); ++g) {
        float scale;
        std::memcpy(&scale, row + format.scale_offset() + 4 * g, sizeof scale);
        const int64_t first = g * RowFormat::kScaleGroup, end = std::min(first + RowFormat::kScaleGroup, width);
        for (int64_t i = first; i < end; ++i) values[i] = table[static_cast<size_t>(row[i])] * scale;
      }
      return;
    }
  }
}

}  // namespace kestrel

#include "backend/linear_weight.h"

#include <algorithm>
#include <cstring>

#include "base/numeric.h"

namespace kestrel {

namespace {

float load_scalar(const std::byte* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::f32: {
      float value;
      std::memcpy(&value, base + index * 4, 4);
      return value;
    }
    case DType::bf16: {
      uint16_t bits;
      std::memcpy(&bits, base + index * 2, 2);
      return bf16_to_f32(bits);
    }
    case DType::f16: {
      uint16_t bits;
      std::memcpy(&bits, base + index * 2, 2);
      return f16_to_f32(bits);
    }
    default:
      return 0.0f;  // unreachable: binding admits only the types above
  }
}

}  // namespace

void dequantize_row(const LinearWeight& weight, int64_t row, float* out) {
  const int64_t n = weight.in_features;
  const std::byte* base = weight.data + row * n * static_cast<int64_t>(dtype_size(weight.dtype));
  switch (weight.dtype) {
    case DType::f32:
      std::memcpy(out, base, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16:
      for (int64_t j = 0; j < n; ++j) {
        uint16_t bits;
        std::memcpy(&bits, base + j * 2, 2);
        out[j] = bf16_to_f32(bits);
      }
      return;
    case DType::f16:
      for (int64_t j = 0; j < n; ++j) {
        uint16_t bits;
        std::memcpy(&bits, base + j * 2, 2);
        out[j] = f16_to_f32(bits);
      }
      return;
    case DType::f8_e4m3: {
      const int64_t scale_cols = (n + weight.block_cols - 1) / weight.block_cols;
      const int64_t scale_row = row / weight.block_rows;
      for (int64_t block = 0; block < scale_cols; ++block) {
        const float scale = load_scalar(weight.scale, weight.scale_dtype, scale_row * scale_cols + block);
        const int64_t end = std::min(n, (block + 1) * weight.block_cols);
        for (int64_t j = block * weight.block_cols; j < end; ++j) {
          out[j] = fp8_e4m3_to_f32(static_cast<uint8_t>(base[j])) * scale;
        }
      }
      return;
    }
    default:
      return;  // unreachable: binding admits only the types above
  }
}

}  // namespace kestrel

// A weight matrix as stored in the checkpoint, used by every linear layer: W is row-major [out_features,
// in_features] and a linear computes y = W x. The elements stay in their on-disk format (f32, f16, bf16, or fp8 e4m3
// with block scales) and are converted inside the kernels, so a checkpoint is never expanded in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/dtype.h"

namespace kestrel {

struct LinearWeight {
  std::string name;  // checkpoint name, for messages
  DType dtype = DType::f32;
  int64_t out_features = 0;
  int64_t in_features = 0;
  const std::byte* data = nullptr;  // [out_features, in_features]

  // Block-fp8 only: `weight_scale_inv`, [ceil(out / block_rows), ceil(in / block_cols)], f32 or bf16.
  // Dequantised W[i][j] = fp8(W[i][j]) * scale[i / block_rows][j / block_cols].
  const std::byte* scale = nullptr;
  DType scale_dtype = DType::f32;
  int64_t block_rows = 0;
  int64_t block_cols = 0;

  bool valid() const { return data != nullptr; }
};

// Writes row `row` of W, dequantised to float32, into out[in_features].
void dequantize_row(const LinearWeight& weight, int64_t row, float* out);

}  // namespace kestrel

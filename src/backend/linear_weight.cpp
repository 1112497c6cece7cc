#include "backend/linear_weight.h"

#include <algorithm>
#include <cstring>
#include <vector>

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

// Row o of W is column o of E = diag(suh) · Hk · Ŵ · Hn · diag(svh): (Ŵ · Hn)[:, o] needs the 128 columns of Ŵ in
// o's Hadamard block, then Hk runs down that column. Decodes k x 128 weights per row: for tests and the CLI, not for
// hot loops (the CPU matmul has its own path).
void dequantize_exl3_row(const LinearWeight& weight, int64_t row, float* out) {
  const Exl3Matrix& m = *weight.exl3;
  constexpr int kBlock = exl3::kHadamardBlock, kSide = exl3::kTileSide;
  const int64_t block_start = row / kBlock * kBlock;
  // Column (row - block_start) of r·H128, which is symmetric: the transform of a unit vector.
  std::vector<float> hadamard_column(kBlock, 0.0f);
  hadamard_column[static_cast<size_t>(row - block_start)] = 1.0f;
  exl3::hadamard128(hadamard_column.data());

  std::vector<float> column(static_cast<size_t>(m.in_padded), 0.0f);
  float tile[exl3::kTileElements];
  for (int64_t a = 0; a < m.in_padded / kSide; ++a) {
    for (int64_t b = block_start / kSide; b < (block_start + kBlock) / kSide; ++b) {
      decode_exl3_tile(m, a, b, tile);
      const float* h = hadamard_column.data() + (b * kSide - block_start);
      for (int r = 0; r < kSide; ++r) {
        float sum = 0.0f;
        for (int c = 0; c < kSide; ++c) sum += tile[r * kSide + c] * h[c];
        column[static_cast<size_t>(a * kSide + r)] += sum;
      }
    }
  }
  for (int64_t block = 0; block < m.in_padded; block += kBlock) exl3::hadamard128(column.data() + block);
  const float output_scale = load_scalar(m.svh, DType::f16, row);
  for (int64_t i = 0; i < weight.in_features; ++i) {
    out[i] = load_scalar(m.suh, DType::f16, i) * column[static_cast<size_t>(i)] * output_scale;
  }
}

}  // namespace

void decode_exl3_tile(const Exl3Matrix& matrix, int64_t a, int64_t b, float* tile) {
  uint16_t record[exl3::kTileSide * exl3::kMaxBits];
  const int64_t record_words = int64_t{exl3::kTileSide} * matrix.bits;
  const int64_t tile_cols = matrix.out_padded / exl3::kTileSide;
  std::memcpy(record, matrix.trellis + (a * tile_cols + b) * record_words * 2, static_cast<size_t>(record_words) * 2);
  exl3::decode_tile(record, matrix.bits, exl3::codebook_f32(matrix.codebook).data(), tile);
}

void dequantize_row(const LinearWeight& weight, int64_t row, float* out) {
  if (weight.exl3) {
    dequantize_exl3_row(weight, row, out);
    return;
  }
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

std::vector<float> block_scales(const LinearWeight& weight) {
  const int64_t rows = (weight.out_features + weight.block_rows - 1) / weight.block_rows;
  const int64_t cols = (weight.in_features + weight.block_cols - 1) / weight.block_cols;
  std::vector<float> scales(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) scales[static_cast<size_t>(i)] = load_scalar(weight.scale, weight.scale_dtype, i);
  return scales;
}

LinearWeight exl3_linear_weight(std::string name, const Exl3Tensors& tensors, int64_t out_features,
                                int64_t in_features) {
  return LinearWeight{.name = std::move(name),
                      .dtype = DType::i16,
                      .out_features = out_features,
                      .in_features = in_features,
                      .data = tensors.trellis->data,
                      .exl3 = Exl3Matrix{.trellis = tensors.trellis->data,
                                         .suh = tensors.suh->data,
                                         .svh = tensors.svh->data,
                                         .bits = tensors.bits,
                                         .codebook = tensors.codebook,
                                         .in_padded = tensors.in_padded,
                                         .out_padded = tensors.out_padded}};
}

}  // namespace kestrel

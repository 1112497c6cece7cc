// A weight matrix as stored in the checkpoint, used by every linear layer: W is row-major [out_features,
// in_features] and a linear computes y = W x. The elements stay in their on-disk format (f32, f16, bf16, fp8 e4m3
// with block scales, or EXL3 trellises) and are converted inside the kernels, so a checkpoint is never expanded in
// memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/dtype.h"
#include "formats/exl3_codec.h"
#include "formats/exl3_tensors.h"

namespace kestrel {

// An EXL3 matrix (exllamav3's format, shared/docs/exl3-format.md §1-2). It is stored transposed and padded: the
// effective weight is E = diag(suh) · Hk · Ŵ · Hn · diag(svh), [in_padded, out_padded], and W[o][i] = E[i][o] for
// o < out_features, i < in_features; inputs are zero-extended to in_padded and outputs past out_features dropped.
// Pointers are into the checkpoint mapping and may be unaligned.
struct Exl3Matrix {
  const std::byte* trellis = nullptr;  // int16 [in_padded / 16, out_padded / 16, 16 * bits], tiles row-major
  const std::byte* suh = nullptr;      // fp16 [in_padded]
  const std::byte* svh = nullptr;      // fp16 [out_padded]
  int bits = 0;                        // K in 1..8: trellis.shape[-1] / 16
  exl3::Codebook codebook = exl3::Codebook::inst3;
  int64_t in_padded = 0, out_padded = 0;  // in_features, out_features rounded up to a multiple of 128
};

// A backend's own form of a weight (a copy in device memory, a re-laid-out matrix), made once at load by
// Backend::place_*; the backend that made it is the only one that reads it.
class PlacedWeight {
public:
  virtual ~PlacedWeight() = default;
};

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

  // EXL3 only: set for an EXL3 matrix, which then has dtype I16 and `data` == exl3->trellis.
  std::optional<Exl3Matrix> exl3 = std::nullopt;

  // The backend's form of this matrix for the op that uses it, when the backend keeps one (null on the CPU).
  std::shared_ptr<const PlacedWeight> placed = nullptr;

  bool valid() const { return data != nullptr; }
};

// The LinearWeight [out_features, in_features] of an EXL3 module's tensors, which stay where they are mapped.
LinearWeight exl3_linear_weight(std::string name, const Exl3Tensors& tensors, int64_t out_features,
                                int64_t in_features);

// A small float32 weight (norm weights, biases, convolution taps), converted at load. The values stay on the host; a
// backend with memory of its own keeps a copy there, which data() then returns.
struct WeightVector {
  WeightVector() = default;
  WeightVector(std::vector<float> host) : values(std::move(host)) {}  // NOLINT(google-explicit-constructor)

  std::vector<float> values;
  std::shared_ptr<const float> placed = nullptr;

  const float* data() const { return placed ? placed.get() : values.data(); }
  size_t size() const { return values.size(); }
};

// Writes row `row` of W, dequantised to float32, into out[in_features]. EXL3 rows are slow (a k x 128 slice is
// decoded per row): fine for embeddings, tests and tools; the backends' linear ops have EXL3 paths of their own.
void dequantize_row(const LinearWeight& weight, int64_t row, float* out);

// The block-fp8 scale grid of `weight` as float32, [ceil(out / block_rows), ceil(in / block_cols)] row-major.
std::vector<float> block_scales(const LinearWeight& weight);

// Decodes tile (a, b) of an EXL3 matrix's rotated weight Ŵ (rows 16a.., columns 16b..) to float, row-major 16 x 16.
void decode_exl3_tile(const Exl3Matrix& matrix, int64_t a, int64_t b, float* tile);

}  // namespace kestrel

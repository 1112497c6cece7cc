// NumPy .npy files (format version 1.0, little-endian, C order) for float32, int32 and float16 arrays: the CLI writes
// logits in this format and the tests read the reference logits (and fp16 reference weights) from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kestrel {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // '<f4' arrays; '<i4' and '<f2' arrays are converted (exactly)
};

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data);
// Throws Error naming the path on a malformed file or an unsupported dtype / order.
NpyArray read_npy(const std::string& path);

}  // namespace kestrel

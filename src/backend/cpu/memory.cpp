// Activation memory of the CPU backend: 64-byte aligned host arrays.
#include <algorithm>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"

namespace kestrel {

float* CpuBackend::allocate_floats(size_t count) {
  const size_t bytes = std::max<size_t>(64, (count * sizeof(float) + 63) / 64 * 64);
  void* data = std::aligned_alloc(64, bytes);
  require(data != nullptr, "out of host memory allocating {} bytes of activations", bytes);
  return static_cast<float*>(data);
}

void CpuBackend::free_floats(float* data) { std::free(data); }

void CpuBackend::fill(float* data, int64_t count, float value) { std::fill(data, data + count, value); }

}  // namespace kestrel

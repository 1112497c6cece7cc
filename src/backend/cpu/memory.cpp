// Memory of the CPU backend: 64-byte aligned host arrays, plain copies, and weights read where the checkpoint mapping
// and the binding left them (placement keeps nothing of its own).
#include <algorithm>
#include <cstdlib>
#include <cstring>

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

// An empty array has no storage (nullptr), and memcpy's pointers must be valid even for zero bytes.
void CpuBackend::copy_to_backend(void* dst, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host, bytes);
}
void CpuBackend::copy_to_host(void* host, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host, src, bytes);
}
void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void CpuBackend::place(LinearWeight& /*weight*/) {}
void CpuBackend::place(WeightVector& /*vector*/) {}
void CpuBackend::place_attention_kv_b(LinearWeight& /*kv_b*/, int64_t /*num_heads*/, int64_t /*qk_head_dim*/,
                                      int64_t /*v_head_dim*/) {}
std::shared_ptr<const PlacedWeight> CpuBackend::place_experts(const std::vector<ExpertWeights>& /*experts*/) {
  return nullptr;
}

}  // namespace kestrel

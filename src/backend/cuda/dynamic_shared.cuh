// Dynamic shared memory above 48 KiB must be opted into, per kernel, before a launch asks for it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace kestrel::cuda {

constexpr size_t kDefaultSharedBytes = 48 * 1024;

// The shared memory a block may opt into on the current device: 227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on
// sm_86, sm_89 and the 12.x parts (the GB10); 0 when no device answers. Kernels sized for sm_90 choose a smaller
// form by it.
inline size_t max_shared_optin() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    return 0;
  }
  return static_cast<size_t>(bytes);
}

template <typename Kernel>
cudaError_t allow_shared(Kernel* kernel, size_t bytes) {
  if (bytes <= kDefaultSharedBytes) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace kestrel::cuda

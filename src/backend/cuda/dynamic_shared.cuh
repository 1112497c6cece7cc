// Dynamic shared memory above 48 KiB must be opted into, per kernel, before a launch asks for it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace kestrel::cuda {

constexpr size_t kDefaultSharedBytes = 48 * 1024;

template <typename Kernel>
cudaError_t allow_shared(Kernel* kernel, size_t bytes) {
  if (bytes <= kDefaultSharedBytes) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace kestrel::cuda

// Programmatic dependent launch (sm_90+): a kernel launched with launch_dependent may start while the kernel before
// it in the stream is still finishing, so that its prologue (launch, loading weights that no kernel writes) overlaps
// that kernel's tail. Such a kernel must call wait_for_previous_grid before it touches anything an earlier kernel
// writes (inputs, scratch, counters, ids); elsewhere, and on older GPUs, the launch is an ordinary one.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

namespace kestrel::cuda {

// Waits until the previous grid in the stream has finished and its writes are visible. Before it, a kernel may only
// read memory that no kernel writes.
__device__ __forceinline__ void wait_for_previous_grid_only() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next dependent grid begin launching (once every block of this one has called it or exited).
__device__ __forceinline__ void let_next_grid_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
// Both at once, what most kernels do. A short kernel on a decode step's chain of latencies calls the halves apart
// instead: the next grid (a product, whose blocks request their first weights as they start) then launches only once
// this kernel has read its inputs, so that its loads do not queue behind that prefetch.
__device__ __forceinline__ void wait_for_previous_grid() {
  wait_for_previous_grid_only();
  let_next_grid_launch();
}

// Brings memory that no kernel in flight writes into L2 before the wait, for a short kernel that reads it after: a
// load issued after the wait queues behind the next product's first weights, an L2 hit does not. The line holding p:
__device__ __forceinline__ void prefetch_line_to_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
// [p, p + bytes), p 16-byte aligned and bytes a multiple of 16 (one bulk request on sm_90+, else line by line).
__device__ __forceinline__ void prefetch_range_to_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  for (unsigned offset = 0; offset < bytes; offset += 128) prefetch_line_to_l2(static_cast<const char*>(p) + offset);
#endif
}

// Whether the current device takes dependent launches (compute capability 9 or more), asked once per device: the
// launchers call it for every kernel.
inline bool dependent_launch_supported() {
  constexpr int kDevices = 64;
  static std::atomic<signed char> known[kDevices];  // 0: not asked yet, 1: yes, -1: no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device >= 0 && device < kDevices) {
    const signed char answer = known[device].load(std::memory_order_relaxed);
    if (answer != 0) return answer > 0;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (device >= 0 && device < kDevices) known[device].store(major >= 9 ? 1 : -1, std::memory_order_relaxed);
  return major >= 9;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to overlap the previous kernel where supported.
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                             cudaStream_t stream, Args&&... args) {
  if (!dependent_launch_supported()) {
    kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kestrel::cuda

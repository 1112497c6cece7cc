// The clamped SwiGLU of GLM's MLPs and experts, for every kernel that applies it (the elementwise kernels, the EXL3
// down projection that reads the gate and up outputs directly): silu(min(gate, limit)) * clamp(up, -limit, limit),
// as the CPU backend's clamped_swiglu.
#pragma once

namespace kestrel::cuda {

__device__ __forceinline__ float clamped_swiglu_of(float gate, float up, float limit) {
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace kestrel::cuda

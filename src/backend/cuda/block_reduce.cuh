// Sums across a warp and across a thread block, for the per-row kernels (norms, mHC, router). The block sum is
// returned to every thread; its order is fixed by the launch shape, so results are deterministic.
#pragma once

namespace kestrel::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

// Every thread of the block must call it; `shared` holds at least 32 floats and is reused after the call returns.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32u, warps = (blockDim.x + 31u) / 32u;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (unsigned w = 0; w < warps; ++w) total += shared[w];
  return total;
}

}  // namespace kestrel::cuda

// mHC (manifold-constrained hyper-connections) on the GPU, matching the CPU backend (mhc.cpp). The pre-mix is
// three launches composed by the caller: rms_norm of the flattened streams (norm_kernels.h), the `fn` linear
// (DeviceLinear), then mhc_mix below, which turns the mixes into pre/post weights and the Sinkhorn-normalised comb
// and collapses the streams. All pointers are float32 device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kestrel::cuda {

// The largest hc_mult the kernels take (the model uses 4); larger is refused with cudaErrorInvalidValue.
constexpr int kMaxHcMult = 16;

struct MhcMixArgs {
  int64_t num_tokens = 0, hc_mult = 0, hidden = 0;
  float hc_eps = 0.0f;
  int64_t sinkhorn_iters = 0;
  const float* mixes = nullptr;    // [T, (2 + hc) * hc]: fn · (streams / rms(streams))
  const float* base = nullptr;     // [(2 + hc) * hc]
  const float* scale = nullptr;    // [3]
  const float* streams = nullptr;  // [T, hc, hidden]
  float* post = nullptr;           // [T, hc]
  float* comb = nullptr;           // [T, hc, hc]
  float* collapsed = nullptr;      // [T, hidden]
};
cudaError_t mhc_mix(const MhcMixArgs& args, cudaStream_t stream);

// In place: streams[t, j] = post[t, j] * block_out[t] + sum_i comb[t, i, j] * streams[t, i].
cudaError_t mhc_post(const float* post, const float* comb, const float* block_out, int64_t num_tokens,
                     int64_t hc_mult, int64_t hidden, float* streams, cudaStream_t stream);

}  // namespace kestrel::cuda

// mHC (manifold-constrained hyper-connections) on the GPU, matching the CPU backend (mhc.cpp). The general pre-mix
// is three launches composed by the caller: rms_norm of the flattened streams (norm_kernels.h), the `fn` linear
// (DeviceLinear), then mhc_mix below, which turns the mixes into pre/post weights and the Sinkhorn-normalised comb
// and collapses the streams. All pointers are float32 device memory, but for the fused site's fn.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/dense_kernels.h"

namespace kestrel::cuda {

// The largest hc_mult the kernels take (GLM-5.3-Flash and DeepSeek's mHC use 4: a site's hc x hc combination
// matrix is one warp's registers); larger is refused with cudaErrorInvalidValue.
constexpr int kMaxHcMult = 4;

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

// One whole mHC site in two launches (Backend::mhc_site): the pending post-mix (when pending_post is set), the
// pre-mix and the RMS norm of the collapsed input. The first launch updates the streams in place and writes each
// 64-channel slice's shares of fn · streams and of the streams' Gram matrix; fn · (streams / rms) is
// (fn · streams) / rms, so the norm needs no pass of its own. The second sums a token's shares in slice order,
// computes the pre weights as mhc_mix does, collapses the streams and normalises the result by the rms that the Gram
// matrix gives, and computes post and comb. Up to 16 tokens both launches run a block per (slice, token), fn's slice
// in each block's registers (with `barrier`, as one launch); above, the first runs tiles of 64 tokens a slice (fn's
// slice read once a tile) and the second a warp per token.
struct MhcSiteArgs {
  int64_t num_tokens = 0, hc_mult = 0, hidden = 0;
  float rms_eps = 0.0f, hc_eps = 0.0f;
  int64_t sinkhorn_iters = 0;
  const void* fn = nullptr;          // [(2 + hc) * hc, hc * hidden], f32, f16 or bf16
  DenseWeightType fn_type = DenseWeightType::f32;
  const float* base = nullptr;       // [(2 + hc) * hc]
  const float* scale = nullptr;      // [3]
  const float* norm_weight = nullptr;  // [hidden], or null: unweighted
  const float* pending_post = nullptr;       // [T, hc]; with pending_comb and pending_block_out, or all null
  const float* pending_comb = nullptr;       // [T, hc, hc]
  const float* pending_block_out = nullptr;  // [T, hidden]
  float* streams = nullptr;          // [T, hc, hidden], updated in place by the pending post-mix
  float* post = nullptr;             // [T, hc]
  float* comb = nullptr;             // [T, hc, hc]
  float* collapsed = nullptr;        // [T, hidden]
  float* normed = nullptr;           // [T, hidden]
  float* partials = nullptr;         // mhc_site_scratch_floats(T, hc, hidden)
  // Two zeroed counters, left zeroed: up to 16 tokens the site then runs as one launch, with a barrier across the
  // grid between its parts, where the grid fits on the GPU at once. Null: two launches.
  unsigned* barrier = nullptr;
};
int64_t mhc_site_scratch_floats(int64_t num_tokens, int64_t hc_mult, int64_t hidden);
cudaError_t mhc_site(const MhcSiteArgs& args, cudaStream_t stream);

}  // namespace kestrel::cuda

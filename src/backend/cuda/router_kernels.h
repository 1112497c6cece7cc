// The MoE router on the GPU, matching the CPU backend's route_experts (moe.cpp, transformers'
// Glm5NextTextTopkRouter): sigmoid scores, the correction bias for the choice only, the best topk_group groups by the
// sum of their two best choices, then the top_k experts (ties to the lower index), weights from the scores,
// optionally normalised, times routed_scaling_factor; a NaN choice ranks last. One block per token. Pointers are
// device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kestrel::cuda {

struct RouterDeviceArgs {
  int64_t num_tokens = 0, num_experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  const float* logits = nullptr;           // [T, experts]
  const float* correction_bias = nullptr;  // [experts], or null for none
  int32_t* expert_ids = nullptr;           // [T, top_k]
  float* expert_weights = nullptr;         // [T, top_k]
};

// The largest expert count the kernel takes (its per-token working set lives in shared memory).
constexpr int64_t kMaxRoutedExperts = 4096;

// cudaErrorInvalidValue for a shape the selection cannot satisfy (experts not divisible into groups, fewer than two
// experts per group, or fewer experts in the kept groups than top_k).
cudaError_t route_experts(const RouterDeviceArgs& args, cudaStream_t stream);

}  // namespace kestrel::cuda

#include <climits>

#include "backend/cuda/router_kernels.h"
#include "backend/cuda/dependent_launch.cuh"

namespace kestrel::cuda {

namespace {

__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

// Index of the largest of v[0, n) (ties to the lower index), returned to every lane of the warp.
__device__ int warp_best(const float* v, int n) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  float best = -INFINITY;
  int index = INT_MAX;
  for (int i = lane; i < n; i += 32) {
    if (ranks_before(v[i], i, best, index)) {
      best = v[i];
      index = i;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
    const int other_index = __shfl_xor_sync(0xFFFFFFFFu, index, offset);
    if (ranks_before(other, other_index, best, index)) {
      best = other;
      index = other_index;
    }
  }
  return index;
}

// Shared memory per token: scores, choices, the working copy the selections strike out, group scores, kept flags.
__global__ void __launch_bounds__(32) route_kernel(RouterDeviceArgs a) {
  extern __shared__ float shared[];
  const int E = static_cast<int>(a.num_experts), groups = static_cast<int>(a.n_group), group_size = E / groups;
  float* scores = shared;
  float* choice = scores + E;
  float* work = choice + E;
  float* group_scores = work + E;
  float* kept = group_scores + groups;
  const int64_t t = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  wait_for_previous_grid();
  for (int e = lane; e < E; e += 32) {
    scores[e] = 1.0f / (1.0f + expf(-a.logits[t * E + e]));
    choice[e] = work[e] = scores[e] + (a.correction_bias ? a.correction_bias[e] : 0.0f);
  }
  __syncwarp();
  // Group masking (the topk_group groups with the best two-member sums keep their experts), unless every group is
  // kept (GLM-5.3-Flash: one group), when it would change nothing.
  if (a.topk_group < groups) {
    for (int g = 0; g < groups; ++g) {
      float* members = work + g * group_size;
      const int first = warp_best(members, group_size);
      const float top = members[first];
      __syncwarp();
      if (lane == 0) members[first] = -INFINITY;
      __syncwarp();
      const int second = warp_best(members, group_size);
      if (lane == 0) group_scores[g] = top + members[second];
      __syncwarp();
    }
    for (int g = lane; g < groups; g += 32) kept[g] = 0.0f;
    __syncwarp();
    for (int64_t k = 0; k < a.topk_group; ++k) {
      const int g = warp_best(group_scores, groups);
      __syncwarp();
      if (lane == 0) {
        kept[g] = 1.0f;
        group_scores[g] = -INFINITY;
      }
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32) work[e] = kept[e / group_size] != 0.0f ? choice[e] : -INFINITY;
  }
  __syncwarp();
  float total = 0.0f;
  for (int64_t i = 0; i < a.top_k; ++i) {
    const int e = warp_best(work, E);
    total += scores[e];
    __syncwarp();
    if (lane == 0) {
      work[e] = -INFINITY;
      a.expert_ids[t * a.top_k + i] = e;
    }
    __syncwarp();
  }
  // Weights in a second pass: the normalisation needs the total of all chosen scores.
  for (int64_t i = lane; i < a.top_k; i += 32) {
    float weight = scores[a.expert_ids[t * a.top_k + i]];
    if (a.norm_topk_prob) weight /= total + 1e-20f;
    a.expert_weights[t * a.top_k + i] = weight * a.routed_scaling_factor;
  }
}

}  // namespace

cudaError_t route_experts(const RouterDeviceArgs& a, cudaStream_t stream) {
  const bool valid = a.num_experts > 0 && a.num_experts <= kMaxRoutedExperts && a.n_group >= 1 &&
                     a.num_experts % a.n_group == 0 && a.num_experts / a.n_group >= 2 && a.topk_group >= 1 &&
                     a.topk_group <= a.n_group && a.top_k >= 1 && a.top_k <= a.topk_group * (a.num_experts / a.n_group);
  if (!valid) return cudaErrorInvalidValue;
  if (a.num_tokens == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(3 * a.num_experts + 2 * a.n_group) * sizeof(float);
  return launch_dependent(route_kernel, dim3(static_cast<unsigned>(a.num_tokens)), dim3(32), shared, stream, a);
}

}  // namespace kestrel::cuda

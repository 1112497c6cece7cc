#include "backend/cuda/router_kernels.h"
#include "backend/cuda/dependent_launch.cuh"

namespace kestrel::cuda {

namespace {

__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

// How many of v[0, n) rank before v[i] (larger, or equal at a lower index), counted until `limit` is reached: an
// entry with `limit` or more before it is not chosen, and most stop counting early. The order is total (the caller
// has no NaN in v), so the ranks below `limit` go to distinct entries.
__device__ int rank_of(const float* v, int n, int i, int limit) {
  const float own = v[i];
  int before = 0;
  for (int j0 = 0; j0 < n && before < limit; j0 += 32) {
    const int end = min(n, j0 + 32);
#pragma unroll 8
    for (int j = j0; j < end; ++j) before += ranks_before(v[j], j, own, i) ? 1 : 0;
  }
  return before;
}

// Threads of a block: 256 for a decode step's few tokens (the ranks counted over the most threads), one warp for
// many (a prefill's thousands of blocks).
constexpr int kRouteThreads = 256;
constexpr int64_t kRouteFewTokens = 16;

// A block per token; each thread takes experts tid, tid + blockDim.x, ...: an expert is chosen as the top-k's entry
// r when r experts rank before it, so every rank is counted at once rather than k selections one after another.
// Shared memory: scores, the choices (the selections mask them), group scores, each group's best two, the chosen
// experts.
__global__ void __launch_bounds__(kRouteThreads) route_kernel(RouterDeviceArgs a) {
  extern __shared__ float shared[];
  const int E = static_cast<int>(a.num_experts), groups = static_cast<int>(a.n_group), group_size = E / groups;
  const int top_k = static_cast<int>(a.top_k), tid = static_cast<int>(threadIdx.x);
  float* scores = shared;
  float* work = scores + E;
  float* group_scores = work + E;
  int* group_best = reinterpret_cast<int*>(group_scores + groups);  // [groups][2]
  int* chosen = group_best + 2 * groups;                            // [top_k]
  __shared__ float total;
  const int64_t t = blockIdx.x;
  const int threads = static_cast<int>(blockDim.x);
  // The bias before the wait (no kernel writes it), so that its loads do not queue behind the next kernel's.
  for (int e = tid; e < E; e += threads) work[e] = a.correction_bias ? a.correction_bias[e] : 0.0f;
  wait_for_previous_grid();
  for (int e = tid; e < E; e += threads) {
    scores[e] = 1.0f / (1.0f + expf(-a.logits[t * E + e]));
    const float choice = scores[e] + work[e];
    work[e] = isnan(choice) ? -INFINITY : choice;  // a NaN ranks last, as on the CPU
  }
  __syncthreads();
  // Group masking (the topk_group groups with the best two-member sums keep their experts), unless every group is
  // kept (GLM-5.3-Flash: one group), when it would change nothing.
  if (a.topk_group < groups) {
    for (int e = tid; e < E; e += threads) {
      const int g = e / group_size, r = rank_of(work + g * group_size, group_size, e - g * group_size, 2);
      if (r < 2) group_best[2 * g + r] = e;
    }
    __syncthreads();
    for (int g = tid; g < groups; g += threads) {
      const float sum = work[group_best[2 * g]] + work[group_best[2 * g + 1]];
      group_scores[g] = isnan(sum) ? -INFINITY : sum;
    }
    __syncthreads();
    const int kept = static_cast<int>(a.topk_group);
    for (int g = tid; g < groups; g += threads) {
      if (rank_of(group_scores, groups, g, kept) >= kept) group_best[2 * g] = -1;  // masked
    }
    __syncthreads();
    for (int e = tid; e < E; e += threads) {
      if (group_best[2 * (e / group_size)] < 0) work[e] = -INFINITY;
    }
    __syncthreads();
  }
  for (int e = tid; e < E; e += threads) {
    const int r = rank_of(work, E, e, top_k);
    if (r < top_k) chosen[r] = e;
  }
  __syncthreads();
  // Weights from the scores, normalised by their total summed in rank order (the CPU's).
  if (tid == 0) {
    float sum = 0.0f;
    for (int i = 0; i < top_k; ++i) sum += scores[chosen[i]];
    total = sum;
  }
  __syncthreads();
  for (int i = tid; i < top_k; i += threads) {
    float weight = scores[chosen[i]];
    if (a.norm_topk_prob) weight /= total + 1e-20f;
    a.expert_ids[t * a.top_k + i] = chosen[i];
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
  const size_t shared = static_cast<size_t>(2 * a.num_experts + 3 * a.n_group + a.top_k) * sizeof(float);
  const unsigned threads = a.num_tokens <= kRouteFewTokens ? kRouteThreads : 32;
  return launch_dependent(route_kernel, dim3(static_cast<unsigned>(a.num_tokens)), dim3(threads), shared, stream, a);
}

}  // namespace kestrel::cuda

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/mhc_kernels.h"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float logistic(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float pre_weight(const float* m, const float* base, const float* scale, float hc_eps,
                                            int i) {
  return logistic(m[i] * scale[0] + base[i]) + hc_eps;
}

// The site's weights from its mixes m [(2 + hc) * hc] with the CPU backend's arithmetic, by one warp (every lane
// calls it): lane r < hc writes pre [hc] (when pre is set) and post_out [hc]; lane i * hc + j holds entry (i, j) of
// the combination matrix in a register through the softmax and the Sinkhorn passes and gathers its row's or column's
// entries by shuffles, so each sum runs over its row or column in the CPU's order and the results are the CPU's bit
// for bit (but expf's). The matrix ends in c [hc * hc].
__device__ void site_weights_by_warp(const float* m, const float* base, const float* scale, int hc, float hc_eps,
                                     int64_t sinkhorn_iters, float* pre, float* c, float* post_out) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = static_cast<int>(threadIdx.x % 32), i = lane / hc, j = lane % hc;
  const bool owner = lane < hc * hc;
  if (lane < hc) {
    if (pre != nullptr) pre[lane] = pre_weight(m, base, scale, hc_eps, lane);
    post_out[lane] = 2.0f * logistic(m[hc + lane] * scale[1] + base[hc + lane]);
  }
  // The loops run to the largest hc (hc is uniform across the warp), so that a sum's shuffles are in flight together
  // rather than one after another: the Sinkhorn passes are a serial chain on the site's critical path.
  const auto row_sum = [&](float v) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxHcMult; ++k) {
      const float entry = __shfl_sync(kAll, v, i * hc + k);
      if (k < hc) sum += entry;
    }
    return sum;
  };
  const auto column_sum = [&](float v) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxHcMult; ++k) {
      const float entry = __shfl_sync(kAll, v, k * hc + j);
      if (k < hc) sum += entry;
    }
    return sum;
  };
  float v = owner ? m[2 * hc + lane] * scale[2] + base[2 * hc + lane] : 0.0f;
  float row_max = -INFINITY;
#pragma unroll
  for (int k = 0; k < kMaxHcMult; ++k) {
    const float entry = __shfl_sync(kAll, v, i * hc + k);
    if (k < hc) row_max = fmaxf(row_max, entry);
  }
  v = expf(v - row_max);
  v = v / row_sum(v) + hc_eps;
  for (int64_t iter = 0; iter < sinkhorn_iters; ++iter) {
    if (iter > 0) v /= row_sum(v) + hc_eps;  // rows, then columns; the first iteration normalises the columns only
    v /= column_sum(v) + hc_eps;
  }
  if (owner) c[lane] = v;
}

// One block per token: the weights, then the block collapses the streams.
__global__ void __launch_bounds__(kThreads) mhc_mix_kernel(MhcMixArgs a) {
  wait_for_previous_grid();
  __shared__ float pre[kMaxHcMult];
  __shared__ float c[kMaxHcMult * kMaxHcMult];
  const int64_t t = blockIdx.x, hc = a.hc_mult, mix = (2 + hc) * hc;
  if (threadIdx.x < 32) {
    site_weights_by_warp(a.mixes + t * mix, a.base, a.scale, static_cast<int>(hc), a.hc_eps, a.sinkhorn_iters, pre, c,
                         a.post + t * hc);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < hc * hc; i += blockDim.x) a.comb[t * hc * hc + i] = c[i];
  const float* x = a.streams + t * hc * a.hidden;
  for (int64_t d = threadIdx.x; d < a.hidden; d += blockDim.x) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hc; ++i) sum += pre[i] * x[i * a.hidden + d];
    a.collapsed[t * a.hidden + d] = sum;
  }
}

// The post-mix of stream j at one channel: post_j * y + sum_i comb[i, j] * x_i, summed in i order (the CPU's), with
// x_i at x[i * x_stride].
__device__ __forceinline__ float post_mixed(const float* comb, int64_t hc, int64_t j, const float* x, int64_t x_stride,
                                            float post_j, float y) {
  float sum = 0.0f;
#pragma unroll  // to the largest hc, so that the loads are issued together
  for (int i = 0; i < kMaxHcMult; ++i) {
    if (i < hc) sum += comb[i * hc + j] * x[i * x_stride];
  }
  return post_j * y + sum;
}

// Grid (T, hidden / kThreads): each thread owns one channel d of one token, so the update can be in place.
__global__ void __launch_bounds__(kThreads) mhc_post_kernel(const float* post, const float* comb,
                                                            const float* block_out, int64_t hc, int64_t hidden,
                                                            float* streams) {
  wait_for_previous_grid();
  const int64_t t = blockIdx.x, d = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (d >= hidden) return;
  float* x = streams + t * hc * hidden;
  const float* c = comb + t * hc * hc;
  float in[kMaxHcMult];
  for (int64_t i = 0; i < hc; ++i) in[i] = x[i * hidden + d];
  const float y = block_out[t * hidden + d];
  for (int64_t j = 0; j < hc; ++j) x[j * hidden + d] = post_mixed(c, hc, j, in, 1, post[t * hc + j], y);
}

constexpr int kSiteChannels = 64;  // channels of a block's slice: hc_mult * 64 <= kThreads elements, one a thread
constexpr int kMaxSiteMix = (2 + kMaxHcMult) * kMaxHcMult;
constexpr int kMaxShareRows = kMaxSiteMix + kMaxHcMult * (kMaxHcMult + 1) / 2;

// A slice's shares, one row each: the mixes' fn · streams, then the streams' Gram matrix <x_i, x_j> for i <= j
// (its diagonal adds up to the sum of squares that the rms takes; with the pre weights it gives the collapsed
// stream's sum of squares, pre^T G pre, so the norm after the collapse needs no second pass over the slices).
__host__ __device__ constexpr int share_rows(int64_t hc) { return static_cast<int>((2 + hc) * hc + hc * (hc + 1) / 2); }
__device__ __forceinline__ int gram_row(int64_t hc, int64_t i, int64_t j) {
  return static_cast<int>((2 + hc) * hc + i * hc - i * (i - 1) / 2 + (j - i));
}

template <typename W>
__device__ __forceinline__ float weight_value(const W* w, int64_t i) {
  if constexpr (std::is_same_v<W, float>) {
    return w[i];
  } else {
    return static_cast<float>(w[i]);
  }
}

// The site's first launch, grid (slices, T). Thread e of a block owns stream i = e / 64 at channel
// d = slice * 64 + e % 64: it applies the pending post-mix to its element in place and the block writes its slice's
// shares (share_rows) to partials[t, row, slice] (a row's slices adjacent, for the collapse's loads).
template <typename W>
__global__ void __launch_bounds__(kThreads) mhc_site_shares_kernel(MhcSiteArgs a) {
  __shared__ float shares[kThreads / 32][kMaxShareRows];
  __shared__ float values[kThreads];
  const int64_t t = blockIdx.y, slice = blockIdx.x, slices = gridDim.x;
  const int64_t hc = a.hc_mult, D = a.hidden, mix = (2 + hc) * hc, width = hc * D, rows = share_rows(hc);
  const int64_t i = threadIdx.x / kSiteChannels, e = threadIdx.x % kSiteChannels, d = slice * kSiteChannels + e;
  const bool active = i < hc && d < D;
  float* x = a.streams + t * width;

  // This thread's column of fn, requested before waiting for the previous kernel (launch_dependent): the weights
  // are the one input no kernel writes.
  const auto* fn = static_cast<const W*>(a.fn);
  float weights[kMaxSiteMix];
#pragma unroll
  for (int r = 0; r < kMaxSiteMix; ++r) weights[r] = active && r < mix ? weight_value(fn, r * width + i * D + d) : 0.0f;
  wait_for_previous_grid();

  // The pending post-mix of this thread's element, in mhc_post's order; every element of the slice is read before
  // any is written.
  float value = 0.0f;
  if (active) {
    value = x[i * D + d];
    if (a.pending_post != nullptr) {
      value = post_mixed(a.pending_comb + t * hc * hc, hc, i, x + d, D, a.pending_post[t * hc + i],
                         a.pending_block_out[t * D + d]);
    }
  }
  values[threadIdx.x] = value;
  __syncthreads();
  if (a.pending_post != nullptr && active) x[i * D + d] = value;

  // Each warp holds 32 channels of one stream (i is warp-uniform): its sums of fn · x_i and of x_i · x_j, j >= i.
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32u;
#pragma unroll
  for (int r = 0; r < kMaxSiteMix; ++r) {
    if (r < mix) {
      const float v = warp_sum(weights[r] * value);
      if (lane == 0) shares[warp][r] = v;
    }
  }
  for (int64_t j = 0; j < hc; ++j) {
    for (int64_t k = j; k < hc; ++k) {
      float v = 0.0f;
      if (j == i) v = warp_sum(value * values[k * kSiteChannels + e]);
      if (lane == 0) shares[warp][gram_row(hc, j, k)] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    float sum = 0.0f;
    for (unsigned w = 0; w < kThreads / 32; ++w) sum += shares[w][threadIdx.x];
    a.partials[(t * rows + threadIdx.x) * slices + slice] = sum;
  }
}

// The site's second launch, same grid: every block sums the token's shares in slice order (so every block holds the
// same totals), collapses its 64 channels with the pre weights and normalises them with the rms that pre^T G pre
// gives; slice 0's first warp computes post and comb meanwhile.
__global__ void __launch_bounds__(kThreads) mhc_site_collapse_kernel(MhcSiteArgs a) {
  __shared__ float totals[kMaxShareRows];
  __shared__ float mixes[kMaxSiteMix];
  __shared__ float pre[kMaxHcMult];
  const int64_t t = blockIdx.y, slice = blockIdx.x, slices = gridDim.x;
  const int64_t hc = a.hc_mult, D = a.hidden, mix = (2 + hc) * hc, width = hc * D, rows = share_rows(hc);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32u;
  // The last two warps collapse, so that the first can run the Sinkhorn passes alongside.
  const int64_t e = static_cast<int64_t>(threadIdx.x) - (kThreads - kSiteChannels), d = slice * kSiteChannels + e;
  const bool collapses = e >= 0 && d < D;
  const float norm_weight = collapses && a.norm_weight != nullptr ? a.norm_weight[d] : 1.0f;
  wait_for_previous_grid();

  // Warp w sums rows w, w + 8, ...: every load is issued before the first sum is needed (lane l adds slices l,
  // l + 32, ... in order, then the warp's butterfly).
  const float* shares = a.partials + t * rows * slices;
  constexpr int kRowsPerWarp = (kMaxShareRows + kThreads / 32 - 1) / (kThreads / 32);
  float sums[kRowsPerWarp] = {};
  for (int64_t s0 = 0; s0 < slices; s0 += 64) {
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      const int64_t r = warp + j * (kThreads / 32);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t s = s0 + lane + 32 * half;
        if (r < rows && s < slices) sums[j] += shares[r * slices + s];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int64_t r = warp + j * (kThreads / 32);
    const float sum = warp_sum(sums[j]);
    if (lane == 0 && r < rows) totals[r] = sum;
  }
  __syncthreads();
  float squares = 0.0f;
  for (int64_t i = 0; i < hc; ++i) squares += totals[gram_row(hc, i, i)];
  const float inv_rms = 1.0f / sqrtf(squares / static_cast<float>(width) + a.rms_eps);
  if (threadIdx.x < mix) mixes[threadIdx.x] = totals[threadIdx.x] * inv_rms;
  __syncthreads();
  if (threadIdx.x < hc) pre[threadIdx.x] = pre_weight(mixes, a.base, a.scale, a.hc_eps, static_cast<int>(threadIdx.x));
  __syncthreads();

  if (slice == 0 && warp == 0) {
    float* comb = a.comb + t * hc * hc;
    site_weights_by_warp(mixes, a.base, a.scale, static_cast<int>(hc), a.hc_eps, a.sinkhorn_iters, nullptr, comb,
                         a.post + t * hc);
  }
  if (!collapses) return;
  const float* x = a.streams + t * width;
  float collapsed = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxHcMult; ++i) {
    if (i < hc) collapsed += pre[i] * x[i * D + d];
  }
  // The collapsed stream's sum of squares, sum_ij pre_i pre_j <x_i, x_j>, in double: the cross terms may cancel.
  double collapsed_squares = 0.0;
  for (int64_t i = 0; i < hc; ++i) {
    for (int64_t j = 0; j < hc; ++j) {
      const float gram = totals[i <= j ? gram_row(hc, i, j) : gram_row(hc, j, i)];
      collapsed_squares += static_cast<double>(pre[i]) * pre[j] * gram;
    }
  }
  const float inv_norm =
      1.0f / sqrtf(static_cast<float>(collapsed_squares) / static_cast<float>(D) + a.rms_eps);
  a.collapsed[t * D + d] = collapsed;
  a.normed[t * D + d] = norm_weight * (collapsed * inv_norm);
}

int64_t site_slices(int64_t hidden) { return (hidden + kSiteChannels - 1) / kSiteChannels; }

}  // namespace

cudaError_t mhc_mix(const MhcMixArgs& args, cudaStream_t stream) {
  if (args.hc_mult < 1 || args.hc_mult > kMaxHcMult || args.sinkhorn_iters < 1) return cudaErrorInvalidValue;
  if (args.num_tokens == 0) return cudaSuccess;
  return launch_dependent(mhc_mix_kernel, dim3(static_cast<unsigned>(args.num_tokens)), dim3(kThreads), 0, stream,
                          args);
}

cudaError_t mhc_post(const float* post, const float* comb, const float* block_out, int64_t num_tokens,
                     int64_t hc_mult, int64_t hidden, float* streams, cudaStream_t stream) {
  if (hc_mult < 1 || hc_mult > kMaxHcMult) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>((hidden + kThreads - 1) / kThreads));
  return launch_dependent(mhc_post_kernel, grid, dim3(kThreads), 0, stream, post, comb, block_out, hc_mult, hidden,
                          streams);
}

int64_t mhc_site_scratch_floats(int64_t num_tokens, int64_t hc_mult, int64_t hidden) {
  return num_tokens * site_slices(hidden) * share_rows(hc_mult);
}

cudaError_t mhc_site(const MhcSiteArgs& a, cudaStream_t stream) {
  const bool pending = a.pending_post != nullptr;
  if (a.hc_mult < 1 || a.hc_mult > kMaxHcMult || a.sinkhorn_iters < 1 || a.hidden < 1 ||
      a.fn_type == DenseWeightType::f8_e4m3 || pending != (a.pending_comb != nullptr) ||
      pending != (a.pending_block_out != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.num_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(site_slices(a.hidden)), static_cast<unsigned>(a.num_tokens));
  // Dependent launches: the shares' fn loads overlap the previous kernel's tail, the collapse's start the shares'.
  cudaError_t status = cudaErrorInvalidValue;
  switch (a.fn_type) {
    case DenseWeightType::f32:
      status = launch_dependent(mhc_site_shares_kernel<float>, grid, dim3(kThreads), 0, stream, a);
      break;
    case DenseWeightType::f16:
      status = launch_dependent(mhc_site_shares_kernel<__half>, grid, dim3(kThreads), 0, stream, a);
      break;
    case DenseWeightType::bf16:
      status = launch_dependent(mhc_site_shares_kernel<__nv_bfloat16>, grid, dim3(kThreads), 0, stream, a);
      break;
    case DenseWeightType::f8_e4m3:
      break;
  }
  if (status != cudaSuccess) return status;
  return launch_dependent(mhc_site_collapse_kernel, grid, dim3(kThreads), 0, stream, a);
}

}  // namespace kestrel::cuda

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/mhc_kernels.h"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float logistic(float x) { return 1.0f / (1.0f + expf(-x)); }

// The site's weights from its mixes m [(2 + hc) * hc] with the CPU backend's arithmetic, by warp 0: lane r < hc
// writes pre [hc] (shared) and post_out [hc]; lane i * hc + j holds entry (i, j) of the combination matrix in a
// register through the softmax and the Sinkhorn passes and gathers its row's or column's entries by shuffles, so
// each sum runs over its row or column in the CPU's order and the results are the CPU's bit for bit (but expf's).
// The matrix ends in c [hc * hc] (shared). Every thread of the block calls it; it returns after a barrier.
__device__ void site_weights(const float* m, const float* base, const float* scale, int hc, float hc_eps,
                             int64_t sinkhorn_iters, float* pre, float* c, float* post_out) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x), i = lane / hc, j = lane % hc;
    const bool owner = lane < hc * hc;
    if (lane < hc) {
      pre[lane] = logistic(m[lane] * scale[0] + base[lane]) + hc_eps;
      post_out[lane] = 2.0f * logistic(m[hc + lane] * scale[1] + base[hc + lane]);
    }
    const auto row_sum = [&](float v) {
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += __shfl_sync(kAll, v, i * hc + k);
      return sum;
    };
    const auto column_sum = [&](float v) {
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += __shfl_sync(kAll, v, k * hc + j);
      return sum;
    };
    float v = owner ? m[2 * hc + lane] * scale[2] + base[2 * hc + lane] : 0.0f;
    float row_max = -INFINITY;
    for (int k = 0; k < hc; ++k) row_max = fmaxf(row_max, __shfl_sync(kAll, v, i * hc + k));
    v = expf(v - row_max);
    v = v / row_sum(v) + hc_eps;
    for (int64_t iter = 0; iter < sinkhorn_iters; ++iter) {
      if (iter > 0) v /= row_sum(v) + hc_eps;  // rows, then columns; the first iteration normalises the columns only
      v /= column_sum(v) + hc_eps;
    }
    if (owner) c[lane] = v;
  }
  __syncthreads();
}

// One block per token: the weights, then the block collapses the streams.
__global__ void __launch_bounds__(kThreads) mhc_mix_kernel(MhcMixArgs a) {
  __shared__ float pre[kMaxHcMult];
  __shared__ float c[kMaxHcMult * kMaxHcMult];
  const int64_t t = blockIdx.x, hc = a.hc_mult, mix = (2 + hc) * hc;
  site_weights(a.mixes + t * mix, a.base, a.scale, static_cast<int>(hc), a.hc_eps, a.sinkhorn_iters, pre, c,
               a.post + t * hc);
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
  for (int64_t i = 0; i < hc; ++i) sum += comb[i * hc + j] * x[i * x_stride];
  return post_j * y + sum;
}

// Grid (T, hidden / kThreads): each thread owns one channel d of one token, so the update can be in place.
__global__ void __launch_bounds__(kThreads) mhc_post_kernel(const float* post, const float* comb,
                                                            const float* block_out, int64_t hc, int64_t hidden,
                                                            float* streams) {
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

template <typename W>
__device__ __forceinline__ float weight_value(const W* w, int64_t i) {
  if constexpr (std::is_same_v<W, float>) {
    return w[i];
  } else {
    return static_cast<float>(w[i]);
  }
}

// Grid (slices, T). Thread e of a block owns stream e / 64 at channel slice * 64 + e % 64.
template <typename W>
__global__ void __launch_bounds__(kThreads) mhc_site_kernel(MhcSiteArgs a) {
  __shared__ float shares[kThreads / 32][kMaxSiteMix + 1];
  __shared__ float totals[kMaxSiteMix + 1];
  __shared__ float pre[kMaxHcMult];
  __shared__ float c[kMaxHcMult * kMaxHcMult];
  __shared__ float reduce[32];
  __shared__ bool last;
  const int64_t t = blockIdx.y, slice = blockIdx.x, slices = gridDim.x;
  const int64_t hc = a.hc_mult, D = a.hidden, mix = (2 + hc) * hc, width = hc * D;
  const int64_t i = threadIdx.x / kSiteChannels, d = slice * kSiteChannels + threadIdx.x % kSiteChannels;
  const bool active = i < hc && d < D;
  float* x = a.streams + t * width;

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
  if (a.pending_post != nullptr) {
    __syncthreads();
    if (active) x[i * D + d] = value;
  }

  // This slice's share of fn · streams (one per mix row) and of the sum of squares, summed over the block. All of a
  // thread's fn loads are issued before the first sum waits on one.
  const auto* fn = static_cast<const W*>(a.fn);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32u;
  float products[kMaxSiteMix + 1];
#pragma unroll
  for (int r = 0; r < kMaxSiteMix; ++r) {
    products[r] = active && r < mix ? weight_value(fn, r * width + i * D + d) * value : 0.0f;
  }
  products[kMaxSiteMix] = value * value;
#pragma unroll
  for (int r = 0; r <= kMaxSiteMix; ++r) {
    if (r < mix || r == kMaxSiteMix) {
      const float v = warp_sum(products[r]);
      if (lane == 0) shares[warp][r < mix ? r : mix] = v;
    }
  }
  __syncthreads();
  float* partial = a.partials + (t * slices + slice) * (mix + 1);
  if (threadIdx.x <= mix) {
    float sum = 0.0f;
    for (unsigned w = 0; w < kThreads / 32; ++w) sum += shares[w][threadIdx.x];
    partial[threadIdx.x] = sum;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counters + t, 1u) == slices - 1;
  __syncthreads();
  if (!last) return;

  // The token's last block: every slice's stream update and share is visible (fence, then counter); they are read
  // past L1, which may hold lines from before the other blocks wrote them.
  __threadfence();
  const float* shares_of_token = a.partials + t * slices * (mix + 1);
  for (int64_t r = warp; r <= mix; r += kThreads / 32) {
    float sum = 0.0f;
    for (int64_t s = lane; s < slices; s += 32) sum += __ldcg(shares_of_token + s * (mix + 1) + r);
    sum = warp_sum(sum);
    if (lane == 0) totals[r] = sum;
  }
  __syncthreads();
  const float inv_rms = 1.0f / sqrtf(totals[mix] / static_cast<float>(width) + a.rms_eps);
  if (threadIdx.x < mix) totals[threadIdx.x] *= inv_rms;
  __syncthreads();
  site_weights(totals, a.base, a.scale, static_cast<int>(hc), a.hc_eps, a.sinkhorn_iters, pre, c, a.post + t * hc);
  for (int64_t k = threadIdx.x; k < hc * hc; k += blockDim.x) a.comb[t * hc * hc + k] = c[k];

  // Collapse: the token's hc * hidden streams (64 KB at the model's size) by one block, four channels a load where
  // rows are 16-byte aligned, with the loads of several channel groups in flight.
  float* collapsed = a.collapsed + t * D;
  float squares = 0.0f;
  if (D % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(collapsed) % 16 == 0) {
    const auto* x4 = reinterpret_cast<const float4*>(x);
    auto* collapsed4 = reinterpret_cast<float4*>(collapsed);
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < D / 4; k += blockDim.x) {
      float4 in[kMaxHcMult];
#pragma unroll
      for (int j = 0; j < kMaxHcMult; ++j) in[j] = j < hc ? __ldcg(x4 + j * (D / 4) + k) : float4{};
      float4 sum{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kMaxHcMult; ++j) {
        if (j < hc) {
          sum.x += pre[j] * in[j].x;
          sum.y += pre[j] * in[j].y;
          sum.z += pre[j] * in[j].z;
          sum.w += pre[j] * in[j].w;
        }
      }
      collapsed4[k] = sum;
      squares += sum.x * sum.x + sum.y * sum.y + sum.z * sum.z + sum.w * sum.w;
    }
  } else {
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += pre[j] * __ldcg(x + j * D + k);
      collapsed[k] = sum;
      squares += sum * sum;
    }
  }
  const float inv_norm = 1.0f / sqrtf(block_sum(squares, reduce) / static_cast<float>(D) + a.rms_eps);
  for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
    a.normed[t * D + k] = (a.norm_weight ? a.norm_weight[k] : 1.0f) * (collapsed[k] * inv_norm);
  }
  if (threadIdx.x == 0) a.counters[t] = 0;
}

int64_t site_slices(int64_t hidden) { return (hidden + kSiteChannels - 1) / kSiteChannels; }

}  // namespace

cudaError_t mhc_mix(const MhcMixArgs& args, cudaStream_t stream) {
  if (args.hc_mult < 1 || args.hc_mult > kMaxHcMult || args.sinkhorn_iters < 1) return cudaErrorInvalidValue;
  if (args.num_tokens == 0) return cudaSuccess;
  mhc_mix_kernel<<<static_cast<unsigned>(args.num_tokens), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t mhc_post(const float* post, const float* comb, const float* block_out, int64_t num_tokens,
                     int64_t hc_mult, int64_t hidden, float* streams, cudaStream_t stream) {
  if (hc_mult < 1 || hc_mult > kMaxHcMult) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>((hidden + kThreads - 1) / kThreads));
  mhc_post_kernel<<<grid, kThreads, 0, stream>>>(post, comb, block_out, hc_mult, hidden, streams);
  return cudaGetLastError();
}

int64_t mhc_site_scratch_floats(int64_t num_tokens, int64_t hc_mult, int64_t hidden) {
  return num_tokens * site_slices(hidden) * ((2 + hc_mult) * hc_mult + 1);
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
  switch (a.fn_type) {
    case DenseWeightType::f32:
      mhc_site_kernel<float><<<grid, kThreads, 0, stream>>>(a);
      break;
    case DenseWeightType::f16:
      mhc_site_kernel<__half><<<grid, kThreads, 0, stream>>>(a);
      break;
    case DenseWeightType::bf16:
      mhc_site_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
      break;
    case DenseWeightType::f8_e4m3:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kestrel::cuda

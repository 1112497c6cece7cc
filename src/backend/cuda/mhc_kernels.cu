#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/dynamic_shared.cuh"
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

// The few-token site's first part, grid (slices, T). Thread e of a block owns stream i = e / 64 at channel
// d = slice * 64 + e % 64: it applies the pending post-mix to its element in place (and leaves it in values[e], the
// caller's shared memory) and the block writes its slice's shares (share_rows) to partials[t, row, slice] (a row's
// slices adjacent, for the collapse's loads). It waits for the previous grid itself, after requesting fn.
template <typename W, bool kLetNextLaunch = true>
__device__ __forceinline__ void site_shares(const MhcSiteArgs& a, float (&values)[kThreads]) {
  __shared__ float shares[kThreads / 32][kMaxShareRows];
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
  if constexpr (kLetNextLaunch) {
    wait_for_previous_grid();
  } else {
    wait_for_previous_grid_only();
  }

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

template <typename W>
__global__ void __launch_bounds__(kThreads) mhc_site_shares_kernel(MhcSiteArgs a) {
  __shared__ float values[kThreads];
  site_shares<W>(a, values);
}

// Up to this many tokens a site runs a block per (slice, token); above, tiles of tokens (mhc_site).
constexpr int64_t kOneTokenSiteMaxTokens = 16;
// Tokens of a block of the tiled first launch (mhc_tile_shares_kernel): fn's slice is staged in shared memory once a
// tile of tokens rather than read once per token.
constexpr int kTileTokens = 64;
constexpr int kTileRow = kMaxHcMult * kSiteChannels + 1;  // floats per token's row: lanes (tokens) in distinct banks
constexpr int kTileReduceRow = kMaxSiteMix + kMaxHcMult + 1;  // a thread's sums: mixes, then <x_i, x_j> for j >= i
constexpr int kTileFnFloats = kMaxHcMult * kSiteChannels * kMaxSiteMix;
constexpr int kTileMixFloats = kTileTokens * (kMaxHcMult * kMaxHcMult + kMaxHcMult);  // pending comb and post
// Elements of the tile a thread post-mixes at once (tile pairs of (token, channel), all hc streams): their loads are
// in flight together.
constexpr int kTilePairsAtOnce = 8;

size_t tile_shared_bytes() {
  const size_t tile = size_t{kTileTokens} * kTileRow, reduce = size_t{kTileTokens} * kMaxHcMult * kTileReduceRow;
  return (kTileFnFloats + kTileMixFloats + std::max(tile, reduce)) * sizeof(float);
}

// The site's first launch for many tokens, grid (slices, token tiles): what mhc_site_shares_kernel computes, with
// the arithmetic arranged for a tile of 64 tokens. The block stages fn's slice (loaded before waiting: no kernel
// writes it) and the tokens' pending comb and post, applies the pending post-mix to its 64 tokens x hc streams x 64
// channels and keeps them in shared memory; then sums fn . x_i and <x_i, x_j>, j >= i, over the slice's 64 channels
// per token and stream i, and adds the streams' sums in stream order. Its shares go to partials[t, slice, row] (a
// token's rows adjacent, so that the block's writes fill whole sectors: [t, row, slice], the few-token layout, cost
// the site more in partly written sectors than the products).
template <typename W>
__global__ void __launch_bounds__(kThreads, 2) mhc_tile_shares_kernel(MhcSiteArgs a) {
  // Index arithmetic in 32 bits where it fits (a tile's offsets), 64 only for addresses into the call's arrays: the
  // kernel is bound on issuing instructions.
  extern __shared__ __align__(16) float tile_shared[];
  float* fn_slice = tile_shared;                   // [stream][channel][kMaxSiteMix]
  float* pending = fn_slice + kTileFnFloats;       // [token][comb hc x hc, then post hc]
  float* tile = pending + kTileMixFloats;          // [token][stream * 64 + channel]
  float* sums = tile;  // [token][stream][kTileReduceRow], once the tile has been read
  __shared__ int gram_source[kMaxShareRows];       // a Gram row's place in a token's sums
  const int tid = static_cast<int>(threadIdx.x), slice = static_cast<int>(blockIdx.x);
  const int slices = static_cast<int>(gridDim.x);
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileTokens, D = a.hidden, width = a.hc_mult * D;
  const int hc = static_cast<int>(a.hc_mult), mix = (2 + hc) * hc, rows = share_rows(hc);
  const int d0 = slice * kSiteChannels, channels = static_cast<int>(min(static_cast<int64_t>(kSiteChannels), D - d0));
  const int tokens = static_cast<int>(min(static_cast<int64_t>(kTileTokens), a.num_tokens - t0));
  const bool has_pending = a.pending_post != nullptr;

  // fn's slice: every load issued, then stored.
  constexpr int kFnPerThread = kTileFnFloats / kThreads;
  const auto* fn = static_cast<const W*>(a.fn);
  float fn_values[kFnPerThread];
#pragma unroll
  for (int n = 0; n < kFnPerThread; ++n) {
    const int i = tid + n * kThreads, c = i % kSiteChannels;
    const int stream = i / kSiteChannels % kMaxHcMult, r = i / (kSiteChannels * kMaxHcMult);
    fn_values[n] = r < mix && stream < hc && c < channels ? weight_value(fn, r * width + stream * D + d0 + c) : 0.0f;
  }
#pragma unroll
  for (int n = 0; n < kFnPerThread; ++n) {
    const int i = tid + n * kThreads, c = i % kSiteChannels;
    const int stream = i / kSiteChannels % kMaxHcMult, r = i / (kSiteChannels * kMaxHcMult);
    fn_slice[(stream * kSiteChannels + c) * kMaxSiteMix + r] = fn_values[n];
  }
  if (tid >= mix && tid < rows) {
    const int r = tid;
    int i = 0;
    while (gram_row(hc, i, hc - 1) < r) ++i;
    gram_source[r] = i * kTileReduceRow + kMaxSiteMix + i + (r - gram_row(hc, i, i));
  }
  wait_for_previous_grid();

  constexpr int kPendingRow = kMaxHcMult * kMaxHcMult + kMaxHcMult;
  if (has_pending) {
    for (int i = tid; i < tokens * kPendingRow; i += kThreads) {
      const int local = i / kPendingRow, e = i % kPendingRow;
      const int64_t t = t0 + local;
      float v = 0.0f;
      if (e < hc * hc) {
        v = a.pending_comb[t * hc * hc + e];
      } else if (e >= kMaxHcMult * kMaxHcMult && e - kMaxHcMult * kMaxHcMult < hc) {
        v = a.pending_post[t * hc + e - kMaxHcMult * kMaxHcMult];
      }
      pending[i] = v;
    }
  }
  __syncthreads();

  // A warp takes 32 channels of one token: each thread post-mixes its channel's hc streams (mhc_post's order),
  // kTilePairsAtOnce (token, channel) pairs at a time.
  constexpr int kPairs = kTileTokens * kSiteChannels;
  static_assert(kPairs % (kThreads * kTilePairsAtOnce) == 0, "whole rounds of pairs");
  for (int first = tid; first < kPairs; first += kThreads * kTilePairsAtOnce) {
    float in[kTilePairsAtOnce][kMaxHcMult] = {}, y[kTilePairsAtOnce] = {};
#pragma unroll
    for (int n = 0; n < kTilePairsAtOnce; ++n) {
      const int p = first + n * kThreads, local = p / kSiteChannels, c = p % kSiteChannels;
      if (local >= tokens || c >= channels) continue;
      const float* x = a.streams + (t0 + local) * width + d0 + c;
#pragma unroll
      for (int i = 0; i < kMaxHcMult; ++i) {
        if (i < hc) in[n][i] = x[i * D];
      }
      if (has_pending) y[n] = a.pending_block_out[(t0 + local) * D + d0 + c];
    }
#pragma unroll
    for (int n = 0; n < kTilePairsAtOnce; ++n) {
      const int p = first + n * kThreads, local = p / kSiteChannels, c = p % kSiteChannels;
      if (has_pending && local < tokens && c < channels) {
        const float* token_pending = pending + local * kPendingRow;
        float mixed[kMaxHcMult];
#pragma unroll
        for (int j = 0; j < kMaxHcMult; ++j) {
          if (j < hc) {
            mixed[j] = post_mixed(token_pending, hc, j, in[n], 1, token_pending[kMaxHcMult * kMaxHcMult + j], y[n]);
          }
        }
        float* x = a.streams + (t0 + local) * width + d0 + c;
#pragma unroll
        for (int j = 0; j < kMaxHcMult; ++j) {
          if (j < hc) x[j * D] = in[n][j] = mixed[j];
        }
      }
#pragma unroll
      for (int i = 0; i < kMaxHcMult; ++i) tile[local * kTileRow + i * kSiteChannels + c] = in[n][i];
    }
  }
  __syncthreads();

  // fn . x_i: stream i = threadIdx.x / 64's 64 threads hold 4 x 6 tiles of (tokens, mix rows), tokens g + 16 u
  // (g = threadIdx.x % 16) and rows 6 (threadIdx.x % 64 / 16) + v: each x and fn value read serves 6 or 4 products.
  // <x_i, x_j>, j >= i: thread (token threadIdx.x % 64, stream i).
  constexpr int kTileTokenGroups = 16, kTileRowsPerThread = kMaxSiteMix / 4;
  const int stream = tid / kTileTokens, token_group = tid % kTileTokenGroups;
  const int row_group = tid % kTileTokens / kTileTokenGroups, local = tid % kTileTokens;
  const bool active = stream < hc;
  float mixes[kTileTokens / kTileTokenGroups][kTileRowsPerThread] = {}, gram[kMaxHcMult] = {};
  if (active) {
    const float* weights = fn_slice + stream * kSiteChannels * kMaxSiteMix + row_group * kTileRowsPerThread;
    const float* columns = tile + token_group * kTileRow + stream * kSiteChannels;
#pragma unroll 2
    for (int c = 0; c < kSiteChannels; ++c) {
      float x[kTileTokens / kTileTokenGroups], w[kTileRowsPerThread];
#pragma unroll
      for (int u = 0; u < kTileTokens / kTileTokenGroups; ++u) x[u] = columns[u * kTileTokenGroups * kTileRow + c];
#pragma unroll
      for (int v = 0; v < kTileRowsPerThread; ++v) w[v] = weights[c * kMaxSiteMix + v];
#pragma unroll
      for (int u = 0; u < kTileTokens / kTileTokenGroups; ++u) {
#pragma unroll
        for (int v = 0; v < kTileRowsPerThread; ++v) mixes[u][v] += w[v] * x[u];
      }
    }
    const float* row = tile + local * kTileRow;
#pragma unroll 4
    for (int c = 0; c < kSiteChannels; ++c) {
      const float x = row[stream * kSiteChannels + c];
#pragma unroll
      for (int j = 0; j < kMaxHcMult; ++j) {
        if (j >= stream && j < hc) gram[j] += x * row[j * kSiteChannels + c];
      }
    }
  }
  __syncthreads();  // the tile is read: its memory now takes the sums
  if (active) {
#pragma unroll
    for (int u = 0; u < kTileTokens / kTileTokenGroups; ++u) {
      float* own = sums + ((token_group + u * kTileTokenGroups) * kMaxHcMult + stream) * kTileReduceRow;
#pragma unroll
      for (int v = 0; v < kTileRowsPerThread; ++v) own[row_group * kTileRowsPerThread + v] = mixes[u][v];
    }
    float* own = sums + (local * kMaxHcMult + stream) * kTileReduceRow;
#pragma unroll
    for (int j = 0; j < kMaxHcMult; ++j) own[kMaxSiteMix + j] = gram[j];
  }
  __syncthreads();
  // Warp w writes tokens w, w + 8, ...: lane r row r (and r + 32), the mix rows the streams' sums in stream order.
  const int warp = tid / 32, lane = tid % 32;
  for (int token = warp; token < tokens; token += kThreads / 32) {
    const float* token_sums = sums + token * kMaxHcMult * kTileReduceRow;
    float* out = a.partials + ((t0 + token) * slices + slice) * rows;
    for (int r = lane; r < rows; r += 32) {
      float total = 0.0f;
      if (r < mix) {
        for (int i = 0; i < hc; ++i) total += token_sums[i * kTileReduceRow + r];
      } else {
        total = token_sums[gram_source[r]];
      }
      out[r] = total;
    }
  }
}

// 1 / rms of the collapsed stream sum_i pre_i x_i from the site's totals: its sum of squares is
// sum_ij pre_i pre_j <x_i, x_j>, summed in double (the cross terms may cancel).
__device__ __forceinline__ float collapsed_inv_norm(const float* totals, const float* pre, int64_t hc, int64_t D,
                                                    float rms_eps) {
  double collapsed_squares = 0.0;
  for (int64_t i = 0; i < hc; ++i) {
    for (int64_t j = 0; j < hc; ++j) {
      const float gram = totals[i <= j ? gram_row(hc, i, j) : gram_row(hc, j, i)];
      collapsed_squares += static_cast<double>(pre[i]) * pre[j] * gram;
    }
  }
  return 1.0f / sqrtf(static_cast<float>(collapsed_squares) / static_cast<float>(D) + rms_eps);
}

// The channel of its slice that a thread of the few-token site's second part collapses: the last two warps', so that
// the first can run the Sinkhorn passes alongside; -1 for the other threads.
__device__ __forceinline__ int64_t site_collapse_channel(const MhcSiteArgs& a) {
  const int64_t e = static_cast<int64_t>(threadIdx.x) - (kThreads - kSiteChannels), d = blockIdx.x * kSiteChannels + e;
  return e >= 0 && d < a.hidden ? d : -1;
}

// The constants the second part reads, requested before the wait (no kernel writes them): after it, their loads
// would queue behind the first weights that the next product's blocks request as they start. The thread's norm
// weight, and the mixes' base and scales in shared memory (read after a __syncthreads).
struct SiteConstants {
  float norm_weight;
  float* base;   // shared [kMaxSiteMix]
  float* scale;  // shared [3]
};
__device__ __forceinline__ SiteConstants site_constants(const MhcSiteArgs& a) {
  __shared__ float base[kMaxSiteMix];
  __shared__ float scale[3];
  const int mix = static_cast<int>((2 + a.hc_mult) * a.hc_mult);
  if (threadIdx.x < mix) base[threadIdx.x] = a.base[threadIdx.x];
  if (threadIdx.x < 3) scale[threadIdx.x] = a.scale[threadIdx.x];
  const int64_t d = site_collapse_channel(a);
  return SiteConstants{.norm_weight = d >= 0 && a.norm_weight != nullptr ? a.norm_weight[d] : 1.0f,
                       .base = base,
                       .scale = scale};
}

// The few-token site's second part, same grid, once every block's shares are written: every block sums the token's
// shares in slice order (so every block holds the same totals; read through L2, as other blocks of the same grid may
// have written them), collapses its 64 channels with the pre weights and normalises them with the rms that
// pre^T G pre gives; slice 0's first warp computes post and comb meanwhile. In one launch the block still holds its
// slice's post-mixed streams (slice_values, site_shares' values): read there rather than from L2 again.
__device__ __forceinline__ void site_collapse(const MhcSiteArgs& a, const SiteConstants& constants,
                                              const float* slice_values = nullptr) {
  __shared__ float totals[kMaxShareRows];
  __shared__ float mixes[kMaxSiteMix];
  __shared__ float pre[kMaxHcMult];
  const int64_t t = blockIdx.y, slice = blockIdx.x, slices = gridDim.x;
  const int64_t hc = a.hc_mult, D = a.hidden, mix = (2 + hc) * hc, width = hc * D, rows = share_rows(hc);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32u;
  const int64_t d = site_collapse_channel(a);

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
        if (r < rows && s < slices) sums[j] += __ldcg(shares + r * slices + s);
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
  if (threadIdx.x < hc) {
    pre[threadIdx.x] = pre_weight(mixes, constants.base, constants.scale, a.hc_eps, static_cast<int>(threadIdx.x));
  }
  __syncthreads();

  if (slice == 0 && warp == 0) {
    float* comb = a.comb + t * hc * hc;
    site_weights_by_warp(mixes, constants.base, constants.scale, static_cast<int>(hc), a.hc_eps, a.sinkhorn_iters,
                         nullptr, comb, a.post + t * hc);
  }
  if (d < 0) return;
  const float* x = a.streams + t * width;
  float collapsed = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxHcMult; ++i) {
    if (i < hc) {
      const float xi = slice_values != nullptr ? slice_values[i * kSiteChannels + d % kSiteChannels] : x[i * D + d];
      collapsed += pre[i] * xi;
    }
  }
  const float inv_norm = collapsed_inv_norm(totals, pre, hc, D, a.rms_eps);
  a.collapsed[t * D + d] = collapsed;
  a.normed[t * D + d] = constants.norm_weight * (collapsed * inv_norm);
}

__global__ void __launch_bounds__(kThreads) mhc_site_collapse_kernel(MhcSiteArgs a) {
  const SiteConstants constants = site_constants(a);
  wait_for_previous_grid();
  site_collapse(a, constants);
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid waits here until all have arrived; the grid must fit on the GPU at once. counts[0] counts
// the arrivals, counts[1] the departures, and the last to leave zeroes both for the next grid.
__device__ void grid_barrier(unsigned* counts) {
  const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // the block's writes are visible before its arrival counts
    atomicAdd(&counts[0], 1u);
    while (load_acquire(&counts[0]) < blocks) {
    }
    __threadfence();
    if (atomicAdd(&counts[1], 1u) == blocks - 1) {
      atomicExch(&counts[0], 0u);
      atomicExch(&counts[1], 0u);
    }
  }
  __syncthreads();
}

// Both parts in one launch, a grid barrier between them where the kernel boundary was: the site's chain loses a
// launch's drain and start (the grid is at most what the GPU holds at once: mhc_site checks). The next grid launches
// once every block is past the barrier, so its blocks take no SM that one of these still waits for, and its first
// weights do not compete with the shares' loads.
template <typename W>
__global__ void __launch_bounds__(kThreads) mhc_site_one_launch_kernel(MhcSiteArgs a) {
  __shared__ float values[kThreads];
  const SiteConstants constants = site_constants(a);
  site_shares<W, false>(a, values);
  grid_barrier(a.barrier);
  let_next_grid_launch();
  site_collapse(a, constants, values);
}

// Channels of its token a lane of mhc_tile_collapse_kernel loads at once.
constexpr int kTileCollapseBatch = 8;

// The many-token site's second launch: a warp per token, 8 tokens a block. The warp sums the token's shares
// (partials[t, slice, row]) in slice order (lane l adds slices l, l + 32, ..., then the butterfly, eight rows at a
// time), computes the pre weights, collapses and normalises the token's channels (lane l channels l, l + 32, ...,
// kTileCollapseBatch at once), then post and comb (site_weights_by_warp): each token's totals are summed once, and
// the Sinkhorn passes of a block's tokens run side by side.
__global__ void __launch_bounds__(kThreads) mhc_tile_collapse_kernel(MhcSiteArgs a, int64_t slices) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float token_totals[kWarps][kMaxShareRows];
  __shared__ float token_mixes[kWarps][kMaxSiteMix];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t hc = a.hc_mult, D = a.hidden, mix = (2 + hc) * hc, width = hc * D, rows = share_rows(hc);
  wait_for_previous_grid();
  if (t >= a.num_tokens) return;
  float* totals = token_totals[warp];
  float* mixes = token_mixes[warp];
  const float* shares = a.partials + t * rows * slices;
  constexpr int kRowsAtOnce = 8;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowsAtOnce) {
    float sums[kRowsAtOnce] = {};
    for (int64_t s0 = 0; s0 < slices; s0 += 32) {
#pragma unroll
      for (int j = 0; j < kRowsAtOnce; ++j) {
        if (r0 + j < rows && s0 + lane < slices) sums[j] += shares[(s0 + lane) * rows + r0 + j];
      }
    }
#pragma unroll
    for (int j = 0; j < kRowsAtOnce; ++j) {
      const float sum = warp_sum(sums[j]);
      if (lane == 0 && r0 + j < rows) totals[r0 + j] = sum;
    }
  }
  __syncwarp();
  float squares = 0.0f;
  for (int64_t i = 0; i < hc; ++i) squares += totals[gram_row(hc, i, i)];
  const float inv_rms = 1.0f / sqrtf(squares / static_cast<float>(width) + a.rms_eps);
  if (lane < mix) mixes[lane] = totals[lane] * inv_rms;
  __syncwarp();
  float pre[kMaxHcMult] = {};
#pragma unroll
  for (int i = 0; i < kMaxHcMult; ++i) {
    if (i < hc) pre[i] = pre_weight(mixes, a.base, a.scale, a.hc_eps, i);
  }
  const float inv_norm = collapsed_inv_norm(totals, pre, hc, D, a.rms_eps);

  const float* x = a.streams + t * width;
  for (int64_t first_d = lane; first_d < D; first_d += 32 * kTileCollapseBatch) {
    float x_d[kTileCollapseBatch][kMaxHcMult] = {}, norm_weight[kTileCollapseBatch];
#pragma unroll
    for (int u = 0; u < kTileCollapseBatch; ++u) {
      const int64_t d = first_d + 32 * u;
      norm_weight[u] = d < D && a.norm_weight != nullptr ? a.norm_weight[d] : 1.0f;
#pragma unroll
      for (int i = 0; i < kMaxHcMult; ++i) {
        if (d < D && i < hc) x_d[u][i] = x[i * D + d];
      }
    }
#pragma unroll
    for (int u = 0; u < kTileCollapseBatch; ++u) {
      const int64_t d = first_d + 32 * u;
      if (d >= D) break;
      float collapsed = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxHcMult; ++i) {
        if (i < hc) collapsed += pre[i] * x_d[u][i];
      }
      a.collapsed[t * D + d] = collapsed;
      a.normed[t * D + d] = norm_weight[u] * (collapsed * inv_norm);
    }
  }
  site_weights_by_warp(mixes, a.base, a.scale, static_cast<int>(hc), a.hc_eps, a.sinkhorn_iters, nullptr,
                       a.comb + t * hc * hc, a.post + t * hc);
}

int64_t site_slices(int64_t hidden) { return (hidden + kSiteChannels - 1) / kSiteChannels; }

// The one-launch site when its grid fits on the GPU at once (the barrier needs every block resident), else the
// two launches. The fit is asked once per kernel and process (one kind of GPU).
template <typename W>
cudaError_t launch_one_site(dim3 grid, const MhcSiteArgs& a, cudaStream_t stream) {
  const auto kernel = mhc_site_one_launch_kernel<W>;
  static std::atomic<int> resident{0};  // blocks the GPU holds at once; 0: not asked yet
  int capacity = resident.load(std::memory_order_relaxed);
  if (capacity == 0) {
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (status == cudaSuccess) status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
    if (status != cudaSuccess) return status;
    capacity = std::max(1, sms * per_sm);
    resident.store(capacity, std::memory_order_relaxed);
  }
  if (static_cast<int64_t>(grid.x) * grid.y <= capacity) {
    return launch_dependent(kernel, grid, dim3(kThreads), 0, stream, a);
  }
  MhcSiteArgs two_launches = a;
  two_launches.barrier = nullptr;
  return mhc_site(two_launches, stream);
}

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
  const int64_t slices = site_slices(a.hidden);
  const auto tokens = static_cast<unsigned>(a.num_tokens);
  // A few tokens: a block per (slice, token) in both launches, the most blocks for the GPU. Many: tiles of tokens
  // for the shares and a warp per token for the collapse, which then sums each token's shares once rather than once
  // per slice.
  const bool tiled = a.num_tokens > kOneTokenSiteMaxTokens;
  const auto launch_shares = [&](auto one_token_kernel, auto tile_kernel) {
    if (!tiled) {
      return launch_dependent(one_token_kernel, dim3(static_cast<unsigned>(slices), tokens), dim3(kThreads), 0, stream,
                              a);
    }
    const size_t shared = tile_shared_bytes();
    if (const cudaError_t status = allow_shared(tile_kernel, shared); status != cudaSuccess) return status;
    const auto tiles = static_cast<unsigned>((a.num_tokens + kTileTokens - 1) / kTileTokens);
    return launch_dependent(tile_kernel, dim3(static_cast<unsigned>(slices), tiles), dim3(kThreads), shared, stream, a);
  };
  // A few tokens with the barrier's counters, when the grid fits on the GPU at once: one launch.
  if (!tiled && a.barrier != nullptr) {
    const dim3 grid(static_cast<unsigned>(slices), tokens);
    switch (a.fn_type) {
      case DenseWeightType::f32:
        return launch_one_site<float>(grid, a, stream);
      case DenseWeightType::f16:
        return launch_one_site<__half>(grid, a, stream);
      case DenseWeightType::bf16:
        return launch_one_site<__nv_bfloat16>(grid, a, stream);
      case DenseWeightType::f8_e4m3:
        break;
    }
  }
  // Dependent launches: the shares' fn loads overlap the previous kernel's tail, the collapse's start the shares'.
  cudaError_t status = cudaErrorInvalidValue;
  switch (a.fn_type) {
    case DenseWeightType::f32:
      status = launch_shares(mhc_site_shares_kernel<float>, mhc_tile_shares_kernel<float>);
      break;
    case DenseWeightType::f16:
      status = launch_shares(mhc_site_shares_kernel<__half>, mhc_tile_shares_kernel<__half>);
      break;
    case DenseWeightType::bf16:
      status = launch_shares(mhc_site_shares_kernel<__nv_bfloat16>, mhc_tile_shares_kernel<__nv_bfloat16>);
      break;
    case DenseWeightType::f8_e4m3:
      break;
  }
  if (status != cudaSuccess) return status;
  if (!tiled) {
    return launch_dependent(mhc_site_collapse_kernel, dim3(static_cast<unsigned>(slices), tokens), dim3(kThreads), 0,
                            stream, a);
  }
  const auto blocks = static_cast<unsigned>((a.num_tokens + kThreads / 32 - 1) / (kThreads / 32));
  return launch_dependent(mhc_tile_collapse_kernel, dim3(blocks), dim3(kThreads), 0, stream, a, slices);
}

}  // namespace kestrel::cuda

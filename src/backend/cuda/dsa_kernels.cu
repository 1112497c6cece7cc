#include <algorithm>
#include <climits>
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/dsa_kernels.h"
#include "backend/cuda/dynamic_shared.cuh"
#include "backend/cuda/mma.cuh"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Latent rows staged in shared memory per online-softmax step (32 KiB at the model's rank 512).
constexpr int kLatentChunk = 16;

__device__ __forceinline__ const unsigned char* block_row(const DevicePagedRows& rows, int64_t block, int64_t i) {
  return static_cast<const unsigned char*>(rows.pool) + (block * rows.block_rows + i % rows.block_rows) * rows.row_bytes;
}

__device__ __forceinline__ const unsigned char* paged_row_bytes(const DevicePagedRows& rows, int64_t i) {
  return block_row(rows, rows.block_ids[i / rows.block_rows], i);
}

// Row i of a float32 pool.
__device__ __forceinline__ const float* paged_row(const DevicePagedRows& rows, int64_t i) {
  return reinterpret_cast<const float*>(paged_row_bytes(rows, i));
}

// Row i of token t's latents: its own sequence's block table in a decode step.
__device__ __forceinline__ const unsigned char* latent_row(const SparseMlaDeviceArgs& a, int64_t t, int64_t i) {
  if (!a.steps) return paged_row_bytes(a.latents, i);
  return block_row(a.latents, a.token_block_ids.at[t][i / a.latents.block_rows], i);
}

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) { return __uint_as_float(bits << 16); }

// Two e4m3 codes (the low 16 bits) as floats, exactly (fp16 holds every e4m3 value).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xFFFFu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Values [4c, 4c + 4) of a row stored as `rows` stores them (4c inside the row; a float32 row's 16-byte vector).
__device__ __forceinline__ float4 row_values4(const unsigned char* row, const DevicePagedRows& rows, int c) {
  if (rows.dtype == CacheDtype::float32) return reinterpret_cast<const float4*>(row)[c];
  if (rows.dtype == CacheDtype::bf16) {
    const uint2 v = reinterpret_cast<const uint2*>(row)[c];
    return make_float4(bf16_bits_to_float(v.x & 0xFFFFu), bf16_bits_to_float(v.x >> 16),
                       bf16_bits_to_float(v.y & 0xFFFFu), bf16_bits_to_float(v.y >> 16));
  }
  const uint32_t codes = reinterpret_cast<const uint32_t*>(row)[c];
  const float scale = reinterpret_cast<const float*>(row + rows.scale_offset)[4 * c / RowFormat::kScaleGroup];
  const float2 low = e4m3x2_to_float2(codes), high = e4m3x2_to_float2(codes >> 16);
  return make_float4(low.x * scale, low.y * scale, high.x * scale, high.y * scale);
}

// Value r of a row stored as `rows` stores them.
__device__ __forceinline__ float row_value(const unsigned char* row, const DevicePagedRows& rows, int r) {
  if (rows.dtype == CacheDtype::float32) return reinterpret_cast<const float*>(row)[r];
  if (rows.dtype == CacheDtype::bf16) return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[r]);
  const float scale = reinterpret_cast<const float*>(row + rows.scale_offset)[r / RowFormat::kScaleGroup];
  return e4m3x2_to_float2(row[r]).x * scale;
}

// One thread per element of float32 rows [first_row, ...) (the cache's pool is written: DevicePagedRows is const for
// the readers).
__global__ void write_paged_rows_kernel(DevicePagedRows rows, int64_t first_row, const float* src, int64_t n) {
  wait_for_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t row = first_row + i / rows.row_width, column = i % rows.row_width;
  const_cast<float*>(paged_row(rows, row))[column] = src[i];
}

// One warp per (row, group of 128 values) of bf16 or fp8 rows [first_row, first_row + count), encoded as the CPU's
// encode_row: bf16 rounded to nearest even; fp8 divided by the group's scale amax / 448 (a warp maximum, written by
// lane 0 after the row's values) and rounded to e4m3, saturating.
__global__ void write_coded_rows_kernel(DevicePagedRows rows, int64_t first_row, const float* src, int64_t count) {
  wait_for_previous_grid();
  const int64_t groups = (rows.row_width + RowFormat::kScaleGroup - 1) / RowFormat::kScaleGroup;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (warp >= count * groups) return;
  const int64_t i = warp / groups, group = warp % groups;
  const float* values = src + i * rows.row_width;
  auto* row = const_cast<unsigned char*>(paged_row_bytes(rows, first_row + i));
  const int64_t first = group * RowFormat::kScaleGroup;
  const int64_t end = min(first + RowFormat::kScaleGroup, rows.row_width);
  if (rows.dtype == CacheDtype::bf16) {
    for (int64_t c = first + lane; c < end; c += 32) {
      reinterpret_cast<__nv_bfloat16*>(row)[c] = __float2bfloat16_rn(values[c]);
    }
    return;
  }
  float amax = 0.0f;
  for (int64_t c = first + lane; c < end; c += 32) amax = fmaxf(amax, fabsf(values[c]));
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  for (int64_t c = first + lane; c < end; c += 32) {
    row[c] = __nv_cvt_float_to_fp8(__fdiv_rn(values[c], scale), __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) reinterpret_cast<float*>(row + rows.scale_offset)[group] = scale;
}

// ---- k-pool compression ----

// One thread per (pool, channel), the CPU's operations in its order (see the header on rounding).
__global__ void __launch_bounds__(kThreads)
    kpool_compress_kernel(DevicePagedRows keys, DevicePagedRows gates, const float* ape, int64_t first_pool,
                          int64_t num_pools, int64_t kpool, float* pooled) {
  const int64_t dim = keys.row_width, index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t c = index % dim, first_row = (first_pool + index / dim) * kpool;
  if (index < num_pools * dim) {
    for (int64_t s = 0; s < kpool; ++s) prefetch_line_to_l2(ape + s * dim + c);  // a constant: before the wait
  }
  wait_for_previous_grid();
  if (index >= num_pools * dim) return;
  const auto logit = [&](int64_t s) { return __fadd_rn(paged_row(gates, first_row + s)[c], ape[s * dim + c]); };
  float max_logit = -INFINITY;
  for (int64_t s = 0; s < kpool; ++s) max_logit = fmaxf(max_logit, logit(s));
  float total = 0.0f;
  for (int64_t s = 0; s < kpool; ++s) total = __fadd_rn(total, expf(logit(s) - max_logit));
  float sum = 0.0f;
  for (int64_t s = 0; s < kpool; ++s) {
    const float weight = __fdiv_rn(expf(logit(s) - max_logit), total);
    sum = __fadd_rn(sum, __fmul_rn(weight, paged_row(keys, first_row + s)[c]));
  }
  pooled[index] = sum;
}

// ---- indexer scores ----

__device__ __forceinline__ int64_t visible_pools(const IndexerDeviceArgs& a, int64_t t) {
  return min(a.pooled_keys.num_rows, (a.start + t + 1) / a.kpool);
}

// The shared memory of a score block: the token's queries transposed to [head_dim, heads4] (heads padded with zeros
// to a multiple of 4, so a thread reads four heads' values as one float4) and its weights [heads4], the tile's keys
// [tile, head_dim + 1] and the heads' terms [tile, heads4 + 1] (the +1 strides keep a warp's 32 pools in 32 banks).
struct ScoreLayout {
  int quads, heads4, tile;
  size_t floats;
};

ScoreLayout score_layout(int64_t num_heads, int64_t head_dim) {
  ScoreLayout l{};
  l.quads = static_cast<int>((num_heads + 3) / 4);
  l.heads4 = 4 * l.quads;
  // About one (pool, head quad) item per thread; a multiple of 32 pools, so that a warp shares its quad.
  l.tile = 32 * (l.quads >= kWarps ? 1 : kWarps / l.quads);
  l.floats = static_cast<size_t>(head_dim * l.heads4 + l.heads4 + l.tile * (head_dim + 1) + l.tile * (l.heads4 + 1));
  return l;
}

__device__ __forceinline__ float head_term(float dot, float weight, float softmax_scale) {
  const float scaled = __fmul_rn(dot, softmax_scale);
  return __fmul_rn(weight, scaled < 0.0f ? 0.0f : scaled);  // std::max(scaled, 0.0f) as the CPU writes it
}

// Block (t, y) scores token t's visible pools [y * tile, (y + 1) * tile). A thread forms four heads' dot products
// with one key, each in channel order; one thread per pool then adds the heads' terms in head order: exactly the
// CPU's sequence of roundings.
__global__ void __launch_bounds__(kThreads)
    indexer_scores_kernel(IndexerDeviceArgs a, ScoreLayout l, float softmax_scale) {
  wait_for_previous_grid();
  extern __shared__ float4 shared_vectors[];
  const int64_t t = blockIdx.x, first = static_cast<int64_t>(blockIdx.y) * l.tile;
  const int64_t visible = visible_pools(a, t);
  if (first >= visible) return;
  const int heads = static_cast<int>(a.num_heads), dim = static_cast<int>(a.head_dim);
  const int rows = static_cast<int>(min(static_cast<int64_t>(l.tile), visible - first));
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  float* queries = reinterpret_cast<float*>(shared_vectors);
  float* weights = queries + dim * l.heads4;
  float* keys = weights + l.heads4;
  float* terms = keys + l.tile * (dim + 1);

  for (int i = tid; i < l.heads4 * dim; i += kThreads) {  // reads the query row-major, coalesced
    const int h = i / dim, c = i % dim;
    queries[c * l.heads4 + h] = h < heads ? a.query[(t * heads + h) * dim + c] : 0.0f;
  }
  for (int h = tid; h < l.heads4; h += kThreads) {
    weights[h] = h < heads ? a.weights[t * heads + h] * a.weights_scale : 0.0f;
  }
  for (int r = warp; r < rows; r += kWarps) {
    const float* key = paged_row(a.pooled_keys, first + r);
    for (int c = lane; c < dim; c += 32) keys[r * (dim + 1) + c] = key[c];
  }
  __syncthreads();

  for (int item = tid; item < l.tile * l.quads; item += kThreads) {
    const int r = item % l.tile, quad = item / l.tile;
    if (r >= rows) continue;
    const float* key = keys + r * (dim + 1);
    const float4* q = reinterpret_cast<const float4*>(queries) + quad;
    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
    for (int c = 0; c < dim; ++c) {
      const float k = key[c];
      const float4 qc = q[c * l.quads];
      d0 = __fadd_rn(d0, __fmul_rn(qc.x, k));
      d1 = __fadd_rn(d1, __fmul_rn(qc.y, k));
      d2 = __fadd_rn(d2, __fmul_rn(qc.z, k));
      d3 = __fadd_rn(d3, __fmul_rn(qc.w, k));
    }
    float* out = terms + r * (l.heads4 + 1) + 4 * quad;
    out[0] = head_term(d0, weights[4 * quad + 0], softmax_scale);
    out[1] = head_term(d1, weights[4 * quad + 1], softmax_scale);
    out[2] = head_term(d2, weights[4 * quad + 2], softmax_scale);
    out[3] = head_term(d3, weights[4 * quad + 3], softmax_scale);
  }
  __syncthreads();

  for (int r = tid; r < rows; r += kThreads) {
    const float* row = terms + r * (l.heads4 + 1);
    float score = 0.0f;
    for (int h = 0; h < heads; ++h) score = __fadd_rn(score, row[h]);
    a.scratch[t * a.pooled_keys.num_rows + first + r] = score;
  }
}

// ---- indexer top-k ----

// Unsigned keys in the order of the scores: a higher score has a higher key. -0 is folded into +0, which the CPU's
// comparison treats as equal (a tie, broken by the pool index).
__device__ __forceinline__ uint32_t order_key(float score) {
  const uint32_t bits = __float_as_uint(score == 0.0f ? 0.0f : score);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// Exclusive prefix sum of v in thread order. `shared` holds kWarps ints.
__device__ int block_exclusive_scan(int v, int* shared) {
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x >> 5);
  int inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int below = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 31) shared[warp] = inclusive;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += shared[w];
  return before + inclusive - v;
}

// One radix step, run by warp 0. bins[256] counts the keys that match *prefix (the digits found so far) by their
// digit at `shift`; the step appends the digit of the *needed-th largest of them to *prefix and leaves in *needed
// that key's rank among the keys matching the longer prefix. Lane l owns digits 8l .. 8l + 7.
__device__ void pick_digit(const int* bins, int shift, uint32_t* prefix, int* needed) {
  const int lane = static_cast<int>(threadIdx.x);
  const int need = *needed;
  int counts[8], lane_total = 0;
  for (int j = 0; j < 8; ++j) {
    counts[j] = bins[8 * lane + j];
    lane_total += counts[j];
  }
  int suffix = lane_total;  // keys with digits of this lane and above
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int higher = __shfl_down_sync(0xFFFFFFFFu, suffix, offset);
    if (lane + offset < 32) suffix += higher;
  }
  int above = suffix - lane_total;
  __syncwarp();  // every lane has read *needed
  for (int j = 7; j >= 0; --j) {
    if (above < need && above + counts[j] >= need) {
      *prefix |= static_cast<uint32_t>(8 * lane + j) << shift;
      *needed = need - above;
    }
    above += counts[j];
  }
}

// One block per token: the score of its keep-th best pool by a radix select, then the chosen pools in index order
// (those above that score, and the lowest-indexed ones equal to it), each thread walking a contiguous run of pools.
__global__ void __launch_bounds__(kThreads) indexer_topk_kernel(IndexerDeviceArgs a) {
  wait_for_previous_grid();
  __shared__ int bins[256];
  __shared__ int scan[kWarps];
  __shared__ uint32_t cut;
  __shared__ int needed;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t t = blockIdx.x, position = a.start + t;
  const int visible = static_cast<int>(visible_pools(a, t));
  const int keep = static_cast<int>(min(a.topk_pools, static_cast<int64_t>(visible)));
  const float* scores = a.scratch + t * a.pooled_keys.num_rows;

  if (tid == 0) {
    cut = 0;
    needed = keep;
  }
  __syncthreads();
  if (keep > 0) {
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += kThreads) bins[i] = 0;
      __syncthreads();
      const uint32_t prefix = cut;
      for (int i = tid; i < visible; i += kThreads) {
        const uint32_t key = order_key(scores[i]);
        if ((key & mask) == prefix) atomicAdd(&bins[(key >> shift) & 255u], 1);
      }
      __syncthreads();
      if (tid < 32) pick_digit(bins, shift, &cut, &needed);
      __syncthreads();
      mask |= 255u << shift;
    }
  }
  const uint32_t threshold = cut;
  const int take_equal = needed;  // pools scoring exactly `threshold` to keep, lowest index first

  const int per_thread = (visible + kThreads - 1) / kThreads;
  const int begin = min(visible, tid * per_thread), end = min(visible, begin + per_thread);
  int above = 0, equal = 0;
  if (keep > 0) {
    for (int i = begin; i < end; ++i) {
      const uint32_t key = order_key(scores[i]);
      above += key > threshold;
      equal += key == threshold;
    }
  }
  int equal_before = block_exclusive_scan(equal, scan);
  const int take = above + max(0, min(equal, take_equal - equal_before));
  int slot = block_exclusive_scan(take, scan);
  const int64_t stride = a.topk_pools * a.kpool + a.kpool - 1;  // indexer_max_positions (a host function)
  int32_t* out = a.positions + t * stride;
  for (int i = begin; i < end && take > 0; ++i) {
    const uint32_t key = order_key(scores[i]);
    const bool chosen = key > threshold || (key == threshold && equal_before++ < take_equal);
    if (!chosen) continue;
    for (int64_t s = 0; s < a.kpool; ++s) out[slot * a.kpool + s] = static_cast<int32_t>(i * a.kpool + s);
    ++slot;
  }

  const int64_t pooled = keep * a.kpool;
  const int64_t tail = a.select_tail ? (position + 1) % a.kpool : 0;
  for (int64_t i = tid; i < stride - pooled; i += kThreads) {
    out[pooled + i] = i < tail ? static_cast<int32_t>(position + 1 - tail + i) : -1;
  }
  if (tid == 0) a.counts[t] = static_cast<int32_t>(pooled + tail);
}

// ---- sparse MLA attention ----

// Decode steps split each token's positions into parts of at least this many, one block per part and group of
// kHeadsPerBlock heads.
constexpr int64_t kMinSplitPositions = 64;
// Blocks of 16 heads a split call aims for: about two per SM, so that a one-token step uses the whole GPU.
constexpr int64_t kTargetBlocks = 256;
// One head's W_UK or W_UV, [rows, rank] from element `first` of the per-head array, as stored: bf16 (where kv_b is,
// exactly) or float32 (mla_weights.h).
struct MlaMatrix {
  const void* data;
  bool bf16;
  int64_t first;
  __device__ __forceinline__ float at(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(data)[first + i])
                : static_cast<const float*>(data)[first + i];
  }
  // Elements i .. i + 7 by 16-byte loads (i and `first` multiples of 8, the array 16-byte aligned).
  __device__ __forceinline__ void eight_at(int64_t i, float (&v)[8]) const {
    if (bf16) {
      const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(data) + first + i);
      const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(pairs[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
      }
    } else {
      const auto* quads = reinterpret_cast<const float4*>(static_cast<const float*>(data) + first + i);
      const float4 lo = quads[0], hi = quads[1];
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    }
  }
};

// Heads of one block of sparse_mla_heads_kernel: each staged latent row serves all of them.
constexpr int kHeadsPerWarp = 2;
constexpr int kHeadsPerBlock = kHeadsPerWarp * kWarps;

// q̂[t, h] = W_UK[h]ᵀ q[t, h] into `q_latent` ([rank], shared or global), by the whole block.
__device__ void absorb_query(const SparseMlaDeviceArgs& a, int64_t t, int64_t h, float* q_staged, float* q_latent) {
  const int rank = static_cast<int>(a.kv_lora_rank), qk = static_cast<int>(a.qk_head_dim);
  for (int d = threadIdx.x; d < qk; d += kThreads) q_staged[d] = a.query[(t * a.num_heads + h) * qk + d];
  __syncthreads();
  const MlaMatrix w_uk{a.w_uk, a.weights_bf16, h * qk * rank};
  for (int r = threadIdx.x; r < rank; r += kThreads) {
    float sum = 0.0f;
    for (int d = 0; d < qk; ++d) sum += q_staged[d] * w_uk.at(d * rank + r);
    q_latent[r] = sum;
  }
}

// Rows [first, last) of out[t, h] = W_UV[h] ô, ô in shared memory, by the whole block: a warp a row, lane l summing
// its 8-value runs l, l + 32, ... of the row by 16-byte loads where the rank is a multiple of 8, else values l, l + 32,
// ..., then the warp's butterfly.
__device__ void project_values(const SparseMlaDeviceArgs& a, int64_t t, int64_t h, const float* o_latent, int first,
                               int last) {
  const int rank = static_cast<int>(a.kv_lora_rank), vd = static_cast<int>(a.v_head_dim);
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const MlaMatrix w_uv{a.w_uv, a.weights_bf16, h * vd * rank};
  float* out = a.out + (t * a.num_heads + h) * vd;
  const bool vectors = rank % 8 == 0;
  for (int v = first + warp; v < last; v += kWarps) {
    float sum = 0.0f;
    if (vectors) {
      for (int r = 8 * lane; r < rank; r += 8 * 32) {
        float w[8];
        w_uv.eight_at(static_cast<int64_t>(v) * rank + r, w);
#pragma unroll
        for (int k = 0; k < 8; ++k) sum += w[k] * o_latent[r + k];
      }
    } else {
      for (int r = lane; r < rank; r += 32) sum += w_uv.at(v * rank + r) * o_latent[r];
    }
    sum = warp_sum(sum);
    if (lane == 0) out[v] = sum;
  }
}

// Split calls: q̂ into the scratch once for all the parts, by blocks of (token × head, kAbsorbRanks ranks), so that
// W_UK (qk_head_dim × rank per head) is read by many SMs at once rather than one block per head. With the rank a
// multiple of 8 (GLM-5.3-Flash's 512), thread (g, c) reads ranks 8c .. 8c + 7 of the block's as one 16-byte load per
// qk dimension and sums the dimensions g, g + kAbsorbRowGroups, ...; otherwise thread (g, r) sums rank r's dimensions
// g, g + kAbsorbGroups, ... one value at a time. The groups' sums are added in group order.
constexpr int kAbsorbRanks = 64;
constexpr int kAbsorbGroups = kThreads / kAbsorbRanks;
constexpr int kAbsorbRowGroups = kThreads / (kAbsorbRanks / 8);

// The block's share of W_UK or W_UV, rows [first_row, last_row) of head h's [rows, rank] matrix and its ranks
// [first_rank, first_rank + ranks), brought into L2 before the wait (prefetch_range_to_l2), a thread a row: the
// weights are most of what these kernels read. Only where the rank is a multiple of 8 (16-byte aligned rows).
__device__ __forceinline__ void prefetch_head_rows(const SparseMlaDeviceArgs& a, const void* weights, int64_t h,
                                                   int64_t rows, int first_row, int last_row, int first_rank,
                                                   int ranks) {
  const int64_t rank = a.kv_lora_rank;
  if (rank % 8 != 0) return;
  const int64_t element = a.weights_bf16 ? 2 : 4;
  const auto* base = static_cast<const char*>(weights) + (h * rows * rank + first_rank) * element;
  const auto bytes = static_cast<unsigned>(min(static_cast<int64_t>(ranks), rank - first_rank) * element);
  for (int row = first_row + static_cast<int>(threadIdx.x); row < last_row; row += kThreads) {
    prefetch_range_to_l2(base + row * rank * element, bytes);
  }
}

__global__ void __launch_bounds__(kThreads) absorb_query_kernel(SparseMlaDeviceArgs a) {
  extern __shared__ float4 shared_vectors[];
  float* q = reinterpret_cast<float*>(shared_vectors);  // [qk_head_dim]
  __shared__ float sums[kAbsorbRowGroups][kAbsorbRanks];
  const int rank = static_cast<int>(a.kv_lora_rank), qk = static_cast<int>(a.qk_head_dim);
  const int64_t pair = blockIdx.x, h = pair % a.num_heads;
  const int tid = static_cast<int>(threadIdx.x), first_rank = static_cast<int>(blockIdx.y) * kAbsorbRanks;
  prefetch_head_rows(a, a.w_uk, h, qk, 0, qk, first_rank, kAbsorbRanks);
  wait_for_previous_grid();
  for (int d = tid; d < qk; d += kThreads) q[d] = a.query[pair * qk + d];
  __syncthreads();
  const MlaMatrix w_uk{a.w_uk, a.weights_bf16, h * qk * rank};
  const bool vectors = rank % 8 == 0;
  int groups = kAbsorbGroups;
  if (vectors) {
    groups = kAbsorbRowGroups;
    const int column = tid % (kAbsorbRanks / 8), group = tid / (kAbsorbRanks / 8), r = first_rank + 8 * column;
    float sum[8] = {};
    if (r < rank) {
      for (int d = group; d < qk; d += kAbsorbRowGroups) {
        float w[8];
        w_uk.eight_at(static_cast<int64_t>(d) * rank + r, w);
#pragma unroll
        for (int k = 0; k < 8; ++k) sum[k] += q[d] * w[k];
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sums[group][8 * column + k] = sum[k];
  } else {
    const int r = first_rank + tid % kAbsorbRanks, group = tid / kAbsorbRanks;
    float sum = 0.0f;
    if (r < rank) {
      for (int d = group; d < qk; d += kAbsorbGroups) sum += q[d] * w_uk.at(d * rank + r);
    }
    sums[group][tid % kAbsorbRanks] = sum;
  }
  __syncthreads();
  if (tid < kAbsorbRanks && first_rank + tid < rank) {
    float total = 0.0f;
    for (int g = 0; g < groups; ++g) total += sums[g][tid];
    a.scratch[pair * rank + first_rank + tid] = total;
  }
}

// Grid (token × head, part). Each block runs the online softmax over its part of the token's positions; with one part
// it finishes (normalises, projects by W_UV), else it leaves its running max, total and unnormalised output in the
// scratch for merge_parts_kernel. Shared memory: the staged latent rows [kLatentChunk, rank], q̂ [rank] (ô at the
// end), the output accumulator [rank] (each thread owns the same ranks throughout), q [qk_head_dim], the step's
// probabilities [kLatentChunk].
__global__ void __launch_bounds__(kThreads) sparse_mla_kernel(SparseMlaDeviceArgs a) {
  wait_for_previous_grid();
  extern __shared__ float4 shared_vectors[];
  __shared__ float running_max, running_total, rescale;
  const int rank = static_cast<int>(a.kv_lora_rank), qk = static_cast<int>(a.qk_head_dim);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t pair = blockIdx.x, t = pair / a.num_heads, h = pair % a.num_heads;
  const int parts = static_cast<int>(gridDim.y), part = static_cast<int>(blockIdx.y);
  float* rows = reinterpret_cast<float*>(shared_vectors);
  float* q_latent = rows + kLatentChunk * rank;
  float* acc = q_latent + rank;
  float* q = acc + rank;
  float* probs = q + qk;

  if (tid == 0) {
    running_max = -INFINITY;
    running_total = 0.0f;
  }
  if (parts == 1) {
    absorb_query(a, t, h, q, q_latent);
  } else {
    for (int r = tid; r < rank; r += kThreads) q_latent[r] = a.scratch[pair * rank + r];
  }
  for (int r = tid; r < rank; r += kThreads) acc[r] = 0.0f;

  const int count = a.counts[t];
  const int per_part = (count + parts - 1) / parts;
  const int begin = min(count, part * per_part), end = min(count, begin + per_part);
  const int32_t* positions = a.positions + t * a.positions_stride;
  for (int first = begin; first < end; first += kLatentChunk) {
    const int n = min(kLatentChunk, end - first);
    __syncthreads();  // q̂ is complete; the previous step's rows are consumed
    for (int i = warp; i < n; i += kWarps) {
      const unsigned char* latent = latent_row(a, t, positions[first + i]);
      for (int r = lane; r < rank; r += 32) rows[i * rank + r] = row_value(latent, a.latents, r);
    }
    __syncthreads();
    for (int i = warp; i < n; i += kWarps) {
      float dot = 0.0f;
      for (int r = lane; r < rank; r += 32) dot += q_latent[r] * rows[i * rank + r];
      dot = warp_sum(dot);
      if (lane == 0) probs[i] = dot * a.scale;
    }
    __syncthreads();
    if (warp == 0) {
      const float score = lane < n ? probs[lane] : -INFINITY;
      float step_max = score;
      for (int offset = 16; offset > 0; offset >>= 1) {
        step_max = fmaxf(step_max, __shfl_xor_sync(0xFFFFFFFFu, step_max, offset));
      }
      const float new_max = fmaxf(running_max, step_max);
      const float p = lane < n ? expf(score - new_max) : 0.0f;
      const float step_total = warp_sum(p);
      if (lane < n) probs[lane] = p;
      if (lane == 0) {
        rescale = expf(running_max - new_max);  // 0 on the first step
        running_total = running_total * rescale + step_total;
        running_max = new_max;
      }
    }
    __syncthreads();
    for (int r = tid; r < rank; r += kThreads) {
      float o = acc[r] * rescale;
      for (int i = 0; i < n; ++i) o += probs[i] * rows[i * rank + r];
      acc[r] = o;
    }
  }
  __syncthreads();  // the last reads of q̂ are done; running_total is final
  if (parts > 1) {
    float* partial = a.scratch + a.num_tokens * a.num_heads * rank + (pair * parts + part) * (rank + 2);
    for (int r = tid; r < rank; r += kThreads) partial[2 + r] = acc[r];
    if (tid == 0) {
      partial[0] = running_max;
      partial[1] = running_total;
    }
    return;
  }
  for (int r = tid; r < rank; r += kThreads) q_latent[r] = running_total > 0.0f ? acc[r] / running_total : 0.0f;
  __syncthreads();
  project_values(a, t, h, q_latent, 0, static_cast<int>(a.v_head_dim));
}

// Grid (token, group of kHeadsPerBlock heads, part): two heads per warp, so that each staged latent row serves 16
// heads (the per-pair kernel stages a token's rows once per head, 64 times over at GLM-5.3-Flash's size) and each
// shared-memory load of a row serves two heads' multiply-adds. Lane l holds ranks l + 32j of its heads' q̂ and output
// accumulators in registers; the online softmax is sparse_mla_kernel's, step for step (scores scaled after the dot,
// the accumulator rescaled, then the chunk's rows added in order). With one part (prefill-sized calls) the block
// computes q̂ and projects by W_UV itself; split (decode), q̂ comes from absorb_query_kernel and the part's running
// max, total and unnormalised output go to the scratch for merge_parts_kernel, as sparse_mla_kernel's do.
constexpr int kRowChunk = 32;  // one position per lane in the softmax step

template <int RankPerLane>
__global__ void __launch_bounds__(kThreads) sparse_mla_heads_kernel(SparseMlaDeviceArgs a) {
  wait_for_previous_grid();
  constexpr int kRank = 32 * RankPerLane;
  extern __shared__ float4 shared_vectors[];
  float* rows = reinterpret_cast<float*>(shared_vectors);  // [kRowChunk, kRank]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x;
  const int parts = static_cast<int>(gridDim.z), part = static_cast<int>(blockIdx.z);
  const int qk = static_cast<int>(a.qk_head_dim), vd = static_cast<int>(a.v_head_dim);
  int64_t head[kHeadsPerWarp];
  bool live[kHeadsPerWarp];
  float q_latent[kHeadsPerWarp][RankPerLane] = {}, acc[kHeadsPerWarp][RankPerLane] = {};
  float running_max[kHeadsPerWarp], running_total[kHeadsPerWarp];
#pragma unroll
  for (int k = 0; k < kHeadsPerWarp; ++k) {
    head[k] = static_cast<int64_t>(blockIdx.y) * kHeadsPerBlock + warp * kHeadsPerWarp + k;
    live[k] = head[k] < a.num_heads;
    running_max[k] = -INFINITY;
    running_total[k] = 0.0f;
    if (!live[k]) continue;  // a missing head keeps q̂ = 0 and is never written
    if (parts > 1) {
#pragma unroll
      for (int j = 0; j < RankPerLane; ++j) {
        q_latent[k][j] = a.scratch[(t * a.num_heads + head[k]) * kRank + lane + 32 * j];
      }
      continue;
    }
    const float* q = a.query + (t * a.num_heads + head[k]) * qk;
    const MlaMatrix w_uk{a.w_uk, a.weights_bf16, head[k] * qk * kRank};
    for (int d = 0; d < qk; ++d) {
      const float qd = q[d];
#pragma unroll
      for (int j = 0; j < RankPerLane; ++j) q_latent[k][j] += qd * w_uk.at(d * kRank + lane + 32 * j);
    }
  }

  const int count = a.counts[t];
  const int per_part = (count + parts - 1) / parts;
  const int begin = min(count, part * per_part), end = min(count, begin + per_part);
  const int32_t* positions = a.positions + t * a.positions_stride;
  for (int first = begin; first < end; first += kRowChunk) {
    const int n = min(kRowChunk, end - first);
    __syncthreads();  // the previous chunk's rows are consumed
    for (int i = tid; i < n * (kRank / 4); i += kThreads) {
      const int row = i / (kRank / 4), column = i % (kRank / 4);
      reinterpret_cast<float4*>(rows)[i] = row_values4(latent_row(a, t, positions[first + row]), a.latents, column);
    }
    __syncthreads();
    float score[kHeadsPerWarp] = {-INFINITY, -INFINITY};  // lane i: position first + i
    for (int i = 0; i < n; ++i) {
      float dot[kHeadsPerWarp] = {};
#pragma unroll
      for (int j = 0; j < RankPerLane; ++j) {
        const float r = rows[i * kRank + lane + 32 * j];
#pragma unroll
        for (int k = 0; k < kHeadsPerWarp; ++k) dot[k] += q_latent[k][j] * r;
      }
#pragma unroll
      for (int k = 0; k < kHeadsPerWarp; ++k) {
        const float sum = warp_sum(dot[k]);
        if (lane == i) score[k] = sum * a.scale;
      }
    }
    float prob[kHeadsPerWarp];
#pragma unroll
    for (int k = 0; k < kHeadsPerWarp; ++k) {
      float step_max = score[k];
      for (int offset = 16; offset > 0; offset >>= 1) {
        step_max = fmaxf(step_max, __shfl_xor_sync(0xFFFFFFFFu, step_max, offset));
      }
      const float new_max = fmaxf(running_max[k], step_max);
      prob[k] = lane < n ? expf(score[k] - new_max) : 0.0f;
      const float rescale = expf(running_max[k] - new_max);  // 0 on the first chunk
      running_total[k] = running_total[k] * rescale + warp_sum(prob[k]);
      running_max[k] = new_max;
#pragma unroll
      for (int j = 0; j < RankPerLane; ++j) acc[k][j] *= rescale;
    }
    for (int i = 0; i < n; ++i) {
      float p[kHeadsPerWarp];
#pragma unroll
      for (int k = 0; k < kHeadsPerWarp; ++k) p[k] = __shfl_sync(0xFFFFFFFFu, prob[k], i);
#pragma unroll
      for (int j = 0; j < RankPerLane; ++j) {
        const float r = rows[i * kRank + lane + 32 * j];
#pragma unroll
        for (int k = 0; k < kHeadsPerWarp; ++k) acc[k][j] += p[k] * r;
      }
    }
  }

  if (parts > 1) {
#pragma unroll
    for (int k = 0; k < kHeadsPerWarp; ++k) {
      if (!live[k]) continue;
      float* partial =
          a.scratch + a.num_tokens * a.num_heads * kRank + ((t * a.num_heads + head[k]) * parts + part) * (kRank + 2);
#pragma unroll
      for (int j = 0; j < RankPerLane; ++j) partial[2 + lane + 32 * j] = acc[k][j];
      if (lane == 0) {
        partial[0] = running_max[k];
        partial[1] = running_total[k];
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kHeadsPerWarp; ++k) {
    if (!live[k]) continue;
    float o_latent[RankPerLane];
#pragma unroll
    for (int j = 0; j < RankPerLane; ++j) o_latent[j] = running_total[k] > 0.0f ? acc[k][j] / running_total[k] : 0.0f;
    const MlaMatrix w_uv{a.w_uv, a.weights_bf16, head[k] * vd * kRank};
    float* out = a.out + (t * a.num_heads + head[k]) * vd;
    for (int v = 0; v < vd; ++v) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < RankPerLane; ++j) sum += w_uv.at(v * kRank + lane + 32 * j) * o_latent[j];
      sum = warp_sum(sum);
      if (lane == 0) out[v] = sum;
    }
  }
}

// Launches sparse_mla_heads_kernel for a rank it is compiled for (32 × 1, 2, 4, 8 or 16); false for another.
template <int RankPerLane = 16>
bool launch_heads_kernel(const SparseMlaDeviceArgs& a, int64_t parts, cudaStream_t stream, cudaError_t& status) {
  if constexpr (RankPerLane == 0) {
    return false;
  } else {
    if (a.kv_lora_rank != 32 * RankPerLane) return launch_heads_kernel<RankPerLane / 2>(a, parts, stream, status);
    const size_t shared = static_cast<size_t>(kRowChunk) * 32 * RankPerLane * sizeof(float);
    status = allow_shared(sparse_mla_heads_kernel<RankPerLane>, shared);
    if (status != cudaSuccess) return true;
    const dim3 grid(static_cast<unsigned>(a.num_tokens),
                    static_cast<unsigned>((a.num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock),
                    static_cast<unsigned>(parts));
    status = launch_dependent(sparse_mla_heads_kernel<RankPerLane>, grid, dim3(kThreads), shared, stream, a);
    return true;
  }
}

// Blocks of (token × head, kThreads ranks): each thread merges its rank's parts (rescaled to the common max) into ô,
// written over the pair's q̂ in the scratch (attention has read it). Every thread of the pair computes the same
// weights and total, in part order.
__global__ void __launch_bounds__(kThreads) merge_parts_kernel(SparseMlaDeviceArgs a, int parts) {
  wait_for_previous_grid();
  const int rank = static_cast<int>(a.kv_lora_rank);
  const int64_t pair = blockIdx.x;
  const int r = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  const float* partial = a.scratch + a.num_tokens * a.num_heads * rank + pair * parts * (rank + 2);
  if (r >= rank) return;
  float max_all = -INFINITY;
  for (int p = 0; p < parts; ++p) max_all = fmaxf(max_all, partial[p * (rank + 2)]);
  float total = 0.0f, o = 0.0f;
  for (int p = 0; p < parts; ++p) {
    const float m = partial[p * (rank + 2)];
    const float w = m == -INFINITY ? 0.0f : expf(m - max_all);  // an empty part weighs nothing
    total += partial[p * (rank + 2) + 1] * w;
    o += w * partial[p * (rank + 2) + 2 + r];
  }
  a.scratch[pair * rank + r] = total > 0.0f ? o / total : 0.0f;
}

// Blocks of (token × head, kProjectRows output rows): W_UV's rows applied to the pair's ô, so that W_UV is read by
// many SMs at once.
constexpr int kProjectRows = 32;

__global__ void __launch_bounds__(kThreads) project_merged_kernel(SparseMlaDeviceArgs a) {
  extern __shared__ float4 shared_vectors[];
  const int rank = static_cast<int>(a.kv_lora_rank), vd = static_cast<int>(a.v_head_dim);
  const int64_t pair = blockIdx.x, t = pair / a.num_heads, h = pair % a.num_heads;
  const int first = static_cast<int>(blockIdx.y) * kProjectRows, last = min(vd, first + kProjectRows);
  prefetch_head_rows(a, a.w_uv, h, vd, first, last, 0, rank);
  wait_for_previous_grid();
  float* o_latent = reinterpret_cast<float*>(shared_vectors);
  for (int r = threadIdx.x; r < rank; r += kThreads) o_latent[r] = a.scratch[pair * rank + r];
  __syncthreads();
  project_values(a, t, h, o_latent, first, last);
}

// ---- Prefill attention on the tensor cores ----

// A block per (token, 64 heads), 16 warps; q̂ (already scaled by the softmax scale) and the latent rows in fp16,
// products and softmax in float32. The token's selected rows' addresses are looked up once into shared memory (per
// staged vector, each lookup's two dependent loads and 64-bit division had the attention of an 8k prompt at 29.0 ms
// against 19.5, H100, run 51). Each step stages 32 of the token's latent rows (cp.async, as stored, the next step's
// in flight during this one's products), converts them to fp16, then: scores S[64 heads, 32 rows] = q̂ Lᵀ, warp w the
// 16x8 tile (heads 16 (w % 4), rows 8 (w / 4)); the online softmax, 8 threads a head; the output
// acc[64 heads, rank] += P L, warp w heads 16 (w % 4) and ranks (w / 4) rank/4, its accumulators in registers across
// steps. fp16 rows are padded by 16 bytes so that ldmatrix's eight row addresses fall in distinct banks.
constexpr int kMmaHeads = 64;
constexpr int kMmaRows = 32;
constexpr int kMmaWarps = 16;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kHalfPad = 8;
constexpr float kLog2e = 1.4426950408889634f;

template <int kRank>
struct MmaLayout {
  static constexpr int latent_pitch = kRank + kHalfPad;      // halves, q̂ and fp16 latent rows
  static constexpr int score_pitch = kMmaRows + 4;           // floats
  static constexpr int prob_pitch = kMmaRows + kHalfPad;     // halves
  static constexpr size_t q_bytes = size_t{kMmaHeads} * latent_pitch * 2;
  static constexpr size_t rows_bytes = size_t{kMmaRows} * latent_pitch * 2;
  static constexpr size_t stage_bytes = size_t{kMmaRows} * kRank * 4;  // float32 rows, the largest format
  static constexpr size_t score_bytes = size_t{kMmaHeads} * score_pitch * 4;
  static constexpr size_t prob_bytes = size_t{kMmaHeads} * prob_pitch * 2;
  static constexpr size_t bytes = q_bytes + rows_bytes + stage_bytes + score_bytes + prob_bytes + 3 * kMmaHeads * 4;
};

// The block's shared memory with the token's selected rows' addresses (looked up once, not once per step: the
// lookups are two dependent loads and a 64-bit division each).
template <int kRank>
constexpr size_t mma_shared_bytes(int64_t positions_stride) {
  return MmaLayout<kRank>::bytes + static_cast<size_t>(positions_stride) * sizeof(const unsigned char*);
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

template <int kRank>
__global__ void __launch_bounds__(kMmaThreads, 1) sparse_mla_mma_kernel(SparseMlaDeviceArgs a, __half* qhat) {
  using Layout = MmaLayout<kRank>;
  constexpr int kPitch = Layout::latent_pitch;
  constexpr int kValues4 = kMmaRows * kRank / 4;  // 4-value pieces of one step's rows
  constexpr int kValueTiles = kRank / 32;               // 8-rank tiles of a warp's output
  extern __shared__ float4 shared_vectors[];
  auto* base = reinterpret_cast<unsigned char*>(shared_vectors);
  __half* q_shared = reinterpret_cast<__half*>(base);
  __half* rows = reinterpret_cast<__half*>(base + Layout::q_bytes);
  unsigned char* stage = base + Layout::q_bytes + Layout::rows_bytes;  // rows as stored, row_bytes apart
  float* scores = reinterpret_cast<float*>(stage + Layout::stage_bytes);
  __half* probs = reinterpret_cast<__half*>(scores + kMmaHeads * Layout::score_pitch);
  float* row_max = reinterpret_cast<float*>(probs + kMmaHeads * Layout::prob_pitch);
  float* row_total = row_max + kMmaHeads;
  float* row_rescale = row_total + kMmaHeads;
  const unsigned char** row_sources = reinterpret_cast<const unsigned char**>(base + Layout::bytes);  // [count]

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x;
  const int64_t first_head = static_cast<int64_t>(blockIdx.y) * kMmaHeads;
  const int live_heads = static_cast<int>(a.num_heads - first_head < kMmaHeads ? a.num_heads - first_head : kMmaHeads);
  __half* q_rows = qhat + (t * a.num_heads + first_head) * kRank;
  for (int i = tid; i < kMmaHeads * kRank / 8; i += kMmaThreads) {
    const int row = i / (kRank / 8), column = i % (kRank / 8);
    const uint4 v = row < live_heads ? reinterpret_cast<const uint4*>(q_rows + row * kRank)[column]
                                     : make_uint4(0, 0, 0, 0);
    reinterpret_cast<uint4*>(q_shared + row * kPitch)[column] = v;
  }
  if (tid < kMmaHeads) {
    row_max[tid] = -INFINITY;
    row_total[tid] = 0.0f;
  }

  const int count = a.counts[t];
  const int32_t* positions = a.positions + t * a.positions_stride;
  for (int i = tid; i < count; i += kMmaThreads) row_sources[i] = latent_row(a, t, positions[i]);
  __syncthreads();
  const int row_vectors = static_cast<int>(a.latents.row_bytes / 16);
  const auto stage_rows = [&](int first) {
    for (int i = tid; i < kMmaRows * row_vectors; i += kMmaThreads) {
      const int row = i / row_vectors, column = i % row_vectors;
      const bool valid = first + row < count;  // rows past the token's last are zeros
      const void* source = valid ? row_sources[first + row] + column * 16 : a.latents.pool;
      copy_async_16(stage + row * a.latents.row_bytes + column * 16, source, valid);
    }
    copy_async_commit();
  };
  if (count > 0) stage_rows(0);

  const int head_tile = warp % 4, column_group = warp / 4;
  const int g = lane >> 2, quad = lane & 3;
  const int rank0 = column_group * (kRank / 4);
  float acc[kValueTiles][4] = {};
  // ldmatrix row addresses: q̂ and probabilities as A (16 rows, two 8-column halves), the latent rows as B of the
  // scores (8 rows, two k halves) and, transposed, of the values (16 rows, two 8-rank tiles).
  const __half* q_lane = q_shared + (head_tile * 16 + (lane & 15)) * kPitch + (lane >> 4) * 8;
  const __half* key_lane = rows + (column_group * 8 + (lane & 7)) * kPitch + ((lane >> 3) & 1) * 8;
  const __half* prob_lane = probs + (head_tile * 16 + (lane & 15)) * Layout::prob_pitch + (lane >> 4) * 8;
  const __half* value_lane = rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + rank0 + (lane >> 4) * 8;

  for (int first = 0; first < count; first += kMmaRows) {
    copy_async_wait_all();
    __syncthreads();  // this step's rows are staged; the previous step is done with rows and probs
    for (int i = tid; i < kValues4; i += kMmaThreads) {
      const int row = i / (kRank / 4), column = i % (kRank / 4);
      const float4 v = row_values4(stage + row * a.latents.row_bytes, a.latents, column);
      *reinterpret_cast<uint2*>(rows + row * kPitch + column * 4) =
          make_uint2(half2_bits(__floats2half2_rn(v.x, v.y)), half2_bits(__floats2half2_rn(v.z, v.w)));
    }
    __syncthreads();  // fp16 rows complete, the stage free
    if (first + kMmaRows < count) stage_rows(first + kMmaRows);

    float s[4] = {};
#pragma unroll 8
    for (int k0 = 0; k0 < kRank; k0 += 16) {
      uint32_t q_frag[4], key_frag[2];
      ldmatrix_x4(q_frag, q_lane + k0);
      ldmatrix_x2(key_frag, key_lane + k0);
      mma_16x8x16<MmaInput::f16>(s, q_frag[0], q_frag[1], q_frag[2], q_frag[3], key_frag[0], key_frag[1]);
    }
    float* score_row = scores + (head_tile * 16 + g) * Layout::score_pitch + column_group * 8 + 2 * quad;
    score_row[0] = s[0];
    score_row[1] = s[1];
    score_row[8 * Layout::score_pitch] = s[2];
    score_row[8 * Layout::score_pitch + 1] = s[3];
    __syncthreads();

    {  // online softmax: threads 8h..8h+7 (one warp's lanes) take head h, 4 rows each
      const int head = tid >> 3, part = tid & 7, n = min(kMmaRows, count - first);
      float v[4], step_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = part * 4 + j;
        v[j] = c < n ? scores[head * Layout::score_pitch + c] : -INFINITY;
        step_max = fmaxf(step_max, v[j]);
      }
      for (int offset = 4; offset > 0; offset >>= 1) {
        step_max = fmaxf(step_max, __shfl_xor_sync(0xFFFFFFFFu, step_max, offset));
      }
      const float old_max = row_max[head];  // read by all 8 lanes before the shuffles below, written after them
      const float new_max = fmaxf(old_max, step_max);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = part * 4 + j < n ? exp2f((v[j] - new_max) * kLog2e) : 0.0f;
        sum += p;
        probs[head * Layout::prob_pitch + part * 4 + j] = __float2half_rn(p);
      }
      for (int offset = 4; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
      if (part == 0) {
        const float rescale = exp2f((old_max - new_max) * kLog2e);  // 0 on the first step
        row_rescale[head] = rescale;
        row_total[head] = row_total[head] * rescale + sum;
        row_max[head] = new_max;
      }
    }
    __syncthreads();

    const float rescale_g = row_rescale[head_tile * 16 + g], rescale_g8 = row_rescale[head_tile * 16 + g + 8];
#pragma unroll
    for (int j = 0; j < kValueTiles; ++j) {
      acc[j][0] *= rescale_g;
      acc[j][1] *= rescale_g;
      acc[j][2] *= rescale_g8;
      acc[j][3] *= rescale_g8;
    }
#pragma unroll
    for (int k0 = 0; k0 < kMmaRows; k0 += 16) {
      uint32_t p_frag[4];
      ldmatrix_x4(p_frag, prob_lane + k0);
#pragma unroll
      for (int j = 0; j < kValueTiles; j += 2) {
        uint32_t v_frag[4];
        ldmatrix_x4_trans(v_frag, value_lane + k0 * kPitch + j * 8);
        mma_16x8x16<MmaInput::f16>(acc[j], p_frag[0], p_frag[1], p_frag[2], p_frag[3], v_frag[0], v_frag[1]);
        mma_16x8x16<MmaInput::f16>(acc[j + 1], p_frag[0], p_frag[1], p_frag[2], p_frag[3], v_frag[2], v_frag[3]);
      }
    }
  }
  __syncthreads();  // row totals final (and visible when the token had no rows)

  // ô = acc / total over q̂'s rows, which only this block reads.
  const int row_g = head_tile * 16 + g, row_g8 = row_g + 8;
  const float inverse_g = row_total[row_g] > 0.0f ? 1.0f / row_total[row_g] : 0.0f;
  const float inverse_g8 = row_total[row_g8] > 0.0f ? 1.0f / row_total[row_g8] : 0.0f;
#pragma unroll
  for (int j = 0; j < kValueTiles; ++j) {
    const int rank = rank0 + j * 8 + 2 * quad;
    if (row_g < live_heads) {
      *reinterpret_cast<__half2*>(q_rows + row_g * kRank + rank) =
          __floats2half2_rn(acc[j][0] * inverse_g, acc[j][1] * inverse_g);
    }
    if (row_g8 < live_heads) {
      *reinterpret_cast<__half2*>(q_rows + row_g8 * kRank + rank) =
          __floats2half2_rn(acc[j][2] * inverse_g8, acc[j][3] * inverse_g8);
    }
  }
}

template <int kRank>
cudaError_t launch_mma_kernel(const SparseMlaDeviceArgs& a, __half* qhat, cudaStream_t stream) {
  const size_t shared = mma_shared_bytes<kRank>(a.positions_stride);
  if (const cudaError_t status = allow_shared(sparse_mla_mma_kernel<kRank>, shared); status != cudaSuccess) {
    return status;
  }
  const dim3 grid(static_cast<unsigned>(a.num_tokens),
                  static_cast<unsigned>((a.num_heads + kMmaHeads - 1) / kMmaHeads));
  sparse_mla_mma_kernel<kRank><<<grid, kMmaThreads, shared, stream>>>(a, qhat);
  return cudaGetLastError();
}

// Rows of `width` values stored as their format says (row_bytes and scale_offset its RowFormat's, so that any value
// a kernel reads lies inside the row).
bool valid_rows(const DevicePagedRows& rows, int64_t width) {
  RowFormat format;
  format.dtype = rows.dtype;
  format.width = width;
  const bool laid_out = rows.row_width == width && rows.row_bytes == format.row_bytes() &&
                        (rows.dtype != CacheDtype::fp8_e4m3 || rows.scale_offset == format.scale_offset());
  return laid_out && rows.block_rows > 0 && rows.num_rows >= 0 &&
         (rows.num_rows == 0 || (rows.pool != nullptr && rows.block_ids != nullptr));
}

// The indexer's pools: float32 rows of `width`.
bool valid_float_rows(const DevicePagedRows& rows, int64_t width) {
  return rows.dtype == CacheDtype::float32 && valid_rows(rows, width);
}

}  // namespace

DevicePagedRows device_paged_rows(const void* pool, const int32_t* block_ids, int64_t block_rows, int64_t num_rows,
                                  const RowFormat& format) {
  return DevicePagedRows{.pool = pool,
                         .block_ids = block_ids,
                         .block_rows = block_rows,
                         .row_width = format.width,
                         .num_rows = num_rows,
                         .row_bytes = format.row_bytes(),
                         .dtype = format.dtype,
                         .scale_offset = format.scale_offset()};
}

cudaError_t write_paged_rows(const DevicePagedRows& rows, int64_t first_row, const float* src, int64_t count,
                             cudaStream_t stream) {
  const bool valid = rows.row_width > 0 && valid_rows(rows, rows.row_width) && first_row >= 0 && count >= 0 &&
                     first_row + count <= rows.num_rows;
  if (!valid) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (rows.dtype != CacheDtype::float32) {
    const int64_t warps = count * ((rows.row_width + RowFormat::kScaleGroup - 1) / RowFormat::kScaleGroup);
    const int64_t blocks = (warps + kWarps - 1) / kWarps;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    return launch_dependent(write_coded_rows_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                            rows, first_row, src, count);
  }
  const int64_t n = count * rows.row_width;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  return launch_dependent(write_paged_rows_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, rows,
                          first_row, src, n);
}

cudaError_t kpool_compress(const DevicePagedRows& keys, const DevicePagedRows& gates, const float* ape,
                           int64_t first_pool, int64_t num_pools, int64_t kpool, float* pooled, cudaStream_t stream) {
  const int64_t dim = keys.row_width;
  const bool valid = dim > 0 && kpool > 0 && first_pool >= 0 && num_pools >= 0 && valid_float_rows(keys, dim) &&
                     valid_float_rows(gates, dim) && (first_pool + num_pools) * kpool <= keys.num_rows &&
                     (first_pool + num_pools) * kpool <= gates.num_rows;
  if (!valid) return cudaErrorInvalidValue;
  if (num_pools == 0) return cudaSuccess;
  const int64_t blocks = (num_pools * dim + kThreads - 1) / kThreads;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  return launch_dependent(kpool_compress_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, keys,
                          gates, ape, first_pool, num_pools, kpool, pooled);
}

namespace {

// The two launches of indexer_select for all of a's tokens, its scratch holding all their scores.
cudaError_t launch_indexer(const IndexerDeviceArgs& a, cudaStream_t stream) {
  const int64_t pools = a.pooled_keys.num_rows;
  const int64_t most_visible = std::min(pools, (a.start + a.num_tokens) / a.kpool);
  if (most_visible > 0) {
    const ScoreLayout layout = score_layout(a.num_heads, a.head_dim);
    const int64_t tiles = (most_visible + layout.tile - 1) / layout.tile;
    if (tiles > 65535) return cudaErrorInvalidValue;
    const size_t shared = layout.floats * sizeof(float);
    if (const cudaError_t status = allow_shared(indexer_scores_kernel, shared); status != cudaSuccess) return status;
    const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));  // as the CPU computes it
    const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(tiles));
    if (const cudaError_t status =
            launch_dependent(indexer_scores_kernel, grid, dim3(kThreads), shared, stream, a, layout, softmax_scale);
        status != cudaSuccess) {
      return status;
    }
  }
  return launch_dependent(indexer_topk_kernel, dim3(static_cast<unsigned>(a.num_tokens)), dim3(kThreads), 0, stream, a);
}

}  // namespace

cudaError_t indexer_select(const IndexerDeviceArgs& a, cudaStream_t stream) {
  const int64_t pools = a.pooled_keys.num_rows;
  // Positions and pool indices are int32 on the device; tiles of score blocks are limited by the grid's y extent.
  const bool valid = a.num_tokens >= 0 && a.start >= 0 && a.num_heads > 0 && a.head_dim > 0 && a.kpool > 0 &&
                     a.topk_pools >= 0 && valid_float_rows(a.pooled_keys, a.head_dim) && a.num_heads <= INT_MAX / 4 &&
                     a.head_dim <= INT_MAX / 4 / a.num_heads && a.start + a.num_tokens <= INT_MAX &&
                     indexer_max_positions(a.topk_pools, a.kpool) <= INT_MAX && a.scratch_floats >= 0 &&
                     (a.scratch_floats == 0 || a.scratch_floats >= pools);
  if (!valid) return cudaErrorInvalidValue;
  if (a.num_tokens == 0) return cudaSuccess;
  const int64_t group = a.scratch_floats == 0 || pools == 0 ? a.num_tokens
                                                            : std::min(a.num_tokens, a.scratch_floats / pools);
  const int64_t stride = indexer_max_positions(a.topk_pools, a.kpool);
  for (int64_t first = 0; first < a.num_tokens; first += group) {
    IndexerDeviceArgs part = a;
    part.num_tokens = std::min(group, a.num_tokens - first);
    part.start = a.start + first;
    part.query = a.query + first * a.num_heads * a.head_dim;
    part.weights = a.weights + first * a.num_heads;
    part.positions = a.positions + first * stride;
    part.counts = a.counts + first;
    if (const cudaError_t status = launch_indexer(part, stream); status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

int64_t sparse_mla_splits(int64_t num_tokens, int64_t num_heads, int64_t positions_stride) {
  const int64_t blocks = std::max<int64_t>(num_tokens * ((num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock), 1);
  const int64_t wanted = (kTargetBlocks + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>((positions_stride + kMinSplitPositions - 1) / kMinSplitPositions, 1);
  return std::clamp<int64_t>(wanted, 1, most);
}

int64_t sparse_mla_steps_scratch_floats(int64_t num_tokens, int64_t num_heads, int64_t positions_stride,
                                        int64_t kv_lora_rank) {
  int64_t most = 0;  // fewer tokens may take more parts, so every launch size up to the largest is asked
  for (int64_t tokens = 1; tokens <= std::min<int64_t>(num_tokens, kMaxAttentionSteps); ++tokens) {
    most = std::max(most, sparse_mla_scratch_floats(tokens, num_heads, positions_stride, kv_lora_rank));
  }
  return most;
}

int64_t sparse_mla_scratch_floats(int64_t num_tokens, int64_t num_heads, int64_t positions_stride,
                                  int64_t kv_lora_rank) {
  const int64_t parts = sparse_mla_splits(num_tokens, num_heads, positions_stride);
  return parts == 1 ? 0 : num_tokens * num_heads * (kv_lora_rank + parts * (kv_lora_rank + 2));
}

cudaError_t sparse_mla_attention(const SparseMlaDeviceArgs& a, cudaStream_t stream) {
  const bool valid = a.num_tokens >= 0 && a.num_heads > 0 && a.qk_head_dim > 0 && a.v_head_dim > 0 &&
                     a.kv_lora_rank > 0 && a.qk_head_dim <= INT_MAX / a.kv_lora_rank &&
                     a.v_head_dim <= INT_MAX / a.kv_lora_rank && a.positions_stride >= 0 &&
                     valid_rows(a.latents, a.kv_lora_rank) && a.num_tokens <= INT_MAX / a.num_heads;
  if (!valid) return cudaErrorInvalidValue;
  if (a.num_tokens == 0) return cudaSuccess;
  const int64_t parts = sparse_mla_splits(a.num_tokens, a.num_heads, a.positions_stride);
  if (parts > 1 && a.scratch == nullptr) return cudaErrorInvalidValue;
  const auto pairs = static_cast<unsigned>(a.num_tokens * a.num_heads);
  if (parts > 1) {
    const size_t absorb_shared = static_cast<size_t>(a.qk_head_dim) * sizeof(float);
    if (const cudaError_t status = allow_shared(absorb_query_kernel, absorb_shared); status != cudaSuccess) {
      return status;
    }
    const auto rank_blocks = static_cast<unsigned>((a.kv_lora_rank + kAbsorbRanks - 1) / kAbsorbRanks);
    if (const cudaError_t status =
            launch_dependent(absorb_query_kernel, dim3(pairs, rank_blocks), dim3(kThreads), absorb_shared, stream, a);
        status != cudaSuccess) {
      return status;
    }
  }
  cudaError_t status = cudaSuccess;
  if (!launch_heads_kernel(a, parts, stream, status)) {
    // Ranks the heads kernel is not compiled for: a block per (token × head, part).
    const size_t shared =
        static_cast<size_t>((kLatentChunk + 2) * a.kv_lora_rank + a.qk_head_dim + kLatentChunk) * sizeof(float);
    status = allow_shared(sparse_mla_kernel, shared);
    if (status == cudaSuccess) {
      status = launch_dependent(sparse_mla_kernel, dim3(pairs, static_cast<unsigned>(parts)), dim3(kThreads), shared,
                                stream, a);
    }
  }
  if (status != cudaSuccess) return status;
  if (parts > 1) {
    // The parts merged once per pair, then W_UV applied by many blocks a pair.
    const auto rank_blocks = static_cast<unsigned>((a.kv_lora_rank + kThreads - 1) / kThreads);
    status = launch_dependent(merge_parts_kernel, dim3(pairs, rank_blocks), dim3(kThreads), 0, stream, a,
                              static_cast<int>(parts));
    if (status != cudaSuccess) return status;
    const size_t project_shared = static_cast<size_t>(a.kv_lora_rank) * sizeof(float);
    status = allow_shared(project_merged_kernel, project_shared);
    if (status != cudaSuccess) return status;
    const auto row_blocks = static_cast<unsigned>((a.v_head_dim + kProjectRows - 1) / kProjectRows);
    return launch_dependent(project_merged_kernel, dim3(pairs, row_blocks), dim3(kThreads), project_shared, stream,
                            a);
  }
  return cudaSuccess;
}

bool sparse_mla_mma_supported(int64_t num_tokens, int64_t num_heads, int64_t positions_stride, int64_t kv_lora_rank,
                              size_t max_shared) {
  if (positions_stride < 0 || num_tokens <= 0) return false;
  size_t shared = 0;  // the block's layout with the row addresses, at a rank the kernel is compiled for
  switch (kv_lora_rank) {
    case 64: shared = mma_shared_bytes<64>(positions_stride); break;
    case 128: shared = mma_shared_bytes<128>(positions_stride); break;
    case 256: shared = mma_shared_bytes<256>(positions_stride); break;
    case 512: shared = mma_shared_bytes<512>(positions_stride); break;
    default: return false;
  }
  return shared <= max_shared && sparse_mla_splits(num_tokens, num_heads, positions_stride) == 1;
}

cudaError_t sparse_mla_mma_attend(const SparseMlaDeviceArgs& a, void* qhat, cudaStream_t stream) {
  const bool valid = a.num_tokens >= 0 && a.num_tokens <= INT_MAX && a.num_heads > 0 && qhat != nullptr &&
                     valid_rows(a.latents, a.kv_lora_rank) && a.latents.row_width % 4 == 0 &&
                     a.latents.row_bytes % 16 == 0;
  if (!valid) return cudaErrorInvalidValue;
  if (a.num_tokens == 0) return cudaSuccess;
  auto* q = static_cast<__half*>(qhat);
  switch (a.kv_lora_rank) {
    case 64: return launch_mma_kernel<64>(a, q, stream);
    case 128: return launch_mma_kernel<128>(a, q, stream);
    case 256: return launch_mma_kernel<256>(a, q, stream);
    case 512: return launch_mma_kernel<512>(a, q, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t sparse_mla_attention_steps(const SparseMlaDeviceArgs& a, const int32_t* const* block_ids,
                                       cudaStream_t stream) {
  for (int64_t first = 0; first < a.num_tokens; first += kMaxAttentionSteps) {
    SparseMlaDeviceArgs part = a;
    part.num_tokens = std::min<int64_t>(kMaxAttentionSteps, a.num_tokens - first);
    part.query = a.query + first * a.num_heads * a.qk_head_dim;
    part.positions = a.positions + first * a.positions_stride;
    part.counts = a.counts + first;
    part.out = a.out + first * a.num_heads * a.v_head_dim;
    part.steps = true;
    for (int64_t t = 0; t < part.num_tokens; ++t) {
      if (block_ids[first + t] == nullptr) return cudaErrorInvalidValue;
      part.token_block_ids.at[t] = block_ids[first + t];
    }
    if (const cudaError_t status = sparse_mla_attention(part, stream); status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace kestrel::cuda

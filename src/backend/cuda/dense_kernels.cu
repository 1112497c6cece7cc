#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/dense_kernels.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/mma.cuh"

namespace kestrel::cuda {

namespace {

constexpr int kTokensPerPass = 8;
constexpr int kWarpsPerBlock = 8;

template <typename W>
__device__ __forceinline__ float to_float(W w) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    return __bfloat162float(w);
  } else if constexpr (std::is_same_v<W, __half>) {
    return __half2float(w);
  } else if constexpr (std::is_same_v<W, __nv_fp8_e4m3>) {
    return static_cast<float>(w);
  } else {
    return w;
  }
}

// Vectors a lane has in flight at once: a warp streams one row, so a single load per lane leaves the memory system
// idle between iterations.
constexpr int kUnroll = 4;
// Blocks a call aims for (two per SM of an H200-class GPU). A matrix with fewer rows than that many warps (the mHC
// mixes' 24 rows, low-rank projections, the router) has each row's k range split over several blocks instead, so
// that its few long rows are not streamed by a handful of warps.
constexpr int64_t kTargetBlocks = 264;

// Rows a warp streams at once for a pass of `tokens` tokens (see dense_gemv).
constexpr int rows_per_warp(int tokens) { return tokens == 1 ? 1 : 4; }

// k splits for a pass with `rows` rows per warp: enough blocks for the GPU, whole warp passes per split.
int64_t split_count(DenseWeightType type, int64_t out_features, int64_t in_features, int rows) {
  const int64_t element_bytes = type == DenseWeightType::f32 ? 4 : type == DenseWeightType::f8_e4m3 ? 1 : 2;
  const int64_t row_blocks = (out_features + kWarpsPerBlock * rows - 1) / (kWarpsPerBlock * rows);
  const int64_t passes = in_features * element_bytes / 16 / (32 * kUnroll);  // whole warp passes in a row
  if (row_blocks >= kTargetBlocks || passes < 2) return 1;
  return std::min((kTargetBlocks + row_blocks - 1) / row_blocks, passes);
}

// Warp w of block b streams rows (8b + w) * kRows + [0, kRows): lane l reads their 16-byte vectors l, l + 32, ...
// (kVector weights each), kUnroll per row loaded before any is used, so a warp's loads are coalesced 512-byte runs with
// several in flight; rows whose length is not a multiple of kVector (or not 16-byte aligned) take the scalar loop.
// v rounded to bf16 (nearest even) and back: a product's input under ProductInput::bf16.
__device__ __forceinline__ float4 bf16_rounded(float4 v) {
  return make_float4(__bfloat162float(__float2bfloat16_rn(v.x)), __bfloat162float(__float2bfloat16_rn(v.y)),
                     __bfloat162float(__float2bfloat16_rn(v.z)), __bfloat162float(__float2bfloat16_rn(v.w)));
}

// Several rows per warp (for more than one token) let each load of x serve them all: x, read from L1 once per row and
// token, is otherwise the bottleneck at 4 to 8 tokens. With block scales, each weight is multiplied by its block's
// scale before the dot product (a vector lies in one block). Token and row counts are template parameters so that the
// accumulators stay in registers (a runtime-indexed array lives in local memory). Each accumulator adds the vectors
// in the same order whatever the unrolling and rows per warp, so results do not depend on them. With k split
// (gridDim.y > 1, vector path only), block (b, s) covers vectors [s * split_vectors, (s + 1) * split_vectors) and
// writes its sums to partial[s, token, row] for sum_splits.
template <typename W, int kTokens, int kRows>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    dense_gemv(const W* weight, int64_t out_features, int64_t in_features, const float* x, float* y,
               BlockScales scales, int64_t split_vectors, float* partial, bool round_x) {
  constexpr int kVector = 16 / sizeof(W);
  constexpr bool kScaled = std::is_same_v<W, __nv_fp8_e4m3>;
  constexpr int kLoads = kRows == 1 ? kUnroll : kUnroll / 2;  // registers: kRows * kLoads vectors in flight
  wait_for_previous_grid();
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * kRows;
  if (first_row >= out_features) return;
  const W* w[kRows];
  const float* row_scales[kRows];
  bool valid[kRows];
  const int64_t scale_cols = kScaled ? (in_features + scales.block_cols - 1) / scales.block_cols : 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = first_row + r;
    valid[r] = row < out_features;
    w[r] = weight + (valid[r] ? row : first_row) * in_features;
    row_scales[r] = kScaled ? scales.scales + (valid[r] ? row : first_row) / scales.block_rows * scale_cols : nullptr;
  }
  // The weight as the CPU dequantises it: fp8 times its block's scale, rounded to float32.
  const auto weight_at = [&](W value, int r, int64_t column) {
    if constexpr (kScaled) {
      return to_float(value) * row_scales[r][column / scales.block_cols];
    } else {
      return to_float(value);
    }
  };
  float acc[kRows][kTokens] = {};
  const bool aligned = ((reinterpret_cast<uintptr_t>(weight) | reinterpret_cast<uintptr_t>(x)) & 15u) == 0;
  if (aligned && in_features % kVector == 0) {
    const int64_t split_begin = blockIdx.y * split_vectors;
    const int64_t vectors = min(in_features / kVector, split_begin + split_vectors);
    for (int64_t first = split_begin + lane; first < vectors; first += 32 * kLoads) {
      uint4 packed[kRows][kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int64_t v = first + 32 * u;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          packed[r][u] = v < vectors && valid[r] ? __ldcs(reinterpret_cast<const uint4*>(w[r]) + v)
                                                 : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int64_t v = first + 32 * u;
        if (v >= vectors) break;
        float wf[kRows][kVector];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const W* values = reinterpret_cast<const W*>(&packed[r][u]);
#pragma unroll
          for (int j = 0; j < kVector; ++j) wf[r][j] = weight_at(values[j], r, v * kVector);
        }
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          const float4* xv = reinterpret_cast<const float4*>(x + t * in_features + v * kVector);
          float4 xq[kVector / 4];
#pragma unroll
          for (int q = 0; q < kVector / 4; ++q) xq[q] = round_x ? bf16_rounded(xv[q]) : xv[q];
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            float sum = 0.0f;
#pragma unroll
            for (int q = 0; q < kVector / 4; ++q) {
              sum += xq[q].x * wf[r][4 * q] + xq[q].y * wf[r][4 * q + 1] + xq[q].z * wf[r][4 * q + 2] +
                     xq[q].w * wf[r][4 * q + 3];
            }
            acc[r][t] += sum;
          }
        }
      }
    }
  } else {
    for (int64_t i = lane; i < in_features; i += 32) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float wi = valid[r] ? weight_at(w[r][i], r, i) : 0.0f;
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          const float xi = x[t * in_features + i];
          acc[r][t] += wi * (round_x ? __bfloat162float(__float2bfloat16_rn(xi)) : xi);
        }
      }
    }
  }
  float* out = gridDim.y == 1 ? y : partial + blockIdx.y * kTokens * out_features;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float v = acc[r][t];
      for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
      if (lane == 0 && valid[r]) out[t * out_features + first_row + r] = v;
    }
  }
}

// The bf16 path on the tensor cores (in_features a multiple of 32, 16-byte aligned rows and x): block b streams
// rows [128b, 128b + 128), 16 per warp, as the mma A operand, and up to 16 tokens are the B operand (8 per mma). A
// float32 input is split into Terms bf16 terms: three, x = hi + mid + lo exactly to float32's 24 bits, so the product
// is the float32 one up to summation order (three mma per 16 k); or one, x rounded to bf16 (ProductInput::bf16). k goes in stages of kMmaStageK: a stage's weights are
// requested first (16 k per lane per row pair and chunk: the warp reads 16 rows x 64 bytes per chunk), then the
// block writes the stage's inputs into shared memory as three bf16 planes (zero for absent tokens) and every warp
// multiplies. A 32-k chunk is permuted the same way in A and B: lane (g, t) holds k 8t..8t+7 of rows g and g + 8
// and of token g, which is the chunk's two mma k-steps (pairs 0-1 and 2-3, then 4-5 and 6-7).
constexpr int kMmaStageK = 256;
constexpr int kMmaChunks = kMmaStageK / 32;
constexpr int kMmaRowsPerBlock = 16 * kWarpsPerBlock;
constexpr int kMmaTokensPerPass = 16;
constexpr int kMmaPlaneRow = kMmaStageK + 32;  // bf16 per token row: rows 64 bytes apart mod 128, conflict-free

size_t mma_shared_bytes(int groups, int terms) {
  return static_cast<size_t>(terms * 8 * groups * kMmaPlaneRow) * 2;
}

// The matrices of one launch (one, or several sharing the input): block x-index b runs matrix m for b in
// [first_block[m], first_block[m + 1]); with k split, matrix m's sums are rows [first_row[m], first_row[m + 1]) of the
// partial sums' rows.
struct MmaGroup {
  const __nv_bfloat16* weight[kMaxDenseGroup];
  int64_t out_features[kMaxDenseGroup];
  float* y[kMaxDenseGroup];
  int64_t first_block[kMaxDenseGroup + 1];
  int64_t first_row[kMaxDenseGroup + 1];
  int count;
};

// The member whose range [first[m], first[m + 1]) holds `index`.
__device__ __forceinline__ int member_of(const int64_t (&first)[kMaxDenseGroup + 1], int count, int64_t index) {
  int m = 0;
  while (m + 1 < count && index >= first[m + 1]) ++m;
  return m;
}

template <int Groups, int Terms>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    bf16_mma_gemv(const __grid_constant__ MmaGroup group, int64_t in_features, const float* x, int num_tokens,
                  int64_t split_k, float* partial, unsigned* counters, const float* up, float limit) {
  constexpr int kRows = 8 * Groups;  // token rows per plane
  extern __shared__ uint4 mma_planes[];
  __nv_bfloat16* planes = reinterpret_cast<__nv_bfloat16*>(mma_planes);  // [Terms][kRows][kMmaPlaneRow]
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x & 31u);
  const int g = lane / 4, t = lane % 4;
  const int member = member_of(group.first_block, group.count, blockIdx.x);
  const __nv_bfloat16* weight = group.weight[member];
  const int64_t out_features = group.out_features[member];
  const int64_t first_row =
      ((static_cast<int64_t>(blockIdx.x) - group.first_block[member]) * kWarpsPerBlock + warp) * 16;
  const int64_t k_begin = blockIdx.y * split_k, k_end = min(in_features, k_begin + split_k);
  // Rows past the matrix read its last row; their sums are never written.
  const uint4* row_a = reinterpret_cast<const uint4*>(weight + min(first_row + g, out_features - 1) * in_features);
  const uint4* row_b = reinterpret_cast<const uint4*>(weight + min(first_row + g + 8, out_features - 1) * in_features);
  float acc[Groups][4] = {};
  uint4 a[kMmaChunks][2];
  const auto load_stage = [&](int64_t k0, int chunks) {
    const uint4* stage_a = row_a + k0 / 8 + t;
    const uint4* stage_b = row_b + k0 / 8 + t;
#pragma unroll
    for (int c = 0; c < kMmaChunks; ++c) {
      if (c < chunks) {
        a[c][0] = __ldcs(stage_a + 4 * c);
        a[c][1] = __ldcs(stage_b + 4 * c);
      }
    }
  };
  const auto stage_chunks = [&](int64_t k0) {
    return static_cast<int>(min(static_cast<int64_t>(kMmaStageK), k_end - k0) / 32);
  };
  // The first stage's weights are requested before waiting for the previous kernel (launch_dependent).
  if (k_begin < k_end) load_stage(k_begin, stage_chunks(k_begin));
  wait_for_previous_grid();
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kMmaStageK) {
    const int chunks = stage_chunks(k0);
    if (k0 != k_begin) load_stage(k0, chunks);
    __syncthreads();  // the previous stage's planes are no longer read
    for (int i = static_cast<int>(threadIdx.x); i < kRows * kMmaStageK / 4; i += 32 * kWarpsPerBlock) {
      const int n = i / (kMmaStageK / 4), k = i % (kMmaStageK / 4) * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (n < num_tokens && k < chunks * 32) {
        v = *reinterpret_cast<const float4*>(x + n * in_features + k0 + k);
        if (up != nullptr) {  // x is the gate: the input is the clamped SwiGLU of gate and up
          const float4 u = *reinterpret_cast<const float4*>(up + n * in_features + k0 + k);
          v = make_float4(clamped_swiglu_of(v.x, u.x, limit), clamped_swiglu_of(v.y, u.y, limit),
                          clamped_swiglu_of(v.z, u.z, limit), clamped_swiglu_of(v.w, u.w, limit));
        }
      }
      float rest[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int term = 0; term < Terms; ++term) {
        __nv_bfloat16 b[4];
        for (int j = 0; j < 4; ++j) {
          b[j] = __float2bfloat16_rn(rest[j]);
          rest[j] -= __bfloat162float(b[j]);
        }
        *reinterpret_cast<uint2*>(planes + (term * kRows + n) * kMmaPlaneRow + k) = *reinterpret_cast<const uint2*>(b);
      }
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kMmaChunks; ++c) {
      if (c >= chunks) break;
#pragma unroll
      for (int token_group = 0; token_group < Groups; ++token_group) {
#pragma unroll
        for (int term = 0; term < Terms; ++term) {
          const uint4 b = *reinterpret_cast<const uint4*>(
              planes + (term * kRows + 8 * token_group + g) * kMmaPlaneRow + 32 * c + 8 * t);
          mma_16x8x16<MmaInput::bf16>(acc[token_group], a[c][0].x, a[c][1].x, a[c][0].y, a[c][1].y, b.x, b.y);
          mma_16x8x16<MmaInput::bf16>(acc[token_group], a[c][0].z, a[c][1].z, a[c][0].w, a[c][1].w, b.z, b.w);
        }
      }
    }
  }
  // Unsplit: y[token, row]; split: partial[split, token, first_row[member] + row].
  const bool split = gridDim.y > 1;
  const int64_t out_stride = split ? group.first_row[group.count] : out_features;
  float* out = split ? partial + blockIdx.y * num_tokens * out_stride + group.first_row[member] : group.y[member];
#pragma unroll
  for (int token_group = 0; token_group < Groups; ++token_group) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = first_row + g + (i >= 2 ? 8 : 0);
      const int token = 8 * token_group + 2 * t + (i & 1);
      if (row < out_features && token < num_tokens) out[token * out_stride + row] = acc[token_group][i];
    }
  }
  if (!split) return;

  // The row block's last split to finish adds the splits' partial sums in split order (deterministic) into y and
  // re-arms the block's counter for the next launch: no second launch for the sums.
  __shared__ bool last;
  __threadfence();  // this block's partial sums are visible before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&counters[blockIdx.x], 1u) == gridDim.y - 1;
    if (last) counters[blockIdx.x] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t block_row = (static_cast<int64_t>(blockIdx.x) - group.first_block[member]) * kMmaRowsPerBlock;
  const int64_t split_stride = num_tokens * out_stride;
  for (int i = static_cast<int>(threadIdx.x); i < num_tokens * kMmaRowsPerBlock; i += 32 * kWarpsPerBlock) {
    const int token = i / kMmaRowsPerBlock;
    const int64_t row = block_row + i % kMmaRowsPerBlock;
    if (row >= out_features) continue;
    const float* sums = partial + token * out_stride + group.first_row[member] + row;
    float sum = 0.0f;
    for (int s = 0; s < static_cast<int>(gridDim.y); ++s) sum += __ldcg(sums + s * split_stride);
    group.y[member][token * out_features + row] = sum;
  }
}

int64_t mma_row_blocks(int64_t out_features) { return (out_features + kMmaRowsPerBlock - 1) / kMmaRowsPerBlock; }

// k splits of the tensor-core path for a launch of `row_blocks` row blocks: enough blocks for the GPU, whole stages
// per split.
int64_t mma_split_count(int64_t row_blocks, int64_t in_features) {
  const int64_t stages = (in_features + kMmaStageK - 1) / kMmaStageK;
  if (row_blocks >= kTargetBlocks || stages < 2) return 1;
  return std::min((kTargetBlocks + row_blocks - 1) / row_blocks, stages);
}

bool takes_mma_path(DenseWeightType type, int64_t in_features) {
  return type == DenseWeightType::bf16 && in_features % 32 == 0;
}

// y[t, row] = the k splits' partial sums added in split order (deterministic).
__global__ void __launch_bounds__(256) sum_splits(const float* partial, int64_t count, int splits, float* y) {
  wait_for_previous_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= count) return;
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) sum += partial[s * count + i];
  y[i] = sum;
}

template <typename W, int kTokens>
void launch_pass(dim3 grid, const void* weight, int64_t out_features, int64_t in_features, const float* x, float* y,
                 const BlockScales& scales, int64_t split_vectors, float* partial, bool round_x, cudaStream_t stream) {
  static_cast<void>(launch_dependent(dense_gemv<W, kTokens, rows_per_warp(kTokens)>, grid, dim3(32 * kWarpsPerBlock), 0,
                                     stream, static_cast<const W*>(weight), out_features, in_features, x, y, scales,
                                     split_vectors, partial, round_x));
}

template <typename W>
void launch(DenseWeightType type, const void* weight, int64_t out_features, int64_t in_features, const float* x,
            int64_t num_tokens, float* y, const BlockScales& scales, float* scratch, bool round_x,
            cudaStream_t stream) {
  constexpr int64_t kVector = 16 / sizeof(W);
  const bool vectorised = in_features % kVector == 0 &&
                          ((reinterpret_cast<uintptr_t>(weight) | reinterpret_cast<uintptr_t>(x)) & 15u) == 0;
  const int64_t vectors = in_features / kVector;
  using Pass = void (*)(dim3, const void*, int64_t, int64_t, const float*, float*, const BlockScales&, int64_t, float*,
                        bool, cudaStream_t);
  static constexpr Pass kPasses[kTokensPerPass] = {launch_pass<W, 1>, launch_pass<W, 2>, launch_pass<W, 3>,
                                                   launch_pass<W, 4>, launch_pass<W, 5>, launch_pass<W, 6>,
                                                   launch_pass<W, 7>, launch_pass<W, 8>};
  for (int64_t t = 0; t < num_tokens; t += kTokensPerPass) {
    const int64_t n = std::min<int64_t>(kTokensPerPass, num_tokens - t);
    const int rows = rows_per_warp(static_cast<int>(n));
    const int64_t splits =
        vectorised && scratch != nullptr ? split_count(type, out_features, in_features, rows) : 1;
    // Whole unrolled passes of the warp per split, so that every split starts where a pass would.
    const int64_t pass = 32 * kUnroll;
    const int64_t split_vectors = splits == 1 ? vectors : ((vectors + splits - 1) / splits + pass - 1) / pass * pass;
    const int64_t used_splits = splits == 1 ? 1 : (vectors + split_vectors - 1) / split_vectors;
    const int64_t rows_per_block = kWarpsPerBlock * rows;
    const dim3 grid(static_cast<unsigned>((out_features + rows_per_block - 1) / rows_per_block),
                    static_cast<unsigned>(used_splits));
    kPasses[n - 1](grid, weight, out_features, in_features, x + t * in_features, y + t * out_features, scales,
                   split_vectors, scratch, round_x, stream);
    if (used_splits > 1) {
      const int64_t count = n * out_features;
      static_cast<void>(launch_dependent(sum_splits, dim3(static_cast<unsigned>((count + 255) / 256)), dim3(256), 0,
                                         stream, scratch, count, static_cast<int>(used_splits), y + t * out_features));
    }
  }
}

// The tensor-core path for one matrix or a group sharing x: passes of up to 16 tokens (one or two mma token groups).
// With `up`, x is the gate and the input the clamped SwiGLU of the two (limit).
void launch_mma(const DenseGroupMember* members, int count, int64_t in_features, const float* x, int64_t num_tokens,
                float* scratch, unsigned* counters, ProductInput input, cudaStream_t stream, const float* up = nullptr,
                float limit = 0.0f) {
  MmaGroup group{};
  group.count = count;
  for (int m = 0; m < count; ++m) {
    const DenseGroupMember& member = members[m];
    group.weight[m] = static_cast<const __nv_bfloat16*>(member.weight);
    group.out_features[m] = member.out_features;
    group.y[m] = member.y;
    group.first_block[m + 1] = group.first_block[m] + mma_row_blocks(member.out_features);
    group.first_row[m + 1] = group.first_row[m] + member.out_features;
  }
  const int64_t row_blocks = group.first_block[group.count];
  const int64_t splits = scratch != nullptr && counters != nullptr ? mma_split_count(row_blocks, in_features) : 1;
  const int64_t stages = (in_features + kMmaStageK - 1) / kMmaStageK;
  const int64_t split_k = (stages + splits - 1) / splits * kMmaStageK;
  const int64_t used_splits = (in_features + split_k - 1) / split_k;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(used_splits));
  for (int64_t t = 0; t < num_tokens; t += kMmaTokensPerPass) {
    const int n = static_cast<int>(std::min<int64_t>(kMmaTokensPerPass, num_tokens - t));
    MmaGroup pass = group;
    for (int m = 0; m < group.count; ++m) pass.y[m] = group.y[m] + t * group.out_features[m];
    // Dependent launches: each kernel's start overlaps the previous one's tail.
    const int token_groups = n > 8 ? 2 : 1;
    const int terms = input == ProductInput::bf16 ? 1 : 3;
    const auto kernel = terms == 1 ? (token_groups == 2 ? bf16_mma_gemv<2, 1> : bf16_mma_gemv<1, 1>)
                                   : (token_groups == 2 ? bf16_mma_gemv<2, 3> : bf16_mma_gemv<1, 3>);
    static_cast<void>(launch_dependent(kernel, grid, dim3(32 * kWarpsPerBlock), mma_shared_bytes(token_groups, terms),
                                       stream, pass,
                                       in_features, x + t * in_features, n, split_k, scratch, counters,
                                       up != nullptr ? up + t * in_features : nullptr, limit));
  }
}

template <typename W>
__global__ void gather_rows_kernel(const W* table, int64_t cols, const int32_t* ids, float* out) {
  wait_for_previous_grid();
  const W* row = table + static_cast<int64_t>(ids[blockIdx.x]) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[blockIdx.x * cols + i] = to_float(row[i]);
}

template <typename W>
void launch_gather(const void* table, int64_t cols, const int32_t* ids, int64_t num_tokens, float* out,
                   cudaStream_t stream) {
  static_cast<void>(launch_dependent(gather_rows_kernel<W>, dim3(static_cast<unsigned>(num_tokens)), dim3(256), 0,
                                     stream, static_cast<const W*>(table), cols, ids, out));
}

// Calls f(W{}) with W the element type of `type`.
template <typename F>
void with_element_type(DenseWeightType type, F&& f) {
  switch (type) {
    case DenseWeightType::f32:
      f(float{});
      break;
    case DenseWeightType::f16:
      f(__half{});
      break;
    case DenseWeightType::bf16:
      f(__nv_bfloat16{});
      break;
    case DenseWeightType::f8_e4m3:
      f(__nv_fp8_e4m3{});
      break;
  }
}

}  // namespace

cudaError_t gather_rows(const void* table, DenseWeightType type, int64_t cols, const int32_t* ids, int64_t num_tokens,
                        float* out, cudaStream_t stream) {
  if (type == DenseWeightType::f8_e4m3) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  with_element_type(type, [&](auto element) {
    launch_gather<decltype(element)>(table, cols, ids, num_tokens, out, stream);
  });
  return cudaGetLastError();
}

// A launch is split only while it has fewer row blocks than kTargetBlocks, so that many counters cover any.
int64_t dense_counter_count() { return kTargetBlocks; }

int64_t dense_splits(DenseWeightType type, int64_t out_features, int64_t in_features) {
  return takes_mma_path(type, in_features) ? mma_split_count(mma_row_blocks(out_features), in_features)
                                           : split_count(type, out_features, in_features, rows_per_warp(1));
}

int64_t bf16_group_scratch_floats(int64_t total_rows, int64_t in_features) {
  const int64_t splits = mma_split_count(mma_row_blocks(total_rows), in_features);
  return splits == 1 ? 0 : splits * kMmaTokensPerPass * total_rows;
}

int64_t dense_scratch_floats(DenseWeightType type, int64_t out_features, int64_t in_features) {
  // A multi-row pass has fewer row blocks, so at least as many splits as a one-token pass. A bf16 matrix whose
  // pointers turn out unaligned falls back to the CUDA-core kernel, so it gets room for either.
  const int64_t splits = split_count(type, out_features, in_features, rows_per_warp(kTokensPerPass));
  const int64_t floats = splits == 1 ? 0 : splits * kTokensPerPass * out_features;
  if (!takes_mma_path(type, in_features)) return floats;
  return std::max(floats, bf16_group_scratch_floats(out_features, in_features));
}

bool bf16_group_supported(int64_t in_features, const float* x) {
  return takes_mma_path(DenseWeightType::bf16, in_features) && (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
}

cudaError_t bf16_linear_group(const DenseGroupMember* members, int count, int64_t in_features, const float* x,
                              int64_t num_tokens, float* scratch, unsigned* counters, cudaStream_t stream,
                              ProductInput input) {
  if (count < 1 || count > kMaxDenseGroup || !bf16_group_supported(in_features, x)) return cudaErrorInvalidValue;
  for (int m = 0; m < count; ++m) {
    if ((reinterpret_cast<uintptr_t>(members[m].weight) & 15u) != 0 || members[m].out_features < 1) {
      return cudaErrorInvalidValue;
    }
  }
  if (num_tokens > 0) launch_mma(members, count, in_features, x, num_tokens, scratch, counters, input, stream);
  return cudaGetLastError();
}

bool bf16_swiglu_supported(int64_t in_features, const void* weight, const float* gate, const float* up) {
  return bf16_group_supported(in_features, gate) && (reinterpret_cast<uintptr_t>(up) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(weight) & 15u) == 0;
}

cudaError_t bf16_swiglu_linear(const void* weight, int64_t out_features, int64_t in_features, const float* gate,
                               const float* up, float limit, int64_t num_tokens, float* y, float* scratch,
                               unsigned* counters, cudaStream_t stream, ProductInput input) {
  if (out_features < 1 || !bf16_swiglu_supported(in_features, weight, gate, up)) return cudaErrorInvalidValue;
  const DenseGroupMember member{.weight = weight, .out_features = out_features, .y = y};
  if (num_tokens > 0) {
    launch_mma(&member, 1, in_features, gate, num_tokens, scratch, counters, input, stream, up, limit);
  }
  return cudaGetLastError();
}

cudaError_t dense_linear(const void* weight, DenseWeightType type, int64_t out_features, int64_t in_features,
                         const float* x, int64_t num_tokens, float* y, cudaStream_t stream,
                         const BlockScales& scales, float* scratch, unsigned* counters, ProductInput input) {
  const bool fp8 = type == DenseWeightType::f8_e4m3;
  if (fp8 != (scales.scales != nullptr) ||
      (fp8 && (scales.block_rows < 1 || scales.block_cols < 1 || scales.block_cols % 16 != 0))) {
    return cudaErrorInvalidValue;
  }
  const bool aligned = ((reinterpret_cast<uintptr_t>(weight) | reinterpret_cast<uintptr_t>(x)) & 15u) == 0;
  if (takes_mma_path(type, in_features) && aligned) {
    const DenseGroupMember member{.weight = weight, .out_features = out_features, .y = y};
    if (num_tokens > 0) launch_mma(&member, 1, in_features, x, num_tokens, scratch, counters, input, stream);
    return cudaGetLastError();
  }
  const bool round_x = type == DenseWeightType::bf16 && input == ProductInput::bf16;
  with_element_type(type, [&](auto element) {
    launch<decltype(element)>(type, weight, out_features, in_features, x, num_tokens, y, scales, scratch, round_x,
                              stream);
  });
  return cudaGetLastError();
}

}  // namespace kestrel::cuda

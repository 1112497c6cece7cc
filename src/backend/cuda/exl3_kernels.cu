#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/exl3_kernels.h"
#include "backend/cuda/hadamard_warp.cuh"

namespace kestrel::cuda {

namespace {

constexpr int kTokensPerPass = 16;  // the M of one mma.m16n8k16
constexpr int kWarpsPerBlock = 8;   // 8 strips of 16 columns: one 128-column output Hadamard block
constexpr int kTilesInFlight = 4;
constexpr int64_t kMaxSliceTiles = 64;
constexpr int kRowPad = 8;  // halves added to each token's shared-memory row: rows start 16 bytes (4 banks) apart

// Two trellis states -> their fp16 codebook values as one half2 (low half: `first`), bit-exact with
// exl3::decode_state. 3INST (0) and MCG (1) are the sum of the two fp16 halves of a masked product, which half2
// arithmetic does for both states in one add; MUL1 (2) is an affine function of the product's byte sum with one
// rounding.
template <int Codebook>
__device__ __forceinline__ uint32_t codebook_pair(uint32_t first, uint32_t second) {
  if constexpr (Codebook == 2) {
    const float scale = __half2float(__ushort_as_half(0x1EEE)), bias = __half2float(__ushort_as_half(0xC931));
    const auto value = [&](uint32_t state) {
      const uint32_t x = state * 0x83DCD12Du;
      const uint32_t byte_sum = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
      return static_cast<float>(1024u + byte_sum) * scale + bias;
    };
    const __half2 pair = __floats2half2_rn(value(first), value(second));
    return *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    const auto masked = [](uint32_t state) {
      const uint32_t x = Codebook == 0 ? state * 89226354u + 64248484u : state * 0xCBAC1FEDu;
      return (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
    };
    const uint32_t a = masked(first), b = masked(second);
    const uint32_t low = __byte_perm(a, b, 0x5410), high = __byte_perm(a, b, 0x7632);
    const __half2 sum = __hadd2(*reinterpret_cast<const __half2*>(&low), *reinterpret_cast<const __half2*>(&high));
    return *reinterpret_cast<const uint32_t*>(&sum);
  }
}

// D += A (16x16 fp16, row-major) x B (16x8 fp16, column-major), fp32 accumulators (sm_80+ tensor cores).
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One launch per 16 tokens. Block (c, s) owns output columns [128c, 128c + 128), one output Hadamard block, and k
// slice s (a multiple of 128 rows, one or more input Hadamard blocks):
//  1. it rotates its slice of the inputs, (x ⊙ suh)·H128 per block, into shared memory as fp16 (zero rows past
//     the tokens), the A operand of the tensor cores;
//  2. warp w multiplies them by the 16-column tile strip 8c + w of Ŵ on the tensor cores: a tile's trellis
//     positions are stored in mma.m16n8k16 B-fragment order (exl3::tile_coord), so lane l decodes its positions
//     8l..8l+7 from the packed words into exactly its B registers for the tile's two 8-column halves; the fp32
//     accumulators go to partial[s];
//  3. the last slice to finish column block c (a counter per block, reset by that last block) adds the partials in
//     slice order, so the result does not depend on timing, and applies the output rotation and svh.
// State p of a tile is the 16-bit window ending at bit (p + 1) * Bits of its circular MSB-first stream of 32-bit
// words, so a lane's 8 states lie in the 72 bits from (8l + 1) * Bits - 16: four words, funnel-shifted to start
// there, after which every window is at a compile-time offset.
struct GemvParams {
  Exl3MatrixRef matrix;         // the matrix of every launch without a table
  const Exl3MatrixRef* table;   // or, per slot (blockIdx.z), matrix table[ids[slot]]
  const int32_t* ids;
  int64_t x_group;              // slot z reads input row z / x_group
  const float* x;
  float* y;
  float* partial;      // per slot: [splits, kTokensPerPass, out_padded]
  unsigned* counters;  // per slot: [out_padded / 128], zero between launches
  int64_t in_features, out_features, in_padded, out_padded;
  int64_t slice_tiles;
  int num_tokens, splits;
};

template <int Bits, int Codebook>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) trellis_gemv(GemvParams p) {
  constexpr int kWords = 8 * Bits, kStreamBits = 256 * Bits;
  extern __shared__ __half rotated[];  // [kTokensPerPass, slice_tiles * 16 + kRowPad]
  __shared__ bool last_slice;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t tiles_k = p.in_padded / 16, tiles_n = p.out_padded / 16;
  const int64_t z = blockIdx.z;
  const Exl3MatrixRef m = p.table ? p.table[p.ids[z]] : p.matrix;
  const float* x = p.x + z / p.x_group * p.in_features;
  float* y = p.y + z * p.out_features;
  float* partial = p.partial + z * p.splits * kTokensPerPass * p.out_padded;
  unsigned* counters = p.counters + z * (p.out_padded / 128);
  const int64_t slice = blockIdx.y;
  const int64_t a_begin = slice * p.slice_tiles, a_end = min(tiles_k, a_begin + p.slice_tiles);
  const int64_t stride = p.slice_tiles * 16 + kRowPad;

  // 1. This slice's rotated inputs: one warp per (token, 128-row block); rows of absent tokens are zero.
  const int64_t row_blocks = (a_end - a_begin) / 8;
  for (int64_t job = warp; job < kTokensPerPass * row_blocks; job += kWarpsPerBlock) {
    const int64_t t = job / row_blocks, row = job % row_blocks * 128 + lane * 4;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (t < p.num_tokens) {
      for (int j = 0; j < 4; ++j) {
        const int64_t i = a_begin * 16 + row + j;
        if (i < p.in_features) v[j] = x[t * p.in_features + i] * __half2float(__ushort_as_half(m.suh[i]));
      }
      hadamard128_warp(v);
    }
    for (int j = 0; j < 4; ++j) rotated[t * stride + row + j] = __float2half_rn(v[j]);
  }
  __syncthreads();

  // 2. The strip's partial sums over this slice, on the tensor cores.
  const int64_t strip = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  const int first_bit = (8 * lane + 1) * Bits - 16 + kStreamBits;  // made positive: the stream is circular
  const int first_word = (first_bit >> 5) % kWords, shift = first_bit & 31;
  // A fragment rows: tokens l/4 and l/4 + 8; columns (k within the tile) 2(l%4) + {0, 1} and + 8.
  const __half* a_row = rotated + (lane / 4) * stride + 2 * (lane % 4);
  float acc[2][4] = {};  // per 8-column half: tokens (l/4, l/4 + 8) x columns 2(l%4) + {0, 1}
  // Tiles go in groups of kTilesInFlight whose words are all requested before any is decoded: a warp keeps that
  // many loads in flight instead of waiting out the memory latency once per tile.
  for (int64_t group = a_begin; group < a_end; group += kTilesInFlight) {
    uint32_t raw[kTilesInFlight][4];
#pragma unroll
    for (int u = 0; u < kTilesInFlight; ++u) {
      const int64_t a = min(group + u, a_end - 1);  // past the slice's end: a repeated tile, loaded and ignored
      const uint32_t* record = m.trellis + (a * tiles_n + strip) * kWords;
#pragma unroll
      for (int i = 0; i < 4; ++i) raw[u][i] = __ldcs(record + (first_word + i) % kWords);
    }
#pragma unroll
    for (int u = 0; u < kTilesInFlight; ++u) {
      if (group + u >= a_end) break;
      uint32_t bits[3];
#pragma unroll
      for (int i = 0; i < 3; ++i) bits[i] = __funnelshift_l(raw[u][i + 1], raw[u][i], shift);
      uint32_t state[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int offset = j * Bits, word = offset >> 5, within = offset & 31;
        const uint64_t pair = (static_cast<uint64_t>(bits[word]) << 32) | (word + 1 < 3 ? bits[word + 1] : 0u);
        state[j] = static_cast<uint32_t>(pair >> (48 - within)) & 0xFFFFu;
      }
      const __half* a_tile = a_row + (group + u - a_begin) * 16;
      uint32_t a[4];
      a[0] = *reinterpret_cast<const uint32_t*>(a_tile);
      a[1] = *reinterpret_cast<const uint32_t*>(a_tile + 8 * stride);
      a[2] = *reinterpret_cast<const uint32_t*>(a_tile + 8);
      a[3] = *reinterpret_cast<const uint32_t*>(a_tile + 8 * stride + 8);
      mma_16x8x16(acc[0], a, codebook_pair<Codebook>(state[0], state[1]), codebook_pair<Codebook>(state[2], state[3]));
      mma_16x8x16(acc[1], a, codebook_pair<Codebook>(state[4], state[5]), codebook_pair<Codebook>(state[6], state[7]));
    }
  }
  for (int half = 0; half < 2; ++half) {
    const int64_t column = strip * 16 + 8 * half + 2 * (lane % 4);
    for (int r = 0; r < 2; ++r) {
      const int t = lane / 4 + 8 * r;
      if (t >= p.num_tokens) continue;
      float* out = partial + (slice * kTokensPerPass + t) * p.out_padded + column;
      out[0] = acc[half][2 * r];
      out[1] = acc[half][2 * r + 1];
    }
  }

  // 3. The last slice of this column block finishes it.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last_slice = atomicAdd(counters + blockIdx.x, 1u) == static_cast<unsigned>(p.splits - 1);
    if (last_slice) counters[blockIdx.x] = 0;
  }
  __syncthreads();
  if (!last_slice) return;
  __threadfence();
  for (int t = warp; t < p.num_tokens; t += kWarpsPerBlock) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * 128 + lane * 4;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < p.splits; ++s) {
      const float* row = partial + (s * kTokensPerPass + t) * p.out_padded + base;
      for (int j = 0; j < 4; ++j) v[j] += __ldcg(row + j);
    }
    hadamard128_warp(v);
    for (int j = 0; j < 4; ++j) {
      const int64_t o = base + j;
      if (o < p.out_features) y[t * p.out_features + o] = v[j] * __half2float(__ushort_as_half(m.svh[o]));
    }
  }
}

// Without a table: passes of up to 16 tokens over one matrix. With a table: one launch, one token per slot.
template <int Bits, int Codebook>
void launch_gemv(GemvParams p, int64_t num_tokens, int64_t slots, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.out_padded / 128), static_cast<unsigned>(p.splits),
                  static_cast<unsigned>(slots));
  const size_t shared = static_cast<size_t>(kTokensPerPass * (p.slice_tiles * 16 + kRowPad)) * sizeof(__half);
  const float* x = p.x;
  float* y = p.y;
  for (int64_t t = 0; t < num_tokens; t += kTokensPerPass) {
    p.num_tokens = static_cast<int>(std::min<int64_t>(kTokensPerPass, num_tokens - t));
    p.x = x + t * p.in_features;
    p.y = y + t * p.out_features;
    trellis_gemv<Bits, Codebook><<<grid, 32 * kWarpsPerBlock, shared, stream>>>(p);
  }
}

template <int Bits>
void launch_gemv_for_codebook(int codebook, const GemvParams& p, int64_t num_tokens, int64_t slots,
                              cudaStream_t stream) {
  switch (codebook) {
    case 0:
      return launch_gemv<Bits, 0>(p, num_tokens, slots, stream);
    case 1:
      return launch_gemv<Bits, 1>(p, num_tokens, slots, stream);
    default:
      return launch_gemv<Bits, 2>(p, num_tokens, slots, stream);
  }
}

template <int... Bits>
void launch_gemv_for_bits(std::integer_sequence<int, Bits...>, int bits, int codebook, const GemvParams& p,
                          int64_t num_tokens, int64_t slots, cudaStream_t stream) {
  ((bits == Bits ? launch_gemv_for_codebook<Bits>(codebook, p, num_tokens, slots, stream) : void()), ...);
}

bool launchable(const Exl3DeviceView& m) {
  return m.bits >= 1 && m.bits <= 8 && m.in_padded % 128 == 0 && m.out_padded % 128 == 0;
}

GemvParams params_for(const Exl3DeviceView& m, const Exl3Plan& plan, const float* x, float* y, float* scratch,
                      unsigned* counters) {
  return GemvParams{.matrix = {.trellis = m.trellis, .suh = m.suh, .svh = m.svh},
                    .table = nullptr,
                    .ids = nullptr,
                    .x_group = 1,
                    .x = x,
                    .y = y,
                    .partial = scratch,
                    .counters = counters,
                    .in_features = m.in_features,
                    .out_features = m.out_features,
                    .in_padded = m.in_padded,
                    .out_padded = m.out_padded,
                    .slice_tiles = plan.slice_tiles,
                    .num_tokens = 1,
                    .splits = plan.splits};
}

}  // namespace

Exl3Plan exl3_plan(const Exl3DeviceView& matrix, int sm_count) {
  // About 32 warps per SM at batch 1; a slice is 8..64 tiles (128..1024 rows: its fp16 inputs fit in 33 KB).
  const int64_t tiles_k = matrix.in_padded / 16, tiles_n = matrix.out_padded / 16;
  const int64_t wanted = std::max<int64_t>(1, int64_t{sm_count} * 32 / tiles_n);
  const int64_t per_slice = (tiles_k + wanted - 1) / wanted;
  const int64_t slice_tiles = std::clamp<int64_t>((per_slice + 7) / 8 * 8, 8, kMaxSliceTiles);
  return Exl3Plan{.slice_tiles = slice_tiles, .splits = static_cast<int>((tiles_k + slice_tiles - 1) / slice_tiles)};
}

size_t exl3_scratch_floats(const Exl3DeviceView& matrix, const Exl3Plan& plan) {
  return static_cast<size_t>(int64_t{plan.splits} * kTokensPerPass * matrix.out_padded);
}

size_t exl3_counter_count(const Exl3DeviceView& matrix) { return static_cast<size_t>(matrix.out_padded / 128); }

cudaError_t exl3_linear(const Exl3DeviceView& m, const Exl3Plan& plan, const float* x, int64_t num_tokens, float* y,
                        float* scratch, unsigned* counters, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  if (!launchable(m)) return cudaErrorInvalidValue;
  launch_gemv_for_bits(std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 7, 8>{}, m.bits, m.codebook,
                       params_for(m, plan, x, y, scratch, counters), num_tokens, 1, stream);
  return cudaGetLastError();
}

cudaError_t exl3_slot_linear(const Exl3DeviceView& shape, const Exl3Plan& plan, const Exl3MatrixRef* table,
                             const int32_t* ids, int64_t slots, const float* x, int64_t x_group, float* y,
                             float* scratch, unsigned* counters, cudaStream_t stream) {
  if (slots == 0) return cudaSuccess;
  if (!launchable(shape) || x_group < 1 || slots > 65535) return cudaErrorInvalidValue;
  GemvParams p = params_for(shape, plan, x, y, scratch, counters);
  p.table = table;
  p.ids = ids;
  p.x_group = x_group;
  launch_gemv_for_bits(std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 7, 8>{}, shape.bits, shape.codebook, p, 1, slots,
                       stream);
  return cudaGetLastError();
}

}  // namespace kestrel::cuda

#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/exl3_kernels.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/dynamic_shared.cuh"
#include "backend/cuda/hadamard_warp.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/swiglu.cuh"

namespace kestrel::cuda {

namespace {

constexpr int kTokensPerPass = 16;  // two mma token groups
constexpr int kTokensPerGroup = 8;  // the N of one mma.m16n8k16
constexpr int kWarpsPerBlock = 8;   // 8 strips of 16 columns: one 128-column output Hadamard block
constexpr int kTilesInFlight = 8;   // a slice is a multiple of 8 tiles, so groups never run past its end
constexpr int kStages = 2;         // groups of tiles in registers: one multiplied while the next loads
constexpr int64_t kMaxSliceTiles = 64;
constexpr int kRowPadWords = 16;    // added to each token's shared-memory row: rows start 64 bytes (16 banks) apart

// The codebook word of one trellis state: two fp16 halves whose sum is the state's value (exl3::decode_state sums
// them in fp16; here the tensor cores multiply both halves by the input and sum in fp32). 3INST (0) and MCG (1) are
// a hashed, masked product; MUL1 (2) is an affine function of the product's byte sum, put in the low half.
__device__ __forceinline__ uint32_t mask_and_flip(uint32_t x) {
  uint32_t r;  // (x & 0x8FFF8FFF) ^ 0x3B603B60 as one lop3 (ptxas otherwise emits two, one per immediate)
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(r) : "r"(x), "r"(0x8FFF8FFFu), "r"(0x3B603B60u));
  return r;
}

template <int Codebook>
__device__ __forceinline__ uint32_t codebook_word(uint32_t state) {
  if constexpr (Codebook == 2) {
    const float scale = __half2float(__ushort_as_half(0x1EEE)), bias = __half2float(__ushort_as_half(0xC931));
    const uint32_t x = state * 0x83DCD12Du;
    const uint32_t byte_sum = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
    return __half_as_ushort(__float2half_rn(static_cast<float>(1024u + byte_sum) * scale + bias));
  } else {
    return mask_and_flip(Codebook == 0 ? state * 89226354u + 64248484u : state * 0xCBAC1FEDu);
  }
}

// The packed words of one tile that a lane decodes its 8 states from. State p of a tile is the 16-bit window ending
// at bit (p + 1) * Bits of its circular MSB-first stream of 32-bit words, so lane l's states 8l..8l+7 lie in the
// bits from (8l + 1) * Bits - 16 to 8(l + 1) * Bits. At 4 bits that is word l and the last 12 bits of word l - 1:
// each lane loads its own word (the warp reads the 128-byte tile in one request) and takes the other from its
// neighbour. Other widths load the four words from the window's first (`first_word`).
template <int Bits>
constexpr int kLaneWords = Bits == 4 ? 1 : 4;

template <int Bits, bool Streaming = true>
__device__ __forceinline__ void load_tile(const uint32_t* record, int lane, int first_word,
                                          uint32_t (&raw)[kLaneWords<Bits>]) {
  const auto load = [](const uint32_t* p) { return Streaming ? __ldcs(p) : __ldg(p); };
  if constexpr (Bits == 4) {
    raw[0] = load(record + lane);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) raw[i] = load(record + (first_word + i) % (8 * Bits));
  }
}

// The words of kTilesInFlight tiles that one lane holds.
template <int Bits>
struct TileGroup {
  uint32_t words[kTilesInFlight][kLaneWords<Bits>];
};

template <int Bits>
__device__ __forceinline__ void tile_states(const uint32_t (&raw)[kLaneWords<Bits>], int lane, int shift,
                                            uint32_t (&state)[8]) {
  if constexpr (Bits == 4) {
    // V = word l - 1 : word l (64 bits); state j = (V >> (28 - 4j)) & 0xFFFF, each a shift or a byte permute.
    const uint32_t lo = raw[0], hi = __shfl_sync(0xFFFFFFFFu, lo, (lane + 31) & 31);
    const uint32_t v4 = __funnelshift_r(lo, hi, 4), v20 = __funnelshift_r(lo, hi, 20);
    state[0] = __byte_perm(v20, 0, 0x4421);
    state[1] = (v20 >> 4) & 0xFFFFu;
    state[2] = v4 >> 16;
    state[3] = lo >> 16;
    state[4] = __byte_perm(v4, 0, 0x4421);
    state[5] = __byte_perm(lo, 0, 0x4421);
    state[6] = v4 & 0xFFFFu;
    state[7] = lo & 0xFFFFu;
  } else {
    uint32_t bits[3];  // the stream from the window's first bit on
#pragma unroll
    for (int i = 0; i < 3; ++i) bits[i] = __funnelshift_l(raw[i + 1], raw[i], shift);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int offset = j * Bits, word = offset >> 5, within = offset & 31;
      const uint64_t pair = (static_cast<uint64_t>(bits[word]) << 32) | (word + 1 < 3 ? bits[word + 1] : 0u);
      state[j] = static_cast<uint32_t>(pair >> (48 - within)) & 0xFFFFu;
    }
  }
}

// Lane l's 8 codebook words of one tile: those of its states 8l..8l+7.
template <int Bits, int Codebook>
__device__ __forceinline__ void lane_codebook_words(const uint32_t (&raw)[kLaneWords<Bits>], int lane, int shift,
                                                    uint32_t (&w)[8]) {
  uint32_t state[8];
  tile_states<Bits>(raw, lane, shift, state);
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = codebook_word<Codebook>(state[j]);
}

// What lane l of the warp decoding one 16-column strip of a matrix reads: the strip's tiles, one per k tile, each
// `kWords` words apart from the next strip's; and where in a tile's circular stream its states begin.
template <int Bits, bool Streaming>
struct StripReader {
  static constexpr int kWords = 8 * Bits;
  const uint32_t* strip_words;
  int64_t tile_words;  // from one k tile of the strip to the next
  int lane, first_word, shift;

  __device__ __forceinline__ StripReader(const uint32_t* trellis, int64_t strip, int64_t tiles_n, int lane_)
      : strip_words(trellis + strip * kWords), tile_words(tiles_n * kWords), lane(lane_) {
    const int first_bit = (8 * lane + 1) * Bits - 16 + 256 * Bits;  // made positive: the stream is circular
    first_word = (first_bit >> 5) % kWords;
    shift = first_bit & 31;
  }
  // The kTilesInFlight tiles from k tile `first` on.
  __device__ __forceinline__ void load(int64_t first, TileGroup<Bits>& raw) const {
#pragma unroll
    for (int u = 0; u < kTilesInFlight; ++u) {
      load_tile<Bits, Streaming>(strip_words + (first + u) * tile_words, lane, first_word, raw.words[u]);
    }
  }
  template <int Codebook>
  __device__ __forceinline__ void decode(const uint32_t (&raw)[kLaneWords<Bits>], uint32_t (&w)[8]) const {
    lane_codebook_words<Bits, Codebook>(raw, lane, shift, w);
  }
};

// One launch per 16 tokens. Block (c, s) owns output columns [128c, 128c + 128), one output Hadamard block, and k
// slice s (a multiple of 128 rows, one or more input Hadamard blocks):
//  1. it rotates its slice of the inputs, (x ⊙ suh)·H128 per block, into shared memory as fp16, each value twice;
//  2. warp w multiplies the 16-column tile strip 8c + w of Ŵ by them on the tensor cores (the next 8 tiles' words
//     loading while 8 multiply), the weights as the A operand (16 output columns x 16 k) and the tokens as B (8 per
//     mma). A tile's trellis positions are stored in mma B-fragment order (exl3::tile_coord): lane l's states
//     8l..8l+7 are the elements (k, n) with
//     k in 2(l%4) + {0, 1, 8, 9}, n in l/4 + {0, 8}, which are also exactly the rows and columns of the A fragment
//     of lane l in the transposed product. Each register of A holds one state's codebook word, two fp16 halves
//     whose sum is the weight, so the matching pair of B rows holds the same input twice: one tile is two mma
//     over 8 of its k each. The fp32 accumulators go to partial[s];
//  3. the last slice to finish column block c (a counter per block, reset by that last block) adds the partials in
//     slice order, so the result does not depend on timing, and applies the output rotation and svh.
// Shared memory holds, per token, per tile, per quad q = l%4, the four doubled inputs of k = 2q, 2q+1, 2q+8, 2q+9:
// the B registers of both mma as one 16-byte load.
struct GemvParams {
  Exl3MatrixRef matrix;         // the matrix of every launch without a table
  const Exl3MatrixRef* table;   // or, per slot z (blockIdx.z), table[ids[z / id_group] * table_stride + z % id_group]
  const int32_t* ids;
  int64_t id_group, table_stride;
  int64_t x_group;              // slot z reads input row z / x_group
  const float* x;               // with swiglu, row r is the (gate, up) pair of rows 2r, 2r + 1: Exl3SlotInput
  bool swiglu;
  float swiglu_limit;
  float* y;
  float* partial;      // per slot: [splits, num_tokens, out_padded]
  unsigned* counters;  // per slot: [out_padded / 128], zero between launches
  int64_t in_features, out_features, in_padded, out_padded;
  int64_t slice_tiles;
  int num_tokens, splits;
};

// Shared memory of one launch: a row of doubled fp16 inputs per token.
size_t shared_bytes(int64_t slice_tiles, int num_tokens) {
  return static_cast<size_t>(num_tokens) * static_cast<size_t>(slice_tiles * 16 + kRowPadWords) * sizeof(uint32_t);
}

template <int Bits, int Codebook, int Groups>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) trellis_gemv(GemvParams p) {
  extern __shared__ uint4 shared_inputs[];  // [num_tokens][slice_tiles * 16 + kRowPadWords] doubled fp16 words
  uint32_t* doubled = reinterpret_cast<uint32_t*>(shared_inputs);
  __shared__ bool last_slice;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t tiles_k = p.in_padded / 16, tiles_n = p.out_padded / 16;
  const int64_t z = blockIdx.z;
  if (p.table) wait_for_previous_grid();  // the ids come from an earlier kernel
  const Exl3MatrixRef m = p.table ? p.table[p.ids[z / p.id_group] * p.table_stride + z % p.id_group] : p.matrix;
  const int64_t x_row = p.swiglu ? 2 * p.in_features : p.in_features;  // floats from one input row to the next
  const float* x = p.x + z / p.x_group * x_row;
  float* y = p.y + z * p.out_features;
  float* partial = p.partial + z * p.splits * p.num_tokens * p.out_padded;
  unsigned* counters = p.counters + z * (p.out_padded / 128);
  const int64_t slice = blockIdx.y;
  const int64_t a_begin = slice * p.slice_tiles, a_end = min(tiles_k, a_begin + p.slice_tiles);
  const int64_t stride = p.slice_tiles * 16 + kRowPadWords;

  const int64_t strip = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  const StripReader<Bits, true> reader(m.trellis, strip, tiles_n, lane);
  using GroupWords = TileGroup<Bits>;
  const auto load_group = [&](int64_t group, GroupWords& raw) {
    if (group < a_end) reader.load(group, raw);
  };
  // 0. The strip's first group of tiles is requested before the input rotation and, for a single matrix, before
  // waiting for the previous kernel (launch_dependent), so that its latency overlaps both. (Requesting the whole
  // slice into L2 up front instead, with prefetch.global.L2, made every shape slower on the H100 once the loads are
  // pipelined: 24.5 against 21.2 µs for 4096 -> 12288, docs/benchmarks/cuda_linear.md.)
  GroupWords words[kStages];
#pragma unroll
  for (int s = 0; s + 1 < kStages; ++s) load_group(a_begin + s * kTilesInFlight, words[s]);
  if (!p.table) wait_for_previous_grid();

  // 1. This slice's rotated inputs: one warp per (token, 128-row block).
  const int64_t row_blocks = (a_end - a_begin) / 8;
  for (int64_t job = warp; job < p.num_tokens * row_blocks; job += kWarpsPerBlock) {
    const int64_t t = job / row_blocks, row = job % row_blocks * 128 + lane * 4;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < 4; ++j) {
      const int64_t i = a_begin * 16 + row + j;
      if (i >= p.in_features) continue;
      const float* row_x = x + t * x_row;
      const float value = p.swiglu ? clamped_swiglu_of(row_x[i], row_x[p.in_features + i], p.swiglu_limit) : row_x[i];
      v[j] = value * __half2float(__ushort_as_half(m.suh[i]));
    }
    hadamard128_warp(v);
    for (int j = 0; j < 4; ++j) {
      const int64_t r = row + j, k = r % 16;
      const int64_t word = r / 16 * 16 + (k & 7) / 2 * 4 + (k / 8) * 2 + (k & 1);
      const __half h = __float2half_rn(v[j]);
      doubled[t * stride + word] = static_cast<uint32_t>(__half_as_ushort(h)) * 0x10001u;
    }
  }
  __syncthreads();

  // 2. The strip's partial sums over this slice, on the tensor cores, kStages - 1 groups of tiles ahead in flight.
  const int quad = lane % 4;
  // B fragments: token l/4 of each group (absent tokens get zeros: their output columns are never written).
  bool present[Groups];
  const uint4* b_row[Groups];
#pragma unroll
  for (int g = 0; g < Groups; ++g) {
    const int t = lane / 4 + kTokensPerGroup * g;
    present[g] = t < p.num_tokens;
    b_row[g] = reinterpret_cast<const uint4*>(doubled + min(t, p.num_tokens - 1) * stride) + quad;
  }
  float acc[Groups][4] = {};  // per group: columns (l/4, l/4 + 8) x tokens 2(l%4) + {0, 1}
  const auto multiply_group = [&](int64_t group, const GroupWords& raw) {
#pragma unroll
    for (int u = 0; u < kTilesInFlight; ++u) {
      uint32_t w[8];
      reader.template decode<Codebook>(raw.words[u], w);
#pragma unroll
      for (int g = 0; g < Groups; ++g) {
        const uint4 b = present[g] ? b_row[g][(group + u - a_begin) * 4] : make_uint4(0, 0, 0, 0);
        mma_16x8x16<MmaInput::f16>(acc[g], w[0], w[4], w[1], w[5], b.x, b.y);
        mma_16x8x16<MmaInput::f16>(acc[g], w[2], w[6], w[3], w[7], b.z, b.w);
      }
    }
  };
  // The stages rotate through the registers by unrolling: stage s multiplies words[s] after requesting the group
  // kStages - 1 ahead into the buffer the previous stage freed.
  for (int64_t group = a_begin; group < a_end; group += kStages * kTilesInFlight) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int64_t current = group + s * kTilesInFlight;
      if (current >= a_end) break;
      load_group(current + (kStages - 1) * kTilesInFlight, words[(s + kStages - 1) % kStages]);
      multiply_group(current, words[s]);
    }
  }
#pragma unroll
  for (int g = 0; g < Groups; ++g) {
    for (int r = 0; r < 2; ++r) {
      const int64_t column = strip * 16 + lane / 4 + 8 * r;
      for (int c = 0; c < 2; ++c) {
        const int t = kTokensPerGroup * g + 2 * quad + c;
        if (t < p.num_tokens) partial[(slice * p.num_tokens + t) * p.out_padded + column] = acc[g][2 * r + c];
      }
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
      const float* row = partial + (s * p.num_tokens + t) * p.out_padded + base;
      for (int j = 0; j < 4; ++j) v[j] += __ldcg(row + j);
    }
    hadamard128_warp(v);
    for (int j = 0; j < 4; ++j) {
      const int64_t o = base + j;
      if (o < p.out_features) y[t * p.out_features + o] = v[j] * __half2float(__ushort_as_half(m.svh[o]));
    }
  }
}

// The large-batch form. Block (m, c, z) multiplies rows [Rows m, Rows (m + 1)) of member z's rotated inputs by
// column block c of its Ŵ (128 columns, one output Hadamard block) over the whole k, then rotates its outputs back:
//  1. the rows' inputs stream through shared memory in chunks of 8 tiles (128 k), kChunkStages - 1 chunks ahead by
//     cp.async (rows past the member's are zeros, multiplied like the rest and never written);
//  2. warp w decodes the 16-column tile strip 8c + w chunk by chunk in registers, the words of the next two chunks
//     loading while one multiplies: each tile once per block, its states' codebook halves summed in fp16 as
//     exl3::decode_state sums them (so Ŵ is bit-exact with the CPU decoder's), two weights to an A register
//     (lane l's states 8l..8l+7 are exactly its A fragment's elements, exl3::tile_coord), and multiplied on the tensor
//     cores by the rows, 8 to an mma, their B fragments read by ldmatrix;
//  3. the fp32 accumulators go through shared memory to one warp per row, which applies the output rotation and svh.
// Nothing of Ŵ is written to memory: the trellis is read once per Rows rows (blocks of one column block run side by
// side, m fastest, so L2 serves the repeats). The kernel is bound by issuing its instructions (Nsight Compute, run
// 44), the decoding about half of them at 64 rows: 128-row blocks halve that share but also the grid.
constexpr int kWordBuffers = 3;  // chunks of trellis words in registers: one multiplied while two load
constexpr int kChunkTiles = kTilesInFlight;
constexpr int kChunkStages = 3;
constexpr int kChunkRowBytes = kChunkTiles * 16 * 2 + 16;  // + 16: ldmatrix's 8 rows fall in distinct banks
constexpr int kOutRowFloats = 128 + 4;  // + 4: the accumulators' scatter is conflict-free
// Shared memory of a block of `rows` rows: the chunk stages, later the outputs.
constexpr size_t gemm_shared_bytes(size_t rows) {
  return std::max(kChunkStages * rows * kChunkRowBytes, rows * kOutRowFloats * sizeof(float));
}

// Two weights in one register: the fp16 sums of the halves of codebook words p (low) and q (high), as two byte
// permutes and one paired fp16 add.
__device__ __forceinline__ uint32_t summed_pair(uint32_t p, uint32_t q) {
  uint32_t sum;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(sum) : "r"(__byte_perm(p, q, 0x5410)), "r"(__byte_perm(p, q, 0x7632)));
  return sum;
}

template <int Bits, int Codebook, int Rows>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) trellis_gemm(Exl3Group group, int64_t in_padded,
                                                                     int64_t out_padded, int64_t out_features) {
  constexpr int kGroups = Rows / kTokensPerGroup;
  constexpr int kChunkBytes = Rows * kChunkRowBytes;
  extern __shared__ uint4 gemm_shared[];
  auto* chunks = reinterpret_cast<unsigned char*>(gemm_shared);
  const Exl3GroupMember& member = group.members[blockIdx.z];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * Rows;
  if (row0 >= member.num_tokens) return;
  const int rows = static_cast<int>(min(static_cast<int64_t>(Rows), member.num_tokens - row0));
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t tiles_n = out_padded / 16, chunks_k = in_padded / 16 / kChunkTiles;
  const __half* x = reinterpret_cast<const __half*>(member.rotated_x) + row0 * in_padded;

  const auto stage_chunk = [&](int64_t chunk) {
    if (chunk < chunks_k) {
      unsigned char* stage = chunks + chunk % kChunkStages * kChunkBytes;
      for (int i = static_cast<int>(threadIdx.x); i < Rows * 16; i += 32 * kWarpsPerBlock) {
        const int row = i / 16, part = i % 16;
        const bool valid = row < rows;
        copy_async_16(stage + row * kChunkRowBytes + part * 16,
                      x + (valid ? row : 0) * in_padded + chunk * kChunkTiles * 16 + part * 8, valid);
      }
    }
    copy_async_commit();  // empty past the end, so that every iteration waits for the same count
  };
  const int64_t strip = static_cast<int64_t>(blockIdx.y) * kWarpsPerBlock + warp;
  const StripReader<Bits, false> reader(member.trellis, strip, tiles_n, lane);
  using GroupWords = TileGroup<Bits>;
  const auto load_chunk_words = [&](int64_t chunk, GroupWords& raw) {
    if (chunk < chunks_k) reader.load(chunk * kChunkTiles, raw);
  };
  GroupWords words[kWordBuffers];
#pragma unroll
  for (int b = 0; b + 1 < kWordBuffers; ++b) load_chunk_words(b, words[b]);
#pragma unroll
  for (int s = 0; s + 1 < kChunkStages; ++s) stage_chunk(s);

  // Lane l gives ldmatrix the row of matrix l / 8: rows (l / 16) * 8 + l % 8 of a 16-row pair of mma groups, the
  // tile's k 0..7 or (odd matrices) 8..15; registers 0, 1 are then the first group's B fragment, 2, 3 the second's.
  const int ldmatrix_offset = ((lane >> 4) * 8 + (lane & 7)) * kChunkRowBytes + ((lane >> 3) & 1) * 16;
  float acc[kGroups][4] = {};
  const auto multiply_chunk = [&](int64_t chunk, const GroupWords& raw) {
    const uint32_t stage = shared_address(chunks) + static_cast<uint32_t>(chunk % kChunkStages * kChunkBytes) +
                           ldmatrix_offset;
#pragma unroll
    for (int u = 0; u < kChunkTiles; ++u) {
      uint32_t w[8];
      reader.template decode<Codebook>(raw.words[u], w);
      const uint32_t a0 = summed_pair(w[0], w[1]), a1 = summed_pair(w[4], w[5]), a2 = summed_pair(w[2], w[3]),
                     a3 = summed_pair(w[6], w[7]);
#pragma unroll
      for (int pair = 0; pair < kGroups / 2; ++pair) {
        uint32_t b[4];
        ldmatrix_x4(b, stage + pair * 2 * kTokensPerGroup * kChunkRowBytes + u * 32);
        mma_16x8x16<MmaInput::f16>(acc[2 * pair], a0, a1, a2, a3, b[0], b[1]);
        mma_16x8x16<MmaInput::f16>(acc[2 * pair + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
  };
  // kWordBuffers chunks per round, so that the register buffers rotate by unrolling.
  for (int64_t round = 0; round < chunks_k; round += kWordBuffers) {
#pragma unroll
    for (int s = 0; s < kWordBuffers; ++s) {
      const int64_t chunk = round + s;
      if (chunk >= chunks_k) break;
      copy_async_wait<kChunkStages - 2>();
      __syncthreads();  // the chunk is in for every thread, and the stage the next copy fills is read by none
      stage_chunk(chunk + kChunkStages - 1);
      load_chunk_words(chunk + kWordBuffers - 1, words[(s + kWordBuffers - 1) % kWordBuffers]);
      multiply_chunk(chunk, words[s]);
    }
  }

  // 3. The block's outputs through shared memory (the stages are free once every warp is done), then per row the
  // output rotation and svh.
  copy_async_wait<0>();
  __syncthreads();
  float* out = reinterpret_cast<float*>(gemm_shared);
  const int quad = lane % 4;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        out[(kTokensPerGroup * g + 2 * quad + c) * kOutRowFloats + warp * 16 + lane / 4 + 8 * r] = acc[g][2 * r + c];
      }
    }
  }
  __syncthreads();
  const int64_t base = static_cast<int64_t>(blockIdx.y) * 128 + lane * 4;
  for (int t = warp; t < rows; t += kWarpsPerBlock) {
    const float4 row = *reinterpret_cast<const float4*>(out + t * kOutRowFloats + lane * 4);
    float v[4] = {row.x, row.y, row.z, row.w};
    hadamard128_warp(v);
    float* y = member.y + (row0 + t) * out_features;
    for (int j = 0; j < 4; ++j) {
      const int64_t o = base + j;
      if (o < out_features) y[o] = v[j] * __half2float(__ushort_as_half(member.svh[o]));
    }
  }
}

// The decode-once form's Ŵ: one warp per tile (the record index is the tile's), lane l's states 8l..8l+7 at
// exl3::tile_coord's places, each the fp16 sum of its codebook word's halves (as exl3::decode_state). Grid y is the
// group's member.
template <int Bits, int Codebook>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) decode_tiles(Exl3Group group, int64_t tiles,
                                                                     int64_t tiles_n) {
  constexpr int kStreamBits = 256 * Bits, kWords = 8 * Bits;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (tile >= tiles) return;
  const Exl3GroupMember& member = group.members[blockIdx.y];
  __half* out = reinterpret_cast<__half*>(member.decoded);
  const int first_bit = (8 * lane + 1) * Bits - 16 + kStreamBits;
  uint32_t raw[kLaneWords<Bits>];
  load_tile<Bits>(member.trellis + tile * kWords, lane, (first_bit >> 5) % kWords, raw);
  uint32_t w[8];
  lane_codebook_words<Bits, Codebook>(raw, lane, first_bit & 31, w);
  const int64_t n = tiles_n * 16;
  __half* corner = out + (tile / tiles_n * 16) * n + tile % tiles_n * 16;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int row = 2 * (lane % 4) + (j & 1) + ((j & 2) ? 8 : 0), col = lane / 4 + ((j & 4) ? 8 : 0);
    corner[row * n + col] = __hadd(__ushort_as_half(static_cast<unsigned short>(w[j] & 0xFFFFu)),
                                   __ushort_as_half(static_cast<unsigned short>(w[j] >> 16)));
  }
}

// The rotations' work split: one warp per (token, 128-element block of a `padded`-wide row); lane l takes elements
// base..base+3 of row t. False for the warps past the last job.
__device__ __forceinline__ bool rotation_job(int64_t padded, int64_t num_tokens, int64_t& t, int64_t& base) {
  const int64_t job = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t blocks = padded / 128;
  t = job / blocks;
  base = job % blocks * 128 + (threadIdx.x & 31u) * 4;
  return job < blocks * num_tokens;
}

// Per member (grid y): rotated_x[t] = (x[t] ⊙ suh)·H128 per block, zero past in_features, rounded to fp16.
__global__ void __launch_bounds__(32 * kWarpsPerBlock) rotate_inputs(Exl3Group group, int64_t in_features,
                                                                      int64_t in_padded) {
  const Exl3GroupMember& member = group.members[blockIdx.y];
  const float* x = member.x;
  const uint16_t* suh = member.suh;
  __half* out = reinterpret_cast<__half*>(member.rotated_x);
  int64_t t = 0, base = 0;
  if (!rotation_job(in_padded, member.num_tokens, t, base)) return;
  float v[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t i = base + j;
    v[j] = i < in_features ? x[t * in_features + i] * __half2float(__ushort_as_half(suh[i])) : 0.0f;
  }
  hadamard128_warp(v);
  for (int j = 0; j < 4; ++j) out[t * in_padded + base + j] = __float2half_rn(v[j]);
}

// Per member (grid y): y[t] = (rotated_y[t]·H128 ⊙ svh) per block, the first out_features columns.
__global__ void __launch_bounds__(32 * kWarpsPerBlock) rotate_outputs(Exl3Group group, int64_t out_features,
                                                                       int64_t out_padded) {
  const Exl3GroupMember& member = group.members[blockIdx.y];
  const float* rotated = member.rotated_y;
  const uint16_t* svh = member.svh;
  float* y = member.y;
  int64_t t = 0, base = 0;
  if (!rotation_job(out_padded, member.num_tokens, t, base)) return;
  float v[4];
  for (int j = 0; j < 4; ++j) v[j] = rotated[t * out_padded + base + j];
  hadamard128_warp(v);
  for (int j = 0; j < 4; ++j) {
    const int64_t o = base + j;
    if (o < out_features) y[t * out_features + o] = v[j] * __half2float(__ushort_as_half(svh[o]));
  }
}

template <int Bits, int Codebook, int Groups>
void launch_pass(const GemvParams& p, dim3 grid, cudaStream_t stream) {
  const size_t shared = shared_bytes(p.slice_tiles, p.num_tokens);
  // A failed opt-in shows as the launch's error.
  static_cast<void>(allow_shared(trellis_gemv<Bits, Codebook, Groups>, shared));
  // A launch may overlap the previous kernel's tail: the kernel loads its first weights before it waits for it.
  static_cast<void>(launch_dependent(trellis_gemv<Bits, Codebook, Groups>, grid, dim3(32 * kWarpsPerBlock), shared,
                                     stream, p));
}

// Without a table: passes of up to 16 tokens over one matrix. With a table: one launch, one token per slot.
template <int Bits, int Codebook>
void launch_gemv(GemvParams p, int64_t num_tokens, int64_t slots, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.out_padded / 128), static_cast<unsigned>(p.splits),
                  static_cast<unsigned>(slots));
  const float* x = p.x;
  float* y = p.y;
  for (int64_t t = 0; t < num_tokens; t += kTokensPerPass) {
    p.num_tokens = static_cast<int>(std::min<int64_t>(kTokensPerPass, num_tokens - t));
    p.x = x + t * p.in_features;
    p.y = y + t * p.out_features;
    if (p.num_tokens > kTokensPerGroup) {
      launch_pass<Bits, Codebook, 2>(p, grid, stream);
    } else {
      launch_pass<Bits, Codebook, 1>(p, grid, stream);
    }
  }
}

// Calls f(bits, codebook) with both as std::integral_constant, for the matrix's format (bits 1..8, codebook 0..2).
template <int Bits, typename F>
void with_codebook(int codebook, F& f) {
  switch (codebook) {
    case 0:
      return f(std::integral_constant<int, Bits>{}, std::integral_constant<int, 0>{});
    case 1:
      return f(std::integral_constant<int, Bits>{}, std::integral_constant<int, 1>{});
    default:
      return f(std::integral_constant<int, Bits>{}, std::integral_constant<int, 2>{});
  }
}

template <typename F, int... Bits>
void with_format_of(std::integer_sequence<int, Bits...>, int bits, int codebook, F&& f) {
  ((bits == Bits ? with_codebook<Bits>(codebook, f) : void()), ...);
}

template <typename F>
void with_format(int bits, int codebook, F&& f) {
  with_format_of(std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 7, 8>{}, bits, codebook, f);
}

unsigned warp_blocks(int64_t warps) { return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

bool launchable(const Exl3DeviceView& m) {
  return m.bits >= 1 && m.bits <= 8 && m.in_padded % 128 == 0 && m.out_padded % 128 == 0;
}

bool valid_group(const Exl3Group& group) { return group.count >= 0 && group.count <= kExl3GroupMax; }

int64_t most_tokens(const Exl3Group& group) {
  int64_t most = 0;
  for (int i = 0; i < group.count; ++i) most = std::max(most, group.members[i].num_tokens);
  return most;
}

GemvParams params_for(const Exl3DeviceView& m, const Exl3Plan& plan, const float* x, float* y, float* scratch,
                      unsigned* counters) {
  return GemvParams{.matrix = {.trellis = m.trellis, .suh = m.suh, .svh = m.svh},
                    .table = nullptr,
                    .ids = nullptr,
                    .id_group = 1,
                    .table_stride = 1,
                    .x_group = 1,
                    .x = x,
                    .swiglu = false,
                    .swiglu_limit = 0.0f,
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
  // About 48 warps per SM at batch 1, but slices of at least 32 tiles (512 rows) where k has them: shorter ones
  // cost more in partial sums and hand-offs than their parallelism gains (an H100 sweep at one token,
  // docs/benchmarks/cuda_linear.md: 4096 -> 2048 took 14.7 µs in slices of 8 tiles, 11.2 in slices of 32). With
  // dependent launches, 4096 -> 12288 runs in 21.5 µs in slices of 32 tiles (8 splits) against 26.6 in slices of 56
  // (5 splits, what 32 warps per SM chose; H100, run 22). At most 64 tiles (1024 rows: 16 tokens' doubled fp16
  // inputs fit in 66 KB).
  const int64_t tiles_k = matrix.in_padded / 16, tiles_n = matrix.out_padded / 16;
  const int64_t wanted = std::max<int64_t>(1, int64_t{sm_count} * 48 / tiles_n);
  const int64_t per_slice = (tiles_k + wanted - 1) / wanted;
  const int64_t shortest = std::min<int64_t>(32, (tiles_k + 7) / 8 * 8);
  const int64_t slice_tiles = std::clamp<int64_t>((per_slice + 7) / 8 * 8, shortest, kMaxSliceTiles);
  return Exl3Plan{.slice_tiles = slice_tiles, .splits = static_cast<int>((tiles_k + slice_tiles - 1) / slice_tiles)};
}

size_t exl3_scratch_floats(const Exl3DeviceView& matrix, const Exl3Plan& plan) {
  return static_cast<size_t>(int64_t{plan.splits} * kTokensPerPass * matrix.out_padded);
}

size_t exl3_slot_scratch_floats(const Exl3DeviceView& matrix, const Exl3Plan& plan) {
  return static_cast<size_t>(int64_t{plan.splits} * matrix.out_padded);
}

size_t exl3_counter_count(const Exl3DeviceView& matrix) { return static_cast<size_t>(matrix.out_padded / 128); }

cudaError_t exl3_linear(const Exl3DeviceView& m, const Exl3Plan& plan, const float* x, int64_t num_tokens, float* y,
                        float* scratch, unsigned* counters, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  if (!launchable(m)) return cudaErrorInvalidValue;
  const GemvParams p = params_for(m, plan, x, y, scratch, counters);
  with_format(m.bits, m.codebook, [&](auto bits, auto codebook) {
    launch_gemv<decltype(bits)::value, decltype(codebook)::value>(p, num_tokens, 1, stream);
  });
  return cudaGetLastError();
}

cudaError_t exl3_slot_linear(const Exl3DeviceView& shape, const Exl3Plan& plan, const Exl3SlotTable& table,
                             int64_t slots, const Exl3SlotInput& input, float* y, float* scratch,
                             unsigned* counters, cudaStream_t stream) {
  if (slots == 0) return cudaSuccess;
  if (!launchable(shape) || input.group < 1 || slots > 65535 || table.id_group < 1 ||
      table.stride < table.id_group) {
    return cudaErrorInvalidValue;
  }
  GemvParams p = params_for(shape, plan, input.x, y, scratch, counters);
  p.x_group = input.group;
  p.swiglu = input.swiglu;
  p.swiglu_limit = input.swiglu_limit;
  p.table = table.matrices;
  p.ids = table.ids;
  p.id_group = table.id_group;
  p.table_stride = table.stride;
  with_format(shape.bits, shape.codebook, [&](auto bits, auto codebook) {
    launch_gemv<decltype(bits)::value, decltype(codebook)::value>(p, 1, slots, stream);
  });
  return cudaGetLastError();
}

// A rotation kernel over the members' rows, `padded` wide: one warp per (token, 128-element block), grid y the
// member (warps past a member's rows return).
template <typename Kernel, typename... Args>
cudaError_t launch_rotation(const Exl3DeviceView& m, const Exl3Group& group, int64_t padded, cudaStream_t stream,
                            Kernel kernel, Args... args) {
  if (!launchable(m) || !valid_group(group)) return cudaErrorInvalidValue;
  const int64_t rows = most_tokens(group);
  if (rows == 0) return cudaSuccess;
  const dim3 grid(warp_blocks(padded / 128 * rows), static_cast<unsigned>(group.count));
  kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(group, args...);
  return cudaGetLastError();
}

cudaError_t exl3_rotate_inputs(const Exl3DeviceView& m, const Exl3Group& group, cudaStream_t stream) {
  return launch_rotation(m, group, m.in_padded, stream, rotate_inputs, m.in_features, m.in_padded);
}

cudaError_t exl3_rotate_outputs(const Exl3DeviceView& m, const Exl3Group& group, cudaStream_t stream) {
  return launch_rotation(m, group, m.out_padded, stream, rotate_outputs, m.out_features, m.out_padded);
}

cudaError_t exl3_decode_rotated(const Exl3DeviceView& m, const Exl3Group& group, cudaStream_t stream) {
  if (!launchable(m) || !valid_group(group)) return cudaErrorInvalidValue;
  if (group.count == 0) return cudaSuccess;
  const int64_t tiles_n = m.out_padded / 16, tiles = m.in_padded / 16 * tiles_n;
  const dim3 grid(warp_blocks(tiles), static_cast<unsigned>(group.count));
  with_format(m.bits, m.codebook, [&](auto bits, auto codebook) {
    decode_tiles<decltype(bits)::value, decltype(codebook)::value><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(
        group, tiles, tiles_n);
  });
  return cudaGetLastError();
}

int exl3_gemm_block_rows(const Exl3Group& group, int64_t out_padded, int sm_count, size_t max_shared) {
  // 128-row blocks where they still give every SM a block (an H100 sweep, docs/benchmarks/cuda_linear.md: 4096 ->
  // 2048 at 4,096 tokens 287 against 350 µs, at 256 tokens 81 against 57).
  int64_t long_blocks = 0;
  for (int i = 0; i < group.count; ++i) long_blocks += (group.members[i].num_tokens + 127) / 128 * (out_padded / 128);
  return long_blocks >= sm_count && gemm_shared_bytes(128) <= max_shared ? 128 : 64;
}

cudaError_t exl3_trellis_gemm(const Exl3DeviceView& m, const Exl3Group& group, int sm_count, cudaStream_t stream) {
  if (!launchable(m) || !valid_group(group)) return cudaErrorInvalidValue;
  const int64_t rows = most_tokens(group);
  if (rows == 0) return cudaSuccess;
  const int64_t block_rows = exl3_gemm_block_rows(group, m.out_padded, sm_count, max_shared_optin());
  const bool long_rows = block_rows == 128;
  const dim3 grid(static_cast<unsigned>((rows + block_rows - 1) / block_rows),
                  static_cast<unsigned>(m.out_padded / 128), static_cast<unsigned>(group.count));
  cudaError_t status = cudaSuccess;
  with_format(m.bits, m.codebook, [&](auto bits, auto codebook) {
    constexpr int kBits = decltype(bits)::value, kCodebook = decltype(codebook)::value;
    const auto kernel = long_rows ? trellis_gemm<kBits, kCodebook, 128> : trellis_gemm<kBits, kCodebook, 64>;
    const size_t shared = gemm_shared_bytes(static_cast<size_t>(block_rows));
    status = allow_shared(kernel, shared);
    if (status == cudaSuccess) {
      kernel<<<grid, 32 * kWarpsPerBlock, shared, stream>>>(group, m.in_padded, m.out_padded, m.out_features);
    }
  });
  return status == cudaSuccess ? cudaGetLastError() : status;
}

}  // namespace kestrel::cuda

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/dynamic_shared.cuh"
#include "backend/cuda/kda_kernels.h"
#include "backend/cuda/mma.cuh"

namespace kestrel::cuda {

namespace {

constexpr int kElementwiseThreads = 256;
constexpr int kMaxConvKernel = 8;
// Value columns of the state one warp owns: a token's step is a chain of warp reductions per column, latency-bound
// with few warps a scheduler, so more warps with fewer columns each finish sooner (4 rather than 8).
constexpr int kColumnsPerWarp = 4;
constexpr int kWarpsPerBlock = 8;  // 32 columns per block: a 64 x 128 step is 256 blocks of 8 warps, over every SM

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Tokens per thread of the prefill convolution: a thread walks its tile with the window in registers, and the
// tiles of a channel run side by side (one thread per channel walking a whole prompt kept ~128 warps busy).
constexpr int kConvTokensPerThread = 16;

// Input s of channel c in the conv's time line: x's token s, or for s < 0 the conv state's slot history + s (the
// inputs before this call).
__device__ __forceinline__ float conv_input(const float* x, const float* conv_state, int64_t channels, int64_t c,
                                            int history, int64_t s) {
  return s >= 0 ? x[s * channels + c] : conv_state[(history + s) * channels + c];
}

// Channel c over tokens [first, first + count), with the window before `first` from x or the conv state: the loops
// run to the maximum kernel with guards, so that every array index is a compile-time constant. Token t's output goes
// to y[(t - first) * y_stride]. With update_state (the call's last tokens, and no other thread reading the state) the
// state becomes the last kernel-1 inputs.
__device__ __forceinline__ void conv_channel(const float* x, int64_t first, int64_t count, int64_t channels,
                                             int64_t c, int kernel, const float* weight, float* conv_state, float* y,
                                             int64_t y_stride, bool update_state) {
  const int history = kernel - 1;
  const float* w = weight + c * kernel;
  float w_history[kMaxConvKernel - 1];
  float window[kMaxConvKernel] = {};  // the previous inputs, oldest first (one spare slot keeps the shift in bounds)
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    w_history[j] = j < history ? w[j] : 0.0f;
    window[j] = j < history ? conv_input(x, conv_state, channels, c, history, first - history + j) : 0.0f;
  }
  const float w_current = w[history];
  for (int64_t t = first; t < first + count; ++t) {
    const float xt = x[t * channels + c];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j) {
      if (j < history) sum += w_history[j] * window[j];
    }
    sum += w_current * xt;
    y[(t - first) * y_stride] = sum / (1.0f + expf(-sum));
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j) {
      if (j + 1 < history) {
        window[j] = window[j + 1];
      } else if (j + 1 == history) {
        window[j] = xt;
      }
    }
  }
  if (!update_state) return;
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    if (j < history) conv_state[j * channels + c] = window[j];
  }
}

// Grid (channel blocks, token tiles of `tile` tokens): thread (c, tile) convolves its tile; a call of one tile
// updates the state too.
__global__ void __launch_bounds__(kElementwiseThreads)
    causal_conv_silu_kernel(const float* x, int64_t num_tokens, int64_t channels, int kernel, const float* weight,
                            int64_t tile, float* conv_state, float* y) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * tile;
  if (c >= channels) return;
  const int64_t count = min(tile, num_tokens - first);
  conv_channel(x, first, count, channels, c, kernel, weight, conv_state, y + first * channels + c, channels,
               gridDim.y == 1);
}

// After a call of several tiles (whose first read the old state): the state becomes the last kernel-1 inputs, which
// for a call shorter than the history still include old state slots (all read before any is written).
__global__ void __launch_bounds__(kElementwiseThreads)
    conv_state_update_kernel(const float* x, int64_t num_tokens, int64_t channels, int kernel, float* conv_state) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int history = kernel - 1;
  float last[kMaxConvKernel - 1];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    last[j] = j < history ? conv_input(x, conv_state, channels, c, history, num_tokens - history + j) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    if (j < history) conv_state[j * channels + c] = last[j];
  }
}

// The forget gate of one channel whose log-rate is a_log and bias dt_bias (kda_gate).
__device__ __forceinline__ float forget_gate(float f, float a_log, float dt_bias, bool bounded, float lower_bound) {
  const float rate = expf(a_log);
  const float x = f + dt_bias;
  if (bounded) return lower_bound / (1.0f + expf(-(rate * x)));
  const float softplus = x > 20.0f ? x : logf(1.0f + expf(x));  // as the CPU (transformers' guard)
  return -rate * softplus;
}

__global__ void __launch_bounds__(kElementwiseThreads)
    kda_gate_kernel(const float* f, int64_t n, int64_t num_heads, int64_t head_dim, const float* a_log,
                    const float* dt_bias, bool bounded, float lower_bound, float* g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t channel = i % (num_heads * head_dim);  // h * head_dim + c
  g[i] = forget_gate(f[i], a_log[channel / head_dim], dt_bias[channel], bounded, lower_bound);
}

// Key rows per lane: lane l holds rows l + 32 i below D (a head_dim below 32 leaves lanes idle; their rows read as
// zero keys and queries, which change nothing).
template <int D>
__host__ __device__ constexpr int rows_per_lane() {
  return (D + 31) / 32;
}

// One token's inputs as one lane holds them: q, k and g of its key rows, v of the warp's columns.
template <int D>
struct TokenInputs {
  float q[rows_per_lane<D>()], k[rows_per_lane<D>()], g[rows_per_lane<D>()], v[kColumnsPerWarp], beta;
};

// Token t's q, k and g of the lane's key rows (v and beta left zero: the caller takes them per column).
template <int D>
__device__ __forceinline__ TokenInputs<D> load_key_rows(const KdaDeviceArgs& a, int64_t t, int64_t h, int lane) {
  TokenInputs<D> in{};
  const int64_t row = (t * a.num_heads + h) * D;
#pragma unroll
  for (int i = 0; i < rows_per_lane<D>(); ++i) {
    const bool held = lane + 32 * i < D;
    in.q[i] = held ? a.q[row + lane + 32 * i] : 0.0f;
    in.k[i] = held ? a.k[row + lane + 32 * i] : 0.0f;
    in.g[i] = held ? a.g[row + lane + 32 * i] : 0.0f;
  }
  return in;
}

// The warp's state columns [column0, column0 + 4) of a head: lane l holds S[l + 32 i][column0 + j].
template <int D>
struct StateColumns {
  float S[rows_per_lane<D>()][kColumnsPerWarp];
};

template <int D>
__device__ __forceinline__ StateColumns<D> load_columns(const float* state, int column0, int lane) {
  StateColumns<D> c{};
#pragma unroll
  for (int i = 0; i < rows_per_lane<D>(); ++i) {
    if (lane + 32 * i >= D) continue;
    const float4 p = *reinterpret_cast<const float4*>(state + (lane + 32 * i) * D + column0);
    c.S[i][0] = p.x, c.S[i][1] = p.y, c.S[i][2] = p.z, c.S[i][3] = p.w;
  }
  return c;
}

template <int D>
__device__ __forceinline__ void store_columns(const StateColumns<D>& c, float* state, int column0, int lane) {
#pragma unroll
  for (int i = 0; i < rows_per_lane<D>(); ++i) {
    if (lane + 32 * i >= D) continue;
    *reinterpret_cast<float4*>(state + (lane + 32 * i) * D + column0) =
        make_float4(c.S[i][0], c.S[i][1], c.S[i][2], c.S[i][3]);
  }
}

// Token inputs normalised as the delta rule takes them: q / |q| * D^-1/2, k / |k| (eps 1e-6 under the roots), and
// the decay exp(g), for the lane's key rows (the norms are warp reductions over them). Returns k . q, which the
// delta rule takes so that S^T q need not wait for the state's update (delta_rule_normalised).
template <int D>
__device__ __forceinline__ float normalise_token(const TokenInputs<D>& in, float (&q)[rows_per_lane<D>()],
                                                 float (&k)[rows_per_lane<D>()], float (&decay)[rows_per_lane<D>()]) {
  constexpr int kRows = rows_per_lane<D>();
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float qq = 0.0f, kk = 0.0f, kq = 0.0f;  // the three sums side by side, so that k . q adds no reduction to the chain
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    qq += in.q[i] * in.q[i];
    kk += in.k[i] * in.k[i];
    kq += in.k[i] * in.q[i];
  }
  const float q_norm = sqrtf(warp_sum(qq) + 1e-6f), k_norm = sqrtf(warp_sum(kk) + 1e-6f);
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    q[i] = in.q[i] / q_norm * scale;
    k[i] = in.k[i] / k_norm;
    decay[i] = expf(in.g[i]);
  }
  return warp_sum(kq) / q_norm * scale / k_norm;
}

// Sums of the warp's 4 column values v[0..3] over its 32 lanes, as a reduce-scatter: two exchange levels leave lane
// l holding a partial sum of column l / 8 only, three more complete it (11 shuffles and adds against 20 for four
// butterflies). Returns column (lane / 8)'s sum.
__device__ __forceinline__ float column_sums_scattered(const float (&v)[kColumnsPerWarp], int lane) {
  static_assert(kColumnsPerWarp == 4, "the reduce-scatter splits the warp's lanes in four");
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const bool upper = (lane & 16) != 0, odd = (lane & 8) != 0;
  // Level 1: the lower half keeps columns 0 and 1, the upper half 2 and 3.
  const float keep0 = (upper ? v[2] : v[0]) + __shfl_xor_sync(kAll, upper ? v[0] : v[2], 16);
  const float keep1 = (upper ? v[3] : v[1]) + __shfl_xor_sync(kAll, upper ? v[1] : v[3], 16);
  // Level 2: lanes with bit 3 set keep the odd column.
  float sum = (odd ? keep1 : keep0) + __shfl_xor_sync(kAll, odd ? keep0 : keep1, 8);
  sum += __shfl_xor_sync(kAll, sum, 4);
  sum += __shfl_xor_sync(kAll, sum, 2);
  sum += __shfl_xor_sync(kAll, sum, 1);
  return sum;
}

// One token of the delta rule on the warp's columns from normalised inputs, with kq = k . q. S^T k and S^T q are
// warp reductions over the key rows, so warps never meet; lanes 8c .. 8c + 7 end holding column column0 + c of the
// token's output (the return value). The output is (S_d + k delta^T)^T q = S_d^T q + (k . q) delta, S_d the decayed
// state: both reductions of S_d run side by side, so one reduction's latency, not two, lies on the chain from token
// to token.
template <int D>
__device__ __forceinline__ float delta_rule_normalised(const float (&q)[rows_per_lane<D>()],
                                                       const float (&k)[rows_per_lane<D>()],
                                                       const float (&decay)[rows_per_lane<D>()], float kq,
                                                       const float (&v)[kColumnsPerWarp], float beta,
                                                       StateColumns<D>& state) {
  constexpr int kRows = rows_per_lane<D>();
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = static_cast<int>(threadIdx.x & 31u), column = lane / 8;
  float memory[kColumnsPerWarp] = {}, recalled[kColumnsPerWarp] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kColumnsPerWarp; ++j) {
      state.S[i][j] *= decay[i];
      memory[j] += state.S[i][j] * k[i];
      recalled[j] += state.S[i][j] * q[i];
    }
  }
  const float own_memory = column_sums_scattered(memory, lane), own_recalled = column_sums_scattered(recalled, lane);
  const float own_v = column == 0 ? v[0] : column == 1 ? v[1] : column == 2 ? v[2] : v[3];
  const float own_delta = (own_v - own_memory) * beta;
#pragma unroll
  for (int j = 0; j < kColumnsPerWarp; ++j) {
    const float delta = __shfl_sync(kAll, own_delta, 8 * j);
#pragma unroll
    for (int i = 0; i < kRows; ++i) state.S[i][j] += k[i] * delta;
  }
  return own_recalled + kq * own_delta;
}

template <int D>
__device__ __forceinline__ float delta_rule_token(const TokenInputs<D>& in, StateColumns<D>& state) {
  constexpr int kRows = rows_per_lane<D>();
  float q[kRows], k[kRows], decay[kRows];
  const float kq = normalise_token<D>(in, q, k, decay);
  return delta_rule_normalised<D>(q, k, decay, kq, in.v, in.beta, state);
}

// Tokens a block normalises together before stepping through them: every warp of a block works on the same head,
// so the norms of q and k and exp(g) are computed once per block and token (by one warp) rather than by each of
// its 8 warps, which left the recurrence bound on issuing those instructions. 32 at head_dim 128 take 104 KiB of
// shared memory; where a block may not have that (99 KiB on sm_86, sm_89 and the 12.x parts), chunks of 16.
constexpr int kRecurrentChunk = 32;
constexpr int kSmallRecurrentChunk = 16;

// The lane's key rows lane + 32 i of a row of D values in shared memory; rows past D (a head_dim below 32) read
// `fill`.
template <int D>
__device__ __forceinline__ void lane_key_rows(const float (&row)[D], int lane, float fill,
                                              float (&out)[rows_per_lane<D>()]) {
#pragma unroll
  for (int i = 0; i < rows_per_lane<D>(); ++i) out[i] = lane + 32 * i < D ? row[lane + 32 * i] : fill;
}

// A chunk's normalised inputs as the block shares them: q, k and the decay per token and key row, v of the block's
// 32 columns, beta and k . q.
template <int D, int Chunk>
struct RecurrentChunk {
  float q[Chunk][D], k[Chunk][D], decay[Chunk][D];
  float v[Chunk][kColumnsPerWarp * kWarpsPerBlock], beta[Chunk], kq[Chunk];
};

// A chunk's inputs as loaded, before normalising: q, k and g per token and key row, v of the block's 32 columns.
template <int D, int Chunk>
struct RecurrentLoads {
  float q[Chunk][D], k[Chunk][D], g[Chunk][D];
  float v[Chunk][kColumnsPerWarp * kWarpsPerBlock];
};

template <int D, int Chunk>
constexpr size_t recurrent_shared_bytes() {
  return sizeof(RecurrentChunk<D, Chunk>) + sizeof(RecurrentLoads<D, Chunk>);
}

// Head blockIdx.x; each warp owns value columns [column0, column0 + 4) and every key row, in registers for the
// whole call. Chunk by chunk, warp w normalises tokens w, w + 8, ... into shared memory, then every warp steps
// through the chunk's tokens on its columns.
template <int D, int Chunk>
__global__ void __launch_bounds__(32 * kWarpsPerBlock, 2) kda_recurrent_kernel(KdaDeviceArgs a) {
  constexpr int kRows = rows_per_lane<D>(), kBlockColumns = kColumnsPerWarp * kWarpsPerBlock;
  extern __shared__ __align__(16) unsigned char chunk_bytes[];
  auto& chunk = *reinterpret_cast<RecurrentChunk<D, Chunk>*>(chunk_bytes);
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t h = blockIdx.x;
  const int block_column0 = static_cast<int>(blockIdx.y) * kBlockColumns, column0 = block_column0 + warp * kColumnsPerWarp;
  const bool owns_columns = column0 < D;  // a head narrower than the block's columns: whole warps idle
  float* state = a.state + h * D * D;  // S[c * D + v]
  StateColumns<D> columns{};
  if (owns_columns) columns = load_columns<D>(state, column0, lane);
  // Warp w normalises tokens w, w + 8, ... of each chunk. Their inputs are copied into shared memory (cp.async;
  // beta into a register) while the block steps through the chunk before, so that a chunk's start waits on no load.
  constexpr int kTokensPerWarp = Chunk / kWarpsPerBlock;
  auto& loads = *reinterpret_cast<RecurrentLoads<D, Chunk>*>(chunk_bytes + sizeof(RecurrentChunk<D, Chunk>));
  float loaded_beta[kTokensPerWarp];
  const auto load_chunk = [&](int64_t c0) {
#pragma unroll
    for (int n = 0; n < kTokensPerWarp; ++n) {
      const int j = warp + n * kWarpsPerBlock;
      const int64_t t = c0 + j, row = (t * a.num_heads + h) * D;
      if (t >= a.num_tokens) continue;
      for (int piece = lane; piece < D / 4; piece += 32) {
        copy_async_16(&loads.q[j][4 * piece], a.q + row + 4 * piece, true);
        copy_async_16(&loads.k[j][4 * piece], a.k + row + 4 * piece, true);
        copy_async_16(&loads.g[j][4 * piece], a.g + row + 4 * piece, true);
      }
      if (lane < kBlockColumns / 4 && block_column0 + 4 * lane < D) {
        copy_async_16(&loads.v[j][4 * lane], a.v + row + block_column0 + 4 * lane, true);
      }
      loaded_beta[n] = a.beta[t * a.num_heads + h];
    }
    copy_async_commit();
  };
  load_chunk(0);
  for (int64_t c0 = 0; c0 < a.num_tokens; c0 += Chunk) {
    const int count = static_cast<int>(min(static_cast<int64_t>(Chunk), a.num_tokens - c0));
    copy_async_wait_all();
    __syncwarp();  // the warp's tokens were copied by all its lanes
#pragma unroll
    for (int n = 0; n < kTokensPerWarp; ++n) {
      const int j = warp + n * kWarpsPerBlock;
      if (j >= count) continue;
      TokenInputs<D> in{};
      lane_key_rows<D>(loads.q[j], lane, 0.0f, in.q);
      lane_key_rows<D>(loads.k[j], lane, 0.0f, in.k);
      lane_key_rows<D>(loads.g[j], lane, 0.0f, in.g);
      float q[kRows], k[kRows], decay[kRows];
      const float kq = normalise_token<D>(in, q, k, decay);
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (lane + 32 * i >= D) continue;
        chunk.q[j][lane + 32 * i] = q[i];
        chunk.k[j][lane + 32 * i] = k[i];
        chunk.decay[j][lane + 32 * i] = decay[i];
      }
      if (block_column0 + lane < D) chunk.v[j][lane] = loads.v[j][lane];
      if (lane == 0) {
        chunk.beta[j] = loaded_beta[n];
        chunk.kq[j] = kq;
      }
    }
    __syncthreads();  // the chunk normalised, and every warp done with `loads`
    if (c0 + Chunk < a.num_tokens) load_chunk(c0 + Chunk);
    if (owns_columns) {
      // Token j + 1's inputs are read from shared memory while token j steps, off the chain from token to token.
      struct Token {
        float q[kRows], k[kRows], decay[kRows], v[kColumnsPerWarp], kq, beta;
      };
      const auto read = [&](int j) {
        Token token;
        lane_key_rows<D>(chunk.q[j], lane, 0.0f, token.q);
        lane_key_rows<D>(chunk.k[j], lane, 0.0f, token.k);
        lane_key_rows<D>(chunk.decay[j], lane, 1.0f, token.decay);
#pragma unroll
        for (int c = 0; c < kColumnsPerWarp; ++c) token.v[c] = chunk.v[j][warp * kColumnsPerWarp + c];
        token.kq = chunk.kq[j];
        token.beta = chunk.beta[j];
        return token;
      };
      Token next = read(0);
      for (int j = 0; j < count; ++j) {
        const Token token = next;
        if (j + 1 < count) next = read(j + 1);
        const float out =
            delta_rule_normalised<D>(token.q, token.k, token.decay, token.kq, token.v, token.beta, columns);
        if (lane % 8 == 0) a.out[((c0 + j) * a.num_heads + h) * D + column0 + lane / 8] = out;
      }
    }
    __syncthreads();  // the chunk read by every warp before the next one is written
  }
  if (owns_columns) store_columns<D>(columns, state, column0, lane);
}

// A decode step of the KDA block for head blockIdx.x of sequence blockIdx.y (KdaDecodeDeviceArgs): D / 4 warps, so
// the block holds the head's whole state and every intermediate stays in shared memory. Its first 3 D threads run
// the conv of one q, k or v channel each (updating that channel's conv state, which no other block touches); the
// warps then take the head's D rows of f_b and of g_b (a row a warp at a time: lane l sums inputs l, l + 32, ...,
// then the warp's butterfly), the token's step on their columns, and the block norms the head's output. The head's
// rows of f_b and g_b (two D x D bf16 blocks, kda_decode_shared_bytes) are copied into shared memory before the
// wait, so that their loads overlap the projection before this kernel rather than lie on the step's path.
template <int D>
constexpr size_t kda_decode_shared_bytes() {
  return 2 * size_t{D} * D * sizeof(__nv_bfloat16);
}

template <int D>
__global__ void __launch_bounds__(8 * D) kda_decode_kernel(KdaDecodeDeviceArgs a, DecodeStates states) {
  __shared__ float qkv[3 * D], lows[2 * D], gates[D], gate_bias[D], o_norm[D], out_gate[D], attended[D], reduce[32];
  __shared__ float a_log;
  extern __shared__ uint4 gate_rows_vectors[];
  const auto* gate_rows = reinterpret_cast<const __nv_bfloat16*>(gate_rows_vectors);  // [f_b rows; g_b rows]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, column0 = (tid / 32) * kColumnsPerWarp;
  const int64_t h = blockIdx.x, s = blockIdx.y, C = a.num_heads * D, row = s * C + h * D;
  // The weights, then the state: it was last written by this layer's launch of the previous step, many launches
  // back, and every launch before the previous one has finished when a dependent launch starts.
  constexpr int kBlockVectors = D * D * 2 / 16;  // 16-byte vectors in one D x D bf16 block
  for (int i = tid; i < 2 * kBlockVectors; i += 8 * D) {
    const bool forget = i < kBlockVectors;
    const auto* source = static_cast<const uint4*>(forget ? a.f_b : a.g_b) + h * kBlockVectors;
    copy_async_16(gate_rows_vectors + i, source + (forget ? i : i - kBlockVectors), true);
  }
  copy_async_commit();
  float* state = states.recurrent[s] + h * D * D;
  StateColumns<D> columns = load_columns<D>(state, column0, lane);
  // The constants read after the wait: the conv's weights and state slots (prefetched), the gates' and the norm's.
  if (tid == 0) a_log = a.a_log[h];
  if (tid < D) {
    gate_bias[tid] = a.dt_bias[h * D + tid];
    o_norm[tid] = a.o_norm[tid];
  }
  if (tid < 3 * D) {
    const int part = tid / D, c = tid % D;
    const float* weight = part == 0 ? a.q_conv : part == 1 ? a.k_conv : a.v_conv;
    prefetch_line_to_l2(weight + (h * D + c) * a.conv_kernel);
    const float* conv_state = states.conv[s] + part * (a.conv_kernel - 1) * C + h * D + c;
    for (int j = 0; j + 1 < a.conv_kernel; ++j) prefetch_line_to_l2(conv_state + j * C);
  }
  wait_for_previous_grid();

  if (tid < 3 * D) {
    const int part = tid / D, c = tid % D;  // q, k, v; the channel within the head
    const float* x = part == 0 ? a.q_in : part == 1 ? a.k_in : a.v_in;
    const float* weight = part == 0 ? a.q_conv : part == 1 ? a.k_conv : a.v_conv;
    float* conv_state = states.conv[s] + part * (a.conv_kernel - 1) * C;
    conv_channel(x + s * C, 0, 1, C, h * D + c, a.conv_kernel, weight, conv_state, &qkv[tid], 0, true);
  }
  if (tid < 2 * D) {
    const float low = tid < D ? a.f_low[s * D + tid] : a.gate_low[s * D + tid - D];
    lows[tid] = a.round_lows ? __bfloat162float(__float2bfloat16_rn(low)) : low;
  }
  copy_async_wait_all();
  __syncthreads();

  constexpr int kWarps = D / kColumnsPerWarp;
  const int warp = tid / 32;
  for (int r = warp; r < 2 * D; r += kWarps) {
    const bool forget = r < D;
    const int c = forget ? r : r - D;
    const __nv_bfloat16* weight = gate_rows + r * D;  // row c of f_b, or of g_b for r >= D
    const float* low = lows + (forget ? 0 : D);
    float sum = 0.0f;
#pragma unroll
    for (int i = lane; i < D; i += 32) sum += __bfloat162float(weight[i]) * low[i];
    sum = warp_sum(sum);
    if (lane == 0) {
      if (forget) {
        gates[c] = forget_gate(sum, a_log, gate_bias[c], a.bounded, a.lower_bound);
      } else {
        out_gate[c] = sum;
      }
    }
  }
  __syncthreads();

  TokenInputs<D> in;
#pragma unroll
  for (int i = 0; i < rows_per_lane<D>(); ++i) {
    const bool held = lane + 32 * i < D;
    in.q[i] = held ? qkv[lane + 32 * i] : 0.0f;
    in.k[i] = held ? qkv[D + lane + 32 * i] : 0.0f;
    in.g[i] = held ? gates[lane + 32 * i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kColumnsPerWarp; ++j) in.v[j] = qkv[2 * D + column0 + j];
  in.beta = 1.0f / (1.0f + expf(-a.beta[s * a.num_heads + h]));
  const float out = delta_rule_token<D>(in, columns);
  if (lane % 8 == 0) attended[column0 + lane / 8] = out;
  store_columns<D>(columns, state, column0, lane);

  __syncthreads();  // every warp's columns of `attended` written
  const float value = tid < D ? attended[tid] : 0.0f;
  const float inv_rms = 1.0f / sqrtf(block_sum(value * value, reduce) / static_cast<float>(D) + a.eps);
  if (tid < D) a.out[row + tid] = o_norm[tid] * (value * inv_rms) / (1.0f + expf(-out_gate[tid]));
}

}  // namespace

cudaError_t causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel,
                             const float* weight, float* conv_state, float* y, cudaStream_t stream) {
  if (kernel < 1 || kernel > kMaxConvKernel) return cudaErrorInvalidValue;
  if (num_tokens == 0 || channels == 0) return cudaSuccess;
  constexpr int64_t kMaxTiles = 65535;  // the grid's y limit: longer calls take longer tiles
  const int64_t tile = std::max<int64_t>(kConvTokensPerThread, (num_tokens + kMaxTiles - 1) / kMaxTiles);
  const auto tiles = static_cast<unsigned>((num_tokens + tile - 1) / tile);
  const dim3 grid(blocks_for(channels, kElementwiseThreads), tiles);
  causal_conv_silu_kernel<<<grid, kElementwiseThreads, 0, stream>>>(x, num_tokens, channels, static_cast<int>(kernel),
                                                                     weight, tile, conv_state, y);
  if (tiles > 1) {
    conv_state_update_kernel<<<blocks_for(channels, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
        x, num_tokens, channels, static_cast<int>(kernel), conv_state);
  }
  return cudaGetLastError();
}

cudaError_t kda_gate(const float* f, int64_t num_tokens, int64_t num_heads, int64_t head_dim, const float* a_log,
                     const float* dt_bias, const float* lower_bound, float* g, cudaStream_t stream) {
  const int64_t n = num_tokens * num_heads * head_dim;
  if (n == 0) return cudaSuccess;
  kda_gate_kernel<<<blocks_for(n, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
      f, n, num_heads, head_dim, a_log, dt_bias, lower_bound != nullptr, lower_bound ? *lower_bound : 0.0f, g);
  return cudaGetLastError();
}

namespace {

bool head_dim_ok(int64_t D) { return D == 16 || D == 32 || D == 64 || D == 128; }

bool aligned_16(const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int D>
cudaError_t launch_decode_kernel(dim3 grid, const KdaDecodeDeviceArgs& args, const DecodeStates& states,
                                 cudaStream_t stream) {
  const size_t shared = kda_decode_shared_bytes<D>();
  if (const cudaError_t status = allow_shared(kda_decode_kernel<D>, shared); status != cudaSuccess) return status;
  return launch_dependent(kda_decode_kernel<D>, grid, dim3(8 * D), shared, stream, args, states);
}

}  // namespace

cudaError_t kda_recurrent(const KdaDeviceArgs& args, cudaStream_t stream) {
  return kda_recurrent(args, stream, max_shared_optin());
}

cudaError_t kda_recurrent(const KdaDeviceArgs& args, cudaStream_t stream, size_t max_shared) {
  // The rows of q, k, g and v are copied 16 bytes at a time.
  const bool aligned = aligned_16(args.state) && aligned_16(args.q) && aligned_16(args.k) &&
                       aligned_16(args.g) && aligned_16(args.v);
  if (!head_dim_ok(args.head_dim) || !aligned) return cudaErrorInvalidValue;
  if (args.num_tokens == 0 || args.num_heads == 0) return cudaSuccess;
  constexpr int64_t kBlockColumns = kColumnsPerWarp * kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned>(args.num_heads),
                  static_cast<unsigned>((args.head_dim + kBlockColumns - 1) / kBlockColumns));
  const auto launch = [&](auto kernel, size_t shared) {
    if (const cudaError_t status = allow_shared(kernel, shared); status != cudaSuccess) return status;
    kernel<<<grid, 32 * kWarpsPerBlock, shared, stream>>>(args);
    return cudaGetLastError();
  };
  // Chunks of 32 tokens where their shared memory fits, else of 16.
  const auto launch_dim = [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    constexpr size_t kLarge = recurrent_shared_bytes<D, kRecurrentChunk>();
    if (kLarge <= max_shared) return launch(kda_recurrent_kernel<D, kRecurrentChunk>, kLarge);
    return launch(kda_recurrent_kernel<D, kSmallRecurrentChunk>, recurrent_shared_bytes<D, kSmallRecurrentChunk>());
  };
  switch (args.head_dim) {
    case 16: return launch_dim(std::integral_constant<int, 16>{});
    case 32: return launch_dim(std::integral_constant<int, 32>{});
    case 64: return launch_dim(std::integral_constant<int, 64>{});
    default: return launch_dim(std::integral_constant<int, 128>{});
  }
}

cudaError_t kda_decode_steps(const KdaDecodeDeviceArgs& args, float* const* conv_states, float* const* states,
                             cudaStream_t stream) {
  if (!head_dim_ok(args.head_dim) || args.conv_kernel < 1 || args.conv_kernel > kMaxConvKernel) {
    return cudaErrorInvalidValue;
  }
  for (int64_t s = 0; s < args.num_sequences; ++s) {
    if (!aligned_16(states[s])) return cudaErrorInvalidValue;
  }
  if (args.num_heads == 0) return cudaSuccess;
  for (int64_t first = 0; first < args.num_sequences; first += kMaxStepSequences) {
    const int64_t count = std::min<int64_t>(kMaxStepSequences, args.num_sequences - first);
    DecodeStates table{};
    for (int64_t s = 0; s < count; ++s) {
      table.conv[s] = conv_states[first + s];
      table.recurrent[s] = states[first + s];
    }
    KdaDecodeDeviceArgs part = args;
    const int64_t width = args.num_heads * args.head_dim;
    part.q_in += first * width;
    part.k_in += first * width;
    part.v_in += first * width;
    part.f_low += first * args.head_dim;
    part.beta += first * args.num_heads;
    part.gate_low += first * args.head_dim;
    part.out += first * width;
    const dim3 grid(static_cast<unsigned>(args.num_heads), static_cast<unsigned>(count));
    // Dependent launch: the block's weight and state loads overlap the projection before it.
    cudaError_t status = cudaSuccess;
    switch (args.head_dim) {
      case 16: status = launch_decode_kernel<16>(grid, part, table, stream); break;
      case 32: status = launch_decode_kernel<32>(grid, part, table, stream); break;
      case 64: status = launch_decode_kernel<64>(grid, part, table, stream); break;
      default: status = launch_decode_kernel<128>(grid, part, table, stream); break;
    }
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t kda_chunked(const KdaDeviceArgs& args, int64_t chunk_size, cudaStream_t stream) {
  if (chunk_size < 1) return cudaErrorInvalidValue;
  return kda_recurrent(args, stream);
}

}  // namespace kestrel::cuda

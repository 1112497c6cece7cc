#include <algorithm>
#include <cstdint>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/kda_kernels.h"

namespace kestrel::cuda {

namespace {

constexpr int kElementwiseThreads = 256;
constexpr int kMaxConvKernel = 8;
// Value columns of the state one warp owns: a token's step is a chain of warp reductions per column, latency-bound
// with few warps a scheduler, so more warps with fewer columns each finish sooner (4 rather than 8).
constexpr int kColumnsPerWarp = 4;
constexpr int kWarpsPerBlock = 8;  // 32 columns per block: a 64 x 128 step is 256 blocks of 8 warps, over every SM

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// One thread per channel walks the tokens with the last kernel-1 inputs in registers: the loops run to the maximum
// kernel with guards, so that every array index is a compile-time constant.
__device__ __forceinline__ void conv_channel(const float* x, int64_t num_tokens, int64_t channels, int64_t c,
                                             int kernel, const float* weight, float* conv_state, float* y) {
  const int history = kernel - 1;
  const float* w = weight + c * kernel;
  float w_history[kMaxConvKernel - 1];
  float window[kMaxConvKernel] = {};  // the previous inputs, oldest first (one spare slot keeps the shift in bounds)
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    w_history[j] = j < history ? w[j] : 0.0f;
    window[j] = j < history ? conv_state[j * channels + c] : 0.0f;
  }
  const float w_current = w[history];
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float xt = x[t * channels + c];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j) {
      if (j < history) sum += w_history[j] * window[j];
    }
    sum += w_current * xt;
    y[t * channels + c] = sum / (1.0f + expf(-sum));
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j) {
      if (j + 1 < history) {
        window[j] = window[j + 1];
      } else if (j + 1 == history) {
        window[j] = xt;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel - 1; ++j) {
    if (j < history) conv_state[j * channels + c] = window[j];
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    causal_conv_silu_kernel(const float* x, int64_t num_tokens, int64_t channels, int kernel, const float* weight,
                            float* conv_state, float* y) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < channels) conv_channel(x, num_tokens, channels, c, kernel, weight, conv_state, y);
}

// Sequence blockIdx.y of a batched step: its row of x and y, its conv state.
__global__ void __launch_bounds__(kElementwiseThreads)
    causal_conv_silu_steps_kernel(const float* x, int64_t channels, int kernel, const float* weight, StepStates states,
                                  float* y) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * channels;
  if (c < channels) conv_channel(x + row, 1, channels, c, kernel, weight, states.at[blockIdx.y], y + row);
}

__global__ void __launch_bounds__(kElementwiseThreads)
    kda_gate_kernel(const float* f, int64_t n, int64_t num_heads, int64_t head_dim, const float* a_log,
                    const float* dt_bias, bool bounded, float lower_bound, float* g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t channel = i % (num_heads * head_dim);  // h * head_dim + c
  const float rate = expf(a_log[channel / head_dim]);
  const float x = f[i] + dt_bias[channel];
  if (bounded) {
    g[i] = lower_bound / (1.0f + expf(-(rate * x)));
  } else {
    const float softplus = x > 20.0f ? x : logf(1.0f + expf(x));  // as the CPU (transformers' guard)
    g[i] = -rate * softplus;
  }
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

template <int D>
__device__ __forceinline__ TokenInputs<D> load_token(const KdaDeviceArgs& a, int64_t t, int64_t h, int column0,
                                                     int lane) {
  TokenInputs<D> in;
  const int64_t row = (t * a.num_heads + h) * D;
#pragma unroll
  for (int i = 0; i < rows_per_lane<D>(); ++i) {
    const bool held = lane + 32 * i < D;
    in.q[i] = held ? a.q[row + lane + 32 * i] : 0.0f;
    in.k[i] = held ? a.k[row + lane + 32 * i] : 0.0f;
    in.g[i] = held ? a.g[row + lane + 32 * i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kColumnsPerWarp; ++j) in.v[j] = a.v[row + column0 + j];
  in.beta = a.beta[t * a.num_heads + h];
  return in;
}

// Head blockIdx.x; each warp owns value columns [column0, column0 + 4) and every key row, so S^T k and S^T q are
// warp reductions over the key rows and the warps never meet. Lane l holds S[l + 32 i][column0 + j] in registers for
// the whole call; the next token's inputs are loaded while the current one is computed.
// The call's tensors from row (token) `first` on.
__host__ __device__ __forceinline__ KdaDeviceArgs from_row(KdaDeviceArgs a, int64_t first) {
  const int64_t width = a.num_heads * a.head_dim;
  a.q += first * width;
  a.k += first * width;
  a.v += first * width;
  a.g += first * width;
  a.beta += first * a.num_heads;
  a.out += first * width;
  return a;
}

// With `steps`, block z runs sequence z of a batched step: one token, row z of the inputs and outputs, states.at[z].
template <int D>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) kda_recurrent_kernel(KdaDeviceArgs a, bool steps,
                                                                           StepStates states) {
  if (steps) {
    a = from_row(a, blockIdx.z);
    a.num_tokens = 1;
    a.state = states.at[blockIdx.z];
  }
  constexpr int kRows = rows_per_lane<D>();
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t h = blockIdx.x;
  const int column0 = (static_cast<int>(blockIdx.y) * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32)) *
                      kColumnsPerWarp;
  if (column0 >= D) return;  // a head narrower than the block's columns: whole warps idle
  float* state = a.state + h * D * D;  // S[c * D + v]
  float S[kRows][kColumnsPerWarp] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    if (lane + 32 * i >= D) continue;
    const float4 p = *reinterpret_cast<const float4*>(state + (lane + 32 * i) * D + column0);
    S[i][0] = p.x, S[i][1] = p.y, S[i][2] = p.z, S[i][3] = p.w;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  TokenInputs<D> next = load_token<D>(a, 0, h, column0, lane);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const TokenInputs<D> in = next;
    if (t + 1 < a.num_tokens) next = load_token<D>(a, t + 1, h, column0, lane);
    float qq = 0.0f, kk = 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      qq += in.q[i] * in.q[i];
      kk += in.k[i] * in.k[i];
    }
    const float q_norm = sqrtf(warp_sum(qq) + 1e-6f), k_norm = sqrtf(warp_sum(kk) + 1e-6f);
    float q[kRows], k[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      q[i] = in.q[i] / q_norm * scale;
      k[i] = in.k[i] / k_norm;
    }
    float memory[kColumnsPerWarp] = {};
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float decay = expf(in.g[i]);
#pragma unroll
      for (int j = 0; j < kColumnsPerWarp; ++j) {
        S[i][j] *= decay;
        memory[j] += S[i][j] * k[i];
      }
    }
    float out[kColumnsPerWarp] = {};
#pragma unroll
    for (int j = 0; j < kColumnsPerWarp; ++j) {
      const float delta = (in.v[j] - warp_sum(memory[j])) * in.beta;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        S[i][j] += k[i] * delta;
        out[j] += S[i][j] * q[i];
      }
    }
    float* o = a.out + (t * a.num_heads + h) * D + column0;
#pragma unroll
    for (int j = 0; j < kColumnsPerWarp; ++j) {
      const float sum = warp_sum(out[j]);
      if (lane == j) o[j] = sum;
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    if (lane + 32 * i >= D) continue;
    *reinterpret_cast<float4*>(state + (lane + 32 * i) * D + column0) = make_float4(S[i][0], S[i][1], S[i][2], S[i][3]);
  }
}

}  // namespace

cudaError_t causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel,
                             const float* weight, float* conv_state, float* y, cudaStream_t stream) {
  if (kernel < 1 || kernel > kMaxConvKernel) return cudaErrorInvalidValue;
  if (num_tokens == 0 || channels == 0) return cudaSuccess;
  causal_conv_silu_kernel<<<blocks_for(channels, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
      x, num_tokens, channels, static_cast<int>(kernel), weight, conv_state, y);
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

bool recurrent_shape_ok(const KdaDeviceArgs& args) {
  const int64_t D = args.head_dim;
  return D == 16 || D == 32 || D == 64 || D == 128;
}

bool aligned_state(const float* state) { return reinterpret_cast<uintptr_t>(state) % 16 == 0; }

// count == 0: the single-sequence call (args.state); else `count` sequences of a batched step.
cudaError_t launch_recurrent(const KdaDeviceArgs& args, int64_t count, const StepStates& states,
                             cudaStream_t stream) {
  const int64_t D = args.head_dim;
  constexpr int64_t kBlockColumns = kColumnsPerWarp * kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned>(args.num_heads), static_cast<unsigned>((D + kBlockColumns - 1) / kBlockColumns),
                  static_cast<unsigned>(std::max<int64_t>(count, 1)));
  const bool steps = count > 0;
  switch (D) {
    case 16: kda_recurrent_kernel<16><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(args, steps, states); break;
    case 32: kda_recurrent_kernel<32><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(args, steps, states); break;
    case 64: kda_recurrent_kernel<64><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(args, steps, states); break;
    default: kda_recurrent_kernel<128><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(args, steps, states); break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t kda_recurrent(const KdaDeviceArgs& args, cudaStream_t stream) {
  if (!recurrent_shape_ok(args) || !aligned_state(args.state)) return cudaErrorInvalidValue;
  if (args.num_tokens == 0 || args.num_heads == 0) return cudaSuccess;
  return launch_recurrent(args, 0, StepStates{}, stream);
}

cudaError_t kda_recurrent_steps(const KdaDeviceArgs& args, float* const* states, cudaStream_t stream) {
  if (!recurrent_shape_ok(args)) return cudaErrorInvalidValue;
  for (int64_t s = 0; s < args.num_tokens; ++s) {
    if (!aligned_state(states[s])) return cudaErrorInvalidValue;
  }
  if (args.num_heads == 0) return cudaSuccess;
  for (int64_t first = 0; first < args.num_tokens; first += kMaxStepSequences) {
    const int64_t count = std::min<int64_t>(kMaxStepSequences, args.num_tokens - first);
    StepStates table{};
    for (int64_t s = 0; s < count; ++s) table.at[s] = states[first + s];
    const cudaError_t status = launch_recurrent(from_row(args, first), count, table, stream);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t causal_conv_silu_steps(const float* x, int64_t count, int64_t channels, int64_t kernel,
                                   const float* weight, float* const* states, float* y, cudaStream_t stream) {
  if (kernel < 1 || kernel > kMaxConvKernel) return cudaErrorInvalidValue;
  if (channels == 0) return cudaSuccess;
  for (int64_t first = 0; first < count; first += kMaxStepSequences) {
    const int64_t n = std::min<int64_t>(kMaxStepSequences, count - first);
    StepStates table{};
    for (int64_t s = 0; s < n; ++s) table.at[s] = states[first + s];
    const dim3 grid(blocks_for(channels, kElementwiseThreads), static_cast<unsigned>(n));
    causal_conv_silu_steps_kernel<<<grid, kElementwiseThreads, 0, stream>>>(x + first * channels, channels,
                                                                           static_cast<int>(kernel), weight, table,
                                                                           y + first * channels);
    if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t kda_chunked(const KdaDeviceArgs& args, int64_t chunk_size, cudaStream_t stream) {
  if (chunk_size < 1) return cudaErrorInvalidValue;
  return kda_recurrent(args, stream);
}

}  // namespace kestrel::cuda

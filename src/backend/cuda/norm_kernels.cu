#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/norm_kernels.h"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;

// Elements of a row a thread holds at once: a pass loads them all before it sums (a decode step's row is one block's,
// so the loads' latency is the kernel's), up to 4096 elements a pass.
constexpr int kHeld = 16;

// gate == nullptr: plain RMSNorm. A thread sums its elements i = threadIdx.x + k * blockDim.x in k order. The
// weights of the first pass (a decode step's whole row) are requested before the wait and the next kernel launches
// once the row is summed: loads after that would queue behind the first weights its blocks request as they start.
__global__ void __launch_bounds__(kThreads)
    rms_norm_rows(const float* x, int64_t n, const float* weight, const float* gate, float eps, float* y) {
  __shared__ float shared[32];
  const int64_t pass = kHeld * static_cast<int64_t>(blockDim.x);
  const bool one_pass = n <= pass;  // held and first_weights hold the row's values at the end
  float held[kHeld], first_weights[kHeld];
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int64_t i = threadIdx.x + k * static_cast<int64_t>(blockDim.x);
    first_weights[k] = weight != nullptr && i < n ? weight[i] : 1.0f;
  }
  wait_for_previous_grid_only();
  const float* in = x + blockIdx.x * n;
  float* out = y + blockIdx.x * n;
  float sum_squares = 0.0f;
  for (int64_t first = threadIdx.x; first < n; first += pass) {
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t i = first + k * static_cast<int64_t>(blockDim.x);
      held[k] = i < n ? in[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kHeld; ++k) sum_squares += held[k] * held[k];
  }
  const float inv_rms = 1.0f / sqrtf(block_sum(sum_squares, shared) / static_cast<float>(n) + eps);
  let_next_grid_launch();
  for (int64_t first = threadIdx.x; first < n; first += pass) {
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t i = first + k * static_cast<int64_t>(blockDim.x);
      if (i >= n) break;
      const float w = one_pass ? first_weights[k] : weight != nullptr ? weight[i] : 1.0f;
      float v = w * ((one_pass ? held[k] : in[i]) * inv_rms);
      if (gate) v *= 1.0f / (1.0f + expf(-gate[blockIdx.x * n + i]));
      out[i] = v;
    }
  }
}

// Rows of at most 32 * kWarpHeld elements take a warp each (8 rows a block): a block per row of the KDA output gate's
// 128-element heads left most of its threads idle and the GPU scheduling 64 tiny blocks per token. The lane holds
// elements lane + 32 k.
constexpr int kWarpHeld = 16;
constexpr int kRowsPerBlock = kThreads / 32;

__global__ void __launch_bounds__(kThreads) rms_norm_warp_rows(const float* x, int64_t rows, int64_t n,
                                                               const float* weight, const float* gate, float eps,
                                                               float* y) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  float weights[kWarpHeld];  // before the wait, as rms_norm_rows'
#pragma unroll
  for (int k = 0; k < kWarpHeld; ++k) {
    const int64_t i = lane + 32 * k;
    weights[k] = weight != nullptr && i < n ? weight[i] : 1.0f;
  }
  wait_for_previous_grid_only();
  if (row >= rows) return;  // (an exited block lets the next grid launch)
  const float* in = x + row * n;
  float held[kWarpHeld];
  float sum_squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kWarpHeld; ++k) {
    const int64_t i = lane + 32 * k;
    held[k] = i < n ? in[i] : 0.0f;
    sum_squares += held[k] * held[k];
  }
  const float inv_rms = 1.0f / sqrtf(warp_sum(sum_squares) / static_cast<float>(n) + eps);
  let_next_grid_launch();
#pragma unroll
  for (int k = 0; k < kWarpHeld; ++k) {
    const int64_t i = lane + 32 * k;
    if (i >= n) break;
    float v = weights[k] * (held[k] * inv_rms);
    if (gate) v *= 1.0f / (1.0f + expf(-gate[row * n + i]));
    y[row * n + i] = v;
  }
}

// The RMS norm of `rows` rows of n: a warp a row for short rows, else a block a row.
cudaError_t launch_rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* gate, float eps,
                            float* y, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // Dependent launches (the norms feed linears): the next kernel's start overlaps this one.
  if (n <= 32 * kWarpHeld) {
    const auto blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    return launch_dependent(rms_norm_warp_rows, dim3(blocks), dim3(kThreads), 0, stream, x, rows, n, weight, gate, eps,
                            y);
  }
  return launch_dependent(rms_norm_rows, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, x, n, weight,
                          gate, eps, y);
}

__global__ void __launch_bounds__(kThreads)
    layer_norm_rows(const float* x, int64_t n, const float* weight, const float* bias, float eps, float* y) {
  wait_for_previous_grid();
  __shared__ float shared[32];
  const float* in = x + blockIdx.x * n;
  float* out = y + blockIdx.x * n;
  float sum = 0.0f;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += in[i];
  const float mean = block_sum(sum, shared) / static_cast<float>(n);
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) squares += (in[i] - mean) * (in[i] - mean);
  const float inv_std = 1.0f / sqrtf(block_sum(squares, shared) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = (in[i] - mean) * inv_std * weight[i] + bias[i];
}

}  // namespace

cudaError_t rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, float eps, float* y,
                     cudaStream_t stream) {
  return launch_rms_norm(x, rows, n, weight, nullptr, eps, y, stream);
}

cudaError_t layer_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias, float eps,
                       float* y, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_dependent(layer_norm_rows, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, x, n, weight,
                          bias, eps, y);
}

cudaError_t gated_rms_norm(const float* x, const float* gate, int64_t rows, int64_t n, const float* weight, float eps,
                           float* y, cudaStream_t stream) {
  return launch_rms_norm(x, rows, n, weight, gate, eps, y, stream);
}

}  // namespace kestrel::cuda

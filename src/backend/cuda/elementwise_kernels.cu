#include "backend/cuda/elementwise_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/swiglu.cuh"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ int64_t element_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void clamped_swiglu_kernel(const float* gate, const float* up, int64_t n, float limit, float* out) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i < n) out[i] = clamped_swiglu_of(gate[i], up[i], limit);
}

__global__ void split_bf16_kernel(const float* x, int64_t n, uint16_t* high, uint16_t* low) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i >= n) return;
  const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
  high[i] = __bfloat16_as_ushort(h);
  if (low != nullptr) low[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i] - __bfloat162float(h)));
}

__global__ void to_f16_kernel(const float* x, int64_t n, uint16_t* out) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i < n) out[i] = __half_as_ushort(__float2half_rn(x[i]));
}

__global__ void sigmoid_kernel(float* x, int64_t n) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i < n) x[i] = 1.0f / (1.0f + expf(-x[i]));
}

__global__ void add_kernel(const float* x, int64_t n, float* y) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i < n) y[i] += x[i];
}

// i indexes [T, hidden].
__global__ void stream_mean_kernel(const float* streams, int64_t n, int64_t hc_mult, int64_t hidden, float* out) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i >= n) return;
  const int64_t t = i / hidden, d = i % hidden;
  float sum = 0.0f;
  for (int64_t s = 0; s < hc_mult; ++s) sum += streams[(t * hc_mult + s) * hidden + d];
  out[i] = sum / static_cast<float>(hc_mult);
}

// i indexes [T, hc, hidden].
__global__ void stream_expand_kernel(const float* x, int64_t n, int64_t hc_mult, int64_t hidden, float* streams) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i >= n) return;
  const int64_t d = i % hidden, t = i / (hc_mult * hidden);
  streams[i] = x[t * hidden + d];
}

// i indexes [T, hidden].
__global__ void weighted_slot_sum_kernel(const float* slots, const float* weights, int64_t n, int64_t top_k,
                                         int64_t hidden, float* out) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i >= n) return;
  const int64_t t = i / hidden, d = i % hidden;
  float sum = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) sum += weights[t * top_k + j] * slots[(t * top_k + j) * hidden + d];
  out[i] += sum;
}

__global__ void fill_kernel(float* x, int64_t n, float value) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i < n) x[i] = value;
}

// i indexes [rows, cols] of src.
__global__ void scatter_rows_kernel(const float* src, const int32_t* rows, int64_t n, int64_t cols, float* out) {
  wait_for_previous_grid();
  const int64_t i = element_index();
  if (i < n) out[static_cast<int64_t>(rows[i / cols]) * cols + i % cols] = src[i];
}

// kernel over n elements, a thread each; a dependent launch (each kernel waits for the previous one's writes first).
template <typename... Params, typename... Args>
cudaError_t launch_elementwise(void (*kernel)(Params...), int64_t n, cudaStream_t stream, Args... args) {
  return launch_dependent(kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, args...);
}

}  // namespace

cudaError_t fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_elementwise(fill_kernel, n, stream, x, n, value);
}

cudaError_t scatter_rows(const float* src, const int32_t* rows, int64_t num_rows, int64_t cols, float* out,
                         cudaStream_t stream) {
  const int64_t n = num_rows * cols;
  if (n == 0) return cudaSuccess;
  return launch_elementwise(scatter_rows_kernel, n, stream, src, rows, n, cols, out);
}

cudaError_t clamped_swiglu(const float* gate, const float* up, int64_t n, float limit, float* out,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_elementwise(clamped_swiglu_kernel, n, stream, gate, up, n, limit, out);
}

cudaError_t split_bf16(const float* x, int64_t n, uint16_t* high, uint16_t* low, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_elementwise(split_bf16_kernel, n, stream, x, n, high, low);
}

cudaError_t to_f16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_elementwise(to_f16_kernel, n, stream, x, n, out);
}

cudaError_t sigmoid(float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_elementwise(sigmoid_kernel, n, stream, x, n);
}

cudaError_t add(const float* x, int64_t n, float* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return launch_elementwise(add_kernel, n, stream, x, n, y);
}

cudaError_t stream_mean(const float* streams, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* out,
                        cudaStream_t stream) {
  const int64_t n = num_tokens * hidden;
  if (n == 0) return cudaSuccess;
  return launch_elementwise(stream_mean_kernel, n, stream, streams, n, hc_mult, hidden, out);
}

cudaError_t stream_expand(const float* x, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* streams,
                          cudaStream_t stream) {
  const int64_t n = num_tokens * hc_mult * hidden;
  if (n == 0) return cudaSuccess;
  return launch_elementwise(stream_expand_kernel, n, stream, x, n, hc_mult, hidden, streams);
}

cudaError_t weighted_slot_sum(const float* slots, const float* weights, int64_t num_tokens, int64_t top_k,
                              int64_t hidden, float* out, cudaStream_t stream) {
  const int64_t n = num_tokens * hidden;
  if (n == 0) return cudaSuccess;
  return launch_elementwise(weighted_slot_sum_kernel, n, stream, slots, weights, n, top_k, hidden, out);
}

}  // namespace kestrel::cuda

#include "backend/cuda/mhc_kernels.h"

namespace kestrel::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float logistic(float x) { return 1.0f / (1.0f + expf(-x)); }

// One block per token. The weights are a few dozen numbers, computed by the first hc threads with the CPU backend's
// arithmetic: thread r owns row r of the combination matrix for the softmax and the row passes, and column r for the
// column passes (each sum still runs over its row or column in order, so the results are the CPU's bit for bit); the
// matrix stays in shared memory, as a thread-0 loop over a local array spent ~60 µs a token in local-memory latency.
// Then the block collapses the streams.
__global__ void __launch_bounds__(kThreads) mhc_mix_kernel(MhcMixArgs a) {
  __shared__ float pre[kMaxHcMult];
  __shared__ float c[kMaxHcMult * kMaxHcMult];
  const int64_t t = blockIdx.x, hc = a.hc_mult, mix = (2 + hc) * hc;
  const int64_t r = threadIdx.x;
  const bool owner = r < hc;
  const float* m = a.mixes + t * mix;
  if (owner) {
    pre[r] = logistic(m[r] * a.scale[0] + a.base[r]) + a.hc_eps;
    a.post[t * hc + r] = 2.0f * logistic(m[hc + r] * a.scale[1] + a.base[hc + r]);
    float* row = c + r * hc;
    float row_max = -INFINITY;
    for (int64_t j = 0; j < hc; ++j) {
      row[j] = m[2 * hc + r * hc + j] * a.scale[2] + a.base[2 * hc + r * hc + j];
      row_max = fmaxf(row_max, row[j]);
    }
    float row_sum = 0.0f;
    for (int64_t j = 0; j < hc; ++j) {
      row[j] = expf(row[j] - row_max);
      row_sum += row[j];
    }
    for (int64_t j = 0; j < hc; ++j) row[j] = row[j] / row_sum + a.hc_eps;
  }
  for (int64_t iter = 0; iter < a.sinkhorn_iters; ++iter) {
    if (iter > 0) {  // rows, then columns; the first iteration normalises the columns only
      __syncthreads();
      if (owner) {
        float* row = c + r * hc;
        float sum = 0.0f;
        for (int64_t j = 0; j < hc; ++j) sum += row[j];
        for (int64_t j = 0; j < hc; ++j) row[j] /= sum + a.hc_eps;
      }
    }
    __syncthreads();
    if (owner) {
      float sum = 0.0f;
      for (int64_t i = 0; i < hc; ++i) sum += c[i * hc + r];
      for (int64_t i = 0; i < hc; ++i) c[i * hc + r] /= sum + a.hc_eps;
    }
  }
  __syncthreads();
  for (int64_t i = r; i < hc * hc; i += blockDim.x) a.comb[t * hc * hc + i] = c[i];
  const float* x = a.streams + t * hc * a.hidden;
  for (int64_t d = threadIdx.x; d < a.hidden; d += blockDim.x) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hc; ++i) sum += pre[i] * x[i * a.hidden + d];
    a.collapsed[t * a.hidden + d] = sum;
  }
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
  for (int64_t j = 0; j < hc; ++j) {
    float sum = 0.0f;
    for (int64_t i = 0; i < hc; ++i) sum += c[i * hc + j] * in[i];
    x[j * hidden + d] = post[t * hc + j] * y + sum;
  }
}

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

}  // namespace kestrel::cuda

// Row normalisations on the GPU, matching the CPU backend's (norm.cpp, elementwise.cpp): one block per row, float32
// throughout. x and y may be the same memory. All pointers are device memory; the weights are constants (no kernel in
// flight writes them: the RMS norms request them before waiting for the previous kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kestrel::cuda {

// y = x / sqrt(mean(x^2) + eps) * weight; weight may be null (unweighted).
cudaError_t rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, float eps, float* y,
                     cudaStream_t stream);
// y = (x - mean) / sqrt(var + eps) * weight + bias, biased variance.
cudaError_t layer_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias, float eps,
                       float* y, cudaStream_t stream);
// y = rms_norm(x; weight, eps) * sigmoid(gate).
cudaError_t gated_rms_norm(const float* x, const float* gate, int64_t rows, int64_t n, const float* weight, float eps,
                           float* y, cudaStream_t stream);

}  // namespace kestrel::cuda

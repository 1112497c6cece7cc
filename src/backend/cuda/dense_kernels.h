// Linear layers with plain (f32, f16, bf16) weights on the GPU: y[T, out] = x[T, in] W^T, W row-major [out, in] as
// stored in the checkpoint, float32 activations and accumulation. One warp per output row; each pass covers up to
// 8 tokens, so the weights are read once per 8 tokens (the decode case). Prefill-sized batches belong on tensor
// cores (cuBLASLt), which this kernel does not replace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kestrel::cuda {

enum class DenseWeightType { f32, f16, bf16 };

cudaError_t dense_linear(const void* weight, DenseWeightType type, int64_t out_features, int64_t in_features,
                         const float* x, int64_t num_tokens, float* y, cudaStream_t stream);

// out[T, cols] = rows ids[T] of table [rows, cols], as float32 (the embedding lookup). ids are device memory and must
// be in [0, rows): the caller validates them (the model does, before anything runs).
cudaError_t gather_rows(const void* table, DenseWeightType type, int64_t cols, const int32_t* ids, int64_t num_tokens,
                        float* out, cudaStream_t stream);

}  // namespace kestrel::cuda

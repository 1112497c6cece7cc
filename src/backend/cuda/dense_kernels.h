// Linear layers with plain (f32, f16, bf16) or block-fp8 (e4m3 with a float32 scale per block_rows x block_cols
// block, DeepSeek/GLM's layout) weights on the GPU: y[T, out] = x[T, in] W^T, W row-major [out, in] as stored in the
// checkpoint, float32 activations and accumulation; fp8 weights are scaled as the CPU backend does (fp8 value times
// its block's scale, rounded to float32, then multiplied). One warp per output row (four rows for passes of more
// than one token, so that each load of x serves them all); each pass covers up to 8 tokens, so the weights are read
// once per 8 tokens (the decode case). A matrix with few rows has its k range split over several blocks
// (dense_splits) whose partial sums are added in a fixed order: by a second launch, or on the bf16 tensor-core path
// by the last of a row block's splits to finish (counted in `counters`). Prefill-sized batches belong on tensor
// cores (cuBLASLt), which this kernel does not replace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/product_input.h"

namespace kestrel::cuda {

enum class DenseWeightType { f32, f16, bf16, f8_e4m3 };

// The scale grid of an fp8 weight: scales [ceil(out / block_rows), ceil(in / block_cols)] float32, device memory.
// block_cols must be a multiple of 16 (a 16-byte vector of weights shares one scale).
struct BlockScales {
  const float* scales = nullptr;
  int64_t block_rows = 0, block_cols = 0;
};

// Into how many k ranges a matrix's rows are split for one token (1: none), and the scratch floats dense_linear
// needs for any token count.
int64_t dense_splits(DenseWeightType type, int64_t out_features, int64_t in_features);
int64_t dense_scratch_floats(DenseWeightType type, int64_t out_features, int64_t in_features);

// The split counters the bf16 tensor-core path needs: dense_counter_count() unsigned of device memory, zeroed
// before first use; every call leaves them zeroed again.
int64_t dense_counter_count();
// cudaErrorInvalidValue for fp8 without a usable scale grid. Without scratch (dense_scratch_floats of device
// memory, not shared with a concurrent call) the rows are not split, nor on the bf16 path without counters.
// `input` applies to bf16 weights (product_input.h): float32, split into three bf16 terms on the tensor cores (the
// float32 product up to summation order), or bf16, rounded to one.
cudaError_t dense_linear(const void* weight, DenseWeightType type, int64_t out_features, int64_t in_features,
                         const float* x, int64_t num_tokens, float* y, cudaStream_t stream,
                         const BlockScales& scales = {}, float* scratch = nullptr, unsigned* counters = nullptr,
                         ProductInput input = ProductInput::float32);

// One matrix of a bf16 group: weight [out_features, in_features] as stored, its output y [T, out_features].
struct DenseGroupMember {
  const void* weight = nullptr;
  int64_t out_features = 0;
  float* y = nullptr;
};
constexpr int kMaxDenseGroup = 8;

// Whether bf16_linear_group takes matrices of this width with this input (the tensor-core GEMV's conditions:
// in_features a multiple of 32, 16-byte aligned x; each member's weight must be 16-byte aligned too).
bool bf16_group_supported(int64_t in_features, const float* x);
// Scratch floats bf16_linear_group needs for members of `total_rows` rows in all.
int64_t bf16_group_scratch_floats(int64_t total_rows, int64_t in_features);
// y_m[T, out_m] = x[T, in_features] W_m^T for up to kMaxDenseGroup bf16 matrices sharing x (a layer's q, k and v
// projections): the decode GEMV of dense_linear over all of them in one launch (split sums included), so that
// their blocks fill the GPU together instead of one small matrix at a time. Same results as dense_linear per matrix
// up to the k splits' summation order. cudaErrorInvalidValue where bf16_group_supported fails, a weight is unaligned
// or there are more than kMaxDenseGroup members.
cudaError_t bf16_linear_group(const DenseGroupMember* members, int count, int64_t in_features, const float* x,
                              int64_t num_tokens, float* scratch, unsigned* counters, cudaStream_t stream,
                              ProductInput input);

// y[T, out_features] = clamped_swiglu(gate, up, limit) [T, in_features] W^T on the bf16 tensor-core GEMV, the
// activation applied as the input is staged (no launch of its own): bit for bit what the activation then dense_linear
// compute. bf16_swiglu_supported: in_features a multiple of 32, weight, gate and up 16-byte aligned; else
// bf16_swiglu_linear returns cudaErrorInvalidValue. scratch and counters as dense_linear's.
bool bf16_swiglu_supported(int64_t in_features, const void* weight, const float* gate, const float* up);
cudaError_t bf16_swiglu_linear(const void* weight, int64_t out_features, int64_t in_features, const float* gate,
                               const float* up, float limit, int64_t num_tokens, float* y, float* scratch,
                               unsigned* counters, cudaStream_t stream, ProductInput input);
// out[T, cols] = rows ids[T] of table [rows, cols], as float32 (the embedding lookup). ids are device memory and must
// be in [0, rows): the caller validates them (the model does, before anything runs). Not for fp8 tables.
cudaError_t gather_rows(const void* table, DenseWeightType type, int64_t cols, const int32_t* ids, int64_t num_tokens,
                        float* out, cudaStream_t stream);

}  // namespace kestrel::cuda

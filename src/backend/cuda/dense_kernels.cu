#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/dense_kernels.h"

namespace kestrel::cuda {

namespace {

constexpr int kTokensPerPass = 8;
constexpr int kWarpsPerBlock = 8;

template <typename W>
__device__ __forceinline__ float to_float(W w) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    return __bfloat162float(w);
  } else if constexpr (std::is_same_v<W, __half>) {
    return __half2float(w);
  } else if constexpr (std::is_same_v<W, __nv_fp8_e4m3>) {
    return static_cast<float>(w);
  } else {
    return w;
  }
}

// Lane l reads 16-byte vectors l, l + 32, ... of the row (kVector weights each), so a warp's loads are coalesced
// 512-byte runs; rows whose length is not a multiple of kVector (or not 16-byte aligned) take the scalar loop. With
// block scales, each weight is multiplied by its block's scale before the dot product (a vector lies in one block).
template <typename W>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    dense_gemv(const W* weight, int64_t out_features, int64_t in_features, const float* x, int num_tokens, float* y,
               BlockScales scales) {
  constexpr int kVector = 16 / sizeof(W);
  constexpr bool kScaled = std::is_same_v<W, __nv_fp8_e4m3>;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= out_features) return;
  const W* w = weight + row * in_features;
  const int64_t scale_cols = kScaled ? (in_features + scales.block_cols - 1) / scales.block_cols : 0;
  const float* row_scales = kScaled ? scales.scales + row / scales.block_rows * scale_cols : nullptr;
  // The weight as the CPU dequantises it: fp8 times its block's scale, rounded to float32.
  const auto weight_at = [&](W value, int64_t column) {
    if constexpr (kScaled) {
      return to_float(value) * row_scales[column / scales.block_cols];
    } else {
      return to_float(value);
    }
  };
  float acc[kTokensPerPass] = {};
  const bool aligned = ((reinterpret_cast<uintptr_t>(weight) | reinterpret_cast<uintptr_t>(x)) & 15u) == 0;
  if (aligned && in_features % kVector == 0) {
    const int64_t vectors = in_features / kVector;
    for (int64_t v = lane; v < vectors; v += 32) {
      const uint4 packed = __ldcs(reinterpret_cast<const uint4*>(w) + v);
      const W* values = reinterpret_cast<const W*>(&packed);
      float wf[kVector];
#pragma unroll
      for (int j = 0; j < kVector; ++j) wf[j] = weight_at(values[j], v * kVector);
      for (int t = 0; t < num_tokens; ++t) {
        const float4* xv = reinterpret_cast<const float4*>(x + t * in_features + v * kVector);
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < kVector / 4; ++q) {
          const float4 xq = xv[q];
          sum += xq.x * wf[4 * q] + xq.y * wf[4 * q + 1] + xq.z * wf[4 * q + 2] + xq.w * wf[4 * q + 3];
        }
        acc[t] += sum;
      }
    }
  } else {
    for (int64_t i = lane; i < in_features; i += 32) {
      const float wi = weight_at(w[i], i);
      for (int t = 0; t < num_tokens; ++t) acc[t] += wi * x[t * in_features + i];
    }
  }
  for (int t = 0; t < num_tokens; ++t) {
    float v = acc[t];
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    if (lane == 0) y[t * out_features + row] = v;
  }
}

template <typename W>
void launch(const void* weight, int64_t out_features, int64_t in_features, const float* x, int64_t num_tokens,
            float* y, const BlockScales& scales, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((out_features + kWarpsPerBlock - 1) / kWarpsPerBlock);
  for (int64_t t = 0; t < num_tokens; t += kTokensPerPass) {
    const int n = static_cast<int>(std::min<int64_t>(kTokensPerPass, num_tokens - t));
    dense_gemv<W><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(static_cast<const W*>(weight), out_features,
                                                              in_features, x + t * in_features, n,
                                                              y + t * out_features, scales);
  }
}

template <typename W>
__global__ void gather_rows_kernel(const W* table, int64_t cols, const int32_t* ids, float* out) {
  const W* row = table + static_cast<int64_t>(ids[blockIdx.x]) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[blockIdx.x * cols + i] = to_float(row[i]);
}

template <typename W>
void launch_gather(const void* table, int64_t cols, const int32_t* ids, int64_t num_tokens, float* out,
                   cudaStream_t stream) {
  gather_rows_kernel<W><<<static_cast<unsigned>(num_tokens), 256, 0, stream>>>(static_cast<const W*>(table), cols, ids,
                                                                              out);
}

// Calls f(W{}) with W the element type of `type`.
template <typename F>
void with_element_type(DenseWeightType type, F&& f) {
  switch (type) {
    case DenseWeightType::f32:
      f(float{});
      break;
    case DenseWeightType::f16:
      f(__half{});
      break;
    case DenseWeightType::bf16:
      f(__nv_bfloat16{});
      break;
    case DenseWeightType::f8_e4m3:
      f(__nv_fp8_e4m3{});
      break;
  }
}

}  // namespace

cudaError_t gather_rows(const void* table, DenseWeightType type, int64_t cols, const int32_t* ids, int64_t num_tokens,
                        float* out, cudaStream_t stream) {
  if (type == DenseWeightType::f8_e4m3) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  with_element_type(type, [&](auto element) {
    launch_gather<decltype(element)>(table, cols, ids, num_tokens, out, stream);
  });
  return cudaGetLastError();
}

cudaError_t dense_linear(const void* weight, DenseWeightType type, int64_t out_features, int64_t in_features,
                         const float* x, int64_t num_tokens, float* y, cudaStream_t stream,
                         const BlockScales& scales) {
  const bool fp8 = type == DenseWeightType::f8_e4m3;
  if (fp8 != (scales.scales != nullptr) ||
      (fp8 && (scales.block_rows < 1 || scales.block_cols < 1 || scales.block_cols % 16 != 0))) {
    return cudaErrorInvalidValue;
  }
  with_element_type(type, [&](auto element) {
    launch<decltype(element)>(weight, out_features, in_features, x, num_tokens, y, scales, stream);
  });
  return cudaGetLastError();
}

}  // namespace kestrel::cuda

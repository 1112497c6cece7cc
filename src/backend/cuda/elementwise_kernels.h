// Elementwise ops and the mHC stream copies on the GPU, matching the CPU backend (elementwise.cpp, norm.cpp):
// float32 device memory, one thread per output element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kestrel::cuda {

cudaError_t fill(float* x, int64_t n, float value, cudaStream_t stream);
// x as the sum of two bf16 terms for tensor-core products: high[i] = x[i] rounded to bf16 (nearest even), low[i] =
// the rest rounded to bf16 (16 significant bits in all, as the float32 activations times bf16 weights need); with
// low null, only x rounded to bf16 (ProductInput::bf16).
cudaError_t split_bf16(const float* x, int64_t n, uint16_t* high, uint16_t* low, cudaStream_t stream);
// out[i] = x[i] rounded to fp16 (nearest even), as fp16 bits.
cudaError_t to_f16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);
// out[rows[i], :] = src[i, :] for i < num_rows (src [num_rows, cols]); rows must be distinct and index out.
cudaError_t scatter_rows(const float* src, const int32_t* rows, int64_t num_rows, int64_t cols, float* out,
                         cudaStream_t stream);
// out = silu(min(gate, limit)) * clamp(up, -limit, limit), over n elements.
cudaError_t clamped_swiglu(const float* gate, const float* up, int64_t n, float limit, float* out,
                           cudaStream_t stream);
cudaError_t sigmoid(float* x, int64_t n, cudaStream_t stream);
// y += x
cudaError_t add(const float* x, int64_t n, float* y, cudaStream_t stream);
// out[T, hidden] = mean over the hc streams of streams[T, hc, hidden].
cudaError_t stream_mean(const float* streams, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* out,
                        cudaStream_t stream);
// streams[T, hc, hidden] = each token's x[T, hidden] in every stream.
cudaError_t stream_expand(const float* x, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* streams,
                          cudaStream_t stream);

// The MoE combine: out[t, :] += sum over j < top_k of weights[t, j] * slots[t * top_k + j, :] (slots [T * top_k,
// hidden]), summed in slot order.
cudaError_t weighted_slot_sum(const float* slots, const float* weights, int64_t num_tokens, int64_t top_k,
                              int64_t hidden, float* out, cudaStream_t stream);

}  // namespace kestrel::cuda

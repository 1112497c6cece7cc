// Sparse MLA attention for prefill-sized calls on the tensor cores: per group of tokens, q̂ = W_UKᵀ q as one batched
// cuBLASLt product over the heads (fp16 in, fp16 out, the softmax scale folded in), the attention over each token's
// selected latent rows (dsa_kernels.h, sparse_mla_mma_attend: ô over q̂ in place), then out = W_UV ô as a second
// batched product straight into out's [T, heads, v_head_dim] rows. The block-per-(token, 16 heads) kernel read W_UK
// and W_UV per token and ran its products on CUDA cores: 172 ms of an 8k prompt's 379 on an H200 (run 26).
//
// Numerics: q, q̂, the latent rows, the probabilities and ô are taken in fp16 (11 significant bits), W_UK and W_UV
// in fp16 (exact for a bf16 checkpoint), every product accumulated in float32; against the float32 CPU path the
// outputs differ by about 1e-3 of their largest (CudaDsaTest.TensorCorePrefillMatchesCpu). A q̂ beyond fp16's range
// (65504 after the scale) would overflow, as exllamav3's fp16 activations would.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/dsa_kernels.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/mla_weights.h"

namespace kestrel::cuda {

// Tokens per group when the caller has no reason to choose: their fp16 scratch stays within 128 MiB (1365 tokens at
// GLM-5.3-Flash's 64 heads x (256 + 512)).
int64_t sparse_mla_prefill_group_tokens(int64_t num_heads, int64_t qk_head_dim, int64_t kv_lora_rank);
// Bytes of scratch for groups of group_tokens tokens: q in fp16, then q̂ in fp16, each 256-byte aligned.
size_t sparse_mla_prefill_scratch_bytes(int64_t group_tokens, int64_t num_heads, int64_t qk_head_dim,
                                        int64_t kv_lora_rank);

// Runs args (a call for which sparse_mla_mma_supported holds; args.scratch is not used) in groups of group_tokens
// tokens through `scratch`, sparse_mla_prefill_scratch_bytes(group_tokens, ...) bytes of device memory. Throws Error
// on a bad shape or a failed launch.
void sparse_mla_prefill(const SparseMlaDeviceArgs& args, const DeviceMlaWeights& weights, Gemm& gemm, void* scratch,
                        int64_t group_tokens, cudaStream_t stream);

}  // namespace kestrel::cuda

// DeepSeek sparse attention (DSA) on the GPU, with the semantics of the CPU backend (cpu/dsa.cpp): k-pool
// compression of the indexer keys, the lightning indexer's selection of the positions each new token attends to, and
// NoPE MLA attention over those positions in the absorbed form. Cached rows are read in place from the paged cache
// through DevicePagedRows. All pointers are device memory; every launcher checks its shapes (cudaErrorInvalidValue
// before any CUDA call) and returns the launch's error (cudaSuccess when it was queued).
//
// Numerics. kpool_compress and the indexer's scores run the CPU's float operations in the CPU's order with every
// product and sum rounded on its own (the CPU's x86-64 code is not FMA-contracted), so scores are bitwise the CPU's
// and the selection is identical, ties and near ties included; pooled keys differ only by expf's last bits.
// Attention reduces in another order (warp partials, online softmax), so it matches the CPU to rounding. Latent rows
// in bf16 or fp8 (--kv-cache-dtype) are encoded as the CPU's encode_row does, to the bit (the scale amax / 448 and
// each value's division rounded to nearest, e4m3 saturating), and decoded exactly as its decode_row.
//
// Design. The indexer is two launches: scores of every visible pool into a caller's scratch [T, pools] (a block per
// (token, tile of pools), the token's queries and the tile's keys in shared memory), then one block per token picks
// its top pools by a radix select over the score bits (four 8-bit passes find the score of the k-th pool; the pools
// above it and the lowest-indexed ones equal to it are kept) and writes them in pool order, which is position order.
// Attention runs a block per (token, 16 heads), each latent row staged in shared memory once for the 16 heads, with
// an online softmax: q̂ = W_UKᵀ q, the selected latents in chunks of 32 rows, then o = W_UV ô. A decode step splits
// each token's positions into parts (flash-decoding): q̂ first by blocks of ranks, then a block per (token, 16 heads,
// part), then one per (token × head, 32 output rows) merging the parts and applying W_UV. Ranks other than 32 × 1, 2,
// 4, 8 or 16 take a block per (token × head). Prefill-sized calls at ranks 64..512 run on the tensor cores instead
// (sparse_mla_mma_attend between two batched per-head products, mla_prefill.h); the indexer's scores do not yet.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/dsa_selection.h"
#include "engine/cache_row_format.h"

namespace kestrel::cuda {

// One sequence's rows in a device pool of blocks (engine/paged_rows.h on the GPU, like vLLM's KV cache): block id b
// holds `block_rows` rows of `row_bytes` bytes at pool + b * block_rows * row_bytes, and the sequence's row i lives
// in block block_ids[i / block_rows] at row i % block_rows. A row holds `row_width` values in `dtype`
// (RowFormat): float32, bf16, or e4m3 bytes with one float32 scale per 128 values from byte `scale_offset`. The
// indexer's pools are float32; the latents may be any of the three.
struct DevicePagedRows {
  const void* pool = nullptr;
  const int32_t* block_ids = nullptr;  // the sequence's block table
  int64_t block_rows = 0, row_width = 0, num_rows = 0;
  int64_t row_bytes = 0;
  CacheDtype dtype = CacheDtype::float32;
  int64_t scale_offset = 0;  // fp8
};

// Rows stored as `format` stores them.
DevicePagedRows device_paged_rows(const void* pool, const int32_t* block_ids, int64_t block_rows, int64_t num_rows,
                                  const RowFormat& format);

// Rows [first_row, first_row + count) of `rows` (their blocks in the table already) = src [count, row_width]: a
// prefill chunk's cache rows in one launch.
cudaError_t write_paged_rows(const DevicePagedRows& rows, int64_t first_row, const float* src, int64_t count,
                             cudaStream_t stream);

// Pooled indexer keys of pools [first_pool, first_pool + num_pools) into pooled [num_pools, dim] (dim = the keys'
// row width): per channel, softmax over the pool's kpool slots of gate + ape[slot] weighting the keys. ape is
// [kpool, dim]; keys and gates must hold every row of those pools.
cudaError_t kpool_compress(const DevicePagedRows& keys, const DevicePagedRows& gates, const float* ape,
                           int64_t first_pool, int64_t num_pools, int64_t kpool, float* pooled, cudaStream_t stream);

// Floats of scratch indexer_select needs: one score per (token, complete pool). 1M tokens of context at kpool 4 is
// 250k pools, 1 MB per token.
constexpr int64_t indexer_scratch_floats(int64_t num_tokens, int64_t num_pools) { return num_tokens * num_pools; }

// IndexerArgs (backend/backend.h) on the device, for T new tokens at positions [start, start + T).
struct IndexerDeviceArgs {
  int64_t num_tokens = 0, start = 0;
  int64_t num_heads = 0, head_dim = 0, kpool = 0, topk_pools = 0;
  bool select_tail = true;
  const float* query = nullptr;    // [T, heads, head_dim] indexer queries
  const float* weights = nullptr;  // [T, heads] per-head weights, each taken as weights[t, h] * weights_scale
  float weights_scale = 1.0f;
  DevicePagedRows pooled_keys;     // one row of head_dim per complete pool of the sequence
  float* scratch = nullptr;        // indexer_scratch_floats(T, pooled_keys.num_rows) floats, or scratch_floats
  // With scratch_floats set (at least pooled_keys.num_rows), the call runs as launches of as many tokens as have their
  // scores fit in it: the scores of a long prompt chunk at a long context (2 GiB for 2048 tokens at 1M) need not be
  // held at once.
  int64_t scratch_floats = 0;
  int32_t* positions = nullptr;    // [T, indexer_max_positions(topk_pools, kpool)]: out, ascending, then -1
  int32_t* counts = nullptr;       // [T]: out, the number of positions of each token
};

// For each token at position t: the score of each visible pool p (p * kpool + kpool - 1 <= t, p < pools) is
// sum_h weights[h] * relu(query[h] . key[p] / sqrt(head_dim)); the best min(topk_pools, visible) pools (higher score,
// then lower index) give their kpool positions each, and with select_tail the incomplete pool's positions
// [t + 1 - (t + 1) % kpool, t] follow. Scores must not be NaN.
cudaError_t indexer_select(const IndexerDeviceArgs& args, cudaStream_t stream);

// Tokens of one attention launch in a decode step: their block tables travel by value in the launch.
constexpr int kMaxAttentionSteps = 64;
struct StepBlockTables {
  const int32_t* at[kMaxAttentionSteps];
};

// SparseMlaArgs (backend/backend.h) on the device, with kv_b already split per head (mla_weights.h) and the
// selection as indexer_select writes it.
struct SparseMlaDeviceArgs {
  int64_t num_tokens = 0, num_heads = 0, qk_head_dim = 0, v_head_dim = 0, kv_lora_rank = 0;
  float scale = 1.0f;              // softmax scale, qk_head_dim^-1/2 in the model
  const float* query = nullptr;    // [T, heads, qk_head_dim]
  const void* w_uk = nullptr;      // [heads, qk_head_dim, kv_lora_rank], float32 or bf16 (weights_bf16)
  const void* w_uv = nullptr;      // [heads, v_head_dim, kv_lora_rank], the same
  bool weights_bf16 = false;
  DevicePagedRows latents;         // [positions, kv_lora_rank]
  const int32_t* positions = nullptr;  // [T, positions_stride], each below latents.num_rows
  const int32_t* counts = nullptr;     // [T]
  int64_t positions_stride = 0;
  float* out = nullptr;            // [T, heads, v_head_dim]
  float* scratch = nullptr;        // sparse_mla_scratch_floats(...) floats (none needed when that is 0)
  // A decode step of several sequences (sparse_mla_attention_steps): token t's block table; latents gives the
  // pool, block_rows and row_width that all of them share.
  bool steps = false;
  StepBlockTables token_block_ids{};
};

// How many parts a token's positions are split into, so that a few tokens still occupy the whole GPU
// (flash-decoding): 1 for prefill-sized calls, up to one part per 64 positions for a decode step (about 256 blocks of
// 16 heads).
int64_t sparse_mla_splits(int64_t num_tokens, int64_t num_heads, int64_t positions_stride);
// Scratch for split calls: q̂ per (token, head) and each part's running max, total and unnormalised output.
int64_t sparse_mla_scratch_floats(int64_t num_tokens, int64_t num_heads, int64_t positions_stride,
                                  int64_t kv_lora_rank);
// Scratch for sparse_mla_attention_steps of num_tokens sequences (launches of up to kMaxAttentionSteps tokens).
int64_t sparse_mla_steps_scratch_floats(int64_t num_tokens, int64_t num_heads, int64_t positions_stride,
                                        int64_t kv_lora_rank);

// Per token t and head h: q̂ = W_UK[h]ᵀ q[t, h]; p = softmax over the selected positions j of scale * q̂ . latent[j];
// out[t, h] = W_UV[h] sum_j p_j latent[j] (zeros for a token with no positions).
cudaError_t sparse_mla_attention(const SparseMlaDeviceArgs& args, cudaStream_t stream);
// A decode step: token s is the new token of the sequence whose block table is block_ids[s] (args.steps and
// token_block_ids are set here, in launches of up to kMaxAttentionSteps tokens); args.latents gives the shared pool.
// args.scratch holds sparse_mla_steps_scratch_floats(...) floats.
cudaError_t sparse_mla_attention_steps(const SparseMlaDeviceArgs& args, const int32_t* const* block_ids,
                                       cudaStream_t stream);

// Prefill on the tensor cores (mla_prefill.h runs it between two per-head products): whether a call of this shape
// takes it (one that sparse_mla_splits leaves in one part, at a rank the kernel is compiled for: 64, 128, 256, 512,
// whose block fits in max_shared bytes of shared memory: 192 KiB at GLM-5.3-Flash's shape, which sm_90 has and
// sm_80, sm_86, sm_89 and the 12.x parts have not; there the per-head kernels take the call).
bool sparse_mla_mma_supported(int64_t num_tokens, int64_t num_heads, int64_t positions_stride, int64_t kv_lora_rank,
                              size_t max_shared);
// The attention itself: qhat is fp16 [num_tokens, num_heads, kv_lora_rank], each token's q̂ already times the
// softmax scale; the token attends over its selected latent rows (taken in fp16) with float32 products, and its
// normalised ô replaces q̂ in place (zeros for a token with no positions). args.query, w_uk, w_uv, out and scratch are
// not used.
cudaError_t sparse_mla_mma_attend(const SparseMlaDeviceArgs& args, void* qhat, cudaStream_t stream);

}  // namespace kestrel::cuda

#include "backend/cuda/mla_prefill.h"

#include <algorithm>

#include "backend/cuda/dynamic_shared.cuh"
#include "backend/cuda/elementwise_kernels.h"
#include "base/error.h"

namespace kestrel::cuda {

namespace {

constexpr size_t kScratchBytes = size_t{128} << 20;
constexpr size_t kAlignment = 256;

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

int64_t sparse_mla_prefill_group_tokens(int64_t num_heads, int64_t qk_head_dim, int64_t kv_lora_rank) {
  const auto per_token = static_cast<size_t>(num_heads * (qk_head_dim + kv_lora_rank)) * 2;
  return std::max<int64_t>(1, static_cast<int64_t>(kScratchBytes / per_token));
}

size_t sparse_mla_prefill_scratch_bytes(int64_t group_tokens, int64_t num_heads, int64_t qk_head_dim,
                                        int64_t kv_lora_rank) {
  const auto rows = static_cast<size_t>(group_tokens * num_heads);
  return aligned(rows * static_cast<size_t>(qk_head_dim) * 2) + aligned(rows * static_cast<size_t>(kv_lora_rank) * 2);
}

void sparse_mla_prefill(const SparseMlaDeviceArgs& a, const DeviceMlaWeights& w, Gemm& gemm, void* scratch,
                        int64_t group_tokens, cudaStream_t stream) {
  const int64_t H = a.num_heads, qk = a.qk_head_dim, vd = a.v_head_dim, rank = a.kv_lora_rank;
  require(w.heads == H && w.qk_head_dim == qk && w.v_head_dim == vd && w.kv_lora_rank == rank,
          "sparse MLA prefill: weights for {} heads of {} + {} at rank {}, call for {} heads of {} + {} at rank {}",
          w.heads, w.qk_head_dim, w.v_head_dim, w.kv_lora_rank, H, qk, vd, rank);
  require(sparse_mla_mma_supported(a.num_tokens, H, a.positions_stride, rank, max_shared_optin()) &&
              group_tokens > 0 && scratch != nullptr,
          "sparse MLA prefill: {} tokens at rank {} do not take the tensor-core path", a.num_tokens, rank);
  auto* q16 = static_cast<uint16_t*>(scratch);
  auto* qhat = reinterpret_cast<uint16_t*>(static_cast<unsigned char*>(scratch) +
                                           aligned(static_cast<size_t>(group_tokens * H * qk) * 2));
  for (int64_t first = 0; first < a.num_tokens; first += group_tokens) {
    const int64_t n = std::min(group_tokens, a.num_tokens - first);
    check(to_f16(a.query + first * H * qk, n * H * qk, q16, stream), "sparse MLA prefill: q to fp16");
    // Head h: q̂[:, h, :] = scale · q[:, h, :] W_UK[h], W_UK[h] [qk, rank] row-major.
    gemm.run_batched(GemmInput::f16, q16, n, qk, w.w_uk_f16.data(), GemmWeights::rows_are_inputs, rank, qhat,
                     GemmBatch{.count = H,
                               .x_ld = H * qk,
                               .x_stride = qk,
                               .w_stride = qk * rank,
                               .y_ld = H * rank,
                               .y_stride = rank,
                               .alpha = a.scale,
                               .y_f16 = true},
                     stream);
    SparseMlaDeviceArgs group = a;
    group.num_tokens = n;
    group.positions = a.positions + first * a.positions_stride;
    group.counts = a.counts + first;
    check(sparse_mla_mma_attend(group, qhat, stream), "sparse MLA prefill: attention");
    // Head h: out[:, h, :] = ô[:, h, :] W_UV[h]ᵀ, W_UV[h] [v, rank] row-major.
    gemm.run_batched(GemmInput::f16, qhat, n, rank, w.w_uv_f16.data(), GemmWeights::rows_are_outputs, vd,
                     a.out + first * H * vd,
                     GemmBatch{.count = H,
                               .x_ld = H * rank,
                               .x_stride = rank,
                               .w_stride = vd * rank,
                               .y_ld = H * vd,
                               .y_stride = vd},
                     stream);
  }
}

}  // namespace kestrel::cuda

// MLA's up-projection kv_b_proj split for the absorbed form that sparse_mla_attention (dsa_kernels.h) runs: per head,
// W_UK [qk_head_dim, kv_lora_rank] maps queries into the latent space (q̂ = W_UKᵀ q) and W_UV [v_head_dim,
// kv_lora_rank] maps the attended latent back out (o = W_UV ô). Kept in bf16 where kv_b is stored in bf16 (the
// values exactly; 32 MiB per layer at GLM-5.3-Flash's 64 heads x (256 + 256) x 512, which decode steps read), else
// dequantised to float32 (64 MiB); and in fp16 for prefill's per-head products on the tensor cores (32 MiB more;
// exact for bf16 checkpoints).
#pragma once

#include <cstdint>

#include "backend/cuda/device_runtime.h"
#include "backend/linear_weight.h"

namespace kestrel::cuda {

struct DeviceMlaWeights {
  DeviceBuffer w_uk;  // [heads, qk_head_dim, kv_lora_rank], bf16 when `bf16`, else float32
  DeviceBuffer w_uv;  // [heads, v_head_dim, kv_lora_rank], the same
  bool bf16 = false;
  DeviceBuffer w_uk_f16, w_uv_f16;  // the same in fp16
  int64_t heads = 0, qk_head_dim = 0, v_head_dim = 0, kv_lora_rank = 0;

  // kv_b is [heads * (qk_head_dim + v_head_dim), kv_lora_rank]: head h's qk_head_dim rows of W_UK, then its
  // v_head_dim rows of W_UV. Throws Error when the shape disagrees.
  static DeviceMlaWeights upload(const LinearWeight& kv_b, int64_t heads, int64_t qk_head_dim, int64_t v_head_dim);
};

}  // namespace kestrel::cuda

#include "backend/cuda/mla_weights.h"

#include <cuda_fp16.h>

#include <vector>

#include "base/error.h"

namespace kestrel::cuda {

DeviceMlaWeights DeviceMlaWeights::upload(const LinearWeight& kv_b, int64_t heads, int64_t qk_head_dim,
                                          int64_t v_head_dim) {
  require(kv_b.valid(), "weight '{}' has no data", kv_b.name);
  require(heads > 0 && qk_head_dim > 0 && v_head_dim > 0 && kv_b.out_features == heads * (qk_head_dim + v_head_dim),
          "weight '{}' has {} rows, expected heads {} x (qk_head_dim {} + v_head_dim {})", kv_b.name,
          kv_b.out_features, heads, qk_head_dim, v_head_dim);
  const int64_t rank = kv_b.in_features;
  std::vector<float> w_uk(static_cast<size_t>(heads * qk_head_dim * rank));
  std::vector<float> w_uv(static_cast<size_t>(heads * v_head_dim * rank));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t first_row = h * (qk_head_dim + v_head_dim);
    for (int64_t r = 0; r < qk_head_dim; ++r) {
      dequantize_row(kv_b, first_row + r, &w_uk[static_cast<size_t>((h * qk_head_dim + r) * rank)]);
    }
    for (int64_t r = 0; r < v_head_dim; ++r) {
      dequantize_row(kv_b, first_row + qk_head_dim + r, &w_uv[static_cast<size_t>((h * v_head_dim + r) * rank)]);
    }
  }
  DeviceMlaWeights weights;
  weights.w_uk = DeviceBuffer::copy_of(w_uk.data(), w_uk.size() * sizeof(float));
  weights.w_uv = DeviceBuffer::copy_of(w_uv.data(), w_uv.size() * sizeof(float));
  const auto to_f16 = [](const std::vector<float>& values) {
    std::vector<__half> halves(values.size());
    for (size_t i = 0; i < values.size(); ++i) halves[i] = __float2half_rn(values[i]);
    return DeviceBuffer::copy_of(halves.data(), halves.size() * sizeof(__half));
  };
  weights.w_uk_f16 = to_f16(w_uk);
  weights.w_uv_f16 = to_f16(w_uv);
  weights.heads = heads;
  weights.qk_head_dim = qk_head_dim;
  weights.v_head_dim = v_head_dim;
  weights.kv_lora_rank = rank;
  return weights;
}

}  // namespace kestrel::cuda

#include "backend/cuda/mla_weights.h"

#include <cuda_fp16.h>

#include <vector>

#include "base/error.h"
#include "base/numeric.h"

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
  // The values converted element by element into a device copy (convert: float -> the stored type).
  const auto converted = [](const std::vector<float>& values, auto convert) {
    std::vector<decltype(convert(0.0f))> stored(values.size());
    for (size_t i = 0; i < values.size(); ++i) stored[i] = convert(values[i]);
    return DeviceBuffer::copy_of(stored.data(), stored.size() * sizeof(stored[0]));
  };
  DeviceMlaWeights weights;
  weights.bf16 = kv_b.dtype == DType::bf16;
  if (weights.bf16) {  // the dequantised values are bf16's, so converting back is exact
    weights.w_uk = converted(w_uk, f32_to_bf16);
    weights.w_uv = converted(w_uv, f32_to_bf16);
  } else {
    weights.w_uk = DeviceBuffer::copy_of(w_uk.data(), w_uk.size() * sizeof(float));
    weights.w_uv = DeviceBuffer::copy_of(w_uv.data(), w_uv.size() * sizeof(float));
  }
  const auto to_f16 = [](float v) { return __float2half_rn(v); };
  weights.w_uk_f16 = converted(w_uk, to_f16);
  weights.w_uv_f16 = converted(w_uv, to_f16);
  weights.heads = heads;
  weights.qk_head_dim = qk_head_dim;
  weights.v_head_dim = v_head_dim;
  weights.kv_lora_rank = rank;
  return weights;
}

}  // namespace kestrel::cuda

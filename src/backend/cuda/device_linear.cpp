#include "backend/cuda/device_linear.h"

#include <vector>

#include "base/error.h"

namespace kestrel::cuda {

float* Scratch::floats(size_t count) {
  if (buffer_.size() < count * sizeof(float)) {
    check(cudaDeviceSynchronize(), "scratch resize");  // kernels in flight may still read the old buffer
    buffer_ = DeviceBuffer(count * sizeof(float));
  }
  return buffer_.as<float>();
}

DeviceLinear DeviceLinear::upload(const LinearWeight& weight, int sm_count) {
  require(weight.valid(), "weight '{}' has no data", weight.name);
  DeviceLinear linear;
  linear.name_ = weight.name;
  linear.in_features_ = weight.in_features;
  linear.out_features_ = weight.out_features;
  if (weight.exl3) {
    const Exl3Matrix& m = *weight.exl3;
    const auto trellis_bytes = static_cast<size_t>(m.in_padded / 16 * (m.out_padded / 16) * 32 * m.bits);
    linear.data_ = DeviceBuffer::copy_of(m.trellis, trellis_bytes);
    linear.suh_ = DeviceBuffer::copy_of(m.suh, static_cast<size_t>(m.in_padded) * 2);
    linear.svh_ = DeviceBuffer::copy_of(m.svh, static_cast<size_t>(m.out_padded) * 2);
    linear.exl3_ = true;
    linear.view_ = Exl3DeviceView{.trellis = linear.data_.as<uint32_t>(),
                                  .suh = linear.suh_.as<uint16_t>(),
                                  .svh = linear.svh_.as<uint16_t>(),
                                  .bits = m.bits,
                                  .codebook = static_cast<int>(m.codebook),
                                  .in_features = weight.in_features,
                                  .out_features = weight.out_features,
                                  .in_padded = m.in_padded,
                                  .out_padded = m.out_padded};
    linear.plan_ = exl3_plan(linear.view_, sm_count);
    linear.counters_ = DeviceBuffer(exl3_counter_count(linear.view_) * sizeof(unsigned));
    linear.counters_.zero();
    linear.weight_bytes_ = trellis_bytes + static_cast<size_t>(m.in_padded + m.out_padded) * 2;
    return linear;
  }
  switch (weight.dtype) {
    case DType::f32:
      linear.dense_type_ = DenseWeightType::f32;
      break;
    case DType::f16:
      linear.dense_type_ = DenseWeightType::f16;
      break;
    case DType::bf16:
      linear.dense_type_ = DenseWeightType::bf16;
      break;
    case DType::f8_e4m3: {
      require(weight.block_cols % 16 == 0, "weight '{}': fp8 scale blocks of {} columns (the CUDA kernel needs a "
              "multiple of 16)", weight.name, weight.block_cols);
      linear.dense_type_ = DenseWeightType::f8_e4m3;
      const std::vector<float> scales = block_scales(weight);
      linear.scales_ = DeviceBuffer::copy_of(scales.data(), scales.size() * sizeof(float));
      linear.block_rows_ = weight.block_rows;
      linear.block_cols_ = weight.block_cols;
      break;
    }
    default:
      fail("weight '{}': dtype {} has no CUDA linear kernel (f32, f16, bf16, block-fp8 and EXL3 do)", weight.name,
           dtype_name(weight.dtype));
  }
  const auto data_bytes = static_cast<size_t>(weight.out_features * weight.in_features) * dtype_size(weight.dtype);
  linear.data_ = DeviceBuffer::copy_of(weight.data, data_bytes);
  linear.weight_bytes_ = data_bytes + linear.scales_.size();
  return linear;
}

void DeviceLinear::forward(const float* x, int64_t num_tokens, float* y, Scratch& scratch, cudaStream_t stream) const {
  require(num_tokens <= 65535, "CUDA linear '{}': {} tokens in one call (at most 65535)", name_, num_tokens);
  if (exl3_) {
    float* partial = scratch.floats(exl3_scratch_floats(view_, plan_));
    check(exl3_linear(view_, plan_, x, num_tokens, y, partial, counters_.as<unsigned>(), stream),
          "EXL3 linear launch");
  } else {
    const BlockScales scales{.scales = scales_.size() ? scales_.as<float>() : nullptr,
                             .block_rows = block_rows_,
                             .block_cols = block_cols_};
    const int64_t scratch_floats = dense_scratch_floats(dense_type_, out_features_, in_features_);
    float* partial = scratch_floats > 0 ? scratch.floats(static_cast<size_t>(scratch_floats)) : nullptr;
    check(dense_linear(data_.data(), dense_type_, out_features_, in_features_, x, num_tokens, y, stream, scales,
                       partial),
          "dense linear launch");
  }
}

void DeviceLinear::gather_rows(const int32_t* ids, int64_t num_tokens, float* out, cudaStream_t stream) const {
  require(!exl3_, "'{}' is EXL3: the CUDA row gather takes f32, f16 and bf16 tables", name_);
  check(cuda::gather_rows(data_.data(), dense_type_, in_features_, ids, num_tokens, out, stream), "row gather launch");
}

}  // namespace kestrel::cuda

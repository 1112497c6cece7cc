// Normalisations and the clamped SwiGLU activation on the CPU.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace kestrel {

void CpuBackend::rms_norm(const float* x, int64_t rows, int64_t n, const float* weight, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * n;
    float* out = y + r * n;
    float sum_squares = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum_squares += in[i] * in[i];
    const float inv_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = (weight ? weight[i] : 1.0f) * (in[i] * inv_rms);
  }
}

void CpuBackend::layer_norm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
                            float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * n;
    float* out = y + r * n;
    float mean = 0.0f;
    for (int64_t i = 0; i < n; ++i) mean += in[i];
    mean /= static_cast<float>(n);
    float variance = 0.0f;
    for (int64_t i = 0; i < n; ++i) variance += (in[i] - mean) * (in[i] - mean);
    variance /= static_cast<float>(n);
    const float inv_std = 1.0f / std::sqrt(variance + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = (in[i] - mean) * inv_std * weight[i] + bias[i];
  }
}

void CpuBackend::clamped_swiglu(const float* gate, const float* up, int64_t rows, int64_t n, float limit, float* out) {
  for (int64_t i = 0; i < rows * n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    out[i] = g / (1.0f + std::exp(-g)) * u;
  }
}

}  // namespace kestrel

// Elementwise ops and small per-row transforms on the CPU.
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace kestrel {

void CpuBackend::kda_gate(const float* f, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                          const float* a_log, const float* dt_bias, const float* lower_bound, float* g) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const float rate = std::exp(a_log[h]);
      for (int64_t c = 0; c < head_dim; ++c) {
        const int64_t i = (t * num_heads + h) * head_dim + c;
        const float x = f[i] + dt_bias[h * head_dim + c];
        if (lower_bound) {
          g[i] = *lower_bound / (1.0f + std::exp(-(rate * x)));
        } else {
          const float softplus = x > 20.0f ? x : std::log(1.0f + std::exp(x));  // as transformers' guard
          g[i] = -rate * softplus;
        }
      }
    }
  }
}

void CpuBackend::gated_rms_norm(const float* x, const float* gate, int64_t rows, int64_t n, const float* weight,
                                float eps, float* y) {
  rms_norm(x, rows, n, weight, eps, y);
  for (int64_t i = 0; i < rows * n; ++i) y[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void CpuBackend::sigmoid(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void CpuBackend::add(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuBackend::stream_mean(const float* streams, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t d = 0; d < hidden; ++d) {
      float sum = 0.0f;
      for (int64_t i = 0; i < hc_mult; ++i) sum += streams[(t * hc_mult + i) * hidden + d];
      out[t * hidden + d] = sum / static_cast<float>(hc_mult);
    }
  }
}

void CpuBackend::stream_expand(const float* x, int64_t num_tokens, int64_t hc_mult, int64_t hidden, float* streams) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < hc_mult; ++i) {
      for (int64_t d = 0; d < hidden; ++d) streams[(t * hc_mult + i) * hidden + d] = x[t * hidden + d];
    }
  }
}

}  // namespace kestrel

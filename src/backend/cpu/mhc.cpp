// mHC on the CPU: mirrors transformers' Glm5NextTextHyperConnection (pre / post / Sinkhorn-projected comb) and the
// decoder layer's expand step. All in float32.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/thread_pool.h"

namespace kestrel {

namespace {

float logistic(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void CpuBackend::mhc_pre(const MhcShape& shape, const MhcWeights& weights, const float* streams, float* post,
                         float* comb, float* collapsed) {
  const int64_t hc = shape.hc_mult, width = hc * shape.hidden, mix = (2 + hc) * hc, T = shape.num_tokens;
  // flat = streams / rms(streams) over the whole hc * hidden vector, then mix = fn · flat, with flat as it is under
  // any --dtype: the reference's mixes are float32's (vLLM's too), and the GPU's fused site multiplies the streams.
  std::vector<float> flat(static_cast<size_t>(T * width));
  rms_norm(streams, T, width, nullptr, shape.rms_eps, flat.data());
  std::vector<float> mixes(static_cast<size_t>(T * mix));
  linear_taking(flat.data(), T, weights.fn, ProductInput::float32, mixes.data());

  const float* base = weights.base.data();
  const float* scale = weights.scale.data();
  ThreadPool::global().parallel_for(T, [&](int64_t begin, int64_t end) {
    std::vector<float> pre(static_cast<size_t>(hc));
    for (int64_t t = begin; t < end; ++t) {
      const float* m = mixes.data() + t * mix;
      for (int64_t j = 0; j < hc; ++j) {
        pre[static_cast<size_t>(j)] = logistic(m[j] * scale[0] + base[j]) + shape.hc_eps;
        post[t * hc + j] = 2.0f * logistic(m[hc + j] * scale[1] + base[hc + j]);
      }
      float* c = comb + t * hc * hc;  // c[i * hc + j]
      for (int64_t i = 0; i < hc; ++i) {
        float row_max = -INFINITY;
        for (int64_t j = 0; j < hc; ++j) {
          c[i * hc + j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
          row_max = std::max(row_max, c[i * hc + j]);
        }
        float row_sum = 0.0f;
        for (int64_t j = 0; j < hc; ++j) {
          c[i * hc + j] = std::exp(c[i * hc + j] - row_max);
          row_sum += c[i * hc + j];
        }
        for (int64_t j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / row_sum + shape.hc_eps;
      }
      auto normalise_columns = [&] {
        for (int64_t j = 0; j < hc; ++j) {
          float sum = 0.0f;
          for (int64_t i = 0; i < hc; ++i) sum += c[i * hc + j];
          for (int64_t i = 0; i < hc; ++i) c[i * hc + j] /= sum + shape.hc_eps;
        }
      };
      auto normalise_rows = [&] {
        for (int64_t i = 0; i < hc; ++i) {
          float sum = 0.0f;
          for (int64_t j = 0; j < hc; ++j) sum += c[i * hc + j];
          for (int64_t j = 0; j < hc; ++j) c[i * hc + j] /= sum + shape.hc_eps;
        }
      };
      normalise_columns();
      for (int64_t iter = 1; iter < shape.sinkhorn_iters; ++iter) {
        normalise_rows();
        normalise_columns();
      }
      const float* x = streams + t * width;
      float* out = collapsed + t * shape.hidden;
      for (int64_t d = 0; d < shape.hidden; ++d) {
        float sum = 0.0f;
        for (int64_t i = 0; i < hc; ++i) sum += pre[static_cast<size_t>(i)] * x[i * shape.hidden + d];
        out[d] = sum;
      }
    }
  });
}

void CpuBackend::mhc_post(const MhcShape& shape, const float* post, const float* comb, const float* block_out,
                          float* streams) {
  const int64_t hc = shape.hc_mult, hidden = shape.hidden;
  ThreadPool::global().parallel_for(shape.num_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> mixed(static_cast<size_t>(hc * hidden));
    for (int64_t t = begin; t < end; ++t) {
      float* x = streams + t * hc * hidden;
      const float* c = comb + t * hc * hc;
      const float* y = block_out + t * hidden;
      for (int64_t j = 0; j < hc; ++j) {
        for (int64_t d = 0; d < hidden; ++d) {
          float sum = 0.0f;
          for (int64_t i = 0; i < hc; ++i) sum += c[i * hc + j] * x[i * hidden + d];
          mixed[static_cast<size_t>(j * hidden + d)] = post[t * hc + j] * y[d] + sum;
        }
      }
      std::copy(mixed.begin(), mixed.end(), x);
    }
  });
}

}  // namespace kestrel

// KDA (Kimi Delta Attention) on the CPU: the short causal convolution, and the gated delta rule in its chunked (WY)
// and recurrent forms. Mirrors transformers' causal_conv1d_fn/update, chunk_kimi_delta_attention and
// recurrent_kimi_delta_attention (float32, q/k L2-normalised with eps 1e-6, q scaled by head_dim^-1/2).
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/thread_pool.h"

namespace kestrel {

namespace {

void l2_normalise(const float* in, int64_t n, float scale, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += in[i] * in[i];
  const float norm = std::sqrt(sum + 1e-6f);
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] / norm * scale;
}

}  // namespace

void CpuBackend::causal_conv_silu(const float* x, int64_t num_tokens, int64_t channels, int64_t kernel,
                                  const float* weight, float* conv_state, float* y) {
  const int64_t history = kernel - 1;
  ThreadPool::global().parallel_for(
      channels,
      [&](int64_t begin, int64_t end) {
        std::vector<float> window(static_cast<size_t>(history + num_tokens));
        for (int64_t c = begin; c < end; ++c) {
          for (int64_t s = 0; s < history; ++s) window[static_cast<size_t>(s)] = conv_state[s * channels + c];
          for (int64_t t = 0; t < num_tokens; ++t) window[static_cast<size_t>(history + t)] = x[t * channels + c];
          const float* w = weight + c * kernel;
          for (int64_t t = 0; t < num_tokens; ++t) {
            float sum = 0.0f;
            for (int64_t j = 0; j < kernel; ++j) sum += w[j] * window[static_cast<size_t>(t + j)];
            y[t * channels + c] = sum / (1.0f + std::exp(-sum));
          }
          for (int64_t s = 0; s < history; ++s) {
            conv_state[s * channels + c] = window[static_cast<size_t>(num_tokens + s)];
          }
        }
      },
      64);
}

void CpuBackend::kda_recurrent(const KdaArgs& a) {
  const int64_t H = a.num_heads, D = a.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  ThreadPool::global().parallel_for(H, [&](int64_t begin, int64_t end) {
    std::vector<float> q(static_cast<size_t>(D)), k(static_cast<size_t>(D)), delta(static_cast<size_t>(D));
    for (int64_t h = begin; h < end; ++h) {
      float* S = a.state + h * D * D;  // S[c * D + v]
      for (int64_t t = 0; t < a.num_tokens; ++t) {
        const int64_t row = (t * H + h) * D;
        l2_normalise(a.q + row, D, scale, q.data());
        l2_normalise(a.k + row, D, 1.0f, k.data());
        for (int64_t c = 0; c < D; ++c) {
          const float decay = std::exp(a.g[row + c]);
          for (int64_t v = 0; v < D; ++v) S[c * D + v] *= decay;
        }
        const float beta = a.beta[t * H + h];
        for (int64_t v = 0; v < D; ++v) {
          float memory = 0.0f;
          for (int64_t c = 0; c < D; ++c) memory += S[c * D + v] * k[static_cast<size_t>(c)];
          delta[static_cast<size_t>(v)] = (a.v[row + v] - memory) * beta;
        }
        for (int64_t c = 0; c < D; ++c) {
          for (int64_t v = 0; v < D; ++v) S[c * D + v] += k[static_cast<size_t>(c)] * delta[static_cast<size_t>(v)];
        }
        for (int64_t v = 0; v < D; ++v) {
          float sum = 0.0f;
          for (int64_t c = 0; c < D; ++c) sum += S[c * D + v] * q[static_cast<size_t>(c)];
          a.out[row + v] = sum;
        }
      }
    }
  });
}

// The WY form over chunks of C tokens: inside a chunk, T = (I + L)^-1 turns the delta rule into dense products;
// across chunks only the [D, D] state is carried. Same algebra as transformers' chunk_kimi_delta_attention.
void CpuBackend::kda_chunked(const KdaArgs& a, int64_t C) {
  const int64_t H = a.num_heads, D = a.head_dim, T = a.num_tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  ThreadPool::global().parallel_for(H, [&](int64_t begin, int64_t end) {
    const auto sz = [](int64_t n) { return static_cast<size_t>(n); };
    std::vector<float> q(sz(C * D)), k(sz(C * D)), g(sz(C * D)), beta(sz(C));
    std::vector<float> A(sz(C * C)), U(sz(C * D)), W(sz(C * D)), Vnew(sz(C * D)), intra(sz(C * C));
    for (int64_t h = begin; h < end; ++h) {
      float* S = a.state + h * D * D;
      for (int64_t start = 0; start < T; start += C) {
        const int64_t L = std::min(C, T - start);
        // Load the chunk: normalised q (scaled) and k, cumulative log-decay g, beta.
        for (int64_t i = 0; i < L; ++i) {
          const int64_t row = ((start + i) * H + h) * D;
          l2_normalise(a.q + row, D, scale, &q[sz(i * D)]);
          l2_normalise(a.k + row, D, 1.0f, &k[sz(i * D)]);
          for (int64_t c = 0; c < D; ++c) g[sz(i * D + c)] = a.g[row + c] + (i > 0 ? g[sz((i - 1) * D + c)] : 0.0f);
          beta[sz(i)] = a.beta[(start + i) * H + h];
        }
        // A[i][j] = -beta_i * sum_c k_i[c] k_j[c] exp(g_i[c] - g_j[c]) for j < i, then forward substitution and +I.
        std::fill(A.begin(), A.end(), 0.0f);
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t j = 0; j < i; ++j) {
            float sum = 0.0f;
            for (int64_t c = 0; c < D; ++c) {
              sum += k[sz(i * D + c)] * beta[sz(i)] * k[sz(j * D + c)] * std::exp(g[sz(i * D + c)] - g[sz(j * D + c)]);
            }
            A[sz(i * C + j)] = -sum;
          }
        }
        for (int64_t i = 1; i < L; ++i) {
          std::vector<float> row(A.begin() + i * C, A.begin() + i * C + i);
          for (int64_t j = 0; j < i; ++j) {
            float sum = row[sz(j)];
            for (int64_t m = 0; m < i; ++m) sum += row[sz(m)] * A[sz(m * C + j)];
            A[sz(i * C + j)] = sum;
          }
        }
        for (int64_t i = 0; i < L; ++i) A[sz(i * C + i)] = 1.0f;
        // U = A (beta v), W = A (beta k exp(g)).
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t c = 0; c < D; ++c) {
            float u = 0.0f, w = 0.0f;
            for (int64_t j = 0; j <= i; ++j) {
              const float coefficient = A[sz(i * C + j)] * beta[sz(j)];
              u += coefficient * a.v[((start + j) * H + h) * D + c];
              w += coefficient * k[sz(j * D + c)] * std::exp(g[sz(j * D + c)]);
            }
            U[sz(i * D + c)] = u;
            W[sz(i * D + c)] = w;
          }
        }
        // Vnew = U - W S; intra[i][j] = sum_c q_i[c] k_j[c] exp(g_i[c] - g_j[c]) for j <= i.
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t v = 0; v < D; ++v) {
            float sum = 0.0f;
            for (int64_t c = 0; c < D; ++c) sum += W[sz(i * D + c)] * S[c * D + v];
            Vnew[sz(i * D + v)] = U[sz(i * D + v)] - sum;
          }
          for (int64_t j = 0; j <= i; ++j) {
            float sum = 0.0f;
            for (int64_t c = 0; c < D; ++c) {
              sum += q[sz(i * D + c)] * k[sz(j * D + c)] * std::exp(g[sz(i * D + c)] - g[sz(j * D + c)]);
            }
            intra[sz(i * C + j)] = sum;
          }
        }
        // O = (q exp(g)) S + intra Vnew.
        for (int64_t i = 0; i < L; ++i) {
          float* out = a.out + ((start + i) * H + h) * D;
          for (int64_t v = 0; v < D; ++v) {
            float inter = 0.0f;
            for (int64_t c = 0; c < D; ++c) inter += q[sz(i * D + c)] * std::exp(g[sz(i * D + c)]) * S[c * D + v];
            float local = 0.0f;
            for (int64_t j = 0; j <= i; ++j) local += intra[sz(i * C + j)] * Vnew[sz(j * D + v)];
            out[v] = inter + local;
          }
        }
        // S = diag(exp(g_last)) S + sum_j (k_j exp(g_last - g_j)) ⊗ Vnew_j.
        const float* g_last = &g[sz((L - 1) * D)];
        for (int64_t c = 0; c < D; ++c) {
          const float decay = std::exp(g_last[c]);
          for (int64_t v = 0; v < D; ++v) {
            float sum = S[c * D + v] * decay;
            for (int64_t j = 0; j < L; ++j) {
              sum += k[sz(j * D + c)] * std::exp(g_last[c] - g[sz(j * D + c)]) * Vnew[sz(j * D + v)];
            }
            S[c * D + v] = sum;
          }
        }
      }
    }
  });
}

}  // namespace kestrel

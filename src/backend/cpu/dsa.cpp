// DeepSeek sparse attention on the CPU: k-pool compression of indexer keys, the lightning indexer's pool selection
// (deterministic: higher score first, then lower pool index) with the visible tail, and NoPE MLA attention over the
// selected positions in the absorbed form (queries mapped into the latent space, attention over cached latents).
// Mirrors transformers' Glm5NextTextIndexer and Glm5NextTextAttention (eager path) in float32, the latents decoded
// from the cache's format (bf16 or fp8 rows, --kv-cache-dtype).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/thread_pool.h"

namespace kestrel {

void CpuBackend::kpool_compress(const PagedRows& keys, const PagedRows& gates, const float* ape, int64_t first_pool,
                                int64_t num_pools, int64_t kpool, float* pooled_rows) {
  const int64_t dim = keys.row_width();
  require(num_pools >= 0 && (first_pool + num_pools) * kpool <= std::min(keys.size(), gates.size()),
          "k-pool compression of pools {}..{} needs rows the cache does not hold", first_pool, first_pool + num_pools);
  std::vector<float> logits(static_cast<size_t>(kpool));
  for (int64_t p = 0; p < num_pools; ++p) {
    const int64_t pool = first_pool + p;
    float* pooled = pooled_rows + p * dim;
    for (int64_t c = 0; c < dim; ++c) {
      float max_logit = -INFINITY;
      for (int64_t s = 0; s < kpool; ++s) {
        logits[static_cast<size_t>(s)] = gates.row(pool * kpool + s)[c] + ape[s * dim + c];
        max_logit = std::max(max_logit, logits[static_cast<size_t>(s)]);
      }
      float total = 0.0f;
      for (int64_t s = 0; s < kpool; ++s) {
        logits[static_cast<size_t>(s)] = std::exp(logits[static_cast<size_t>(s)] - max_logit);
        total += logits[static_cast<size_t>(s)];
      }
      float sum = 0.0f;
      for (int64_t s = 0; s < kpool; ++s) sum += logits[static_cast<size_t>(s)] / total * keys.row(pool * kpool + s)[c];
      pooled[c] = sum;
    }
  }
}

void CpuBackend::indexer_select(const IndexerArgs& a) {
  require(a.positions_stride >= indexer_max_positions(a.topk_pools, a.kpool),
          "indexer selection stride {} is below the longest selection ({})", a.positions_stride,
          indexer_max_positions(a.topk_pools, a.kpool));
  const int64_t num_pools = a.pooled_keys->size();
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  ThreadPool::global().parallel_for(a.num_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<int64_t> order, positions;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t position = a.start + t;
      // Pools whose last token the query can see: p * kpool + kpool - 1 <= position.
      const int64_t visible_pools = std::min(num_pools, (position + 1) / a.kpool);
      scores.assign(static_cast<size_t>(visible_pools), 0.0f);
      for (int64_t p = 0; p < visible_pools; ++p) {
        const float* key = a.pooled_keys->row(p);
        float score = 0.0f;
        for (int64_t h = 0; h < a.num_heads; ++h) {
          const float* q = a.query + (t * a.num_heads + h) * a.head_dim;
          float dot = 0.0f;
          for (int64_t c = 0; c < a.head_dim; ++c) dot += q[c] * key[c];
          const float weight = a.weights[t * a.num_heads + h] * a.weights_scale;
          score += weight * std::max(dot * softmax_scale, 0.0f);
        }
        scores[static_cast<size_t>(p)] = score;
      }
      order.resize(static_cast<size_t>(visible_pools));
      std::iota(order.begin(), order.end(), int64_t{0});
      const int64_t keep = std::min(a.topk_pools, visible_pools);
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t x, int64_t y) {
        const float sx = scores[static_cast<size_t>(x)], sy = scores[static_cast<size_t>(y)];
        return sx != sy ? sx > sy : x < y;
      });
      positions.clear();
      for (int64_t i = 0; i < keep; ++i) {
        const int64_t pool = order[static_cast<size_t>(i)];
        for (int64_t s = 0; s < a.kpool; ++s) positions.push_back(pool * a.kpool + s);
      }
      if (a.select_tail) {
        const int64_t tail = (position + 1) % a.kpool;
        for (int64_t p = position + 1 - tail; p <= position; ++p) positions.push_back(p);
      }
      std::sort(positions.begin(), positions.end());
      int32_t* out = a.positions + t * a.positions_stride;
      std::fill(out, out + a.positions_stride, -1);
      for (size_t i = 0; i < positions.size(); ++i) out[i] = static_cast<int32_t>(positions[i]);
      a.counts[t] = static_cast<int32_t>(positions.size());
    }
  });
}

namespace {

// The rows of `cache` at `positions` as float32: the pool's own rows when it keeps float32, else decoded into
// `decoded`.
void selected_rows(const PagedRows& cache, std::span<const int32_t> positions, std::vector<float>& decoded,
                   std::vector<const float*>& rows) {
  rows.resize(positions.size());
  if (cache.format().dtype == CacheDtype::float32) {
    for (size_t i = 0; i < positions.size(); ++i) rows[i] = cache.row(positions[i]);
    return;
  }
  const auto width = static_cast<size_t>(cache.row_width());
  decoded.resize(positions.size() * width);
  for (size_t i = 0; i < positions.size(); ++i) {
    decode_row(cache.format(), cache.row_bytes(positions[i]), &decoded[i * width]);
    rows[i] = &decoded[i * width];
  }
}

}  // namespace

void CpuBackend::sparse_mla_attention(const SparseMlaArgs& a) {
  const int64_t rank = a.kv_lora_rank, qk = a.qk_head_dim, vd = a.v_head_dim;
  ThreadPool::global().parallel_for(a.num_heads, [&](int64_t begin, int64_t end) {
    const auto sz = [](int64_t n) { return static_cast<size_t>(n); };
    std::vector<float> w_uk(sz(qk * rank)), w_uv(sz(vd * rank)), q_latent(sz(rank)), o_latent(sz(rank)), probs;
    std::vector<float> decoded;
    std::vector<const float*> latents;
    for (int64_t h = begin; h < end; ++h) {
      const int64_t first_row = h * (qk + vd);
      for (int64_t r = 0; r < qk; ++r) dequantize_row(*a.kv_b, first_row + r, &w_uk[sz(r * rank)]);
      for (int64_t r = 0; r < vd; ++r) dequantize_row(*a.kv_b, first_row + qk + r, &w_uv[sz(r * rank)]);
      for (int64_t t = 0; t < a.num_tokens; ++t) {
        const float* q = a.query + (t * a.num_heads + h) * qk;
        // q_latent = W_UK^T q, so that q . (W_UK c) = q_latent . c.
        std::fill(q_latent.begin(), q_latent.end(), 0.0f);
        for (int64_t d = 0; d < qk; ++d) {
          for (int64_t r = 0; r < rank; ++r) q_latent[sz(r)] += q[d] * w_uk[sz(d * rank + r)];
        }
        const std::span<const int32_t> positions(a.positions + t * a.positions_stride, sz(a.counts[t]));
        selected_rows(*a.latents, positions, decoded, latents);
        probs.resize(positions.size());
        float max_score = -INFINITY;
        for (size_t i = 0; i < positions.size(); ++i) {
          const float* latent = latents[i];
          float score = 0.0f;
          for (int64_t r = 0; r < rank; ++r) score += q_latent[sz(r)] * latent[r];
          probs[i] = score * a.scale;
          max_score = std::max(max_score, probs[i]);
        }
        float total = 0.0f;
        for (float& p : probs) {
          p = std::exp(p - max_score);
          total += p;
        }
        std::fill(o_latent.begin(), o_latent.end(), 0.0f);
        for (size_t i = 0; i < positions.size(); ++i) {
          const float* latent = latents[i];
          const float p = probs[i] / total;
          for (int64_t r = 0; r < rank; ++r) o_latent[sz(r)] += p * latent[r];
        }
        float* out = a.out + (t * a.num_heads + h) * vd;
        for (int64_t v = 0; v < vd; ++v) {
          float sum = 0.0f;
          for (int64_t r = 0; r < rank; ++r) sum += w_uv[sz(v * rank + r)] * o_latent[sz(r)];
          out[v] = sum;
        }
      }
    }
  });
}

}  // namespace kestrel

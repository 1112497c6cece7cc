// Mixture-of-experts on the CPU: the sigmoid router with correction bias, expert groups and scaled top-k
// (transformers' Glm5NextTextTopkRouter, ties broken towards the lower index), and the routed experts, each a clamped
// SwiGLU MLP applied to the tokens routed to it.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace kestrel {

namespace {

// Indices of the k largest values, ordered by value (descending) and then index (ascending).
std::vector<int64_t> top_k_indices(const std::vector<float>& values, int64_t k) {
  std::vector<int64_t> order(values.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    const float va = values[static_cast<size_t>(a)], vb = values[static_cast<size_t>(b)];
    return va != vb ? va > vb : a < b;
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

}  // namespace

void CpuBackend::route_experts(const RouterArgs& a) {
  const int64_t E = a.num_experts, group_size = E / a.n_group;
  std::vector<float> scores(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      scores[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-a.logits[t * E + e]));
      const float c = scores[static_cast<size_t>(e)] + a.correction_bias[e];
      choice[static_cast<size_t>(e)] = std::isnan(c) ? -INFINITY : c;  // ranks last: the order stays total
    }
    // Group score = sum of the group's two best choices; experts outside the topk_group best groups are excluded.
    std::vector<float> group_scores(static_cast<size_t>(a.n_group));
    for (int64_t grp = 0; grp < a.n_group; ++grp) {
      std::vector<float> members(choice.begin() + grp * group_size, choice.begin() + (grp + 1) * group_size);
      const auto best = top_k_indices(members, 2);
      const float sum = members[static_cast<size_t>(best[0])] + members[static_cast<size_t>(best[1])];
      group_scores[static_cast<size_t>(grp)] = std::isnan(sum) ? -INFINITY : sum;
    }
    const auto kept_groups = top_k_indices(group_scores, a.topk_group);
    std::vector<float> masked(static_cast<size_t>(E), -INFINITY);
    for (const int64_t grp : kept_groups) {
      for (int64_t e = grp * group_size; e < (grp + 1) * group_size; ++e) masked[static_cast<size_t>(e)] = choice[static_cast<size_t>(e)];
    }
    const auto experts = top_k_indices(masked, a.top_k);
    float total = 0.0f;
    for (const int64_t e : experts) total += scores[static_cast<size_t>(e)];
    for (int64_t i = 0; i < a.top_k; ++i) {
      const int64_t e = experts[static_cast<size_t>(i)];
      float weight = scores[static_cast<size_t>(e)];
      if (a.norm_topk_prob) weight /= total + 1e-20f;
      a.expert_ids[t * a.top_k + i] = static_cast<int32_t>(e);
      a.expert_weights[t * a.top_k + i] = weight * a.routed_scaling_factor;
    }
  }
}

void CpuBackend::moe_experts(const MoeArgs& a) {
  const int64_t D = a.hidden, I = a.intermediate;
  const auto num_experts = static_cast<int64_t>(a.experts->size());
  for (int64_t e = 0; e < num_experts; ++e) {
    std::vector<int64_t> tokens;
    std::vector<float> weights;
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      for (int64_t i = 0; i < a.top_k; ++i) {
        if (a.expert_ids[t * a.top_k + i] == e) {
          tokens.push_back(t);
          weights.push_back(a.expert_weights[t * a.top_k + i]);
        }
      }
    }
    if (tokens.empty()) continue;
    const auto n = static_cast<int64_t>(tokens.size());
    std::vector<float> x(static_cast<size_t>(n * D)), gate(static_cast<size_t>(n * I)), up(static_cast<size_t>(n * I));
    std::vector<float> hidden(static_cast<size_t>(n * I)), y(static_cast<size_t>(n * D));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(a.x + tokens[static_cast<size_t>(i)] * D, D, x.begin() + i * D);
    }
    const ExpertWeights& expert = (*a.experts)[static_cast<size_t>(e)];
    linear(x.data(), n, expert.gate, gate.data());
    linear(x.data(), n, expert.up, up.data());
    clamped_swiglu(gate.data(), up.data(), n, I, a.swiglu_limit, hidden.data());
    linear(hidden.data(), n, expert.down, y.data());
    for (int64_t i = 0; i < n; ++i) {
      float* out = a.out + tokens[static_cast<size_t>(i)] * D;
      for (int64_t d = 0; d < D; ++d) out[d] += weights[static_cast<size_t>(i)] * y[static_cast<size_t>(i * D + d)];
    }
  }
}

}  // namespace kestrel

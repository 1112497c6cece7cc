#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "base/error.h"

namespace kestrel {

namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// The raw logits' log-softmax at `token` and at the `num_top` most likely tokens (weights summed in double; NaN logits
// count for nothing).
SampleLogprobs raw_logprobs(std::span<const float> raw, int32_t token, int64_t num_top) {
  const float max_logit = largest_logit(raw);
  const double log_total = max_logit + std::log(kept_weight_total(raw, token_weights(raw, max_logit), kMinusInfinity));
  const auto logprob = [&](int32_t id) { return static_cast<float>(raw[static_cast<size_t>(id)] - log_total); };

  SampleLogprobs result{.logprob = logprob(token), .rank = 1, .top = {}};
  for (const float l : raw) result.rank += l > raw[static_cast<size_t>(token)] ? 1 : 0;
  if (num_top == 0) return result;
  thread_local std::vector<uint64_t> keys;
  keys.clear();
  for (size_t i = 0; i < raw.size(); ++i) {
    if (!std::isnan(raw[i])) keys.push_back(rank_key(raw[i], static_cast<int32_t>(i)));
  }
  const auto top = keys.begin() + std::min<std::ptrdiff_t>(num_top, static_cast<std::ptrdiff_t>(keys.size()));
  std::partial_sort(keys.begin(), top, keys.end(), std::greater<>());
  for (auto key = keys.begin(); key != top; ++key) {
    result.top.push_back({.token_id = id_of_rank_key(*key), .logprob = logprob(id_of_rank_key(*key))});
  }
  return result;
}

// Repetition penalty on every token of the prompt and the output, once each; frequency and presence penalties on the
// output's tokens by their counts. Marks and counts live in per-vocabulary arrays kept from call to call (a sort of the
// tokens took milliseconds a draw at long prompts) and are cleared by a second pass over the same tokens.
void apply_penalties(std::span<float> logits, const SamplingInput& in) {
  const SamplingParams& p = in.params;
  if (p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f) return;
  // Every id is checked before any mark is set, so that a refusal leaves the arrays clear.
  for (const std::span<const int32_t> tokens : {in.prompt, in.output}) {
    for (const int32_t id : tokens) {
      require(id >= 0 && static_cast<size_t>(id) < logits.size(), "token id {} is outside the vocabulary ({} logits)",
              id, logits.size());
    }
  }
  const auto slot = [](int32_t id) { return static_cast<size_t>(id); };
  if (p.repetition_penalty != 1.0f) {
    thread_local std::vector<uint8_t> seen;
    seen.resize(logits.size());
    for (const std::span<const int32_t> tokens : {in.prompt, in.output}) {
      for (const int32_t id : tokens) {
        const size_t i = slot(id);
        if (seen[i] != 0) continue;
        seen[i] = 1;
        logits[i] = logits[i] > 0.0f ? logits[i] / p.repetition_penalty : logits[i] * p.repetition_penalty;
      }
    }
    for (const std::span<const int32_t> tokens : {in.prompt, in.output}) {
      for (const int32_t id : tokens) seen[static_cast<size_t>(id)] = 0;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    thread_local std::vector<int32_t> counts;
    counts.resize(logits.size());
    for (const int32_t id : in.output) ++counts[slot(id)];
    for (const int32_t id : in.output) {
      int32_t& count = counts[static_cast<size_t>(id)];
      if (count == 0) continue;  // applied at the id's first occurrence
      logits[static_cast<size_t>(id)] -= p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
      count = 0;
    }
  }
}

}  // namespace

TokenDraw token_draw(const SamplingParams& params, std::mt19937_64& rng) {
  TokenDraw draw{.temperature = params.temperature, .min_p = params.min_p, .top_p = params.top_p,
                 .top_k = params.top_k, .u = 0.0};
  if (!draw.greedy()) draw.u = uniform_of(rng());
  return draw;
}

bool needs_only_logits(const SamplingInput& in) {
  const SamplingParams& p = in.params;
  const bool suppresses = static_cast<int64_t>(in.output.size()) < p.min_tokens &&
                          (!p.stop_token_ids.empty() || (!p.ignore_eos && !in.eos_token_ids.empty()));
  return !p.logprobs && p.logit_bias.empty() && !suppresses && p.repetition_penalty == 1.0f &&
         p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f;
}

SampledToken sample_token(std::span<float> logits, const SamplingInput& in) {
  const SamplingParams& p = in.params;
  std::vector<float> raw;
  if (p.logprobs) raw.assign(logits.begin(), logits.end());

  for (const auto& [id, bias] : p.logit_bias) logits[static_cast<size_t>(id)] += bias;
  if (static_cast<int64_t>(in.output.size()) < p.min_tokens) {
    for (const int32_t id : p.stop_token_ids) logits[static_cast<size_t>(id)] = kMinusInfinity;
    if (!p.ignore_eos) {
      for (const int32_t id : in.eos_token_ids) logits[static_cast<size_t>(id)] = kMinusInfinity;
    }
  }
  apply_penalties(logits, in);

  SampledToken result{.token_id = draw_token(logits, token_draw(p, in.rng)), .logprobs = {}};
  if (p.logprobs) result.logprobs = raw_logprobs(raw, result.token_id, *p.logprobs);
  return result;
}

}  // namespace kestrel

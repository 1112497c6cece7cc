#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace kestrel {

namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Higher logit first, then lower id: the order of every ranking here.
bool ranks_before(std::span<const float> logits, int32_t a, int32_t b) {
  const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
  return la != lb ? la > lb : a < b;
}

SampleLogprobs raw_logprobs(std::span<const float> raw, int32_t token, int64_t num_top) {
  const float max_logit = *std::max_element(raw.begin(), raw.end());
  double total = 0.0;
  for (const float l : raw) total += std::exp(static_cast<double>(l) - max_logit);
  const double log_total = max_logit + std::log(total);
  const auto logprob = [&](int32_t id) { return static_cast<float>(raw[static_cast<size_t>(id)] - log_total); };

  SampleLogprobs result{.logprob = logprob(token), .rank = 1, .top = {}};
  for (const float l : raw) result.rank += l > raw[static_cast<size_t>(token)] ? 1 : 0;
  std::vector<int32_t> ids(raw.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto top = std::min<size_t>(static_cast<size_t>(num_top), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(top), ids.end(),
                    [&](int32_t a, int32_t b) { return ranks_before(raw, a, b); });
  for (size_t i = 0; i < top; ++i) result.top.push_back({.token_id = ids[i], .logprob = logprob(ids[i])});
  return result;
}

void apply_penalties(std::span<float> logits, const SamplingInput& in) {
  const SamplingParams& p = in.params;
  if (p.repetition_penalty != 1.0f) {
    std::vector<int32_t> seen(in.prompt.begin(), in.prompt.end());
    seen.insert(seen.end(), in.output.begin(), in.output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (const int32_t id : seen) {
      float& l = logits[static_cast<size_t>(id)];
      l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    std::vector<int32_t> generated(in.output.begin(), in.output.end());
    std::sort(generated.begin(), generated.end());
    for (auto run = generated.begin(); run != generated.end();) {
      const auto run_end = std::upper_bound(run, generated.end(), *run);
      const auto count = static_cast<float>(run_end - run);
      logits[static_cast<size_t>(*run)] -= p.frequency_penalty * count + p.presence_penalty;
      run = run_end;
    }
  }
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Temperature, min_p, top_k, top_p, then one draw.
int32_t sample_random(std::span<float> logits, const SamplingParams& p, std::mt19937_64& rng) {
  for (float& l : logits) l /= p.temperature;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  if (max_logit == kMinusInfinity) return 0;
  // min_p: p_i >= min_p * p_max, i.e. l_i - l_max >= log(min_p).
  const float floor = p.min_p > 0.0f ? max_logit + std::log(p.min_p) : kMinusInfinity;
  std::vector<int32_t> kept;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > kMinusInfinity && logits[i] >= floor) kept.push_back(static_cast<int32_t>(i));
  }
  const auto ranking = [&](int32_t a, int32_t b) { return ranks_before(logits, a, b); };
  if (p.top_k > 0 && p.top_k < static_cast<int64_t>(kept.size())) {
    std::nth_element(kept.begin(), kept.begin() + (p.top_k - 1), kept.end(), ranking);
    const float kth = logits[static_cast<size_t>(kept[static_cast<size_t>(p.top_k - 1)])];
    std::erase_if(kept, [&](int32_t id) { return logits[static_cast<size_t>(id)] < kth; });
  }
  std::sort(kept.begin(), kept.end(), ranking);
  std::vector<double> weights(kept.size());
  double total = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    weights[i] = std::exp(static_cast<double>(logits[static_cast<size_t>(kept[i])]) - max_logit);
    total += weights[i];
  }
  if (p.top_p < 1.0f) {
    // Keep the most likely tokens while the mass before each is below top_p (at least one).
    double mass = 0.0;
    size_t keep = 0;
    while (keep < kept.size() && mass < p.top_p * total) mass += weights[keep++];
    kept.resize(keep);
    weights.resize(keep);
    total = mass;
  }
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    cumulative += weights[i];
    if (u < cumulative) return kept[i];
  }
  return kept.back();
}

}  // namespace

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

  SampledToken result{.token_id = p.greedy() ? argmax(logits) : sample_random(logits, p, in.rng), .logprobs = {}};
  if (p.logprobs) result.logprobs = raw_logprobs(raw, result.token_id, *p.logprobs);
  return result;
}

}  // namespace kestrel

#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "base/error.h"

namespace kestrel {

namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// The largest logit, NaN ignored (so never kept): eight running maxima, so that the compares do not wait on each other.
float largest_logit(std::span<const float> logits) {
  constexpr size_t kLanes = 8;
  float largest[kLanes];
  std::fill(std::begin(largest), std::end(largest), kMinusInfinity);
  size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) largest[j] = logits[i + j] > largest[j] ? logits[i + j] : largest[j];
  }
  for (; i < logits.size(); ++i) largest[0] = logits[i] > largest[0] ? logits[i] : largest[0];
  float result = kMinusInfinity;
  for (const float l : largest) result = l > result ? l : result;
  return result;
}

// A token's place in the ranking as one integer, larger ranking first: the logit's bits made monotonic (-0 as +0, so
// that equal logits tie), then the id inverted (ties go to the lower id). Sorting these needs no lookups.
uint64_t rank_key(float logit, int32_t id) {
  const uint32_t bits = std::bit_cast<uint32_t>(logit == 0.0f ? 0.0f : logit);
  const uint32_t ordered = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<uint64_t>(ordered) << 32) | ~static_cast<uint32_t>(id);
}

int32_t id_of(uint64_t key) { return static_cast<int32_t>(~static_cast<uint32_t>(key)); }

// Every token's sampling_weight(l - max_logit), in a buffer kept from call to call. The loop is vectorised (this file
// is compiled without trapping math, which lets g++ turn the weight's selects into vector blends).
std::span<const float> weights_of(std::span<const float> logits, float max_logit) {
  thread_local std::vector<float> weights;
  weights.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) weights[i] = sampling_weight(logits[i] - max_logit);
  return weights;
}

// The raw logits' log-softmax at `token` and at the `num_top` most likely tokens (weights summed in double; NaN logits
// count for nothing).
SampleLogprobs raw_logprobs(std::span<const float> raw, int32_t token, int64_t num_top) {
  const float max_logit = largest_logit(raw);
  const double log_total = max_logit + std::log(kept_weight_total(raw, weights_of(raw, max_logit), kMinusInfinity));
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
    result.top.push_back({.token_id = id_of(*key), .logprob = logprob(id_of(*key))});
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

// The first largest logit's id; NaN logits are never taken (0 when every logit is NaN or -inf).
int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  float best_logit = kMinusInfinity;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best_logit) {
      best_logit = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

// The kept tokens, put in ranking order only as far as a walk from the most likely one reaches. The first step
// takes the tokens within kHeadLogits of the most likely (a partition, no comparisons of ranks) and sorts them when
// they are few, which for a peaked distribution is where the walk ends; each later step moves the next run into place
// with nth_element and sorts that run. Every prefix is the full sort's (the keys are distinct), so the draw is the
// one a full sort would give, at a cost that follows the distribution's head rather than the vocabulary (a full
// sort of 154,880 tokens took 22 ms a token).
class RankedTokens {
public:
  RankedTokens(std::vector<uint64_t>& keys, float max_logit)
      : keys_(keys), head_(rank_key(max_logit - kHeadLogits, -1)) {}

  size_t size() const { return keys_.size(); }
  // The id of rank i (0 = most likely).
  int32_t at(size_t i) {
    if (i >= ranked_) rank_through(i + 1);
    return id_of(keys_[i]);
  }

private:
  static constexpr float kHeadLogits = 8.0f;  // the head's tokens weigh at least e^-8 of the most likely's
  static constexpr size_t kSmallHead = 4096, kFirstRun = 1024;

  void rank_through(size_t needed) {
    const auto first = keys_.begin() + static_cast<std::ptrdiff_t>(ranked_);
    if (ranked_ == 0) {
      const auto head_end = std::partition(keys_.begin(), keys_.end(), [&](uint64_t key) { return key > head_; });
      const auto head = static_cast<size_t>(head_end - keys_.begin());
      if (head >= needed && head <= kSmallHead) {
        std::sort(keys_.begin(), head_end, std::greater<>());
        ranked_ = head;
        return;
      }
    }
    const size_t count = std::min(std::max({needed, kFirstRun, 4 * ranked_}), keys_.size());
    const auto last = keys_.begin() + static_cast<std::ptrdiff_t>(count);
    if (last != keys_.end()) std::nth_element(first, last, keys_.end(), std::greater<>());
    std::sort(first, last, std::greater<>());
    ranked_ = count;
  }

  std::vector<uint64_t>& keys_;
  uint64_t head_;  // keys above it are the head's
  size_t ranked_ = 0;
};

// The rank keys of the tokens whose logit is at least `threshold` (never NaN or -inf), in id order, into `kept`.
void keep_at_least(std::span<const float> logits, float threshold, std::vector<uint64_t>& kept) {
  kept.resize(logits.size());
  size_t count = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > kMinusInfinity && logits[i] >= threshold) {
      kept[count++] = rank_key(logits[i], static_cast<int32_t>(i));
    }
  }
  kept.resize(count);
}

// Temperature, min_p, top_k, top_p, then one draw. A token's weight is sampling_weight(l - l_max); the kept tokens'
// total is summed in id order in double, and the top_p prefix and the draw walk the tokens from the most likely down.
int32_t sample_random(std::span<float> logits, const SamplingParams& p, std::mt19937_64& rng) {
  if (p.temperature != 1.0f) {
    for (float& l : logits) l /= p.temperature;
  }
  const float max_logit = largest_logit(logits);
  if (max_logit == kMinusInfinity) return 0;
  const std::span<const float> weights = weights_of(logits, max_logit);
  const auto weight = [weights](int32_t id) { return static_cast<double>(weights[static_cast<size_t>(id)]); };
  // min_p: p_i >= min_p * p_max, i.e. l_i - l_max >= log(min_p).
  float threshold = p.min_p > 0.0f ? max_logit + std::log(p.min_p) : kMinusInfinity;
  thread_local std::vector<uint64_t> kept;  // the vocabulary's worth, kept from call to call
  keep_at_least(logits, threshold, kept);
  if (p.top_k > 0 && p.top_k < static_cast<int64_t>(kept.size())) {
    // top_k keeps the tokens at least as likely as the k-th (ties with it included).
    const auto kth = kept.begin() + (p.top_k - 1);
    std::nth_element(kept.begin(), kth, kept.end(), std::greater<>());
    threshold = logits[static_cast<size_t>(id_of(*kth))];
    keep_at_least(logits, threshold, kept);
  }
  double total = kept_weight_total(logits, weights, threshold);
  RankedTokens ranked(kept, max_logit);
  size_t count = ranked.size();
  if (p.top_p < 1.0f) {
    // Keep the most likely tokens while the mass before each is below top_p (at least one).
    double mass = 0.0;
    size_t keep = 0;
    while (keep < count && mass < p.top_p * total) mass += weight(ranked.at(keep++));
    count = keep;
    total = mass;
  }
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0.0;
  // Past the end (u within rounding of the total, or no weight at all: a +inf logit), the least likely token that
  // weighs anything, else the most likely.
  int32_t last_weighed = ranked.at(0);
  for (size_t i = 0; i < count; ++i) {
    const int32_t id = ranked.at(i);
    const double w = weight(id);
    cumulative += w;
    if (u < cumulative) return id;
    if (w > 0.0) last_weighed = id;
  }
  return last_weighed;
}

}  // namespace

double kept_weight_total(std::span<const float> logits, std::span<const float> weights, float threshold) {
  constexpr size_t kRuns = 8;
  double runs[kRuns] = {};
  size_t i = 0;
  for (; i + kRuns <= logits.size(); i += kRuns) {
    for (size_t j = 0; j < kRuns; ++j) runs[j] += logits[i + j] >= threshold ? weights[i + j] : 0.0f;
  }
  for (; i < logits.size(); ++i) runs[i % kRuns] += logits[i] >= threshold ? weights[i] : 0.0f;
  double total = 0.0;
  for (const double run : runs) total += run;
  return total;
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

  SampledToken result{.token_id = p.greedy() ? argmax(logits) : sample_random(logits, p, in.rng), .logprobs = {}};
  if (p.logprobs) result.logprobs = raw_logprobs(raw, result.token_id, *p.logprobs);
  return result;
}

}  // namespace kestrel

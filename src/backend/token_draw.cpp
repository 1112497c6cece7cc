#include "backend/token_draw.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace kestrel {

namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

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
    return id_of_rank_key(keys_[i]);
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

// Temperature, min_p, top_k, top_p, then the walk. The kept tokens' total is summed in id order in double, and the
// top_p prefix and the draw walk the tokens from the most likely down.
int32_t draw_random(std::span<float> logits, const TokenDraw& p) {
  if (p.temperature != 1.0f) {
    for (float& l : logits) l /= p.temperature;
  }
  const float max_logit = largest_logit(logits);
  if (max_logit == kMinusInfinity) return 0;
  const std::span<const float> weights = token_weights(logits, max_logit);
  const auto weight = [weights](int32_t id) { return static_cast<double>(weights[static_cast<size_t>(id)]); };
  // min_p: p_i >= min_p * p_max, i.e. l_i - l_max >= log(min_p).
  float threshold = p.min_p > 0.0f ? max_logit + std::log(p.min_p) : kMinusInfinity;
  thread_local std::vector<uint64_t> kept;  // the vocabulary's worth, kept from call to call
  keep_at_least(logits, threshold, kept);
  if (p.top_k > 0 && p.top_k < static_cast<int64_t>(kept.size())) {
    // top_k keeps the tokens at least as likely as the k-th (ties with it included).
    const auto kth = kept.begin() + (p.top_k - 1);
    std::nth_element(kept.begin(), kth, kept.end(), std::greater<>());
    threshold = logits[static_cast<size_t>(id_of_rank_key(*kth))];
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
  const double u = p.u * total;
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

// Eight running maxima, so that the compares do not wait on each other.
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

// The loop is vectorised (this file is compiled without trapping math, which lets g++ turn the weight's selects into
// vector blends).
std::span<const float> token_weights(std::span<const float> logits, float max_logit) {
  thread_local std::vector<float> weights;
  weights.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) weights[i] = sampling_weight(logits[i] - max_logit);
  return weights;
}

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

int32_t draw_token(std::span<float> logits, const TokenDraw& draw) {
  return draw.greedy() ? argmax(logits) : draw_random(logits, draw);
}

}  // namespace kestrel

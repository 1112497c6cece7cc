// The sampler: one sequence's next-token logits to a token, in vLLM v1's order —
//   raw logprobs (if asked) → logit_bias → min_tokens (EOS and stop ids at -inf) → repetition penalty (prompt and
//   output tokens; positive logits divided, others multiplied) → frequency and presence penalties (output tokens) →
//   greedy argmax (temperature < 1e-5; ties to the lower id)  or  logits / temperature → min_p → top_k (ties with
//   the k-th logit kept) → top_p (smallest set, most likely first, whose mass reaches p) → one draw.
// The draw is one uniform double from the request's own generator (mt19937_64, seeded with the request's seed),
// walked through the kept tokens from most to least likely; a greedy step draws nothing. A token thus depends only on
// the request's logits, its tokens so far and its generator, never on the rest of the batch.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <random>
#include <span>

#include "engine/request.h"
#include "engine/sampling_params.h"

namespace kestrel {

struct SamplingInput {
  const SamplingParams& params;
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;         // generated so far
  std::span<const int32_t> eos_token_ids;  // stop the request unless ignore_eos; suppressed before min_tokens
  std::mt19937_64& rng;
};

struct SampledToken {
  int32_t token_id;
  std::optional<SampleLogprobs> logprobs;  // when params.logprobs is set
};

// `logits` [vocab] are overwritten by the processed logits.
SampledToken sample_token(std::span<float> logits, const SamplingInput& input);

// A token's weight as the sampler and the logprobs take it, exp(x) for x = logit - largest logit <= 0: a degree-7
// polynomial on a Cody-Waite reduction, within 2 ulp of exp, 0 below -87 (where exp leaves float's normal range) and
// for NaN; float operations only, so the same bits on every machine.
inline float sampling_weight(float x) {
  const bool kept = x > -87.0f;  // false for NaN
  x = kept ? x : -87.0f;
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // x / ln 2 rounded to an integer
  const float r = (x - n * 0.693145752f) - n * 1.42860682e-6f;   // x - n ln 2, ln 2 in two parts
  float p = 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = p * r + c;
  const auto two_to_n = std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return p * two_to_n * (kept ? 1.0f : 0.0f);
}

// The weights' total over the tokens whose logit is at least `threshold` (weights[i] belongs to logits[i]): summed in
// double in eight interleaved runs of ids (so the additions do not wait on each other), then the runs in order.
double kept_weight_total(std::span<const float> logits, std::span<const float> weights, float threshold);

}  // namespace kestrel

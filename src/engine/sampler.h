// The sampler: one sequence's next-token logits to a token, in vLLM v1's order —
//   raw logprobs (if asked) → logit_bias → min_tokens (EOS and stop ids at -inf) → repetition penalty (prompt and
//   output tokens; positive logits divided, others multiplied) → frequency and presence penalties (output tokens) →
//   greedy argmax (temperature < 1e-5; ties to the lower id)  or  logits / temperature → min_p → top_k (ties with
//   the k-th logit kept) → top_p (smallest set, most likely first, whose mass reaches p) → one draw.
// The draw is one uniform double from the request's own generator (mt19937_64, seeded with the request's seed),
// taken before the logits are looked at and walked through the kept tokens from most to least likely (that last
// stage is backend/token_draw.h's draw_token, which a backend may run where the logits are); a greedy step draws
// nothing. A token thus depends only on the request's logits, its tokens so far and its generator, never on the rest
// of the batch.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>

#include "backend/token_draw.h"
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

// The sampler's draw for `params`' next token: its temperature, min_p, top_k and top_p, and (unless greedy) u from
// the request's generator, one output of it per token.
TokenDraw token_draw(const SamplingParams& params, std::mt19937_64& rng);

// Whether the next token depends on the logits and the draw alone (no logprobs, logit bias, suppression before
// min_tokens or penalties), so that the backend can draw it where the logits are (Backend::draw_tokens) with the
// token sample_token would give: the engine then passes token_draw(params, rng) to the forward instead.
bool needs_only_logits(const SamplingInput& input);

}  // namespace kestrel

#include "engine/sampling_params.h"

#include <cmath>

#include "base/error.h"

namespace kestrel {

void validate_sampling_params(const SamplingParams& p, int64_t vocab_size, int64_t max_logprobs) {
  const auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab_size; };
  require(p.n >= 1, "n must be at least 1, got {}", p.n);
  require(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature must be >= 0, got {}", p.temperature);
  require(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got {}", p.top_p);
  require(p.top_k >= -1, "top_k must be -1, 0 (off) or positive, got {}", p.top_k);
  require(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1], got {}", p.min_p);
  require(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f, "presence_penalty must be in [-2, 2], got {}",
          p.presence_penalty);
  require(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f, "frequency_penalty must be in [-2, 2], got {}",
          p.frequency_penalty);
  require(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
          "repetition_penalty must be > 0, got {}", p.repetition_penalty);
  for (const auto& [id, bias] : p.logit_bias) {
    require(in_vocab(id), "logit_bias token id {} is outside the vocabulary [0, {})", id, vocab_size);
    require(std::isfinite(bias), "logit_bias for token {} must be finite", id);
  }
  require(!p.max_tokens || *p.max_tokens >= 1, "max_tokens must be at least 1, got {}", p.max_tokens.value_or(0));
  require(p.min_tokens >= 0, "min_tokens must be >= 0, got {}", p.min_tokens);
  require(!p.max_tokens || p.min_tokens <= *p.max_tokens, "min_tokens ({}) must not exceed max_tokens ({})",
          p.min_tokens, p.max_tokens.value_or(0));
  for (const int32_t id : p.stop_token_ids) {
    require(in_vocab(id), "stop_token_ids entry {} is outside the vocabulary [0, {})", id, vocab_size);
  }
  require(!p.logprobs || (*p.logprobs >= 0 && *p.logprobs <= max_logprobs), "logprobs must be in [0, {}], got {}",
          max_logprobs, p.logprobs.value_or(0));
}

}  // namespace kestrel

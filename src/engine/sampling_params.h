// What a request asks of the sampler and of the stop checks, with vLLM's SamplingParams semantics (the server maps
// the OpenAI fields onto it; stop strings are the detokenizer's business and do not appear here).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace kestrel {

struct SamplingParams {
  int64_t n = 1;                     // completions of one prompt (siblings share its prefill)
  float temperature = 1.0f;          // below 1e-5: greedy
  float top_p = 1.0f;                // (0, 1]
  int64_t top_k = 0;                 // 0 or -1: off
  float min_p = 0.0f;                // [0, 1]
  float presence_penalty = 0.0f;     // [-2, 2], on generated tokens
  float frequency_penalty = 0.0f;    // [-2, 2], on generated tokens
  float repetition_penalty = 1.0f;   // > 0, on prompt and generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias{};  // token id, added to its logit
  std::optional<uint64_t> seed{};    // completion i of n uses seed + i
  std::optional<int64_t> max_tokens{}; // unset: until max_model_len
  int64_t min_tokens = 0;            // EOS and stop_token_ids are suppressed before this many tokens
  std::vector<int32_t> stop_token_ids{};
  bool ignore_eos = false;
  std::optional<int64_t> logprobs{}; // top logprobs per token; 0: only the sampled token's

  bool greedy() const { return temperature < 1e-5f; }
};

// Throws Error naming the field when a value is out of range for a model with `vocab_size` tokens.
void validate_sampling_params(const SamplingParams& params, int64_t vocab_size, int64_t max_logprobs);

}  // namespace kestrel

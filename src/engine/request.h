// A request as the engine tracks it (owned by the scheduler), and what it reports back after each step: the new
// token ids with their logprobs, and on the last output the finish reason — enough for the server to detokenize
// incrementally, hold stop strings back and fill `usage`.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/cache_manager.h"
#include "engine/sampling_params.h"

namespace kestrel {

using Clock = std::chrono::steady_clock;

enum class FinishReason {
  stop,    // EOS or a stop_token_ids entry
  length,  // max_tokens, or max_model_len reached
  abort,   // cancelled (client gone, engine shut down)
  error,   // the engine failed while running it
};
std::string_view finish_reason_name(FinishReason reason);

struct TokenLogprob {
  int32_t token_id;
  float logprob;
};

// Log-probabilities of one sampled token under the raw model distribution: log-softmax of the logits before logit
// bias, penalties, temperature and truncation (vLLM's default, logprobs_mode "raw_logprobs").
struct SampleLogprobs {
  float logprob;                  // of the sampled token
  int64_t rank;                   // 1 + the number of tokens with a higher logprob
  std::vector<TokenLogprob> top;  // the `logprobs` most likely tokens, best first (ties: lower id first)
};

struct RequestTimes {
  Clock::time_point arrival, first_scheduled, first_token, last_token, finished;
};

struct RequestOutput {
  uint64_t request_id = 0;
  int64_t index = 0;                         // which of the n completions
  std::vector<int32_t> token_ids;            // new since the previous output
  std::vector<SampleLogprobs> logprobs;      // one per new token, when requested
  std::optional<FinishReason> finish_reason; // set on the last output of this completion
  std::optional<int32_t> stop_token_id;      // the stop_token_ids entry that ended it (EOS leaves it unset)
  std::string error;                         // with FinishReason::error
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;             // prompt tokens served by the prefix cache at first admission
  int64_t num_output_tokens = 0;             // generated so far, these included
  Clock::time_point time;                    // when the engine emitted it
  RequestTimes times;                        // complete on the last output
};

// Receives a request's outputs on the engine thread; must not block.
class OutputSink {
public:
  virtual ~OutputSink() = default;
  virtual void push(RequestOutput output) = 0;
};

// The completions of one n > 1 request. With prefix caching the others wait until the first has computed the shared
// prompt, then reuse it from the cache instead of computing it again.
struct RequestGroup {
  bool prompt_ready = false;
};

struct Request {
  uint64_t id = 0;
  int64_t index = 0;
  std::vector<int32_t> token_ids;  // the prompt, then the generated tokens
  int64_t num_prompt_tokens = 0;
  SamplingParams params;
  std::string cache_salt;
  std::shared_ptr<OutputSink> sink;
  std::shared_ptr<RequestGroup> group;  // null for n = 1
  bool leads_group = false;

  std::mt19937_64 rng;                  // advanced once per randomly sampled token
  int64_t num_computed_tokens = 0;
  std::optional<int64_t> num_cached_tokens;  // known at first admission
  SequenceCache cache;                  // valid while running
  RequestTimes times;
  bool finished = false;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt() const {
    return std::span(token_ids).first(static_cast<size_t>(num_prompt_tokens));
  }
  std::span<const int32_t> output() const {
    return std::span(token_ids).subspan(static_cast<size_t>(num_prompt_tokens));
  }
};

}  // namespace kestrel

// The body of POST /v1/chat/completions and /v1/completions, checked field by field with vLLM's rules and turned
// into what the engine and the response builder need. Every problem is an ApiError(400) naming the field; the
// model name and lengths that need the tokenizer and the engine's limits are checked by the caller.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "text/glm_tool_parser.h"

namespace kestrel::server {

enum class ToolChoice { none, auto_, required, named };

struct CompletionPrompt {
  std::optional<std::string> text;   // a string prompt
  std::vector<int32_t> token_ids;    // or token ids
};

struct GenerationRequest {
  bool chat = true;
  std::string model;                 // "" when the request names none
  SamplingParams sampling;           // max_tokens as given (resolved against the prompt length later)
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  bool continuous_usage = false;     // stream_options.continuous_usage_stats
  bool logprobs = false;             // chat: logprobs; completions: logprobs is not null
  int64_t top_logprobs = 0;          // chat: top_logprobs; completions: the logprobs count
  bool echo = false;                 // completions: prepend the prompt text
  std::string cache_salt;

  // Chat only.
  std::vector<GlmToolSpec> tools;
  ToolChoice tool_choice = ToolChoice::none;
  std::string named_tool;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();

  // Completions only: one or more prompts (choices are numbered prompt * n + i).
  std::vector<CompletionPrompt> prompts;
};

struct RequestLimits {
  int64_t max_logprobs = 20;
  int64_t max_n = 64;
  bool enable_auto_tool_choice = false;
  bool has_tool_parser = false;
};

GenerationRequest parse_chat_request(const nlohmann::json& body, const RequestLimits& limits);
GenerationRequest parse_completion_request(const nlohmann::json& body, const RequestLimits& limits);

}  // namespace kestrel::server

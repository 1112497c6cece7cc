// The JSON of OpenAI responses: chat.completion / text_completion objects, their streamed chunks, usage, and the two
// logprobs formats (chat: content[{token, logprob, bytes, top_logprobs}]; completions: tokens/token_logprobs/
// top_logprobs/text_offset). Extra fields as vLLM: reasoning_content and reasoning, stop_reason.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/choice_state.h"

namespace kestrel::server {

using ojson = nlohmann::ordered_json;

// Serialises without ever throwing on invalid UTF-8 (replaced with U+FFFD).
std::string dump_json(const ojson& value);

struct ResponseHeader {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
ojson chat_logprobs_json(const std::vector<TokenLogprobEntry>& entries);
ojson completion_logprobs_json(const std::vector<TokenLogprobEntry>& entries, int64_t text_offset);

// delta of a chat chunk: role on the first one, then reasoning, content and tool call fragments.
ojson chat_delta_json(const ChatDelta& delta, bool with_role);
ojson chat_chunk(const ResponseHeader& h, int64_t index, ojson delta, ojson logprobs,
                 const std::optional<std::string>& finish_reason, ojson stop_reason = nullptr);
ojson completion_chunk(const ResponseHeader& h, int64_t index, const std::string& text, ojson logprobs,
                       const std::optional<std::string>& finish_reason, ojson stop_reason = nullptr);
// The last streamed chunk with stream_options.include_usage: no choices, only usage.
ojson usage_chunk(const ResponseHeader& h, bool chat, ojson usage);

// The assistant message of a finished chat choice.
ojson chat_message_json(const ChoiceState& choice);
ojson chat_response(const ResponseHeader& h, const std::vector<const ChoiceState*>& choices, bool logprobs,
                    ojson usage);
// `prefixes` (echo): text put before each choice's completion.
ojson completion_response(const ResponseHeader& h, const std::vector<const ChoiceState*>& choices,
                          const std::vector<std::string>& prefixes, bool logprobs, ojson usage);

}  // namespace kestrel::server

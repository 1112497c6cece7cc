// One completion choice from token ids to API text: incremental detokenization, stop strings (held back across
// token boundaries), then for chat the reasoning/tool parsers. Also keeps what the final response and `usage` need:
// the finish reason, the number of tokens that counted, and the logprobs of each token.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/chat_text_parser.h"
#include "server/stop_strings.h"
#include "text/detokenizer.h"

namespace kestrel::server {

struct TokenLogprobText {
  std::string token;  // the token's text (decoded alone)
  float logprob = 0.0f;
};
struct TokenLogprobEntry {
  int32_t token_id = 0;
  TokenLogprobText sampled;
  std::vector<TokenLogprobText> top;
};

struct ChoiceOptions {
  bool skip_special_tokens = true;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  int64_t min_tokens = 0;
  bool want_logprobs = false;
  bool chat = false;       // run `parser` over the text
  ChatTextOptions parser;
};

// What one engine output adds to a choice.
struct ChoiceUpdate {
  ChatDelta delta;  // completions use only delta.content
  std::vector<TokenLogprobEntry> logprobs;
  bool finished = false;  // this update ends the choice
};

class ChoiceState {
public:
  ChoiceState(const text::Tokenizer& tokenizer, ChoiceOptions options);

  // Applies one engine output. Outputs arriving after the choice ended (a stop string ended it while the engine
  // was still running) are ignored.
  ChoiceUpdate add(const RequestOutput& output);

  bool finished() const { return finish_reason_.has_value(); }
  // True when a stop string ended the choice before the engine did: the caller should abort the engine request.
  bool stopped_by_string() const { return stopped_by_string_; }
  // "stop", "length", "tool_calls", "abort" or "error" (set once finished).
  std::string finish_reason() const;
  // vLLM's stop_reason: the matched stop string or stop token id, else null.
  nlohmann::json stop_reason() const;
  const std::string& error() const { return error_; }

  int64_t num_tokens() const { return num_tokens_; }
  const std::string& text() const { return text_; }  // completions: the whole text
  const ChatTextParser& chat() const { return *parser_; }
  const std::vector<TokenLogprobEntry>& logprobs() const { return logprobs_; }

private:
  TokenLogprobEntry logprob_entry(int32_t id, const SampleLogprobs& lp) const;
  void emit(const std::string& text, ChoiceUpdate& out);
  void end(ChoiceUpdate& out);

  const text::Tokenizer& tokenizer_;
  ChoiceOptions options_;
  text::Detokenizer detokenizer_;
  StopStrings stops_;
  std::optional<ChatTextParser> parser_;
  std::string text_;
  std::vector<TokenLogprobEntry> logprobs_;
  int64_t num_tokens_ = 0;
  std::optional<FinishReason> finish_reason_;
  std::optional<std::string> stop_string_;
  std::optional<int32_t> stop_token_;
  bool stopped_by_string_ = false;
  std::string error_;
};

}  // namespace kestrel::server

// One chat choice's generated text split into what the API returns: reasoning (glm45 parser), content and tool
// calls (glm47 parser), as streaming deltas and accumulated for the non-streaming message. Text in, so the
// response assembly is testable without a model that writes sensible text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/glm_reasoning_parser.h"
#include "text/glm_tool_parser.h"

namespace kestrel::server {

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<GlmToolCallDelta> tool_calls;  // consecutive fragments of one call merged
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ChatTextOptions {
  std::optional<bool> thinking;           // set: run the reasoning parser with this thinking mode
  std::optional<std::vector<GlmToolSpec>> tools;  // set: run the tool parser over the content
  GlmToolCallIdGenerator make_id;         // tests inject fixed ids
};

class ChatTextParser {
public:
  explicit ChatTextParser(ChatTextOptions options);

  ChatDelta feed(std::string_view text);
  // End of the output: flushes held-back text and completes an open call.
  ChatDelta finish();

  // Everything so far, for the non-streaming message.
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<GlmToolCall>& tool_calls() const { return calls_; }

private:
  void route(GlmReasoningDelta in, ChatDelta& out);
  void add_tool_items(std::vector<GlmToolStreamItem> items, ChatDelta& out);

  std::optional<GlmReasoningParser> reasoning_parser_;
  std::optional<GlmToolParser> tool_parser_;
  std::string reasoning_, content_;
  std::vector<GlmToolCall> calls_;
};

}  // namespace kestrel::server

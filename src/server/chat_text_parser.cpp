#include "server/chat_text_parser.h"

#include <utility>

namespace kestrel::server {

ChatTextParser::ChatTextParser(ChatTextOptions options) {
  if (options.thinking) reasoning_parser_.emplace(*options.thinking);
  if (options.tools) tool_parser_.emplace(*options.tools, std::move(options.make_id));
}

ChatDelta ChatTextParser::feed(std::string_view text) {
  ChatDelta out;
  if (reasoning_parser_) {
    route(reasoning_parser_->feed(text), out);
  } else {
    route(GlmReasoningDelta{.reasoning = {}, .content = std::string(text)}, out);
  }
  return out;
}

ChatDelta ChatTextParser::finish() {
  ChatDelta out;
  if (reasoning_parser_) route(reasoning_parser_->finish(), out);
  if (tool_parser_) add_tool_items(tool_parser_->finish(), out);
  return out;
}

void ChatTextParser::route(GlmReasoningDelta in, ChatDelta& out) {
  reasoning_ += in.reasoning;
  out.reasoning += in.reasoning;
  if (in.content.empty()) return;
  if (tool_parser_) {
    add_tool_items(tool_parser_->feed(in.content), out);
  } else {
    content_ += in.content;
    out.content += in.content;
  }
}

void ChatTextParser::add_tool_items(std::vector<GlmToolStreamItem> items, ChatDelta& out) {
  for (auto& item : items) {
    if (item.kind == GlmToolStreamItem::Kind::kContent) {
      content_ += item.content;
      out.content += item.content;
      continue;
    }
    GlmToolCallDelta& d = item.tool_call;
    if (d.id || d.name) {
      calls_.push_back({.id = d.id.value_or(""), .name = d.name.value_or(""), .arguments = {}});
    }
    if (d.index >= 0 && static_cast<size_t>(d.index) < calls_.size()) calls_[static_cast<size_t>(d.index)].arguments += d.arguments;
    if (!out.tool_calls.empty() && out.tool_calls.back().index == d.index && !d.id && !d.name) {
      out.tool_calls.back().arguments += d.arguments;
    } else {
      out.tool_calls.push_back(std::move(d));
    }
  }
}

}  // namespace kestrel::server

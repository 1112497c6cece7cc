#include "text/glm_reasoning_parser.h"

#include <algorithm>
#include <array>

#include "base/error.h"

namespace kestrel {

namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCallStart = "<tool_call>";
constexpr std::string_view kToolCallEnd = "</tool_call>";

// Tag lists per state; the index is the tag's identity.
constexpr std::array<std::string_view, 3> kOpenTags = {kThinkStart, kThinkEnd, kToolCallStart};
constexpr std::array<std::string_view, 1> kInToolTags = {kToolCallEnd};

bool python_truthy(const nlohmann::json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number_unsigned()) return v.get<uint64_t>() != 0;
  if (v.is_number_float()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();  // array, object, binary
}

}  // namespace

bool glm_thinking_enabled(const nlohmann::json& chat_template_kwargs) {
  if (!chat_template_kwargs.is_object()) return true;
  const auto thinking = chat_template_kwargs.find("thinking");
  const auto enable_thinking = chat_template_kwargs.find("enable_thinking");
  const bool has_thinking = thinking != chat_template_kwargs.end() && !thinking->is_null();
  const bool has_enable = enable_thinking != chat_template_kwargs.end() && !enable_thinking->is_null();
  if (!has_thinking && !has_enable) return true;
  return (has_thinking && python_truthy(*thinking)) || (has_enable && python_truthy(*enable_thinking));
}

GlmReasoningParser::GlmReasoningParser(bool thinking)
    : thinking_(thinking), state_(thinking ? State::kReasoning : State::kContent), reasoning_ended_(!thinking) {}

GlmReasoningDelta GlmReasoningParser::feed(std::string_view delta) {
  require(!finished_, "GLM reasoning parser: feed() after finish()");
  GlmReasoningDelta out;
  if (!thinking_) {
    out.content.assign(delta);
    return out;
  }
  scanner_.append(delta);
  run(false, out);
  return out;
}

GlmReasoningDelta GlmReasoningParser::finish() {
  require(!finished_, "GLM reasoning parser: finish() called twice");
  finished_ = true;
  GlmReasoningDelta out;
  if (!thinking_) return out;
  run(true, out);
  if (state_ == State::kReasoning) end_reasoning_run();
  return out;
}

void GlmReasoningParser::add_reasoning(std::string_view text, GlmReasoningDelta& out) {
  const size_t keep = glm::py_rstrip_length(text);
  if (keep == 0) {
    reasoning_ws_.append(text);
    return;
  }
  out.reasoning += reasoning_ws_;
  out.reasoning.append(text.substr(0, keep));
  reasoning_ws_.assign(text.substr(keep));
}

void GlmReasoningParser::run(bool final, GlmReasoningDelta& out) {
  while (true) {
    const std::span<const std::string_view> tags =
        state_ == State::kToolCall ? std::span<const std::string_view>(kInToolTags)
                                   : std::span<const std::string_view>(kOpenTags);
    const glm::TagScanner::Piece piece = scanner_.next(tags, final);
    if (!piece) break;
    if (!piece.is_tag) {
      if (state_ == State::kReasoning) {
        add_reasoning(piece.text, out);
      } else {
        out.content.append(piece.text);
      }
      continue;
    }
    const std::string_view tag = piece.text;
    switch (state_) {
      case State::kReasoning:
        if (tag == kThinkEnd) {
          end_reasoning_run();
          reasoning_ended_ = true;
          state_ = State::kContent;
        } else if (tag == kToolCallStart) {
          end_reasoning_run();
          reasoning_ended_ = true;
          state_ = State::kToolCall;
          out.content.append(tag);
        }
        break;  // a repeated <think> is swallowed
      case State::kContent:
        if (tag == kThinkStart) {
          state_ = State::kReasoning;
        } else if (tag == kToolCallStart) {
          state_ = State::kToolCall;
          out.content.append(tag);
        }
        break;  // a stray </think> is dropped
      case State::kToolCall:
        out.content.append(tag);  // </tool_call>
        state_ = State::kContent;
        break;
    }
  }
}

GlmReasoningResult GlmReasoningParser::parse(std::string_view text, bool thinking) {
  GlmReasoningParser parser(thinking);
  GlmReasoningDelta all = parser.feed(text);
  GlmReasoningDelta rest = parser.finish();
  all.reasoning += rest.reasoning;
  all.content += rest.content;
  GlmReasoningResult result;
  if (!all.reasoning.empty()) result.reasoning = std::move(all.reasoning);
  if (!all.content.empty()) result.content = std::move(all.content);
  result.reasoning_ended = parser.reasoning_ended();
  return result;
}

bool glm_is_reasoning_end(const std::vector<int64_t>& ids, bool thinking, const GlmSpecialTokens& tokens) {
  if (!thinking) return true;
  for (size_t i = ids.size(); i-- > 0;) {
    const int64_t id = ids[i];
    if (id == tokens.think_end || id == tokens.tool_call_start) return true;
    if (id == tokens.think_start) return false;
    if (std::find(tokens.turn_boundaries.begin(), tokens.turn_boundaries.end(), id) != tokens.turn_boundaries.end()) {
      return false;  // the current turn starts in reasoning
    }
  }
  return false;
}

std::vector<int64_t> glm_extract_content_ids(const std::vector<int64_t>& ids, bool thinking,
                                             const GlmSpecialTokens& tokens) {
  if (!thinking) return ids;
  for (size_t i = ids.size(); i-- > 0;) {
    if (ids[i] == tokens.think_end) return {ids.begin() + static_cast<std::ptrdiff_t>(i) + 1, ids.end()};
  }
  const auto tool = std::find(ids.begin(), ids.end(), tokens.tool_call_start);
  return {tool == ids.end() ? ids.begin() : tool, ids.end()};
}

}  // namespace kestrel

// The `glm45` reasoning parser with vLLM's current semantics (the unified GLM-4.7 parser engine,
// vllm/frontend/processing/parser/glm47_moe.py): see ../shared/docs/serving-peers-and-dependencies.md B.2.
//
// With thinking on (the default; the GLM-5.x generation prompt ends in `<think>`), the output starts in reasoning:
//   - a `<think>` inside reasoning is swallowed (so a leading `<think>` the model repeats is optional);
//   - `</think>` ends reasoning (the tag is dropped);
//   - `<tool_call>` also ends reasoning, and stays in the content for the tool parser;
//   - in content, a stray `</think>` is dropped and `<think>` starts reasoning again; inside a tool call
//     (`<tool_call>` ... `</tool_call>`) both are plain text;
//   - trailing whitespace of each reasoning run is dropped (vLLM's strip_trailing_reasoning_whitespace): it is held
//     back until more reasoning text shows it was inner whitespace.
// With thinking off, everything is content and the think tags are plain text.
// Tags split across deltas are never mis-decided: a tail that may still grow into a tag is held back until the
// next delta (or finish()). An incomplete UTF-8 sequence at the end of a delta is held back too, so each output
// delta is whole characters when the input is valid UTF-8. Invalid bytes pass through unchanged.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/glm_text_scan.h"

namespace kestrel {

// vLLM's rule for the request's chat_template_kwargs: thinking is on unless `thinking` or `enable_thinking` is
// given; if either is given, it is their OR (Python truthiness: false, 0, "", null, [] and {} are false).
bool glm_thinking_enabled(const nlohmann::json& chat_template_kwargs);

struct GlmReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

struct GlmReasoningResult {
  std::optional<std::string> reasoning;  // nullopt when there was none (or only whitespace)
  std::optional<std::string> content;    // nullopt when empty
  bool reasoning_ended = false;          // see GlmReasoningParser::reasoning_ended()
};

class GlmReasoningParser {
public:
  explicit GlmReasoningParser(bool thinking = true);

  GlmReasoningDelta feed(std::string_view delta);
  // End of stream: flushes held-back text (an unfinished tag is plain text). Feeding after finish() is an error.
  GlmReasoningDelta finish();

  bool thinking() const { return thinking_; }
  bool in_reasoning() const { return state_ == State::kReasoning; }
  // True once `</think>` or `<tool_call>` has ended reasoning (always true when thinking is off).
  bool reasoning_ended() const { return reasoning_ended_; }

  // One-shot parse of a whole output.
  static GlmReasoningResult parse(std::string_view text, bool thinking = true);

private:
  enum class State { kReasoning, kContent, kToolCall };

  void run(bool final, GlmReasoningDelta& out);
  void add_reasoning(std::string_view text, GlmReasoningDelta& out);
  void end_reasoning_run() { reasoning_ws_.clear(); }

  bool thinking_;
  State state_;
  bool reasoning_ended_;
  bool finished_ = false;
  std::string reasoning_ws_;  // trailing whitespace of the current reasoning run, held back
  glm::TagScanner scanner_;
};

// Token-id helpers for a prompt or an output (vLLM's is_reasoning_end / extract_content_ids, B.5.4).
struct GlmSpecialTokens {
  int64_t think_start = 154841;  // <think>
  int64_t think_end = 154842;    // </think>
  int64_t tool_call_start = 154843;
  std::vector<int64_t> turn_boundaries = {154828, 154827, 154829};  // <|assistant|>, <|user|>, <|observation|>
};

// Scans backwards: true at `</think>` or `<tool_call>`, false at `<think>`; at a turn boundary (or at the start)
// the current turn has not left its initial state, which is reasoning when thinking is on. Always true when thinking
// is off.
bool glm_is_reasoning_end(const std::vector<int64_t>& ids, bool thinking = true,
                          const GlmSpecialTokens& tokens = {});
// The content part of `ids`: after the last `</think>`; else from the first `<tool_call>`; else all of it. With
// thinking off, all of it.
std::vector<int64_t> glm_extract_content_ids(const std::vector<int64_t>& ids, bool thinking = true,
                                             const GlmSpecialTokens& tokens = {});

}  // namespace kestrel

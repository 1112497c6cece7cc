// The `glm47` tool-call parser with vLLM's current semantics (the GLM-4.7 parser engine; see
// ../shared/docs/serving-peers-and-dependencies.md B.3 and ../shared/docs/glm53-flash-architecture.md §5).
//
// Format: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>, several calls in a row,
// zero-argument calls legal, whitespace/newlines around the name and between </arg_key> and <arg_value> tolerated.
// The input is the content the reasoning parser passes on (or the whole output when thinking is off).
//
//   - Name: the text between <tool_call> and the first <arg_key> or </tool_call>, Python-stripped. A call is kept
//     only if the name is one of the request's tools (any non-empty name when the request declares none); other
//     calls are dropped, with their arguments. A <tool_call> inside the name restarts the call.
//   - Arguments: pairs as vLLM's regexes find them (key lazily up to a </arg_key> followed by whitespace and
//     <arg_value>; value up to the first </arg_value>; text between pairs ignored); keys stripped, values raw.
//     Values are typed by the tool's `parameters.properties[key]` schema as coerce_to_schema_type does (types from
//     type/enum/anyOf/oneOf/allOf, tried null > integer > number > boolean > object > array > string, then a
//     json.loads fallback, then the raw string); a key missing from the schema or a tool without properties keeps
//     the string. Arguments are Python json.dumps text (", " and ": ", non-ASCII raw).
//   - Streaming: the name delta {index, id, name} goes out when the name closes; then argument fragments: every
//     completed pair, and the open value character by character when its key is string-only in the schema (or the
//     tool has no schema); other values are held until they close. The final fragment closes the object.
//   - Content outside tool calls is content. Whitespace-only content is dropped once a call is accepted (held
//     until then). An unterminated call at the end of the stream: if its name was accepted it is completed (as
//     vLLM's engine does); otherwise its raw text is returned as content.
//
// Deviations from vLLM (chosen so that the accumulated stream always equals the one-shot result):
//   - a repeated argument key keeps its first value (Python's dict would take the last one, which would rewrite
//     already streamed text);
//   - an unterminated last value at </tool_call> is kept (vLLM's final conversion drops it after streaming it);
//   - tool call indices count accepted calls only (0, 1, ...), ids are "call_" + random (injectable);
//   - content is not stripped when tools are called (vLLM strips it in the non-streaming path only).
// A request without tools, or with tool_choice "none", should bypass this parser (as vLLM does).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "text/glm_text_scan.h"

namespace kestrel {

struct GlmToolSpec {
  std::string name;
  nlohmann::json parameters;  // the JSON schema object (may be null)
};

// The function tools of an OpenAI request's `tools` array: Chat Completions style
// ({"type": "function", "function": {"name", "parameters"}}) or Responses style ({"type": "function", "name",
// "parameters"}). Other entries are skipped.
std::vector<GlmToolSpec> glm_tools_from_request(const nlohmann::json& tools);

struct GlmToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, Python json.dumps style
  bool operator==(const GlmToolCall&) const = default;
};

// One OpenAI `delta.tool_calls[]` entry. The first delta of a call carries id and name (type "function"); later
// ones only argument text. Concatenating `arguments` of one index gives the full JSON object.
struct GlmToolCallDelta {
  int index = 0;
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;
};

// The output of one feed()/finish(), in order: content runs and tool call deltas (one entry per run; consecutive
// deltas of the same call merged).
struct GlmToolStreamItem {
  enum class Kind { kContent, kToolCall };
  Kind kind = Kind::kContent;
  std::string content;
  GlmToolCallDelta tool_call;
};

struct GlmToolParseResult {
  std::optional<std::string> content;  // nullopt when empty
  std::vector<GlmToolCall> tool_calls;
};

using GlmToolCallIdGenerator = std::function<std::string()>;
// "call_" followed by 24 random alphanumerics.
std::string glm_random_tool_call_id();

class GlmToolParser {
public:
  explicit GlmToolParser(const std::vector<GlmToolSpec>& tools, GlmToolCallIdGenerator make_id = {});

  std::vector<GlmToolStreamItem> feed(std::string_view delta);
  // End of stream: flushes held-back text and completes or abandons an open call. Feeding after finish() is an error.
  std::vector<GlmToolStreamItem> finish();

  // Number of calls accepted so far.
  int tool_call_count() const { return next_index_; }

  // One-shot parse of a whole text.
  static GlmToolParseResult parse(std::string_view text, const std::vector<GlmToolSpec>& tools,
                                  GlmToolCallIdGenerator make_id = {});
  // Folds stream items (of one or many feed() calls) into the one-shot result shape.
  static GlmToolParseResult accumulate(const std::vector<GlmToolStreamItem>& items);

private:
  struct Property {
    bool streamable = true;  // string-only: an open value may stream
    bool coerce = false;     // the schema is an object: coerce by `types`
    std::unordered_set<std::string> types;  // normalised (aliases resolved)
  };
  struct Tool {
    std::unordered_map<std::string, Property> properties;  // empty: no schema, every value a string
  };
  enum class State { kContent, kName, kArgs };
  enum class ArgPhase { kBetween, kKey, kAfterKey, kValue };

  void run(bool final, std::vector<GlmToolStreamItem>& out);
  void on_content(std::string_view text, std::vector<GlmToolStreamItem>& out);
  void on_name_end(bool call_end, std::vector<GlmToolStreamItem>& out);
  void on_arg_tag(int tag, std::string_view text, std::vector<GlmToolStreamItem>& out);
  void on_arg_text(std::string_view text, std::vector<GlmToolStreamItem>& out);
  void open_value(std::vector<GlmToolStreamItem>& out);
  void append_value(std::string_view text, std::vector<GlmToolStreamItem>& out);
  void complete_value(std::vector<GlmToolStreamItem>& out);
  void start_entry(std::string key, std::vector<GlmToolStreamItem>& out);
  void close_entry(std::vector<GlmToolStreamItem>& out);
  void finish_call(std::vector<GlmToolStreamItem>& out);
  void emit_args(std::string_view text, std::vector<GlmToolStreamItem>& out);
  const Property* property(const std::string& key) const;
  void reset_call();

  std::unordered_map<std::string, Tool> tools_;
  bool any_tools_ = false;
  GlmToolCallIdGenerator make_id_;
  glm::TagScanner scanner_;
  State state_ = State::kContent;
  bool finished_ = false;
  int next_index_ = 0;

  // content
  bool content_has_text_ = false;  // non-whitespace content was emitted
  std::string pending_ws_;         // whitespace-only content held back

  // the open call
  std::string raw_;   // its text since <tool_call>, while not accepted (returned as content if unterminated)
  std::string name_;  // raw name text
  bool accepted_ = false;
  int index_ = -1;
  const Tool* tool_ = nullptr;
  ArgPhase phase_ = ArgPhase::kBetween;
  std::string key_, after_key_ws_, hidden_value_;
  bool value_visible_ = false;
  std::unordered_set<std::string> keys_;
  bool has_entry_ = false;  // "{" sent: a last entry exists
  std::string last_key_, last_raw_;
  const Property* last_prop_ = nullptr;
  bool last_streamable_ = true;
};

}  // namespace kestrel

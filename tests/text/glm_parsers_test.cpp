// Conformance tests for the GLM `glm45` reasoning and `glm47` tool-call parsers: every row of the vLLM-derived tables
// in ../shared/docs/serving-peers-and-dependencies.md B.5 (named B51_*, B52_*, ... after their table), each run
// one-shot and streamed (split at every byte boundary, byte by byte, and at random token-like splits), plus hostile
// inputs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "text/glm_reasoning_parser.h"
#include "text/glm_tool_parser.h"

namespace kestrel {
namespace {

using nlohmann::json;

struct Parsed {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
  std::vector<GlmToolCall> calls;
  bool reasoning_ended = false;
};

bool operator==(const Parsed& a, const Parsed& b) {
  return a.reasoning == b.reasoning && a.content == b.content && a.calls == b.calls &&
         a.reasoning_ended == b.reasoning_ended;
}
std::ostream& operator<<(std::ostream& os, const Parsed& p) {
  os << "{reasoning=" << (p.reasoning ? json(*p.reasoning).dump() : "None")
     << ", content=" << (p.content ? json(*p.content).dump() : "None") << ", ended=" << p.reasoning_ended
     << ", calls=[";
  for (const auto& c : p.calls) os << "(" << c.id << ", " << c.name << ", " << c.arguments << ")";
  return os << "]}";
}

GlmToolCallIdGenerator counter_ids() {
  return [n = std::make_shared<int>(0)] { return "call_" + std::to_string((*n)++); };
}

struct Pipeline {
  bool reasoning = false;  // run the reasoning parser first
  bool thinking = true;
  bool tools_on = true;    // run the tool parser
  std::vector<GlmToolSpec> tools;
};

// Streams `chunks` through the pipeline; checks the stream's shape (names before arguments, one id per call).
Parsed run_stream(const std::vector<std::string_view>& chunks, const Pipeline& setup) {
  GlmReasoningParser reasoning_parser(setup.thinking);
  GlmToolParser tool_parser(setup.tools, counter_ids());
  std::string reasoning, plain_content;
  std::vector<GlmToolStreamItem> items;
  auto to_tools = [&](std::string_view content, bool final) {
    if (!setup.tools_on) {
      plain_content += content;
      return;
    }
    std::vector<GlmToolStreamItem> got = tool_parser.feed(content);
    if (final) {
      auto rest = tool_parser.finish();
      got.insert(got.end(), rest.begin(), rest.end());
    }
    for (auto& item : got) {
      if (item.kind == GlmToolStreamItem::Kind::kContent) {
        EXPECT_FALSE(item.content.empty());
      } else {
        const auto index = static_cast<size_t>(item.tool_call.index);
        const bool first = std::none_of(items.begin(), items.end(), [&](const GlmToolStreamItem& prev) {
          return prev.kind == GlmToolStreamItem::Kind::kToolCall && prev.tool_call.index == item.tool_call.index;
        });
        EXPECT_EQ(first, item.tool_call.id.has_value()) << "id only in the first delta of call " << index;
        EXPECT_EQ(first, item.tool_call.name.has_value()) << "name only in the first delta of call " << index;
      }
      items.push_back(std::move(item));
    }
  };
  for (std::string_view chunk : chunks) {
    if (setup.reasoning) {
      GlmReasoningDelta d = reasoning_parser.feed(chunk);
      reasoning += d.reasoning;
      to_tools(d.content, false);
    } else {
      to_tools(chunk, false);
    }
  }
  if (setup.reasoning) {
    GlmReasoningDelta d = reasoning_parser.finish();
    reasoning += d.reasoning;
    to_tools(d.content, true);
  } else {
    to_tools("", true);
  }
  Parsed parsed;
  if (setup.tools_on) {
    GlmToolParseResult r = GlmToolParser::accumulate(items);
    parsed.content = r.content;
    parsed.calls = r.tool_calls;
  } else if (!plain_content.empty()) {
    parsed.content = plain_content;
  }
  if (!reasoning.empty()) parsed.reasoning = reasoning;
  parsed.reasoning_ended = setup.reasoning ? reasoning_parser.reasoning_ended() : false;
  return parsed;
}

Parsed run_once(std::string_view text, const Pipeline& setup) {
  Parsed streamed = run_stream({text}, setup);
  // The one-shot helpers agree with a one-chunk stream.
  if (setup.reasoning) {
    GlmReasoningResult r = GlmReasoningParser::parse(text, setup.thinking);
    EXPECT_EQ(r.reasoning, streamed.reasoning);
    EXPECT_EQ(r.reasoning_ended, streamed.reasoning_ended);
    if (!setup.tools_on) {
      EXPECT_EQ(r.content, streamed.content);
    }
  } else if (setup.tools_on) {
    GlmToolParseResult r = GlmToolParser::parse(text, setup.tools, counter_ids());
    EXPECT_EQ(r.content, streamed.content);
    EXPECT_EQ(r.tool_calls, streamed.calls);
  }
  return streamed;
}

// One-shot result must equal `expected`, and every streaming split must give the same result.
void expect_all_splits(std::string_view text, const Pipeline& setup, const Parsed& expected) {
  const Parsed once = run_once(text, setup);
  EXPECT_EQ(once, expected) << "one-shot: " << json(std::string(text)).dump();
  for (size_t i = 0; i <= text.size(); ++i) {
    const Parsed got = run_stream({text.substr(0, i), text.substr(i)}, setup);
    ASSERT_EQ(got, once) << "split at byte " << i << " of " << json(std::string(text)).dump();
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  ASSERT_EQ(run_stream(bytes, setup), once) << "byte by byte";
  for (size_t interval : {2, 3, 5, 8}) {  // vLLM's stream_interval / multi-token chunks
    std::vector<std::string_view> chunks;
    for (size_t i = 0; i < text.size(); i += interval) chunks.push_back(text.substr(i, interval));
    ASSERT_EQ(run_stream(chunks, setup), once) << "chunks of " << interval;
  }
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<std::string_view> chunks;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t n = std::uniform_int_distribution<size_t>(0, 12)(rng);
      chunks.push_back(text.substr(pos, n));
      pos += std::min(n, text.size() - pos);
    }
    ASSERT_EQ(run_stream(chunks, setup), once) << "random split trial " << trial;
  }
}

GlmToolSpec tool(std::string name, json parameters) { return {std::move(name), std::move(parameters)}; }
json string_props(std::initializer_list<const char*> keys) {
  json props = json::object();
  for (const char* k : keys) props[k] = {{"type", "string"}};
  return {{"type", "object"}, {"properties", props}};
}

// The tools of B.5.1: get_current_date (params {}) and get_weather{city: string, date: string}.
Pipeline b51_tools() {
  Pipeline s;
  s.tools = {tool("get_current_date", json::object()), tool("get_weather", string_props({"city", "date"}))};
  return s;
}

Parsed content_only(std::string content) {
  Parsed p;
  p.content = std::move(content);
  return p;
}
GlmToolCall call(int id, std::string name, std::string arguments) {
  return {"call_" + std::to_string(id), std::move(name), std::move(arguments)};
}

// ---------------------------------------------------------------------------------------------------------------
// B.5.1 tests/tool_parsers/test_glm47_moe_tool_parser.py

TEST(GlmToolParserTest, B51_1_PlainResponse) {
  expect_all_splits("This is a plain response.", b51_tools(), content_only("This is a plain response."));
}

TEST(GlmToolParserTest, B51_2_ZeroArgInline) {
  expect_all_splits("<tool_call>get_current_date</tool_call>", b51_tools(),
                    {std::nullopt, std::nullopt, {call(0, "get_current_date", "{}")}});
}

TEST(GlmToolParserTest, B51_3_ZeroArgNewline) {
  expect_all_splits("<tool_call>get_current_date\n</tool_call>", b51_tools(),
                    {std::nullopt, std::nullopt, {call(0, "get_current_date", "{}")}});
}

TEST(GlmToolParserTest, B51_4_ArgsSameLine) {
  expect_all_splits("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>",
                    b51_tools(), {std::nullopt, std::nullopt, {call(0, "get_weather", R"({"city": "Beijing"})")}});
}

TEST(GlmToolParserTest, B51_5_ArgsWithNewlines) {
  expect_all_splits(
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>", b51_tools(),
      {std::nullopt, std::nullopt, {call(0, "get_weather", R"({"city": "Beijing"})")}});
}

TEST(GlmToolParserTest, B51_6_ContentBefore) {
  expect_all_splits("Checking.<tool_call>get_current_date</tool_call>", b51_tools(),
                    {std::nullopt, "Checking.", {call(0, "get_current_date", "{}")}});
}

TEST(GlmToolParserTest, B51_7_Multiple) {
  expect_all_splits(
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>"
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Shanghai</arg_value></tool_call>",
      b51_tools(),
      {std::nullopt,
       std::nullopt,
       {call(0, "get_weather", R"({"city": "Beijing"})"), call(1, "get_weather", R"({"city": "Shanghai"})")}});
}

TEST(GlmToolParserTest, B51_8_WhitespaceOnlyContentIsNone) {
  expect_all_splits("  \n  <tool_call>get_current_date</tool_call>", b51_tools(),
                    {std::nullopt, std::nullopt, {call(0, "get_current_date", "{}")}});
}

TEST(GlmToolParserTest, B51_9_StreamNoArgs) {
  const Parsed got = run_stream({"<tool_call>", "get_current_date", "</tool_call>"}, b51_tools());
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0], call(0, "get_current_date", "{}"));
}

TEST(GlmToolParserTest, B51_10_StreamWithArgs) {
  const Parsed got = run_stream({"<tool_call>", "get_weather\n", "<arg_key>city</arg_key>", "<arg_value>", "Beijing",
                                 "</arg_value>", "</tool_call>"},
                                b51_tools());
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(json::parse(got.calls[0].arguments), json::parse(R"({"city": "Beijing"})"));
}

// B.5.1 #11, adapted to a delta stream (vLLM's test rewrites current_text, which a delta parser cannot see): a call
// to the undeclared prefix "get" is dropped and nothing of it streams; the name "get_weather" split as
// "get" + "_weather" is only sent once whole, in one delta, followed by its arguments.
TEST(GlmToolParserTest, B51_11_PrefixNameNotStreamed) {
  for (const bool responses_style : {false, true}) {
    const json tools_json =
        responses_style
            ? json::array({{{"type", "function"}, {"name", "get_weather"}, {"parameters", string_props({"city"})}}})
            : json::array({{{"type", "function"},
                            {"function", {{"name", "get_weather"}, {"parameters", string_props({"city"})}}}}});
    const std::vector<GlmToolSpec> tools = glm_tools_from_request(tools_json);
    ASSERT_EQ(tools.size(), 1u);

    GlmToolParser dropped(tools, counter_ids());
    auto items = dropped.feed("<tool_call>get<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>");
    auto rest = dropped.finish();
    EXPECT_TRUE(items.empty());
    EXPECT_TRUE(rest.empty());

    GlmToolParser parser(tools, counter_ids());
    EXPECT_TRUE(parser.feed("<tool_call>get").empty());
    auto step = parser.feed("_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>");
    ASSERT_EQ(step.size(), 1u);  // one coalesced delta for index 0
    EXPECT_EQ(step[0].tool_call.name, "get_weather");
    EXPECT_EQ(json::parse(step[0].tool_call.arguments), json::parse(R"({"city": "Beijing"})"));
    EXPECT_TRUE(parser.finish().empty());
  }
}

// ---------------------------------------------------------------------------------------------------------------
// B.5.2 tests/tool_parsers/test_glm47_final_delta_bug.py

TEST(GlmToolParserTest, B52_FinalDeltaIsIncremental) {
  GlmToolParser parser(b51_tools().tools, counter_ids());
  std::vector<std::string> fragments;
  bool name_seen = false;
  for (std::string_view stage : {"<tool_call>get_weather\n", "<arg_key>city</arg_key>", "<arg_value>Beijing</arg_value>",
                                 "<arg_key>date</arg_key>", "<arg_value>2025-08", "-01</arg_value>", "</tool_call>"}) {
    auto items = parser.feed(stage);
    if (stage == "</tool_call>") {
      auto rest = parser.finish();
      items.insert(items.end(), rest.begin(), rest.end());
    }
    for (const auto& item : items) {
      ASSERT_EQ(item.kind, GlmToolStreamItem::Kind::kToolCall);
      if (item.tool_call.name) name_seen = true;
      if (!item.tool_call.arguments.empty()) fragments.push_back(item.tool_call.arguments);
    }
  }
  EXPECT_TRUE(name_seen);
  ASSERT_GE(fragments.size(), 3u);
  std::string all;
  for (size_t i = 0; i < fragments.size(); ++i) {
    if (i > 0) {
      EXPECT_NE(fragments[i].front(), '{') << fragments[i];
      EXPECT_FALSE(json::accept(fragments[i]) && json::parse(fragments[i]).is_object()) << fragments[i];
    }
    all += fragments[i];
  }
  EXPECT_EQ(all, R"({"city": "Beijing", "date": "2025-08-01"})");
}

// ---------------------------------------------------------------------------------------------------------------
// B.5.3 tests/parser/engine/test_glm47_stray_tool_call.py (tool get_weather, params {})

Pipeline b53_tools() {
  Pipeline s;
  s.tools = {tool("get_weather", json::object())};
  return s;
}

TEST(GlmToolParserTest, B53_StrayToolCall) {
  expect_all_splits("Fetching. I will issue a <tool_call>get_weather</tool_call>", b53_tools(),
                    {std::nullopt, "Fetching. I will issue a ", {call(0, "get_weather", "{}")}});
  expect_all_splits("text <tool_call><tool_call>get_weather</tool_call>", b53_tools(),
                    {std::nullopt, "text ", {call(0, "get_weather", "{}")}});
  // A lone unterminated <tool_call> is no call; its text stays content.
  expect_all_splits("text <tool_call>", b53_tools(), content_only("text <tool_call>"));
  expect_all_splits("<tool_call>get_weather</tool_call>", b53_tools(),
                    {std::nullopt, std::nullopt, {call(0, "get_weather", "{}")}});
  expect_all_splits("prose <tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>BJ</arg_value></tool_call>",
                    b53_tools(), {std::nullopt, "prose ", {call(0, "get_weather", R"({"city": "BJ"})")}});
}

// ---------------------------------------------------------------------------------------------------------------
// B.5.4 tests/parser/engine/test_glm47_moe.py (token ids)

constexpr int64_t THINK_S = 154841, THINK_E = 154842, TOOL_S = 154843, TOOL_E = 154844, ASSISTANT = 154828,
                  USER = 154827, OBSERVATION = 154829, TEXT = 1000;

TEST(GlmReasoningParserTest, B54_IsReasoningEnd) {
  EXPECT_FALSE(glm_is_reasoning_end({THINK_S, TEXT}));
  EXPECT_TRUE(glm_is_reasoning_end({THINK_S, TEXT, THINK_E, TEXT}));
  EXPECT_TRUE(glm_is_reasoning_end({THINK_S, TEXT, TOOL_S, TEXT}));
  EXPECT_FALSE(glm_is_reasoning_end({THINK_S, TEXT, TOOL_S, TEXT, TOOL_E, OBSERVATION, TEXT, ASSISTANT}));
  EXPECT_FALSE(glm_is_reasoning_end({THINK_S, TEXT, THINK_E, TEXT, USER, TEXT, ASSISTANT}));
  EXPECT_FALSE(glm_is_reasoning_end({}));
  EXPECT_TRUE(glm_is_reasoning_end({THINK_S, TEXT}, /*thinking=*/false));
}

TEST(GlmReasoningParserTest, B54_ExtractContentIds) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(glm_extract_content_ids({THINK_S, TEXT, THINK_E, 20, 21, TOOL_S, 30, TOOL_E}), (V{20, 21, TOOL_S, 30, TOOL_E}));
  EXPECT_EQ(glm_extract_content_ids({THINK_E, 20, TOOL_S, 30, TOOL_E, 21, TOOL_S, 31, TOOL_E}),
            (V{20, TOOL_S, 30, TOOL_E, 21, TOOL_S, 31, TOOL_E}));
  EXPECT_EQ(glm_extract_content_ids({THINK_S, TEXT, TOOL_S, 30, TOOL_E}), (V{TOOL_S, 30, TOOL_E}));
  EXPECT_EQ(glm_extract_content_ids({THINK_S, TEXT, TOOL_S, 30, TOOL_E, TOOL_S, 31, TOOL_E}),
            (V{TOOL_S, 30, TOOL_E, TOOL_S, 31, TOOL_E}));
  const V unchanged = {TOOL_S, 30, TOOL_E, OBSERVATION, TEXT, ASSISTANT, THINK_S, TEXT};
  EXPECT_EQ(glm_extract_content_ids(unchanged), unchanged);
  EXPECT_EQ(glm_extract_content_ids({20, 21}), (V{20, 21}));
  EXPECT_EQ(glm_extract_content_ids({THINK_S, TEXT, TOOL_S}, /*thinking=*/false), (V{THINK_S, TEXT, TOOL_S}));
}

// ---------------------------------------------------------------------------------------------------------------
// B.5.5 tests/tool_parsers/test_glm4_moe_tool_parser.py (legacy GLM-4.5 parser)

Pipeline b55_tools() {
  Pipeline s;
  s.tools = {
      tool("get_weather", string_props({"city", "date"})),
      tool("get_current_weather", string_props({"city", "state", "unit"})),
      tool("get_current_time", json::object()),
      tool("send_message", string_props({"recipient", "message", "priority"})),
      tool("write_to_file", string_props({"file_path", "content"})),
      tool("process", string_props({"s", "text"})),
      tool("calculate_typed", json::parse(R"({"type": "object", "properties": {"operation": {"type": "string"},
          "a": {"type": "integer"}, "b": {"type": "number"}, "enabled": {"type": "boolean"}}})")),
      tool("auth", json::parse(R"({"type": "object", "properties": {"api_key": {"anyOf": [{"type": "string"},
          {"type": "null"}]}, "message": {"type": ["string", "null"]}, "enabled": {"type": "boolean"}}})")),
  };
  return s;
}

const char* const kDallas =
    "<tool_call>get_current_weather\n    <arg_key>city</arg_key>\n    <arg_value>Dallas</arg_value>\n"
    "    <arg_key>state</arg_key>\n    <arg_value>TX</arg_value>\n    <arg_key>unit</arg_key>\n"
    "    <arg_value>fahrenheit</arg_value>\n    </tool_call>";
const char* const kDallasArgs = R"({"city": "Dallas", "state": "TX", "unit": "fahrenheit"})";

TEST(GlmToolParserTest, B55_Single) {
  expect_all_splits(kDallas, b55_tools(), {std::nullopt, std::nullopt, {call(0, "get_current_weather", kDallasArgs)}});
}

TEST(GlmToolParserTest, B55_Multiple) {
  std::string orlando = kDallas;
  orlando.replace(orlando.find("Dallas"), 6, "Orlando");
  orlando.replace(orlando.find("TX"), 2, "FL");
  expect_all_splits(std::string(kDallas) + "\n" + orlando, b55_tools(),
                    {std::nullopt,
                     std::nullopt,
                     {call(0, "get_current_weather", kDallasArgs),
                      call(1, "get_current_weather", R"({"city": "Orlando", "state": "FL", "unit": "fahrenheit"})")}});
}

TEST(GlmToolParserTest, B55_ContentBeforeKeepsTrailingSpace) {
  expect_all_splits(
      "I'll help you check the weather. <tool_call>get_current_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Seattle</arg_value>\n<arg_key>state</arg_key>\n<arg_value>WA</arg_value>\n"
      "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>",
      b55_tools(),
      {std::nullopt,
       "I'll help you check the weather. ",
       {call(0, "get_current_weather", R"({"city": "Seattle", "state": "WA", "unit": "celsius"})")}});
}

TEST(GlmToolParserTest, B55_ValueWithSpace) {
  expect_all_splits("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>New York</arg_value>\n</tool_call>",
                    b55_tools(), {std::nullopt, std::nullopt, {call(0, "get_weather", R"({"city": "New York"})")}});
}

TEST(GlmToolParserTest, B55_ContentNoSpace) {
  expect_all_splits(
      "I will help you get the weather.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing"
      "</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>\n</tool_call>",
      b55_tools(),
      {std::nullopt,
       "I will help you get the weather.",
       {call(0, "get_weather", R"({"city": "Beijing", "date": "2025-08-01"})")}});
}

TEST(GlmToolParserTest, B55_ThinkTagsToolParserOnly) {
  expect_all_splits(
      "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n<tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>date</arg_key>\n"
      "<arg_value>2025-08-01</arg_value>\n</tool_call>",
      b55_tools(),
      {std::nullopt,
       "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n",
       {call(0, "get_weather", R"({"city": "Beijing", "date": "2025-08-01"})")}});
}

TEST(GlmToolParserTest, B55_MalformedNoCrash) {
  // The key never closes, so there is no pair: the call has no arguments.
  expect_all_splits("<tool_call>get_weather\n<arg_key>incomplete_arg\n<arg_value>value</arg_value>\n</tool_call>",
                    b55_tools(), {std::nullopt, std::nullopt, {call(0, "get_weather", "{}")}});
}

TEST(GlmToolParserTest, B55_EmptyArgsExactlyBraces) {
  expect_all_splits("<tool_call>get_current_time\n</tool_call>", b55_tools(),
                    {std::nullopt, std::nullopt, {call(0, "get_current_time", "{}")}});
}

// Legacy dropped the text between calls in non-streaming mode; the engine streams it, and we keep it in both.
TEST(GlmToolParserTest, B55_MixedContent) {
  expect_all_splits(
      "I will help you get the weather.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing"
      "</arg_value>\n</tool_call>Let me also check Shanghai.<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Shanghai</arg_value>\n</tool_call>",
      b55_tools(),
      {std::nullopt,
       "I will help you get the weather.Let me also check Shanghai.",
       {call(0, "get_weather", R"({"city": "Beijing"})"), call(1, "get_weather", R"({"city": "Shanghai"})")}});
}

TEST(GlmToolParserTest, B55_StreamNoTools) {
  expect_all_splits("This is a test response without any tool calls", b55_tools(),
                    content_only("This is a test response without any tool calls"));
}

TEST(GlmToolParserTest, B55_StreamTagPrefixNotInContent) {
  GlmToolParser parser(b55_tools().tools, counter_ids());
  std::vector<GlmToolStreamItem> items;
  for (std::string_view chunk : {"I will help you ", "get the weather.<tool", "_call>"}) {
    auto got = parser.feed(chunk);
    items.insert(items.end(), got.begin(), got.end());
  }
  EXPECT_EQ(GlmToolParser::accumulate(items).content, "I will help you get the weather.");
}

// Legacy: an unterminated call is no call. vLLM's engine completes a call whose name was accepted (its name and
// arguments have already streamed), and so do we.
TEST(GlmToolParserTest, B55_IncompleteCallCompletedAtEnd) {
  expect_all_splits(
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>date</arg_key>\n"
      "<arg_value>2025-08-01</arg_value>",
      b55_tools(), {std::nullopt, std::nullopt, {call(0, "get_weather", R"({"city": "Beijing", "date": "2025-08-01"})")}});
}

TEST(GlmToolParserTest, B55_OpenTagWithSpacesIsContent) {
  expect_all_splits("<tool_call>   ", b55_tools(), content_only("<tool_call>   "));
}

TEST(GlmToolParserTest, B55_LongStringArgumentStreams) {
  std::vector<std::string> lines = {"<tool_call>write_to_file\n<arg_key>file_path</arg_key>\n",
                                    "<arg_value>/tmp/sort.py</arg_value>\n<arg_key>content</arg_key>\n<arg_value>"};
  lines.push_back("def bubble_sort(arr):\n");
  for (int i = 0; i < 24; ++i) lines.push_back("    # step " + std::to_string(i) + ": compare \"a\" and 'b'\\n\n");
  lines.push_back("</arg_value>\n</tool_call>");
  GlmToolParser parser(b55_tools().tools, counter_ids());
  int fragments = 0;
  std::string arguments;
  for (const auto& line : lines) {
    for (const auto& item : parser.feed(line)) {
      if (!item.tool_call.arguments.empty()) ++fragments, arguments += item.tool_call.arguments;
    }
  }
  for (const auto& item : parser.finish()) arguments += item.tool_call.arguments;
  EXPECT_GE(fragments, 10);
  const json args = json::parse(arguments);
  EXPECT_NE(args["content"].get<std::string>().find("def bubble_sort"), std::string::npos);
  std::string full;
  for (const auto& line : lines) full += line;
  EXPECT_EQ(GlmToolParser::parse(full, b55_tools().tools, counter_ids()).tool_calls.at(0).arguments, arguments);
}

TEST(GlmToolParserTest, B55_NumericUndeclaredToolDropped) {
  const std::string text =
      "<tool_call>calculate\n<arg_key>operation</arg_key>\n<arg_value>add</arg_value>\n<arg_key>a</arg_key>\n"
      "<arg_value>42</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3.14</arg_value>\n<arg_key>enabled</arg_key>\n"
      "<arg_value>true</arg_value>\n</tool_call>";
  expect_all_splits(text, b55_tools(), Parsed{});
  // Declared with a typed schema, the values are typed: 42 int, 3.14 float, true bool.
  std::string typed = text;
  typed.replace(typed.find("calculate"), 9, "calculate_typed");
  expect_all_splits(typed, b55_tools(),
                    {std::nullopt,
                     std::nullopt,
                     {call(0, "calculate_typed", R"({"operation": "add", "a": 42, "b": 3.14, "enabled": true})")}});
}

TEST(GlmToolParserTest, B55_WhitespaceKeptExactly) {
  expect_all_splits("<tool_call>process<arg_key>s</arg_key><arg_value>    indented code    </arg_value></tool_call>",
                    b55_tools(), {std::nullopt, std::nullopt, {call(0, "process", R"({"s": "    indented code    "})")}});
}

TEST(GlmToolParserTest, B55_UnicodeRaw) {
  expect_all_splits(
      "<tool_call>send_message\n<arg_key>recipient</arg_key>\n<arg_value>Amy</arg_value>\n<arg_key>message</arg_key>\n"
      "<arg_value>你好世界 🎉</arg_value>\n</tool_call>",
      b55_tools(),
      {std::nullopt, std::nullopt, {call(0, "send_message", R"({"recipient": "Amy", "message": "你好世界 🎉"})")}});
}

TEST(GlmToolParserTest, B55_NoNewlineAfterName) {
  expect_all_splits("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Seattle</arg_value></tool_call>",
                    b55_tools(), {std::nullopt, std::nullopt, {call(0, "get_weather", R"({"city": "Seattle"})")}});
}

TEST(GlmToolParserTest, B55_AnyOfStringNullStreamed) {
  const Parsed got = run_stream({"<tool_call>auth<arg_key>api_key</arg_key><arg_value>", "sk-", "12345678",
                                 "</arg_value></tool_call>"},
                                b55_tools());
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0].arguments, R"({"api_key": "sk-12345678"})");
}

TEST(GlmToolParserTest, B55_TypeListString) {
  expect_all_splits("<tool_call>auth<arg_key>message</arg_key><arg_value>test message</arg_value></tool_call>",
                    b55_tools(), {std::nullopt, std::nullopt, {call(0, "auth", R"({"message": "test message"})")}});
}

TEST(GlmToolParserTest, B55_Boolean) {
  expect_all_splits("<tool_call>auth<arg_key>enabled</arg_key><arg_value>true</arg_value></tool_call>", b55_tools(),
                    {std::nullopt, std::nullopt, {call(0, "auth", R"({"enabled": true})")}});
}

// ---------------------------------------------------------------------------------------------------------------
// B.5.6 reasoning tables. glm45 (Aug 2025, model emits <think>) and glm47 (R1: prompt holds <think>) rows, run
// through reasoning + tool parser with thinking on (the current engine's semantics).

Pipeline reasoning_setup(bool thinking = true) {
  Pipeline s = b51_tools();
  s.reasoning = true;
  s.thinking = thinking;
  return s;
}

Parsed rc(std::optional<std::string> reasoning, std::optional<std::string> content, bool ended) {
  Parsed p;
  p.reasoning = std::move(reasoning);
  p.content = std::move(content);
  p.reasoning_ended = ended;
  return p;
}

TEST(GlmReasoningParserTest, B56_Glm45Table) {
  const Pipeline s = reasoning_setup();
  expect_all_splits("<think>This is a reasoning section</think>This is the rest", s,
                    rc("This is a reasoning section", "This is the rest", true));
  expect_all_splits("<think>This is a reasoning section</think>", s, rc("This is a reasoning section", {}, true));
  expect_all_splits("<think>This is a reasoning\nsection</think>This is the rest\nThat", s,
                    rc("This is a reasoning\nsection", "This is the rest\nThat", true));
  expect_all_splits("<think></think>This is the rest", s, rc({}, "This is the rest", true));
  // Engine semantics differ from the Aug 2025 rows here: without </think>, the output is reasoning (the prompt
  // opened the think block). Legacy: without_think → content; only-open-tag non-stream → content incl. <think>.
  expect_all_splits("This is the rest", s, rc("This is the rest", {}, false));
  expect_all_splits("<think>This is a reasoning section", s, rc("This is a reasoning section", {}, false));
}

TEST(GlmReasoningParserTest, B56_Glm47Table) {
  const Pipeline s = reasoning_setup();
  expect_all_splits("This is a reasoning section</think>This is the rest", s,
                    rc("This is a reasoning section", "This is the rest", true));
  expect_all_splits("This is a reasoning section</think>", s, rc("This is a reasoning section", {}, true));
  expect_all_splits("This is content", s, rc("This is content", {}, false));
  expect_all_splits("This\nThat</think>This is the rest\nThat", s, rc("This\nThat", "This is the rest\nThat", true));
  expect_all_splits("</think>This is the rest", s, rc({}, "This is the rest", true));  // R1 non-stream: ""
  expect_all_splits("<think>This is a reasoning section</think>This is the rest", s,
                    rc("This is a reasoning section", "This is the rest", true));
  expect_all_splits("<think>This\nThat</think>This is the rest\nThat", s,
                    rc("This\nThat", "This is the rest\nThat", true));
  expect_all_splits("<think>This is a reasoning section", s, rc("This is a reasoning section", {}, false));
  expect_all_splits("", s, rc({}, {}, false));
}

TEST(GlmReasoningParserTest, B56_PromptIsReasoningEnd) {
  // "…<|assistant|>\n<think>The user is asking for the capital of" / "…<think>…</think>\nThe capital…"
  EXPECT_FALSE(glm_is_reasoning_end({USER, TEXT, ASSISTANT, TEXT, THINK_S, TEXT}));
  EXPECT_TRUE(glm_is_reasoning_end({USER, TEXT, ASSISTANT, TEXT, THINK_S, TEXT, THINK_E, TEXT}));
  // Multi-turn: an earlier turn has <think></think>; the last turn open / closed.
  EXPECT_FALSE(glm_is_reasoning_end({USER, ASSISTANT, THINK_S, THINK_E, TEXT, USER, TEXT, ASSISTANT, THINK_S, TEXT}));
  EXPECT_TRUE(
      glm_is_reasoning_end({USER, ASSISTANT, THINK_S, THINK_E, TEXT, USER, TEXT, ASSISTANT, THINK_S, TEXT, THINK_E}));
}

// The GLM-5.x bug (#42400): a <tool_call> before </think> ends reasoning instead of being swallowed.
TEST(GlmReasoningParserTest, ToolCallEndsReasoning) {
  Parsed expected = rc("I need the weather.", std::nullopt, true);
  expected.calls = {call(0, "get_weather", R"({"city": "Beijing"})")};
  expect_all_splits(
      "I need the weather.\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>",
      reasoning_setup(), expected);
  expected.reasoning = "Let me think.";
  expect_all_splits(
      "Let me think.  \n</think>\n\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value>"
      "</tool_call>",
      reasoning_setup(), expected);
}

// enable_thinking=false (#40466): everything is content, think tags included.
TEST(GlmReasoningParserTest, ThinkingOffAllContent) {
  expect_all_splits("<think>a</think>b", reasoning_setup(false), rc({}, "<think>a</think>b", true));
  Parsed expected = rc({}, "Sure.", true);
  expected.calls = {call(0, "get_current_date", "{}")};
  expect_all_splits("Sure.<tool_call>get_current_date</tool_call>", reasoning_setup(false), expected);
}

TEST(GlmReasoningParserTest, ThinkingFlag) {
  EXPECT_TRUE(glm_thinking_enabled(json::object()));
  EXPECT_TRUE(glm_thinking_enabled(json()));
  EXPECT_FALSE(glm_thinking_enabled({{"enable_thinking", false}}));
  EXPECT_FALSE(glm_thinking_enabled({{"thinking", false}}));
  EXPECT_TRUE(glm_thinking_enabled({{"thinking", false}, {"enable_thinking", true}}));
  EXPECT_FALSE(glm_thinking_enabled({{"thinking", 0}, {"enable_thinking", ""}}));
  EXPECT_TRUE(glm_thinking_enabled({{"thinking", nullptr}}));
  EXPECT_FALSE(glm_thinking_enabled({{"thinking", nullptr}, {"enable_thinking", false}}));
}

TEST(GlmReasoningParserTest, StateTransitions) {
  const Pipeline s = reasoning_setup();
  // A repeated <think> in reasoning is swallowed; a stray </think> in content is dropped; <think> in content
  // starts reasoning again; inside a tool call the think tags are text of the call.
  expect_all_splits("a<think>b</think>c</think>d<think>e</think>f", s, rc("abe", "cdf", true));
  Parsed expected = rc("r", "x", true);
  expected.calls = {call(0, "get_weather", R"({"city": "<think>B</think>"})")};
  expect_all_splits(
      "r</think>x<tool_call>get_weather<arg_key>city</arg_key><arg_value><think>B</think></arg_value></tool_call>", s,
      expected);
  // Trailing whitespace of each reasoning run is dropped, inner whitespace kept (also Unicode whitespace).
  expect_all_splits("a \n b\u3000 \n</think>c", s, rc("a \n b", "c", true));
}

// ---------------------------------------------------------------------------------------------------------------
// Typing by schema (coerce_to_schema_type) and Python json.dumps output.

TEST(GlmToolParserTest, SchemaCoercion) {
  Pipeline s;
  s.tools = {tool("f", json::parse(R"({"type": "object", "properties": {
      "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"}, "o": {"type": "object"},
      "a": {"type": "array"}, "nul": {"type": ["null", "integer"]}, "e": {"enum": [1, 2]}, "t": {"type": "INT"},
      "s": {"type": "string"}, "u": {}}})"))};
  auto args_of = [&](const std::string& key, const std::string& value) {
    const auto r = GlmToolParser::parse("<tool_call>f<arg_key>" + key + "</arg_key><arg_value>" + value +
                                            "</arg_value></tool_call>",
                                        s.tools, counter_ids());
    EXPECT_EQ(r.tool_calls.size(), 1u);
    return r.tool_calls.empty() ? std::string() : r.tool_calls[0].arguments;
  };
  EXPECT_EQ(args_of("i", " 42 "), R"({"i": 42})");
  EXPECT_EQ(args_of("i", "1_000"), R"({"i": 1000})");
  EXPECT_EQ(args_of("i", "123456789012345678901234567890"), R"({"i": 123456789012345678901234567890})");
  EXPECT_EQ(args_of("i", "4.5"), R"({"i": 4.5})");  // int() fails, json.loads fallback
  EXPECT_EQ(args_of("i", "abc"), R"({"i": "abc"})");
  EXPECT_EQ(args_of("n", "3.0"), R"({"n": 3})");
  EXPECT_EQ(args_of("n", "3.14"), R"({"n": 3.14})");
  EXPECT_EQ(args_of("n", "1e-5"), R"({"n": 1e-05})");
  EXPECT_EQ(args_of("n", "0.1"), R"({"n": 0.1})");
  EXPECT_EQ(args_of("n", "1e22"), R"({"n": 10000000000000000000000})");
  // str(int(1.5e300)): the exact integer value of the double.
  EXPECT_EQ(args_of("n", "1.5e300"), "{\"n\": "
            "150000000000000007875714038280663037305670287166223873237378117326770368698336229367955706"
            "262067179606555666574932581726541378485304064586346718827718006047427258080138986370560674"
            "535069218213508905342985245619991762167855845146132011197911417021374186888818323008526425"
            "7173504208294580298189100810240}");
  EXPECT_EQ(args_of("n", "inf"), R"({"n": "inf"})");
  EXPECT_EQ(args_of("n", "1e999"), R"({"n": "1e999"})");
  EXPECT_EQ(args_of("b", "True"), R"({"b": true})");
  EXPECT_EQ(args_of("b", " 0 "), R"({"b": false})");
  EXPECT_EQ(args_of("b", "yes"), R"({"b": "yes"})");
  EXPECT_EQ(args_of("o", R"({"x":[1,2.50,{"y":null}],"z":"é\n"})"), R"({"o": {"x": [1, 2.5, {"y": null}], "z": "é\n"}})");
  EXPECT_EQ(args_of("o", "{'a': 1}"), R"({"o": "{'a': 1}"})");
  EXPECT_EQ(args_of("o", R"({"a":1,"a":2,"b":3})"), R"({"o": {"a": 2, "b": 3}})");
  EXPECT_EQ(args_of("a", "[1, 1e999]"), R"({"a": "[1, 1e999]"})");
  EXPECT_EQ(args_of("nul", "NULL"), R"({"nul": null})");
  EXPECT_EQ(args_of("nul", "7"), R"({"nul": 7})");
  EXPECT_EQ(args_of("e", "2"), R"({"e": 2})");
  EXPECT_EQ(args_of("t", "5"), R"({"t": 5})");
  EXPECT_EQ(args_of("s", "5"), R"({"s": "5"})");
  EXPECT_EQ(args_of("u", "5"), R"({"u": "5"})");            // no type information: string
  EXPECT_EQ(args_of("missing", "5"), R"({"missing": "5"})");  // key not in the schema: string
  EXPECT_EQ(args_of("s", "tab\there \"q\" \\ \x01 \x7f"), R"({"s": "tab\there \"q\" \\ \u0001 )"
                                                          "\x7f"
                                                          R"("})");
}

TEST(GlmToolParserTest, ArgumentRegexSemantics) {
  Pipeline s;
  s.tools = {tool("f", json::object())};
  auto args_of = [&](const std::string& body) {
    const Parsed p = run_once("<tool_call>f" + body + "</tool_call>", s);
    EXPECT_EQ(p.calls.size(), 1u);
    return p.calls.empty() ? std::string() : p.calls[0].arguments;
  };
  EXPECT_EQ(args_of("<arg_key> k </arg_key> \n <arg_value> v </arg_value>"), R"({"k": " v "})");
  EXPECT_EQ(args_of("<arg_key>a</arg_key>x<arg_key>b</arg_key><arg_value>v</arg_value>"),
            R"({"a</arg_key>x<arg_key>b": "v"})");
  EXPECT_EQ(args_of("<arg_key>a</arg_key><arg_value>1</arg_value>junk<arg_key>b</arg_key><arg_value>2</arg_value>"),
            R"({"a": "1", "b": "2"})");
  EXPECT_EQ(args_of("<arg_key>a</arg_key><arg_value>x<arg_key>b</arg_key><arg_value>y</arg_value>"),
            R"({"a": "x<arg_key>b</arg_key><arg_value>y"})");
  EXPECT_EQ(args_of("<arg_key></arg_key><arg_value>e</arg_value>"), R"({"": "e"})");
  EXPECT_EQ(args_of("<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>"),
            R"({"a": "1"})");  // first value kept (deviation: Python's dict keeps the last)
  EXPECT_EQ(args_of("<arg_key>a</arg_key><arg_value>open"), R"({"a": "open"})");
  EXPECT_EQ(args_of("<arg_key>a</arg_key><arg_value><tool_call>x</arg_value>"), R"({"a": "<tool_call>x"})");
  for (const auto& body : {"<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>",
                           "<arg_key>a</arg_key>x<arg_key>b</arg_key><arg_value>v</arg_value>",
                           "<arg_key></arg_key><arg_value>e</arg_value><arg_key>z</arg_key><arg_value>w</arg_value>"}) {
    const std::string text = std::string("<tool_call>f") + body + "</tool_call>";
    expect_all_splits(text, s, run_once(text, s));
  }
}

TEST(GlmToolParserTest, NoToolsDeclaredAcceptsAnyName) {
  Pipeline s;  // no tools: any non-empty name, values stay strings
  expect_all_splits("<tool_call>anything<arg_key>n</arg_key><arg_value>1</arg_value></tool_call>", s,
                    {std::nullopt, std::nullopt, {call(0, "anything", R"({"n": "1"})")}});
}

TEST(GlmToolParserTest, DroppedCallsAndIndices) {
  expect_all_splits(
      "a<tool_call>nope<arg_key>city</arg_key><arg_value>X</arg_value></tool_call>b<tool_call>get_weather"
      "<arg_key>city</arg_key><arg_value>Y</arg_value></tool_call>c<tool_call></tool_call>d",
      b51_tools(), {std::nullopt, "abcd", {call(0, "get_weather", R"({"city": "Y"})")}});
  // Whitespace-only content around accepted calls is dropped.
  expect_all_splits("\n<tool_call>get_current_date</tool_call>\n\n<tool_call>get_current_date</tool_call>\n",
                    b51_tools(),
                    {std::nullopt, std::nullopt, {call(0, "get_current_date", "{}"), call(1, "get_current_date", "{}")}});
  // Whitespace-only output without calls is content.
  expect_all_splits(" \n ", b51_tools(), content_only(" \n "));
}

// ---------------------------------------------------------------------------------------------------------------
// Hostile inputs.

TEST(GlmParsersHostileTest, UnterminatedAndMismatchedTags) {
  const Pipeline s = reasoning_setup();
  for (std::string_view text :
       {"<tool_call>", "</tool_call>", "<tool_call><arg_key>", "<tool_call>get_weather<arg_key>",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>", "<tool_call>get_weather</arg_value></arg_key>",
        "<think><think></think></think><tool_call><tool_call></tool_call></tool_call>", "<arg_key>x</arg_key>",
        "</think><tool_call>get_weather<arg_key>a<arg_key>b</arg_value></arg_key><arg_value>c", "<", "</", "<tool_",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>x</arg_val", "</think", "<think>\xE3\x80"}) {
    SCOPED_TRACE(json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::replace));
    expect_all_splits(text, s, run_once(text, s));
    Pipeline tools_only = b51_tools();
    expect_all_splits(text, tools_only, run_once(text, tools_only));
  }
}

TEST(GlmParsersHostileTest, InvalidUtf8SplitAcrossDeltas) {
  const std::string text =
      "r\xE4\xBD</think>c\xF0\x9F\x8E\xFF<tool_call>get_weather<arg_key>city</arg_key><arg_value>\xE4\xBD\xA0\xC3"
      "\x28\xF0\x9F</arg_value></tool_call>\xED\xA0\x80 \xE3\x80\x80";
  const Pipeline s = reasoning_setup();
  const Parsed once = run_once(text, s);
  ASSERT_EQ(once.calls.size(), 1u);
  EXPECT_EQ(once.calls[0].arguments, "{\"city\": \"\xE4\xBD\xA0\xC3\x28\xF0\x9F\"}");
  expect_all_splits(text, s, once);
  // Valid multi-byte characters split across deltas come out whole.
  GlmReasoningParser parser;
  EXPECT_EQ(parser.feed("a\xE4").reasoning, "a");
  EXPECT_EQ(parser.feed("\xBD").reasoning, "");
  EXPECT_EQ(parser.feed("\xA0").reasoning, "\xE4\xBD\xA0");
}

TEST(GlmParsersHostileTest, HugeInputs) {
  const std::string big(1 << 20, 'x');
  const Pipeline s = reasoning_setup();
  auto chunks_of = [](std::string_view text, size_t n) {
    std::vector<std::string_view> chunks;
    for (size_t i = 0; i < text.size(); i += n) chunks.push_back(text.substr(i, n));
    return chunks;
  };
  // 1 MB of reasoning, then 1 MB of content, then a call with a 1 MB string argument.
  const std::string text = big + "</think>" + big + "<tool_call>get_weather<arg_key>city</arg_key><arg_value>" + big +
                           "</arg_value></tool_call>";
  const Parsed once = run_once(text, s);
  EXPECT_EQ(once.reasoning, big);
  EXPECT_EQ(once.content, big);
  ASSERT_EQ(once.calls.size(), 1u);
  EXPECT_EQ(once.calls[0].arguments, R"({"city": ")" + big + R"("})");
  EXPECT_EQ(run_stream(chunks_of(text, 4093), s), once);
  // Byte-by-byte over the argument is linear.
  const std::string arg_text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>" + big.substr(0, 1 << 18) +
                               "</arg_value></tool_call>";
  EXPECT_EQ(run_stream(chunks_of(arg_text, 1), b51_tools()), run_once(arg_text, b51_tools()));
  // 1 MB of '<' (every byte may start a tag) and of an unterminated tag.
  const std::string angles(1 << 20, '<');
  EXPECT_EQ(run_stream(chunks_of(angles, 4093), s), run_once(angles, s));
  const std::string open_call = "<tool_call>" + big;
  const Parsed open_once = run_once(open_call, b51_tools());
  EXPECT_EQ(open_once.content, open_call);
  EXPECT_EQ(run_stream(chunks_of(open_call, 4093), b51_tools()), open_once);
}

TEST(GlmParsersHostileTest, DeeplyNestedJsonValues) {
  Pipeline s;
  s.tools = {tool("f", json::parse(R"({"type": "object", "properties": {"o": {"type": "object"},
                                        "a": {"type": "array"}, "x": {"type": "integer"}}})"))};
  auto args_of = [&](const std::string& key, const std::string& value) {
    const std::string text =
        "<tool_call>f<arg_key>" + key + "</arg_key><arg_value>" + value + "</arg_value></tool_call>";
    const Parsed p = run_once(text, s);
    EXPECT_EQ(p.calls.size(), 1u);
    return p.calls.empty() ? std::string() : p.calls[0].arguments;
  };
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_EQ(args_of("a", deep), R"({"a": ")" + deep + R"("})");  // too deep: kept as the raw string
  EXPECT_EQ(args_of("x", deep), R"({"x": ")" + deep + R"("})");
  const std::string ok = std::string(300, '[') + std::string(300, ']');
  EXPECT_EQ(args_of("a", ok), R"({"a": )" + ok + "}");
  std::string deep_obj;
  for (int i = 0; i < 100000; ++i) deep_obj += R"({"k":)";
  deep_obj += "1" + std::string(100000, '}');
  EXPECT_EQ(args_of("o", deep_obj).size(), deep_obj.size() + 2 * 100000 + 9);  // escaped quotes, raw string
  const std::string unbalanced = std::string(100000, '{');
  EXPECT_EQ(args_of("o", unbalanced), R"({"o": ")" + unbalanced + R"("})");
}

}  // namespace
}  // namespace kestrel

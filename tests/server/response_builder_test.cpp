// Response assembly from generated text: the fixture tokenizer encodes an output a GLM model would write (reasoning,
// answer, tool calls), the ids go through ChoiceState one engine output at a time, and the streamed deltas must add
// up to the non-streaming message.
#include <gtest/gtest.h>

#include "server/choice_state.h"
#include "server/openai_response.h"
#include "text/tokenizer.h"

namespace kestrel::server {
namespace {

const text::Tokenizer& fixture_tokenizer() {
  static const auto tokenizer = text::Tokenizer::load(std::string(KESTREL_TEST_DATA) + "/serve_model/tokenizer.json");
  return *tokenizer;
}

std::vector<GlmToolSpec> weather_tools() {
  return {{.name = "get_weather",
           .parameters = nlohmann::json::parse(
               R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}})")}};
}

ChoiceOptions chat_options(bool tools) {
  ChoiceOptions o;
  o.chat = true;
  o.parser.thinking = true;
  if (tools) o.parser.tools = weather_tools();
  int next = 0;
  o.parser.make_id = [next]() mutable { return "call_" + std::to_string(next++); };
  return o;
}

struct Streamed {
  std::string reasoning, content;
  std::vector<GlmToolCall> calls;  // from the deltas
  std::string finish_reason;
  int64_t tokens = 0;
};

// Feeds `text`'s token ids `per_output` at a time; the last output carries `reason`.
Streamed run(ChoiceState& choice, const std::string& text, size_t per_output,
             FinishReason reason = FinishReason::stop, std::optional<int32_t> eos = std::nullopt) {
  std::vector<int32_t> ids = fixture_tokenizer().encode(text, {.add_special_tokens = false, .split_special_tokens = true});
  if (eos) ids.push_back(*eos);
  Streamed s;
  for (size_t i = 0; i < ids.size() && !choice.finished(); i += per_output) {
    RequestOutput out;
    out.token_ids.assign(ids.begin() + static_cast<long>(i),
                         ids.begin() + static_cast<long>(std::min(ids.size(), i + per_output)));
    if (i + per_output >= ids.size()) out.finish_reason = reason;
    const ChoiceUpdate u = choice.add(out);
    s.reasoning += u.delta.reasoning;
    s.content += u.delta.content;
    for (const auto& d : u.delta.tool_calls) {
      if (d.id) s.calls.push_back({.id = *d.id, .name = d.name.value_or(""), .arguments = {}});
      EXPECT_LT(static_cast<size_t>(d.index), s.calls.size()) << "argument fragment before the call's first delta";
      if (static_cast<size_t>(d.index) < s.calls.size()) s.calls[static_cast<size_t>(d.index)].arguments += d.arguments;
    }
    if (u.finished) s.finish_reason = choice.finish_reason();
  }
  s.tokens = choice.num_tokens();
  return s;
}

TEST(ResponseBuilder, ReasoningThenAnswer) {
  for (size_t step : {1, 2, 5, 1000}) {
    ChoiceState choice(fixture_tokenizer(), chat_options(false));
    const Streamed s = run(choice, "Let me think.</think>The answer is 42.", step);
    EXPECT_EQ(s.reasoning, "Let me think.") << step;
    EXPECT_EQ(s.content, "The answer is 42.") << step;
    EXPECT_EQ(s.finish_reason, "stop");
    const ojson message = chat_message_json(choice);
    EXPECT_EQ(message["reasoning_content"], "Let me think.");
    EXPECT_EQ(message["reasoning"], "Let me think.");
    EXPECT_EQ(message["content"], "The answer is 42.");
    EXPECT_TRUE(message["tool_calls"].empty());
  }
}

TEST(ResponseBuilder, ToolCallsStreamAndAssemble) {
  const std::string text =
      "I should check.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
      "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key>"
      "<arg_value>Beijing</arg_value></tool_call>";
  for (size_t step : {1, 3, 1000}) {
    ChoiceState choice(fixture_tokenizer(), chat_options(true));
    const auto eos = fixture_tokenizer().token_to_id("<|observation|>");
    const Streamed s = run(choice, text, step, FinishReason::stop, eos);
    EXPECT_EQ(s.reasoning, "I should check.");
    EXPECT_EQ(s.content, "");
    EXPECT_EQ(s.finish_reason, "tool_calls");
    ASSERT_EQ(s.calls.size(), 2u) << step;
    EXPECT_EQ(s.calls[0].name, "get_weather");
    EXPECT_EQ(s.calls[0].arguments, R"({"city": "Paris", "days": 3})");
    EXPECT_EQ(s.calls[1].arguments, R"({"city": "Beijing"})");
    const ojson message = chat_message_json(choice);
    EXPECT_TRUE(message["content"].is_null());
    ASSERT_EQ(message["tool_calls"].size(), 2u);
    EXPECT_EQ(message["tool_calls"][0]["id"], "call_0");
    EXPECT_EQ(message["tool_calls"][0]["type"], "function");
    EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], s.calls[0].arguments);
    EXPECT_EQ(message["tool_calls"][1]["function"]["arguments"], s.calls[1].arguments);
  }
}

TEST(ResponseBuilder, ToolCallCutByLengthKeepsLengthReason) {
  ChoiceState choice(fixture_tokenizer(), chat_options(true));
  const Streamed s = run(choice, "x</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa", 2,
                         FinishReason::length);
  EXPECT_EQ(s.finish_reason, "length");
}

TEST(ResponseBuilder, UnknownToolStaysContent) {
  ChoiceState choice(fixture_tokenizer(), chat_options(true));
  const Streamed s = run(choice, "hm</think>ok <tool_call>launch<arg_key>a</arg_key><arg_value>b</arg_value></tool_call>", 1);
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.finish_reason, "stop");
  EXPECT_EQ(s.content, "ok ");  // a call to an undeclared tool is dropped, as vLLM does
}

TEST(ResponseBuilder, StopStringEndsChoiceEarly) {
  ChoiceOptions o;
  o.stop = {"STOP"};
  ChoiceState choice(fixture_tokenizer(), o);
  const Streamed s = run(choice, "hello world STOP and more text", 1, FinishReason::length);
  EXPECT_EQ(s.content, "hello world ");
  EXPECT_EQ(choice.finish_reason(), "stop");
  EXPECT_EQ(choice.stop_reason(), "STOP");
  EXPECT_TRUE(choice.stopped_by_string());
  const auto all = fixture_tokenizer().encode("hello world STOP and more text", {.add_special_tokens = false, .split_special_tokens = true});
  EXPECT_LT(s.tokens, static_cast<int64_t>(all.size()));  // tokens after the stop are not counted
  // Later outputs for the finished choice change nothing.
  RequestOutput late;
  late.token_ids = {all[0]};
  EXPECT_TRUE(choice.add(late).delta.empty());
  EXPECT_EQ(choice.text(), "hello world ");
}

TEST(ResponseBuilder, EosIsSkippedAsSpecialAndStopTokenReported) {
  ChoiceState choice(fixture_tokenizer(), ChoiceOptions{});
  const auto eos = fixture_tokenizer().token_to_id("<|user|>");
  ASSERT_TRUE(eos);
  std::vector<int32_t> ids = fixture_tokenizer().encode("abc", {.add_special_tokens = false, .split_special_tokens = true});
  ids.push_back(*eos);
  RequestOutput out;
  out.token_ids = ids;
  out.finish_reason = FinishReason::stop;
  out.stop_token_id = *eos;
  const ChoiceUpdate u = choice.add(out);
  EXPECT_EQ(u.delta.content, "abc");
  EXPECT_EQ(choice.stop_reason(), *eos);
  EXPECT_EQ(choice.num_tokens(), static_cast<int64_t>(ids.size()));
}

TEST(ResponseBuilder, LogprobsInBothFormats) {
  ChoiceOptions o;
  o.want_logprobs = true;
  ChoiceState choice(fixture_tokenizer(), o);
  const auto ids = fixture_tokenizer().encode("hi", {.add_special_tokens = false, .split_special_tokens = true});
  RequestOutput out;
  out.token_ids = ids;
  for (const int32_t id : ids) {
    out.logprobs.push_back({.logprob = -0.5f, .rank = 1, .top = {{id, -0.5f}, {id == 0 ? 1 : 0, -1.5f}}});
  }
  out.finish_reason = FinishReason::length;
  choice.add(out);
  ASSERT_EQ(choice.logprobs().size(), ids.size());
  const ojson chat = chat_logprobs_json(choice.logprobs());
  ASSERT_EQ(chat["content"].size(), ids.size());
  EXPECT_FLOAT_EQ(chat["content"][0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(chat["content"][0]["bytes"].is_array());
  const ojson completion = completion_logprobs_json(choice.logprobs(), 0);
  EXPECT_EQ(completion["tokens"].size(), ids.size());
  EXPECT_EQ(completion["text_offset"][0], 0);
  EXPECT_EQ(completion["top_logprobs"][0].size(), 2u);
}

TEST(ResponseBuilder, ChunkShapes) {
  const ResponseHeader h{.id = "chatcmpl-1", .created = 5, .model = "m"};
  ChatDelta d;
  d.reasoning = "r";
  d.tool_calls.push_back({.index = 0, .id = "call_x", .name = "f", .arguments = ""});
  const ojson chunk = chat_chunk(h, 1, chat_delta_json(d, false), nullptr, std::string("tool_calls"), nullptr);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(chunk["choices"][0]["delta"]["reasoning_content"], "r");
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["type"], "function");
  const ojson first = chat_chunk(h, 0, chat_delta_json({}, true), nullptr, std::nullopt);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const ojson usage = usage_chunk(h, true, usage_json(10, 4, 8));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 14);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
}

}  // namespace
}  // namespace kestrel::server

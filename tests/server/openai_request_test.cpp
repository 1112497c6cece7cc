#include "server/openai_request.h"

#include <gtest/gtest.h>

#include "server/api_error.h"

namespace kestrel::server {
namespace {

using json = nlohmann::json;

const RequestLimits kLimits{.max_logprobs = 20, .max_n = 8, .enable_auto_tool_choice = true, .has_tool_parser = true};

json chat(json extra = json::object()) {
  json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// The field named by the 400 for `body`, or "<no error>".
std::string error_param(const json& body, bool is_chat = true) {
  try {
    if (is_chat) parse_chat_request(body, kLimits);
    else parse_completion_request(body, kLimits);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param;
  }
  return "<no error>";
}

TEST(ChatRequest, MapsSamplingFields) {
  const auto r = parse_chat_request(
      chat({{"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 5}, {"min_p", 0.1}, {"seed", 7}, {"n", 2},
            {"max_completion_tokens", 12}, {"max_tokens", 99}, {"stop", "x"}, {"stop_token_ids", {3, 4}},
            {"logprobs", true}, {"top_logprobs", 3}, {"logit_bias", {{"5", -100}}}, {"presence_penalty", 1},
            {"frequency_penalty", -1}, {"repetition_penalty", 1.2}, {"min_tokens", 2}, {"ignore_eos", true},
            {"stream", true}, {"stream_options", {{"include_usage", true}}},
            {"chat_template_kwargs", {{"enable_thinking", false}}}}),
      kLimits);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.sampling.n, 2);
  EXPECT_EQ(r.sampling.max_tokens, 12);  // max_completion_tokens wins
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(r.sampling.logprobs, 3);
  ASSERT_EQ(r.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(r.sampling.logit_bias[0].first, 5);
  EXPECT_EQ(r.sampling.min_tokens, 2);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
}

TEST(ChatRequest, NullMeansDefault) {
  const auto r = parse_chat_request(chat({{"temperature", nullptr}, {"stop", nullptr}, {"n", nullptr}}), kLimits);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_TRUE(r.stop.empty());
}

TEST(ChatRequest, EachBadFieldIsNamed) {
  EXPECT_EQ(error_param(json::array()), "");
  EXPECT_EQ(error_param({{"model", "m"}}), "messages");
  EXPECT_EQ(error_param(chat({{"messages", json::array()}})), "messages");
  EXPECT_EQ(error_param(chat({{"messages", {{{"content", "no role"}}}}})), "messages");
  EXPECT_EQ(error_param(chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}})), "messages");
  EXPECT_EQ(error_param(chat({{"model", 5}})), "model");
  EXPECT_EQ(error_param(chat({{"temperature", "hot"}})), "temperature");
  EXPECT_EQ(error_param(chat({{"temperature", -1}})), "temperature");
  EXPECT_EQ(error_param(chat({{"top_p", 0}})), "top_p");
  EXPECT_EQ(error_param(chat({{"top_p", 1.5}})), "top_p");
  EXPECT_EQ(error_param(chat({{"top_k", -2}})), "top_k");
  EXPECT_EQ(error_param(chat({{"n", 0}})), "n");
  EXPECT_EQ(error_param(chat({{"n", 9}})), "n");
  EXPECT_EQ(error_param(chat({{"n", 1.5}})), "n");
  EXPECT_EQ(error_param(chat({{"max_tokens", 0}})), "max_tokens");
  EXPECT_EQ(error_param(chat({{"max_tokens", "10"}})), "max_tokens");
  EXPECT_EQ(error_param(chat({{"max_tokens", 1e30}})), "max_tokens");
  EXPECT_EQ(error_param(chat({{"stop", 5}})), "stop");
  EXPECT_EQ(error_param(chat({{"stop", {"a", 1}}})), "stop");
  EXPECT_EQ(error_param(chat({{"stop", {""}}})), "stop");
  EXPECT_EQ(error_param(chat({{"stream", "yes"}})), "stream");
  EXPECT_EQ(error_param(chat({{"stream_options", {{"include_usage", true}}}})), "stream_options");
  EXPECT_EQ(error_param(chat({{"top_logprobs", 3}})), "top_logprobs");
  EXPECT_EQ(error_param(chat({{"logprobs", true}, {"top_logprobs", 21}})), "top_logprobs");
  EXPECT_EQ(error_param(chat({{"logit_bias", {{"abc", 1}}}})), "logit_bias");
  EXPECT_EQ(error_param(chat({{"logit_bias", {{"5", 101}}}})), "logit_bias");
  EXPECT_EQ(error_param(chat({{"presence_penalty", 3}})), "presence_penalty");
  EXPECT_EQ(error_param(chat({{"repetition_penalty", 0}})), "repetition_penalty");
  EXPECT_EQ(error_param(chat({{"stop_token_ids", {-1}}})), "stop_token_ids");
  EXPECT_EQ(error_param(chat({{"min_tokens", -1}})), "min_tokens");
  EXPECT_EQ(error_param(chat({{"response_format", {{"type", "json_object"}}}})), "response_format");
  EXPECT_EQ(error_param(chat({{"chat_template_kwargs", "x"}})), "chat_template_kwargs");
  EXPECT_EQ(error_param(chat({{"temperature", 0.7}})), "<no error>");
}

json weather_tool() {
  return json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})");
}

TEST(ChatRequest, ToolChoiceRules) {
  const json tools = json::array({weather_tool()});
  auto r = parse_chat_request(chat({{"tools", tools}}), kLimits);
  EXPECT_EQ(r.tool_choice, ToolChoice::auto_);
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  r = parse_chat_request(chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}), kLimits);
  EXPECT_EQ(r.tool_choice, ToolChoice::named);
  EXPECT_EQ(r.named_tool, "get_weather");
  EXPECT_EQ(parse_chat_request(chat({{"tools", tools}, {"tool_choice", "required"}}), kLimits).tool_choice,
            ToolChoice::required);
  EXPECT_EQ(parse_chat_request(chat({{"tools", tools}, {"tool_choice", "none"}}), kLimits).tool_choice, ToolChoice::none);

  EXPECT_EQ(error_param(chat({{"tool_choice", "required"}})), "tool_choice");  // no tools
  EXPECT_EQ(error_param(chat({{"tools", tools}, {"tool_choice", "sometimes"}})), "tool_choice");
  EXPECT_EQ(error_param(chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}})),
            "tool_choice");
  EXPECT_EQ(error_param(chat({{"tools", "x"}})), "tools");
  EXPECT_EQ(error_param(chat({{"tools", {{{"type", "function"}}}}})), "tools");
  EXPECT_EQ(error_param(chat({{"tools", {{{"type", "function"}, {"function", {{"name", 3}}}}}}})), "tools");

  // Without --enable-auto-tool-choice, "auto" with tools is refused (vLLM's rule).
  RequestLimits strict = kLimits;
  strict.enable_auto_tool_choice = false;
  EXPECT_THROW(parse_chat_request(chat({{"tools", tools}}), strict), ApiError);
  EXPECT_NO_THROW(parse_chat_request(chat({{"tools", tools}, {"tool_choice", "none"}}), strict));
}

TEST(CompletionRequest, PromptShapesAndDefaults) {
  auto r = parse_completion_request({{"prompt", "hello"}}, kLimits);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hello");
  EXPECT_EQ(r.sampling.max_tokens, 16);  // OpenAI's default for completions
  r = parse_completion_request({{"prompt", {1, 2, 3}}, {"logprobs", 2}, {"echo", false}}, kLimits);
  EXPECT_EQ(r.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  r = parse_completion_request({{"prompt", {"a", "b"}}, {"n", 2}}, kLimits);
  EXPECT_EQ(r.prompts.size(), 2u);
  r = parse_completion_request({{"prompt", {{1, 2}, {3}}}}, kLimits);
  EXPECT_EQ(r.prompts.size(), 2u);

  EXPECT_EQ(error_param(json::object(), false), "prompt");
  EXPECT_EQ(error_param({{"prompt", 5}}, false), "prompt");
  EXPECT_EQ(error_param({{"prompt", json::array()}}, false), "prompt");
  EXPECT_EQ(error_param({{"prompt", {1, "a"}}}, false), "prompt");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"suffix", "y"}}, false), "suffix");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"logprobs", 50}}, false), "logprobs");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"logprobs", true}}, false), "logprobs");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"best_of", 3}}, false), "best_of");
}

}  // namespace
}  // namespace kestrel::server

#include "server/openai_response.h"

namespace kestrel::server {

std::string dump_json(const ojson& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"completion_tokens", completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

static ojson token_bytes(const std::string& token) {
  ojson bytes = ojson::array();
  for (const unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

ojson chat_logprobs_json(const std::vector<TokenLogprobEntry>& entries) {
  ojson content = ojson::array();
  for (const auto& e : entries) {
    ojson top = ojson::array();
    for (const auto& t : e.top) {
      top.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", token_bytes(t.token)}});
    }
    content.push_back({{"token", e.sampled.token},
                       {"logprob", e.sampled.logprob},
                       {"bytes", token_bytes(e.sampled.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

ojson completion_logprobs_json(const std::vector<TokenLogprobEntry>& entries, int64_t text_offset) {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top_logprobs = ojson::array(),
        offsets = ojson::array();
  for (const auto& e : entries) {
    tokens.push_back(e.sampled.token);
    token_logprobs.push_back(e.sampled.logprob);
    ojson top = ojson::object();
    for (const auto& t : e.top) {
      if (!top.contains(t.token)) top[t.token] = t.logprob;
    }
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(e.sampled.token.size());
  }
  return {{"text_offset", std::move(offsets)},
          {"token_logprobs", std::move(token_logprobs)},
          {"tokens", std::move(tokens)},
          {"top_logprobs", std::move(top_logprobs)}};
}

static ojson tool_call_delta_json(const GlmToolCallDelta& d) {
  ojson call = {{"index", d.index}};
  ojson function = ojson::object();
  if (d.id) {
    call["id"] = *d.id;
    call["type"] = "function";
  }
  if (d.name) function["name"] = *d.name;
  function["arguments"] = d.arguments;
  call["function"] = std::move(function);
  return call;
}

ojson chat_delta_json(const ChatDelta& delta, bool with_role) {
  ojson d = ojson::object();
  if (with_role) d["role"] = "assistant";
  if (!delta.reasoning.empty()) {
    d["reasoning_content"] = delta.reasoning;
    d["reasoning"] = delta.reasoning;
  }
  if (!delta.content.empty() || (with_role && delta.empty())) d["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const auto& c : delta.tool_calls) calls.push_back(tool_call_delta_json(c));
    d["tool_calls"] = std::move(calls);
  }
  return d;
}

static ojson reason_json(const std::optional<std::string>& reason) {
  return reason ? ojson(*reason) : ojson(nullptr);
}

ojson chat_chunk(const ResponseHeader& h, int64_t index, ojson delta, ojson logprobs,
                 const std::optional<std::string>& finish_reason, ojson stop_reason) {
  ojson choice = {{"index", index},
                  {"delta", std::move(delta)},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason", reason_json(finish_reason)}};
  if (finish_reason) choice["stop_reason"] = std::move(stop_reason);
  return {{"id", h.id},
          {"object", "chat.completion.chunk"},
          {"created", h.created},
          {"model", h.model},
          {"choices", ojson::array({std::move(choice)})}};
}

ojson completion_chunk(const ResponseHeader& h, int64_t index, const std::string& text, ojson logprobs,
                       const std::optional<std::string>& finish_reason, ojson stop_reason) {
  ojson choice = {{"index", index},
                  {"text", text},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason", reason_json(finish_reason)}};
  if (finish_reason) choice["stop_reason"] = std::move(stop_reason);
  return {{"id", h.id},
          {"object", "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", ojson::array({std::move(choice)})}};
}

ojson usage_chunk(const ResponseHeader& h, bool chat, ojson usage) {
  return {{"id", h.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", ojson::array()},
          {"usage", std::move(usage)}};
}

ojson chat_message_json(const ChoiceState& choice) {
  const ChatTextParser& chat = choice.chat();
  ojson message = {{"role", "assistant"}};
  // An answer made only of tool calls has null content, as OpenAI returns it.
  message["content"] = chat.content().empty() && !chat.tool_calls().empty() ? ojson(nullptr) : ojson(chat.content());
  const ojson reasoning = chat.reasoning().empty() ? ojson(nullptr) : ojson(chat.reasoning());
  message["reasoning_content"] = reasoning;
  message["reasoning"] = reasoning;
  ojson calls = ojson::array();
  for (const auto& c : chat.tool_calls()) {
    calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  message["tool_calls"] = std::move(calls);
  return message;
}

ojson chat_response(const ResponseHeader& h, const std::vector<const ChoiceState*>& choices, bool logprobs,
                    ojson usage) {
  ojson list = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = *choices[i];
    list.push_back({{"index", i},
                    {"message", chat_message_json(c)},
                    {"logprobs", logprobs ? chat_logprobs_json(c.logprobs()) : ojson(nullptr)},
                    {"finish_reason", c.finish_reason()},
                    {"stop_reason", c.stop_reason()}});
  }
  return {{"id", h.id},
          {"object", "chat.completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", std::move(list)},
          {"usage", std::move(usage)}};
}

ojson completion_response(const ResponseHeader& h, const std::vector<const ChoiceState*>& choices,
                          const std::vector<std::string>& prefixes, bool logprobs, ojson usage) {
  ojson list = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = *choices[i];
    const std::string& prefix = i < prefixes.size() ? prefixes[i] : std::string();
    list.push_back(
        {{"index", i},
         {"text", prefix + c.text()},
         {"logprobs", logprobs ? completion_logprobs_json(c.logprobs(), static_cast<int64_t>(prefix.size())) : ojson(nullptr)},
         {"finish_reason", c.finish_reason()},
         {"stop_reason", c.stop_reason()}});
  }
  return {{"id", h.id},
          {"object", "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", std::move(list)},
          {"usage", std::move(usage)}};
}

}  // namespace kestrel::server

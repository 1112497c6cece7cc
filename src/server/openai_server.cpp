#include "server/openai_server.h"

#include <nlohmann/json.hpp>

#include <ctime>
#include <random>

#include "base/error.h"
#include "base/log.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/openai_response.h"

namespace kestrel::server {

namespace http = boost::beast::http;
using json = nlohmann::json;

namespace {

constexpr int kMaxJsonDepth = 256;

// Deepest bracket nesting outside strings: checked before parsing so a hostile body cannot exhaust the stack.
int json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

json parse_body(const std::string& body) {
  if (body.empty()) throw ApiError(400, "the request body is empty; a JSON object is expected");
  if (json_depth(body) > kMaxJsonDepth) throw ApiError(400, fmt::format("JSON nested deeper than {}", kMaxJsonDepth));
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("invalid JSON body: {}", e.what()));
  }
}

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

// Compares every byte whatever the first difference, so response time does not reveal a key's prefix.
bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

OpenAiServer::OpenAiServer(ServeOptions options, const text::Tokenizer& tokenizer, const ChatTemplate& chat_template,
                           Engine& engine)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      template_(chat_template),
      engine_(engine),
      metrics_(options_.served_model_name),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  limits_.max_logprobs = engine_.config().max_logprobs;
  limits_.max_n = options_.max_n;
  limits_.enable_auto_tool_choice = options_.enable_auto_tool_choice;
  limits_.has_tool_parser = options_.tool_parser;
}

void OpenAiServer::handle(HttpRequest& request, std::shared_ptr<Exchange> exchange) {
  const auto json_response = [&](int status, std::string body) {
    exchange->respond(status, "application/json", std::move(body));
  };
  try {
    const std::string_view path = request.path();
    const http::verb method = request.method;
    const auto expect = [&](std::initializer_list<http::verb> allowed, const char* allow_header) {
      for (const auto v : allowed) {
        if (v == method) return;
      }
      throw ApiError(405, fmt::format("method {} not allowed on {}; use {}", request.method_name, path, allow_header),
                     "", "invalid_request_error");
    };
    if (path.starts_with("/v1/")) check_api_key(request);
    if (path == "/health") {
      expect({http::verb::get, http::verb::head}, "GET");
      return exchange->respond(200, "application/json", "");
    }
    if (path == "/ping") {
      expect({http::verb::get, http::verb::post}, "GET, POST");
      return exchange->respond(200, "application/json", "");
    }
    if (path == "/metrics") {
      expect({http::verb::get}, "GET");
      return exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(engine_.stats()));
    }
    if (path == "/version") {
      expect({http::verb::get}, "GET");
      return json_response(200, dump_json({{"version", KESTREL_VERSION}}));
    }
    if (path == "/v1/models") {
      expect({http::verb::get}, "GET");
      return json_response(200, models());
    }
    if (path == "/tokenize") {
      expect({http::verb::post}, "POST");
      return json_response(200, tokenize(request.body));
    }
    if (path == "/detokenize") {
      expect({http::verb::post}, "POST");
      return json_response(200, detokenize(request.body));
    }
    if (path == "/v1/chat/completions") {
      expect({http::verb::post}, "POST");
      return chat_completions(request, exchange);
    }
    if (path == "/v1/completions") {
      expect({http::verb::post}, "POST");
      return completions(request, exchange);
    }
    throw ApiError(404, fmt::format("no route {} {}", request.method_name, path), "", "not_found_error");
  } catch (const ApiError& e) {
    json_response(e.status, error_body(e));
  } catch (const Error& e) {
    // Bad input found below the API layer: template errors, tokenizer input, engine validation.
    json_response(400, error_body(400, e.what(), "invalid_request_error"));
  } catch (const std::exception& e) {
    log_warn("internal error answering {} {}: {}", request.method_name, request.target, e.what());
    json_response(500, error_body(500, fmt::format("internal error: {}", e.what()), "internal_server_error"));
  }
}

void OpenAiServer::check_api_key(const HttpRequest& request) const {
  if (!options_.api_key) return;
  const std::string_view auth = request.header(http::field::authorization);
  constexpr std::string_view bearer = "Bearer ";
  if (auth.starts_with(bearer) && constant_time_equal(auth.substr(bearer.size()), *options_.api_key)) return;
  throw ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'", "", "invalid_request_error",
                 "invalid_api_key");
}

void OpenAiServer::check_model(const std::string& model) const {
  if (model.empty() || model == options_.served_model_name) return;
  throw ApiError(404, fmt::format("The model `{}` does not exist.", model), "model", "invalid_request_error",
                 "model_not_found");
}

std::string OpenAiServer::models() const {
  const int64_t max_model_len = engine_.config().max_model_len;
  ojson model = {{"id", options_.served_model_name},
                 {"object", "model"},
                 {"created", created_},
                 {"owned_by", "kestrel"},
                 {"root", options_.model_path},
                 {"parent", nullptr},
                 {"max_model_len", max_model_len}};
  return dump_json({{"object", "list"}, {"data", ojson::array({model})}});
}

void OpenAiServer::resolve_max_tokens(GenerationRequest& r, int64_t prompt_tokens, const char* prompt_param) const {
  const int64_t max_model_len = engine_.config().max_model_len;
  if (prompt_tokens >= max_model_len) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, your request has {} input "
                               "tokens. Please reduce the length of the input.",
                               max_model_len, prompt_tokens),
                   prompt_param);
  }
  const int64_t room = max_model_len - prompt_tokens;
  if (!r.sampling.max_tokens) {
    r.sampling.max_tokens = room;
  } else if (*r.sampling.max_tokens > room) {
    throw ApiError(400,
                   fmt::format("'max_tokens' or 'max_completion_tokens' is too large: {}. This model's maximum context "
                               "length is {} tokens and your request has {} input tokens ({} > {} - {}).",
                               *r.sampling.max_tokens, max_model_len, prompt_tokens, *r.sampling.max_tokens,
                               max_model_len, prompt_tokens),
                   r.chat ? "max_completion_tokens" : "max_tokens");
  }
  if (r.sampling.min_tokens > *r.sampling.max_tokens) {
    throw ApiError(400, fmt::format("'min_tokens' ({}) must not exceed 'max_tokens' ({})", r.sampling.min_tokens,
                                    *r.sampling.max_tokens),
                   "min_tokens");
  }
}

void OpenAiServer::chat_completions(HttpRequest& request, std::shared_ptr<Exchange> exchange) {
  const json body = parse_body(request.body);
  GenerationRequest r = parse_chat_request(body, limits_);
  check_model(r.model);
  if (draining_) throw ApiError(503, "the server is shutting down");
  const std::string prompt = template_.render_json(request.body);
  std::vector<int32_t> ids = tokenizer_.encode(prompt, {.add_special_tokens = false, .split_special_tokens = true});
  resolve_max_tokens(r, static_cast<int64_t>(ids.size()), "messages");

  ChoiceOptions options{.skip_special_tokens = r.skip_special_tokens,
                        .stop = r.stop,
                        .include_stop_str_in_output = r.include_stop_str_in_output,
                        .min_tokens = r.sampling.min_tokens,
                        .want_logprobs = r.logprobs,
                        .chat = true,
                        .parser = {}};
  if (options_.reasoning_parser) options.parser.thinking = glm_thinking_enabled(r.chat_template_kwargs);
  if (options_.tool_parser && r.tool_choice != ToolChoice::none && !r.tools.empty()) {
    std::vector<GlmToolSpec> tools;
    for (const auto& t : r.tools) {
      if (r.tool_choice != ToolChoice::named || t.name == r.named_tool) tools.push_back(t);
    }
    options.parser.tools = std::move(tools);
  }
  ResponseHeader header{.id = random_id("chatcmpl-"), .created = static_cast<int64_t>(std::time(nullptr)),
                        .model = options_.served_model_name};
  std::vector<PreparedPrompt> prompts;
  prompts.push_back({.token_ids = std::move(ids), .echo = {}});
  auto generation = std::make_shared<Generation>(GenerationContext{tokenizer_, engine_, metrics_, in_flight_},
                                                 std::move(r), std::move(prompts), std::move(options),
                                                 std::move(header), exchange);
  generation->start();
}

void OpenAiServer::completions(HttpRequest& request, std::shared_ptr<Exchange> exchange) {
  const json body = parse_body(request.body);
  GenerationRequest r = parse_completion_request(body, limits_);
  check_model(r.model);
  if (draining_) throw ApiError(503, "the server is shutting down");
  std::vector<PreparedPrompt> prompts;
  int64_t longest = 0;
  for (const auto& p : r.prompts) {
    PreparedPrompt prepared;
    if (p.text) {
      prepared.token_ids = tokenizer_.encode(*p.text, {.add_special_tokens = true, .split_special_tokens = true});
      prepared.echo = *p.text;
    } else {
      for (const int32_t id : p.token_ids) {
        if (static_cast<size_t>(id) >= tokenizer_.vocab_size() || id >= options_.model_vocab_size) {
          throw ApiError(400, fmt::format("prompt token id {} is outside the vocabulary", id), "prompt");
        }
      }
      prepared.token_ids = p.token_ids;
      if (r.echo) prepared.echo = tokenizer_.decode(p.token_ids);
    }
    if (prepared.token_ids.empty()) throw ApiError(400, "the prompt is empty", "prompt");
    if (!r.echo) prepared.echo.clear();
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prepared.token_ids.size()));
    prompts.push_back(std::move(prepared));
  }
  resolve_max_tokens(r, longest, "prompt");
  ChoiceOptions options{.skip_special_tokens = r.skip_special_tokens,
                        .stop = r.stop,
                        .include_stop_str_in_output = r.include_stop_str_in_output,
                        .min_tokens = r.sampling.min_tokens,
                        .want_logprobs = r.logprobs,
                        .chat = false,
                        .parser = {}};
  ResponseHeader header{.id = random_id("cmpl-"), .created = static_cast<int64_t>(std::time(nullptr)),
                        .model = options_.served_model_name};
  auto generation = std::make_shared<Generation>(GenerationContext{tokenizer_, engine_, metrics_, in_flight_},
                                                 std::move(r), std::move(prompts), std::move(options),
                                                 std::move(header), exchange);
  generation->start();
}

std::string OpenAiServer::tokenize(const std::string& text) const {
  const json body = parse_body(text);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) throw ApiError(400, "'model' must be a string", "model");
    check_model(body["model"].get<std::string>());
  }
  const auto flag = [&](const char* name, bool fallback) {
    if (!body.contains(name) || body[name].is_null()) return fallback;
    if (!body[name].is_boolean()) throw ApiError(400, fmt::format("'{}' must be a boolean", name), name);
    return body[name].get<bool>();
  };
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    if (!body["messages"].is_array()) throw ApiError(400, "'messages' must be a list", "messages");
    ids = tokenizer_.encode(template_.render_json(text), {.add_special_tokens = flag("add_special_tokens", false), .split_special_tokens = true});
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    ids = tokenizer_.encode(body["prompt"].get<std::string>(), {.add_special_tokens = flag("add_special_tokens", true), .split_special_tokens = true});
  } else {
    throw ApiError(400, "either 'prompt' (a string) or 'messages' is required", "prompt");
  }
  ojson out = {{"count", ids.size()}, {"max_model_len", engine_.config().max_model_len}, {"tokens", ids}};
  if (flag("return_token_strs", false)) {
    ojson strs = ojson::array();
    for (const int32_t id : ids) {
      const std::string* s = tokenizer_.id_to_token(id);
      strs.push_back(s ? *s : std::string());
    }
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  return dump_json(out);
}

std::string OpenAiServer::detokenize(const std::string& text) const {
  const json body = parse_body(text);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    throw ApiError(400, "'tokens' (a list of token ids) is required", "tokens");
  }
  if (body.contains("model") && body["model"].is_string()) check_model(body["model"].get<std::string>());
  std::vector<int32_t> ids;
  for (const auto& v : body["tokens"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= options_.model_vocab_size ||
        !tokenizer_.id_to_token(static_cast<int32_t>(v.get<int64_t>()))) {
      throw ApiError(400, fmt::format("'tokens' entry {} is not a token id of this model", v.dump()), "tokens");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return dump_json({{"prompt", tokenizer_.decode(ids)}});
}

}  // namespace kestrel::server

// The OpenAI-compatible application: routes, API-key check, request parsing and the small endpoints (/health,
// /metrics, /version, /v1/models, /tokenize, /detokenize); generation requests go to a Generation. Every error is
// answered as an OpenAI error object with a 4xx (5xx only for our own failures).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace kestrel::server {

struct ServeOptions {
  std::string served_model_name;
  std::string model_path;
  std::optional<std::string> api_key;
  bool tool_parser = false;       // --tool-call-parser glm47
  bool reasoning_parser = false;  // --reasoning-parser glm45
  bool enable_auto_tool_choice = false;
  int64_t max_n = 64;
  int64_t model_vocab_size = 0;   // the model's (token ids at or past it are refused)
};

class OpenAiServer {
public:
  OpenAiServer(ServeOptions options, const text::Tokenizer& tokenizer, const ChatTemplate& chat_template,
               Engine& engine);

  void handle(HttpRequest& request, std::shared_ptr<Exchange> exchange);
  // From now on generation requests get 503 (SIGTERM: the engine drains what it accepted).
  void begin_drain() { draining_ = true; }
  int in_flight() const { return in_flight_.load(); }

private:
  void chat_completions(HttpRequest& request, std::shared_ptr<Exchange> exchange);
  void completions(HttpRequest& request, std::shared_ptr<Exchange> exchange);
  std::string models() const;
  std::string tokenize(const std::string& body) const;
  std::string detokenize(const std::string& body) const;
  void check_model(const std::string& model) const;
  void check_api_key(const HttpRequest& request) const;
  // max_tokens resolved against the prompt and max_model_len, with vLLM's errors.
  void resolve_max_tokens(GenerationRequest& request, int64_t prompt_tokens, const char* prompt_param) const;

  ServeOptions options_;
  const text::Tokenizer& tokenizer_;
  const ChatTemplate& template_;
  Engine& engine_;
  RequestLimits limits_;
  Metrics metrics_;
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  int64_t created_;
};

}  // namespace kestrel::server

// `kestrel serve`: the OpenAI-compatible HTTP server, with `vllm serve`'s flag names so clients and launch scripts
// written for vLLM's GLM recipe work unchanged. SIGTERM/SIGINT: stop accepting, let the engine finish what it
// accepted, answer it, then exit.
#include <boost/asio/signal_set.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/device_option.h"
#include "engine/engine.h"
#include "model/glm5_next.h"
#include "server/http_server.h"
#include "server/openai_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace kestrel::cli {

Action add_serve_command(CLI::App& app) {
  struct Options {
    std::string model, served_model_name, host = "0.0.0.0", api_key, tool_call_parser, reasoning_parser;
    std::string chat_template, kv_cache_dtype = "auto", dtype = "auto", device = "auto";
    int port = 8888;
    int64_t max_model_len = 0, max_num_seqs = 16, max_num_batched_tokens = 2048;
    bool enable_prefix_caching = true, enable_auto_tool_choice = false;
    double read_timeout = 30.0, gpu_memory_utilization = 0.9;
    int64_t max_request_bytes = 16 * 1024 * 1024;
    int http_threads = 2;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (vLLM's flags)");
  cmd->add_option("--model", o->model, "Checkpoint directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("--served-model-name", o->served_model_name, "Model name in the API (default: --model)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  add_device_option(cmd, o->device);
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--max-model-len", o->max_model_len, "Prompt + output tokens per request (0: the model's)")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences running at once")->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "Fraction of the GPU's memory to use, weights and cache included (the cache gets the rest)")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens computed per engine step")
      ->capture_default_str();
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->enable_prefix_caching,
                "Automatic prefix caching (default on)");
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_dtype_option(cmd, o->dtype);
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1/* (env KESTREL_API_KEY, VLLM_API_KEY)");
  cmd->add_option("--tool-call-parser", o->tool_call_parser, "Tool call parser: glm47");
  cmd->add_option("--reasoning-parser", o->reasoning_parser, "Reasoning parser: glm45");
  cmd->add_flag("--enable-auto-tool-choice", o->enable_auto_tool_choice, "Parse tool calls for tool_choice auto");
  cmd->add_option("--chat-template", o->chat_template, "Jinja chat template file (default: the model's)");
  cmd->add_option("--request-read-timeout", o->read_timeout, "Seconds to receive one request (408 after)")
      ->capture_default_str();
  cmd->add_option("--max-request-bytes", o->max_request_bytes, "Largest request body (413 above)")->capture_default_str();
  cmd->add_option("--http-threads", o->http_threads, "HTTP event-loop threads")->capture_default_str();
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    const CacheDtype kv_cache_dtype = parse_kv_cache_dtype(o->kv_cache_dtype);
    const ProductInput product_input = parse_dtype(o->dtype);
    require(o->tool_call_parser.empty() || o->tool_call_parser == "glm47",
            "--tool-call-parser {} is not supported (glm47 is)", o->tool_call_parser);
    require(o->reasoning_parser.empty() || o->reasoning_parser == "glm45",
            "--reasoning-parser {} is not supported (glm45 is)", o->reasoning_parser);
    require(!o->enable_auto_tool_choice || !o->tool_call_parser.empty(),
            "--enable-auto-tool-choice requires --tool-call-parser");
    require(o->read_timeout > 0, "--request-read-timeout must be positive");
    require(o->max_request_bytes > 0, "--max-request-bytes must be positive");
    require(o->http_threads >= 1 && o->http_threads <= 64, "--http-threads must be in [1, 64]");
    std::optional<std::string> api_key;
    if (!o->api_key.empty()) {
      api_key = o->api_key;
    } else if (const char* k = std::getenv("KESTREL_API_KEY"); k && *k) {
      api_key = k;
    } else if (const char* v = std::getenv("VLLM_API_KEY"); v && *v) {
      api_key = v;
    }

    const std::filesystem::path dir(o->model);
    const auto tokenizer = text::Tokenizer::load(dir / "tokenizer.json");
    const ChatTemplate chat_template =
        ChatTemplate::load(dir, o->chat_template.empty() ? std::nullopt : std::optional<std::filesystem::path>(o->chat_template));
    const auto backend = make_backend(o->device, product_input);
    const auto model = Glm5NextModel::load(o->model, *backend);
    EngineConfig config;
    config.max_model_len = o->max_model_len;
    config.max_num_seqs = o->max_num_seqs;
    config.gpu_memory_utilization = o->gpu_memory_utilization;
    config.max_num_batched_tokens = o->max_num_batched_tokens;
    config.enable_prefix_caching = o->enable_prefix_caching;
    config.kv_cache_dtype = kv_cache_dtype;
    config.eos_token_ids = model_eos_token_ids(dir, model->config());
    Engine engine(std::make_unique<EngineCore>(*model, config));

    server::ServeOptions serve{.served_model_name = o->served_model_name.empty() ? o->model : o->served_model_name,
                               .model_path = o->model,
                               .api_key = api_key,
                               .tool_parser = !o->tool_call_parser.empty(),
                               .reasoning_parser = !o->reasoning_parser.empty(),
                               .enable_auto_tool_choice = o->enable_auto_tool_choice,
                               .max_n = 64,
                               .model_vocab_size = model->config().vocab_size};
    server::OpenAiServer api(serve, *tokenizer, chat_template, engine);
    server::HttpOptions http_options;
    http_options.host = o->host;
    http_options.port = static_cast<uint16_t>(o->port);
    http_options.max_body_bytes = static_cast<size_t>(o->max_request_bytes);
    http_options.read_timeout = std::chrono::milliseconds(static_cast<int64_t>(o->read_timeout * 1000));
    http_options.threads = o->http_threads;
    server::HttpServer http(http_options, [&api](server::HttpRequest& request, std::shared_ptr<server::Exchange> ex) {
      api.handle(request, std::move(ex));
    });

    // Drain on SIGTERM/SIGINT: refuse new work, wait for the engine and for the last answers to go out.
    std::thread drainer;
    boost::asio::signal_set signals(http.io(), SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int signal) {
      if (ec) return;
      log_info("signal {}: draining {} in-flight requests", signal, api.in_flight());
      api.begin_drain();
      http.stop_accepting();
      drainer = std::thread([&] {
        engine.drain();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (api.in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        http.stop();
      });
    });
    std::printf("kestrel serve: model %s ready on http://%s:%u\n", serve.served_model_name.c_str(), o->host.c_str(),
                static_cast<unsigned>(http.port()));
    // A request to paste, addressed to where a local client reaches the server.
    const std::string reach = (o->host == "0.0.0.0" || o->host == "::") ? "localhost" : o->host;
    std::printf("try: curl http://%s:%u/v1/chat/completions -H 'Content-Type: application/json'%s -d '{\"model\": "
                "\"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}'\n",
                reach.c_str(), static_cast<unsigned>(http.port()),
                api_key ? " -H \"Authorization: Bearer <api key>\"" : "", serve.served_model_name.c_str());
    std::fflush(stdout);
    http.run();
    if (drainer.joinable()) drainer.join();
    log_info("server stopped");
    return 0;
  };
}

}  // namespace kestrel::cli

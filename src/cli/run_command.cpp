// `kestrel run`: generation through the serving engine from the command line, in three forms —
//   --tokens IDS   token ids in, token ids out ("prompt: ..." and "continuation: ..." lines; no tokenizer needed);
//   -p PROMPT      one user message through the chat template (or as raw text with --raw), the answer streamed as text;
//   neither        a chat: one user message per line of stdin, the conversation kept across turns, until /exit or
//                  end of input (Ctrl-D). A "> " prompt is shown when stdin is a terminal.
// Sampling defaults to greedy so that a run repeats; --temperature and the other flags are vLLM's sampling
// parameters. Stop ids are the model's EOS ids (config.json and generation_config.json).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/device_option.h"
#include "cli/token_list.h"
#include "engine/engine.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace kestrel::cli {

namespace {

struct RunOptions {
  std::string model, device = "auto", kv_cache_dtype = "auto", dtype = "auto";
  std::optional<std::string> tokens, prompt, chat_template;
  bool raw = false;
  int64_t max_tokens = 256;
  int64_t max_model_len = 0;
  double gpu_memory_utilization = 0.9;
  SamplingParams sampling{.temperature = 0.0f};
};

// Runs one request to its end, handing each new token id to `on_token`; adds its time in the engine to `seconds`
// (a chat's time waiting for the user is not generation time).
void generate(Engine& engine, std::vector<int32_t> prompt, const SamplingParams& sampling,
              const std::function<void(int32_t)>& on_token, double& seconds) {
  const auto stream = engine.submit({.prompt_token_ids = std::move(prompt), .sampling = sampling});
  while (const auto output = stream->next()) {
    require(output->finish_reason != FinishReason::error, "generation failed: {}", output->error);
    for (const int32_t id : output->token_ids) on_token(id);
    if (output->finish_reason) {
      seconds += std::chrono::duration<double>(output->times.finished - output->times.arrival).count();
    }
  }
}

void print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// The token-id form (as before the engine existed, so scripts and tests keep their format).
int run_tokens(Engine& engine, const RunOptions& options, double& seconds) {
  const std::vector<int32_t> prompt = parse_token_list(*options.tokens);
  std::printf("prompt:");
  for (const int32_t id : prompt) std::printf(" %d", id);
  std::printf("\ncontinuation:");
  std::fflush(stdout);
  if (options.max_tokens > 0) {
    generate(
        engine, prompt, options.sampling,
        [](int32_t id) {
          std::printf(" %d", id);
          std::fflush(stdout);
        },
        seconds);
  }
  std::printf("\n");
  std::fflush(stdout);
  return 0;
}

class TextSession {
public:
  TextSession(Engine& engine, const RunOptions& options)
      : engine_(engine), options_(options), tokenizer_(text::Tokenizer::load(options.model + "/tokenizer.json")) {
    if (!options.raw) {
      std::optional<std::filesystem::path> file;
      if (options.chat_template) file = *options.chat_template;
      chat_template_.emplace(ChatTemplate::load(options.model, file));
    }
  }

  double seconds() const { return seconds_; }

  // Answers `user` after the conversation so far, streaming the text to stdout; returns the answer.
  std::string answer(const std::string& user) {
    std::vector<int32_t> prompt;
    if (chat_template_) {
      messages_.push_back({{"role", "user"}, {"content", user}});
      const nlohmann::json request{{"messages", messages_}};
      // The template writes the special tokens itself.
      prompt = tokenizer_->encode(chat_template_->render_json(request.dump()),
                                  text::EncodeOptions{.add_special_tokens = false});
    } else {
      prompt = tokenizer_->encode(user);
    }
    text::Detokenizer detokenizer(*tokenizer_, /*skip_special_tokens=*/true);
    std::string reply;
    if (options_.max_tokens > 0) {
      generate(
          engine_, std::move(prompt), options_.sampling,
          [&](int32_t id) {
            const std::string delta = detokenizer.feed(id);
            reply += delta;
            print(delta);
          },
          seconds_);
    }
    const std::string tail = detokenizer.finish();
    reply += tail;
    print(tail + "\n");
    if (chat_template_) messages_.push_back({{"role", "assistant"}, {"content", reply}});
    return reply;
  }

private:
  Engine& engine_;
  const RunOptions& options_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::vector<nlohmann::json> messages_;
  double seconds_ = 0.0;
};

int run_chat(TextSession& session) {
  const bool terminal = ::isatty(STDIN_FILENO) != 0;
  if (terminal) std::fprintf(stderr, "Chat with the model; /exit or Ctrl-D ends it.\n");
  for (;;) {
    if (terminal) print("> ");
    std::string line;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    session.answer(line);
  }
  if (terminal) print("\n");
  return 0;
}

}  // namespace

Action add_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  SamplingParams& s = options->sampling;
  CLI::App* cmd = app.add_subcommand("run", "Generate from a prompt, or chat, through the engine");
  cmd->add_option("--model", options->model, "Checkpoint directory (config.json, safetensors, tokenizer)")->required();
  auto* tokens = cmd->add_option("--tokens", options->tokens, "Comma-separated prompt token ids (prints ids)");
  cmd->add_option("-p,--prompt", options->prompt, "A user message (without it: chat, one message per line)")
      ->excludes(tokens);
  cmd->add_flag("--raw", options->raw, "Feed the prompt as plain text, without the chat template");
  cmd->add_option("--chat-template", options->chat_template, "Jinja template file to use instead of the model's");
  cmd->add_option("-n,--max-tokens", options->max_tokens, "Tokens to generate per answer")->capture_default_str();
  cmd->add_option("--max-model-len", options->max_model_len, "Context length (0: the model's)")->capture_default_str();
  add_device_option(cmd, options->device);
  add_kv_cache_dtype_option(cmd, options->kv_cache_dtype);
  add_dtype_option(cmd, options->dtype);
  cmd->add_option("--gpu-memory-utilization", options->gpu_memory_utilization,
                  "Fraction of the GPU's memory to use, weights and cache included")
      ->capture_default_str();
  cmd->add_option("--temperature", s.temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Drop tokens below this fraction of the most likely")->capture_default_str();
  cmd->add_option("--repetition-penalty", s.repetition_penalty, "Penalty on seen tokens (1: none)")
      ->capture_default_str();
  cmd->add_option("--seed", s.seed, "Random seed (same seed, same output)");
  return [cmd, options]() -> int {
    if (!cmd->parsed()) return -1;
    require(options->max_tokens >= 0, "--max-tokens must not be negative");
    options->sampling.max_tokens = std::max<int64_t>(options->max_tokens, 1);
    const CacheDtype kv_cache_dtype = parse_kv_cache_dtype(options->kv_cache_dtype);
    const ProductInput product_input = parse_dtype(options->dtype);

    const auto backend = make_backend(options->device, product_input);
    const auto model = Glm5NextModel::load(options->model, *backend);
    // One sequence at a time; the prefix cache lets each chat turn reuse the conversation's earlier blocks.
    Engine engine(std::make_unique<EngineCore>(
        *model, EngineConfig{.max_model_len = options->max_model_len,
                             .max_num_seqs = 1,
                             .gpu_memory_utilization = options->gpu_memory_utilization,
                             .kv_cache_dtype = kv_cache_dtype,
                             .eos_token_ids = model_eos_token_ids(options->model, model->config())}));
    int status;
    double seconds = 0.0;
    if (options->tokens) {
      status = run_tokens(engine, *options, seconds);
    } else {
      TextSession session(engine, *options);
      status = options->prompt ? (session.answer(*options->prompt), 0) : run_chat(session);
      seconds = session.seconds();
    }
    const EngineStats stats = engine.stats();
    log_info("{} tokens generated in {:.3f} s ({:.1f} tokens/s, prompts included); {} prompt tokens from the cache",
             stats.scheduler.generation_tokens, seconds,
             static_cast<double>(stats.scheduler.generation_tokens) / seconds, stats.cache.prefix_cache_hits);
    return status;
  };
}

}  // namespace kestrel::cli

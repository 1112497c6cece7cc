// `kestrel run`: greedy continuation of a token sequence, printed as token ids as they are produced. (Text prompts
// arrive with the tokenizer.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/token_list.h"
#include "model/glm5_next.h"

namespace kestrel::cli {

Action add_run_command(CLI::App& app) {
  struct Options {
    std::string model, tokens;
    int64_t max_tokens = 32;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Greedy continuation of a token sequence");
  cmd->add_option("--model", options->model, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--tokens", options->tokens, "Comma-separated prompt token ids")->required();
  cmd->add_option("-n,--max-tokens", options->max_tokens, "Tokens to generate")->capture_default_str();
  return [cmd, options]() -> int {
    if (!cmd->parsed()) return -1;
    std::vector<int32_t> tokens = parse_token_list(options->tokens);
    require(options->max_tokens >= 0, "--max-tokens must not be negative");
    CpuBackend backend;
    const auto model = Glm5NextModel::load(options->model, backend);
    const auto sequence = model->new_sequence();
    const auto& eos = model->config().eos_token_ids;
    std::printf("prompt:");
    for (const int32_t id : tokens) std::printf(" %d", id);
    std::printf("\ncontinuation:");
    std::span<const int32_t> next = tokens;
    const auto started = std::chrono::steady_clock::now();
    int64_t generated = 0;
    for (int64_t i = 0; i < options->max_tokens; ++i, ++generated) {
      const std::vector<float> logits = model->forward(*sequence, next, ForwardOptions{.all_logits = false});
      const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      std::printf(" %d", best);
      std::fflush(stdout);
      tokens.push_back(best);
      next = std::span<const int32_t>(tokens).last(1);
      if (std::find(eos.begin(), eos.end(), best) != eos.end()) {
        ++generated;
        break;
      }
    }
    std::printf("\n");
    std::fflush(stdout);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    log_info("{} tokens in {:.3f} s ({:.1f} tokens/s, prompt included)", generated, seconds,
             static_cast<double>(generated) / seconds);
    return 0;
  };
}

}  // namespace kestrel::cli

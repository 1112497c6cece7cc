// `kestrel render`: an OpenAI chat-completions request (JSON on stdin) -> the prompt text on stdout, exactly as
// transformers' apply_chat_template(messages, tools=..., add_generation_prompt=True, **chat_template_kwargs).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "text/chat_template.h"

namespace kestrel::cli {

Action add_render_command(CLI::App& app) {
  struct Options {
    std::string model;
    std::optional<std::string> chat_template;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("render", "Render an OpenAI chat request (stdin) with the model's chat template");
  cmd->add_option("--model", options->model, "Model directory (tokenizer_config.json, chat_template.jinja)")->required();
  cmd->add_option("--chat-template", options->chat_template, "Jinja template file to use instead of the model's");
  return [cmd, options]() -> int {
    if (!cmd->parsed()) return -1;
    std::optional<std::filesystem::path> file;
    if (options->chat_template) file = *options->chat_template;
    const ChatTemplate chat_template = ChatTemplate::load(options->model, file);
    const std::string request{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    const std::string prompt = chat_template.render_json(request);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    return 0;
  };
}

}  // namespace kestrel::cli

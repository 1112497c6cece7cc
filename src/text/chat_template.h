// Chat templates as transformers applies them: the template text chosen as a tokenizer loads it, the variables
// apply_chat_template passes, and an OpenAI chat-completions request turned into that call:
//
//   apply_chat_template(messages, tools=tools, documents=documents,
//                       add_generation_prompt=request.get("add_generation_prompt", True),
//                       **special_tokens_map, **{"reasoning_effort": ...}, **chat_template_kwargs)
//
// Template source, in transformers' order: an explicit file; else `chat_template.jinja` in the model directory
// (plus `additional_chat_templates/NAME.jinja`); else tokenizer_config.json "chat_template" (a string, or a list of
// {name, template}). With several named templates, "tool_use" is picked when the request has tools, else "default".
// Special tokens: tokenizer_config.json's bos/eos/unk/sep/pad/cls/mask_token and any other "*_token" string
// (strings or AddedToken objects), as tokenizer.special_tokens_map gives them to the template.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "base/py_value.h"
#include "text/jinja.h"

namespace kestrel {

class ChatTemplate {
public:
  // Throws Error naming the file at fault (missing template, malformed JSON, template syntax error).
  static ChatTemplate load(const std::filesystem::path& model_dir,
                           const std::optional<std::filesystem::path>& template_file = std::nullopt);
  // From template text and special tokens directly (tests, fixtures).
  ChatTemplate(std::map<std::string, std::string> templates, py::Dict special_tokens);

  // Renders an OpenAI chat-completions request (a JSON object as py::Value). Throws Error for a malformed
  // request or a template error.
  std::string render(const py::Value& request) const;
  std::string render_json(std::string_view request_json) const;

  const py::Dict& special_tokens() const { return special_tokens_; }

private:
  const jinja::Template& pick(bool has_tools) const;

  std::map<std::string, jinja::Template> templates_;
  py::Dict special_tokens_;
};

}  // namespace kestrel

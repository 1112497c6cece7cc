#include "server/openai_request.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace kestrel::server {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

// Reads optional fields of the request object; null counts as absent (the OpenAI clients send null for "unset").
class Fields {
public:
  explicit Fields(const json& body) : body_(body) {}

  const json* get(const char* name) const {
    const auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<bool> boolean(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean", name));
    return v->get<bool>();
  }
  std::optional<double> number(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(name, fmt::format("'{}' must be a number", name));
    const double d = v->get<double>();
    if (!std::isfinite(d)) bad(name, fmt::format("'{}' must be finite", name));
    return d;
  }
  std::optional<int64_t> integer(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    return as_integer(*v, name);
  }
  std::optional<std::string> string(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad(name, fmt::format("'{}' must be a string", name));
    return v->get<std::string>();
  }

  static int64_t as_integer(const json& v, const std::string& name) {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        bad(name, fmt::format("'{}' is too large", name));
      }
      return v.get<int64_t>();
    }
    // Pydantic's lax mode takes 3.0 for an int; 3.5 is an error.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
    }
    bad(name, fmt::format("'{}' must be an integer", name));
  }

private:
  const json& body_;
};

float bounded(std::optional<double> v, float fallback, double lo, double hi, const char* name) {
  if (!v) return fallback;
  if (*v < lo || *v > hi) bad(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, *v));
  return static_cast<float>(*v);
}

std::vector<int32_t> token_id_list(const json& v, const std::string& name) {
  if (!v.is_array()) bad(name, fmt::format("'{}' must be a list of token ids", name));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const auto& item : v) {
    const int64_t id = Fields::as_integer(item, name);
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) bad(name, fmt::format("'{}' has token id {} out of range", name, id));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// The fields both endpoints share.
void parse_common(const Fields& f, const RequestLimits& limits, GenerationRequest& r) {
  if (const json* model = f.get("model")) {
    if (!model->is_string()) bad("model", "'model' must be a string");
    r.model = model->get<std::string>();
  }
  SamplingParams& s = r.sampling;
  if (auto n = f.integer("n")) {
    if (*n < 1 || *n > limits.max_n) bad("n", fmt::format("'n' must be in [1, {}], got {}", limits.max_n, *n));
    s.n = *n;
  }
  if (auto best_of = f.integer("best_of"); best_of && *best_of != s.n) {
    bad("best_of", "'best_of' other than n is not supported");
  }
  s.temperature = bounded(f.number("temperature"), 1.0f, 0.0, 1e6, "temperature");
  s.top_p = bounded(f.number("top_p"), 1.0f, 0.0, 1.0, "top_p");
  if (s.top_p <= 0.0f) bad("top_p", "'top_p' must be in (0, 1]");
  if (auto k = f.integer("top_k")) {
    if (*k < -1) bad("top_k", fmt::format("'top_k' must be -1 (off), 0 (off) or positive, got {}", *k));
    s.top_k = *k;
  }
  s.min_p = bounded(f.number("min_p"), 0.0f, 0.0, 1.0, "min_p");
  s.presence_penalty = bounded(f.number("presence_penalty"), 0.0f, -2.0, 2.0, "presence_penalty");
  s.frequency_penalty = bounded(f.number("frequency_penalty"), 0.0f, -2.0, 2.0, "frequency_penalty");
  s.repetition_penalty = bounded(f.number("repetition_penalty"), 1.0f, 0.0, 1e6, "repetition_penalty");
  if (s.repetition_penalty <= 0.0f) bad("repetition_penalty", "'repetition_penalty' must be > 0");
  if (const json* bias = f.get("logit_bias")) {
    if (!bias->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (const auto& [key, value] : bias->items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || id < 0 || id > std::numeric_limits<int32_t>::max()) {
        bad("logit_bias", fmt::format("'logit_bias' key '{}' is not a token id", key));
      }
      if (!value.is_number()) bad("logit_bias", "'logit_bias' values must be numbers");
      const double b = value.get<double>();
      if (!(b >= -100.0 && b <= 100.0)) bad("logit_bias", "'logit_bias' values must be in [-100, 100]");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  if (auto seed = f.integer("seed")) s.seed = static_cast<uint64_t>(*seed);
  if (auto min_tokens = f.integer("min_tokens")) {
    if (*min_tokens < 0) bad("min_tokens", "'min_tokens' must be >= 0");
    s.min_tokens = *min_tokens;
  }
  if (const json* ids = f.get("stop_token_ids")) s.stop_token_ids = token_id_list(*ids, "stop_token_ids");
  s.ignore_eos = f.boolean("ignore_eos").value_or(false);
  if (const json* stop = f.get("stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const auto& item : *stop) {
        if (!item.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        r.stop.push_back(item.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings");
    }
    for (const auto& s1 : r.stop) {
      if (s1.empty()) bad("stop", "'stop' strings must not be empty");
    }
  }
  r.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  r.stream = f.boolean("stream").value_or(false);
  if (const json* options = f.get("stream_options")) {
    if (!options->is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad("stream_options", "'stream_options' can only be set when 'stream' is true");
    const Fields o(*options);
    r.include_usage = o.boolean("include_usage").value_or(false);
    r.continuous_usage = o.boolean("continuous_usage_stats").value_or(false);
  }
  if (auto salt = f.string("cache_salt")) r.cache_salt = *salt;
  if (const json* format = f.get("response_format")) {
    const json* type = format->is_object() && format->contains("type") ? &(*format)["type"] : nullptr;
    if (!type || !type->is_string()) bad("response_format", "'response_format' must be an object with a 'type'");
    if (*type != "text") bad("response_format", "structured output (response_format json_object / json_schema) is not supported");
  }
}

std::optional<int64_t> max_tokens(const Fields& f, const char* preferred, const char* fallback) {
  std::optional<int64_t> v = preferred ? f.integer(preferred) : std::nullopt;
  const char* name = preferred;
  if (!v) {
    v = f.integer(fallback);
    name = fallback;
  }
  if (v && *v < 1) bad(name, fmt::format("'{}' must be at least 1, got {}", name, *v));
  return v;
}

void parse_tools(const Fields& f, const RequestLimits& limits, GenerationRequest& r) {
  const json* tools = f.get("tools");
  if (tools) {
    if (!tools->is_array()) bad("tools", "'tools' must be a list");
    for (const auto& tool : *tools) {
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) {
        bad("tools", "each tool must be {\"type\": \"function\", \"function\": {...}}");
      }
      if (tool.contains("type") && tool["type"] != "function") bad("tools", "only 'function' tools are supported");
      const json& fn = tool["function"];
      if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
        bad("tools", "each tool function needs a non-empty string 'name'");
      }
      if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object()) {
        bad("tools", "a tool's 'parameters' must be a JSON schema object");
      }
    }
    r.tools = glm_tools_from_request(*tools);
  }
  const json* choice = f.get("tool_choice");
  const bool has_tools = !r.tools.empty();
  if (!choice) {
    r.tool_choice = has_tools ? ToolChoice::auto_ : ToolChoice::none;
  } else if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") r.tool_choice = ToolChoice::none;
    else if (c == "auto") r.tool_choice = ToolChoice::auto_;
    else if (c == "required") r.tool_choice = ToolChoice::required;
    else bad("tool_choice", fmt::format("'tool_choice' must be 'none', 'auto', 'required' or a named function, got '{}'", c));
  } else if (choice->is_object()) {
    const json* fn = choice->contains("function") ? &(*choice)["function"] : nullptr;
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      bad("tool_choice", "a named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    r.tool_choice = ToolChoice::named;
    r.named_tool = (*fn)["name"].get<std::string>();
  } else {
    bad("tool_choice", "'tool_choice' must be a string or an object");
  }
  if (r.tool_choice != ToolChoice::none && !has_tools) {
    if (choice) bad("tool_choice", "when 'tool_choice' is set, 'tools' must be given");
  }
  if (r.tool_choice == ToolChoice::named) {
    bool found = false;
    for (const auto& t : r.tools) found = found || t.name == r.named_tool;
    if (!found) bad("tool_choice", fmt::format("tool '{}' named by 'tool_choice' is not in 'tools'", r.named_tool));
  }
  if (r.tool_choice == ToolChoice::auto_ && has_tools && !(limits.enable_auto_tool_choice && limits.has_tool_parser)) {
    bad("tool_choice", "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
  }
  if ((r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::named) && !limits.has_tool_parser) {
    bad("tool_choice", "tool_choice 'required' or a named tool requires --tool-call-parser to be set");
  }
}

}  // namespace

GenerationRequest parse_chat_request(const json& body, const RequestLimits& limits) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  const Fields f(body);
  GenerationRequest r;
  r.chat = true;
  const json* messages = f.get("messages");
  if (!messages) bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty list");
  for (const auto& m : *messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      bad("messages", "each message must be an object with a string 'role'");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer") {
      bad("messages", fmt::format("unknown message role '{}'", role));
    }
    if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() && !m["content"].is_array()) {
      bad("messages", "a message's 'content' must be a string or a list of parts");
    }
  }
  parse_common(f, limits, r);
  r.sampling.max_tokens = max_tokens(f, "max_completion_tokens", "max_tokens");
  r.logprobs = f.boolean("logprobs").value_or(false);
  if (auto top = f.integer("top_logprobs")) {
    if (*top < 0 || *top > limits.max_logprobs) {
      bad("top_logprobs", fmt::format("'top_logprobs' must be in [0, {}], got {}", limits.max_logprobs, *top));
    }
    if (!r.logprobs && *top > 0) bad("top_logprobs", "when using 'top_logprobs', 'logprobs' must be true");
    r.top_logprobs = *top;
  }
  if (r.logprobs) r.sampling.logprobs = r.top_logprobs;
  parse_tools(f, limits, r);
  if (const json* kwargs = f.get("chat_template_kwargs")) {
    if (!kwargs->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.chat_template_kwargs = *kwargs;
  }
  return r;
}

GenerationRequest parse_completion_request(const json& body, const RequestLimits& limits) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  const Fields f(body);
  GenerationRequest r;
  r.chat = false;
  const json* prompt = f.get("prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  const auto is_ids = [](const json& v) { return v.is_array() && !v.empty() && v.front().is_number(); };
  if (prompt->is_string()) {
    r.prompts.push_back({.text = prompt->get<std::string>(), .token_ids = {}});
  } else if (is_ids(*prompt)) {
    r.prompts.push_back({.text = std::nullopt, .token_ids = token_id_list(*prompt, "prompt")});
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const auto& p : *prompt) {
      if (p.is_string()) r.prompts.push_back({.text = p.get<std::string>(), .token_ids = {}});
      else if (is_ids(p)) r.prompts.push_back({.text = std::nullopt, .token_ids = token_id_list(p, "prompt")});
      else bad("prompt", "'prompt' must be a string, a list of strings, or token ids");
    }
  } else {
    bad("prompt", "'prompt' must be a string, a list of strings, or token ids (non-empty)");
  }
  if (r.prompts.size() > 64) bad("prompt", "at most 64 prompts per request");
  if (f.get("suffix")) bad("suffix", "'suffix' is not supported");
  parse_common(f, limits, r);
  r.sampling.max_tokens = max_tokens(f, nullptr, "max_tokens");
  if (r.sampling.max_tokens == std::nullopt && !f.get("max_tokens")) r.sampling.max_tokens = 16;  // OpenAI's default
  if (auto lp = f.integer("logprobs")) {
    if (*lp < 0 || *lp > limits.max_logprobs) {
      bad("logprobs", fmt::format("'logprobs' must be in [0, {}], got {}", limits.max_logprobs, *lp));
    }
    r.logprobs = true;
    r.top_logprobs = *lp;
    r.sampling.logprobs = *lp;
  }
  r.echo = f.boolean("echo").value_or(false);
  if (r.echo && r.logprobs) bad("echo", "'echo' together with 'logprobs' (prompt logprobs) is not supported");
  return r;
}

}  // namespace kestrel::server

#include "text/chat_template.h"

#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/python_json.h"

namespace kestrel {

namespace {

constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token value as transformers keeps it: a string, or an AddedToken ({"content": ...}).
std::optional<std::string> token_text(const py::Value& v) {
  if (v.is_string()) return v.str();
  if (v.is_dict())
    if (const py::Value* content = v.dict_ref().find("content"); content && content->is_string()) return content->str();
  return std::nullopt;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

ChatTemplate::ChatTemplate(std::map<std::string, std::string> templates, py::Dict special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  require(!templates.empty(), "no chat template");
  for (auto& [name, text] : templates) {
    try {
      templates_.emplace(name, jinja::Template(text));
    } catch (const Error& e) {
      fail("chat template '{}': {}", name, e.what());
    }
  }
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir,
                                const std::optional<std::filesystem::path>& template_file) {
  py::Value config = py::Value::dict();
  const auto config_path = model_dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    try {
      config = py::parse_json(read_file(config_path));
    } catch (const Error& e) {
      fail("{}: {}", config_path.string(), e.what());
    }
    require(config.is_dict(), "{}: expected a JSON object", config_path.string());
  }
  const py::Dict& cfg = config.dict_ref();

  // Special tokens: the named ones, then model-specific "*_token" strings, then extra_special_tokens as a dict.
  py::Dict special;
  py::Dict legacy;
  const auto map_path = model_dir / "special_tokens_map.json";
  if (std::filesystem::exists(map_path)) {
    py::Value m;
    try {
      m = py::parse_json(read_file(map_path));
    } catch (const Error& e) {
      fail("{}: {}", map_path.string(), e.what());
    }
    if (m.is_dict()) legacy = m.dict_ref();
  }
  auto lookup = [&](std::string_view key) -> const py::Value* {
    if (const py::Value* v = cfg.find(key)) return v;
    return legacy.find(key);
  };
  for (const char* name : kSpecialTokenNames)
    if (const py::Value* v = lookup(name))
      if (auto text = token_text(*v)) special.set(name, py::Value::string(*text));
  for (const auto& [key, value] : cfg.items()) {
    if (!key.is_string() || !ends_with(key.str(), "_token") || special.find(key.str())) continue;
    bool named = false;
    for (const char* name : kSpecialTokenNames) named = named || key.str() == name;
    if (named) continue;
    if (auto text = token_text(value)) special.set(key.str(), py::Value::string(*text));
  }
  for (const char* field : {"extra_special_tokens", "model_specific_special_tokens"}) {
    if (const py::Value* extra = cfg.find(field); extra && extra->is_dict())
      for (const auto& [key, value] : extra->dict_ref().items())
        if (auto text = token_text(value)) special.set(key, py::Value::string(*text));
  }

  std::map<std::string, std::string> templates;
  if (template_file) {
    templates["default"] = read_file(*template_file);
  } else if (std::filesystem::exists(model_dir / "chat_template.jinja")) {
    templates["default"] = read_file(model_dir / "chat_template.jinja");
    const auto extra_dir = model_dir / "additional_chat_templates";
    if (std::filesystem::is_directory(extra_dir))
      for (const auto& entry : std::filesystem::directory_iterator(extra_dir))
        if (entry.path().extension() == ".jinja") templates[entry.path().stem().string()] = read_file(entry.path());
  } else if (const py::Value* t = cfg.find("chat_template")) {
    if (t->is_string()) {
      templates["default"] = t->str();
    } else if (t->is_list()) {
      for (const py::Value& item : t->list_ref().items) {
        require(item.is_dict(), "{}: chat_template list entries must be {{name, template}} objects",
                config_path.string());
        const py::Value* name = item.dict_ref().find("name");
        const py::Value* text = item.dict_ref().find("template");
        require(name && name->is_string() && text && text->is_string(),
                "{}: chat_template list entries must be {{name, template}} objects", config_path.string());
        templates[name->str()] = text->str();
      }
    } else {
      fail("{}: chat_template must be a string or a list", config_path.string());
    }
  }
  require(!templates.empty(), "{}: no chat template (no chat_template.jinja, no \"chat_template\" in "
                              "tokenizer_config.json; pass --chat-template FILE)", model_dir.string());
  return ChatTemplate(std::move(templates), std::move(special));
}

const jinja::Template& ChatTemplate::pick(bool has_tools) const {
  if (templates_.size() == 1 && templates_.count("default")) return templates_.at("default");
  if (has_tools && templates_.count("tool_use")) return templates_.at("tool_use");
  if (templates_.count("default")) return templates_.at("default");
  std::string names;
  for (const auto& [name, t] : templates_) names += (names.empty() ? "" : ", ") + name;
  fail("this model has multiple chat templates and no \"default\" ({})", names);
}

std::string ChatTemplate::render(const py::Value& request) const {
  require(request.is_dict(), "the request must be a JSON object");
  const py::Dict& r = request.dict_ref();
  const py::Value* messages = r.find("messages");
  require(messages && messages->is_list(), "the request needs \"messages\" (an array)");
  require(!messages->list_ref().items.empty(), "cannot apply the chat template to an empty conversation");
  for (const py::Value& m : messages->list_ref().items) require(m.is_dict(), "each message must be a JSON object");

  py::Value tools = py::Value::none();
  if (const py::Value* t = r.find("tools"); t && !t->is_none()) {
    require(t->is_list(), "\"tools\" must be an array");
    for (const py::Value& tool : t->list_ref().items)
      require(tool.is_dict(), "tools should be JSON schemas (objects)");
    tools = *t;
  }
  py::Value documents = py::Value::none();
  if (const py::Value* d = r.find("documents"); d && !d->is_none()) {
    require(d->is_list(), "\"documents\" must be an array");
    for (const py::Value& doc : d->list_ref().items) require(doc.is_dict(), "documents should be a list of objects");
    documents = *d;
  }
  bool add_generation_prompt = true;
  if (const py::Value* a = r.find("add_generation_prompt"); a && !a->is_none()) {
    require(a->is_bool(), "\"add_generation_prompt\" must be a boolean");
    add_generation_prompt = a->as_bool();
  }
  if (const py::Value* c = r.find("continue_final_message"))
    require(!c->truthy(), "\"continue_final_message\" is not supported");

  // template_kwargs = {**special_tokens_map, **kwargs}; then messages/tools/documents/add_generation_prompt.
  py::Dict variables = special_tokens_;
  if (const py::Value* effort = r.find("reasoning_effort"); effort && !effort->is_none())
    variables.set("reasoning_effort", *effort);
  if (const py::Value* kwargs = r.find("chat_template_kwargs"); kwargs && !kwargs->is_none()) {
    require(kwargs->is_dict(), "\"chat_template_kwargs\" must be an object");
    for (const auto& [key, value] : kwargs->dict_ref().items()) {
      const std::string& k = key.str();
      require(k != "messages" && k != "tools" && k != "documents" && k != "add_generation_prompt" &&
                  k != "conversation" && k != "chat_template",
              "chat_template_kwargs may not set \"{}\"", k);
      variables.set(key, value);
    }
  }
  variables.set("messages", *messages);
  variables.set("tools", tools);
  variables.set("documents", documents);
  variables.set("add_generation_prompt", py::Value::boolean(add_generation_prompt));
  return pick(!tools.is_none()).render(variables);
}

std::string ChatTemplate::render_json(std::string_view request_json) const {
  return render(py::parse_json(request_json));
}

}  // namespace kestrel

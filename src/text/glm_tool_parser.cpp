#include "text/glm_tool_parser.h"

#include <array>
#include <cmath>
#include <random>
#include <set>

#include "base/error.h"
#include "text/glm_json_compat.h"

namespace kestrel {

namespace {

constexpr std::string_view kToolCallStart = "<tool_call>";
constexpr std::string_view kToolCallEnd = "</tool_call>";
constexpr std::string_view kArgKeyStart = "<arg_key>";
constexpr std::string_view kArgKeyEnd = "</arg_key>";
constexpr std::string_view kArgValueStart = "<arg_value>";
constexpr std::string_view kArgValueEnd = "</arg_value>";

constexpr std::array<std::string_view, 1> kContentTags = {kToolCallStart};
constexpr std::array<std::string_view, 3> kNameTags = {kToolCallStart, kArgKeyStart, kToolCallEnd};
constexpr std::array<std::string_view, 5> kArgTags = {kToolCallEnd, kArgKeyStart, kArgKeyEnd, kArgValueStart,
                                                      kArgValueEnd};
// Indices into kArgTags.
enum ArgTag { kTagCallEnd = 0, kTagKeyStart, kTagKeyEnd, kTagValueStart, kTagValueEnd };

constexpr int kMaxSchemaDepth = 64;

// vLLM's extract_types_from_schema: types from `type` (string or list), `enum` values and anyOf/oneOf/allOf;
// {"string"} when nothing is known.
std::set<std::string> schema_types(const nlohmann::json& schema, int depth = 0) {
  if (!schema.is_object() || depth > kMaxSchemaDepth) return {"string"};
  std::set<std::string> types;
  if (auto it = schema.find("type"); it != schema.end()) {
    if (it->is_string()) {
      types.insert(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& t : *it) {
        if (t.is_string()) types.insert(t.get<std::string>());
      }
    }
  }
  if (auto it = schema.find("enum"); it != schema.end() && it->is_array()) {
    for (const auto& v : *it) {
      if (v.is_null()) {
        types.insert("null");
      } else if (v.is_boolean()) {
        types.insert("boolean");
      } else if (v.is_number_integer() || v.is_number_unsigned()) {
        types.insert("integer");
      } else if (v.is_number_float()) {
        types.insert("number");
      } else if (v.is_string()) {
        types.insert("string");
      } else if (v.is_array()) {
        types.insert("array");
      } else if (v.is_object()) {
        types.insert("object");
      }
    }
  }
  for (const char* field : {"anyOf", "oneOf", "allOf"}) {
    if (auto it = schema.find(field); it != schema.end() && it->is_array()) {
      for (const auto& choice : *it) {
        auto sub = schema_types(choice, depth + 1);
        types.insert(sub.begin(), sub.end());
      }
    }
  }
  if (types.empty()) types.insert("string");
  return types;
}

std::string normalize_type(std::string_view t) {
  std::string s(glm::py_strip(t));
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  static const std::unordered_map<std::string, std::string> kAliases = {
      {"str", "string"},      {"text", "string"},     {"varchar", "string"}, {"char", "string"},
      {"enum", "string"},     {"int", "integer"},     {"int32", "integer"},  {"int64", "integer"},
      {"uint", "integer"},    {"uint32", "integer"},  {"uint64", "integer"}, {"long", "integer"},
      {"short", "integer"},   {"unsigned", "integer"}, {"float", "number"},   {"float32", "number"},
      {"float64", "number"},  {"double", "number"},   {"bool", "boolean"},   {"dict", "object"},
      {"arr", "array"},       {"list", "array"},      {"sequence", "array"},
  };
  if (auto it = kAliases.find(s); it != kAliases.end()) return it->second;
  return s;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string json_string(std::string_view s) {
  std::string out;
  glm::append_py_json_string(out, s);
  return out;
}

// vLLM's coerce_to_schema_type(value, types), serialised with json.dumps.
std::string coerce_to_json(std::string_view value, const std::unordered_set<std::string>& types) {
  static constexpr std::array<std::string_view, 7> kPriority = {"null",   "integer", "number", "boolean",
                                                                "object", "array",   "string"};
  for (std::string_view candidate : kPriority) {
    if (!types.contains(std::string(candidate))) continue;
    if (candidate == "null") {
      if (ascii_lower(value) == "null") return "null";
    } else if (candidate == "string") {
      return json_string(value);
    } else if (candidate == "integer") {
      if (auto digits = glm::py_int_string(value)) return *digits;
    } else if (candidate == "number") {
      if (auto v = glm::py_float(value); v && std::isfinite(*v)) {
        return *v == std::trunc(*v) ? glm::py_integral_double_string(*v) : glm::py_float_repr(*v);
      }
    } else if (candidate == "boolean") {
      const std::string lower(glm::py_strip(ascii_lower(value)));
      if (lower == "true" || lower == "1") return "true";
      if (lower == "false" || lower == "0") return "false";
    } else {  // object, array
      if (auto parsed = glm::json_loads_finite(value)) return glm::py_json_dumps(*parsed);
    }
  }
  if (auto parsed = glm::json_loads_finite(value)) return glm::py_json_dumps(*parsed);
  return json_string(value);
}

void push_content(std::vector<GlmToolStreamItem>& out, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == GlmToolStreamItem::Kind::kContent) {
    out.back().content.append(text);
    return;
  }
  GlmToolStreamItem item;
  item.kind = GlmToolStreamItem::Kind::kContent;
  item.content.assign(text);
  out.push_back(std::move(item));
}

}  // namespace

std::vector<GlmToolSpec> glm_tools_from_request(const nlohmann::json& tools) {
  std::vector<GlmToolSpec> specs;
  if (!tools.is_array()) return specs;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    if (auto type = tool.find("type"); type != tool.end() && !(type->is_string() && *type == "function")) continue;
    const nlohmann::json* fn = &tool;
    if (auto it = tool.find("function"); it != tool.end() && it->is_object()) fn = &*it;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) continue;
    GlmToolSpec spec;
    spec.name = name->get<std::string>();
    if (auto params = fn->find("parameters"); params != fn->end()) spec.parameters = *params;
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::string glm_random_tool_call_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[pick(rng)]);
  return id;
}

GlmToolParser::GlmToolParser(const std::vector<GlmToolSpec>& tools, GlmToolCallIdGenerator make_id)
    : any_tools_(!tools.empty()), make_id_(make_id ? std::move(make_id) : GlmToolCallIdGenerator(glm_random_tool_call_id)) {
  for (const GlmToolSpec& spec : tools) {
    if (tools_.contains(spec.name)) continue;  // the first declaration wins, as vLLM's lookup does
    Tool tool;
    if (spec.parameters.is_object()) {
      if (auto props = spec.parameters.find("properties"); props != spec.parameters.end() && props->is_object()) {
        for (const auto& [key, schema] : props->items()) {
          Property prop;
          const std::set<std::string> raw = schema_types(schema);
          prop.streamable = raw.size() == 1 && *raw.begin() == "string";
          prop.coerce = schema.is_object();
          for (const std::string& t : raw) prop.types.insert(normalize_type(t));
          tool.properties.emplace(key, std::move(prop));
        }
      }
    }
    tools_.emplace(spec.name, std::move(tool));
  }
}

std::vector<GlmToolStreamItem> GlmToolParser::feed(std::string_view delta) {
  require(!finished_, "GLM tool parser: feed() after finish()");
  std::vector<GlmToolStreamItem> out;
  scanner_.append(delta);
  run(false, out);
  return out;
}

std::vector<GlmToolStreamItem> GlmToolParser::finish() {
  require(!finished_, "GLM tool parser: finish() called twice");
  finished_ = true;
  std::vector<GlmToolStreamItem> out;
  run(true, out);
  if (state_ != State::kContent) {
    if (accepted_) {
      finish_call(out);
    } else {
      const std::string raw = std::move(raw_);
      reset_call();
      state_ = State::kContent;
      on_content(raw, out);
    }
  }
  if (!pending_ws_.empty() && next_index_ == 0) push_content(out, pending_ws_);
  pending_ws_.clear();
  return out;
}

void GlmToolParser::run(bool final, std::vector<GlmToolStreamItem>& out) {
  while (true) {
    std::span<const std::string_view> tags;
    switch (state_) {
      case State::kContent: tags = kContentTags; break;
      case State::kName: tags = kNameTags; break;
      case State::kArgs: tags = kArgTags; break;
    }
    const glm::TagScanner::Piece piece = scanner_.next(tags, final);
    if (!piece) return;
    switch (state_) {
      case State::kContent:
        if (piece.is_tag) {
          state_ = State::kName;
          raw_.assign(piece.text);
        } else {
          on_content(piece.text, out);
        }
        break;
      case State::kName:
        raw_.append(piece.text);
        if (!piece.is_tag) {
          name_.append(piece.text);
        } else if (piece.text == kToolCallStart) {
          name_.clear();  // a stray <tool_call> inside the name restarts the call
        } else {
          on_name_end(piece.text == kToolCallEnd, out);
        }
        break;
      case State::kArgs:
        if (!accepted_) raw_.append(piece.text);
        if (piece.is_tag && piece.tag == kTagCallEnd) {
          if (accepted_) finish_call(out);
          reset_call();
          state_ = State::kContent;
        } else if (accepted_) {
          if (piece.is_tag) {
            on_arg_tag(piece.tag, piece.text, out);
          } else {
            on_arg_text(piece.text, out);
          }
        }
        break;
    }
  }
}

void GlmToolParser::on_content(std::string_view text, std::vector<GlmToolStreamItem>& out) {
  if (content_has_text_) {
    push_content(out, text);
    return;
  }
  if (glm::is_py_space_only(text)) {
    if (next_index_ == 0) pending_ws_.append(text);  // dropped once a call was accepted
    return;
  }
  content_has_text_ = true;
  pending_ws_.append(text);
  push_content(out, pending_ws_);
  pending_ws_.clear();
}

void GlmToolParser::on_name_end(bool call_end, std::vector<GlmToolStreamItem>& out) {
  const std::string name(glm::py_strip(name_));
  const Tool* tool = nullptr;
  bool accept = !name.empty();
  if (accept && any_tools_) {
    auto it = tools_.find(name);
    accept = it != tools_.end();
    if (accept) tool = &it->second;
  }
  if (!accept) {
    if (call_end) {
      reset_call();  // dropped
      state_ = State::kContent;
    } else {
      state_ = State::kArgs;  // skip the arguments of a dropped call up to </tool_call>
    }
    return;
  }
  accepted_ = true;
  raw_.clear();
  pending_ws_.clear();
  tool_ = tool;
  index_ = next_index_++;
  GlmToolStreamItem item;
  item.kind = GlmToolStreamItem::Kind::kToolCall;
  item.tool_call.index = index_;
  item.tool_call.id = make_id_();
  item.tool_call.name = name;
  out.push_back(std::move(item));
  if (call_end) {
    finish_call(out);
    reset_call();
    state_ = State::kContent;
  } else {
    state_ = State::kArgs;
    phase_ = ArgPhase::kKey;  // the <arg_key> that closed the name
  }
}

void GlmToolParser::on_arg_tag(int tag, std::string_view text, std::vector<GlmToolStreamItem>& out) {
  switch (phase_) {
    case ArgPhase::kBetween:
      if (tag == kTagKeyStart) {
        phase_ = ArgPhase::kKey;
        key_.clear();
      }
      break;
    case ArgPhase::kKey:
      if (tag == kTagKeyEnd) {
        phase_ = ArgPhase::kAfterKey;
        after_key_ws_.clear();
      } else {
        key_.append(text);
      }
      break;
    case ArgPhase::kAfterKey:
      if (tag == kTagValueStart) {
        open_value(out);
      } else {  // this </arg_key> did not close the key: it is part of it
        key_.append(kArgKeyEnd).append(after_key_ws_);
        phase_ = ArgPhase::kKey;
        on_arg_tag(tag, text, out);
      }
      break;
    case ArgPhase::kValue:
      if (tag == kTagValueEnd) {
        complete_value(out);
      } else {
        append_value(text, out);
      }
      break;
  }
}

void GlmToolParser::on_arg_text(std::string_view text, std::vector<GlmToolStreamItem>& out) {
  while (!text.empty()) {
    switch (phase_) {
      case ArgPhase::kBetween: return;
      case ArgPhase::kKey: key_.append(text); return;
      case ArgPhase::kValue: append_value(text, out); return;
      case ArgPhase::kAfterKey: {
        const size_t ws = glm::py_lstrip_length(text);
        after_key_ws_.append(text.substr(0, ws));
        text.remove_prefix(ws);
        if (!text.empty()) {
          key_.append(kArgKeyEnd).append(after_key_ws_);
          phase_ = ArgPhase::kKey;
        }
        break;
      }
    }
  }
}

void GlmToolParser::open_value(std::vector<GlmToolStreamItem>& out) {
  phase_ = ArgPhase::kValue;
  hidden_value_.clear();
  std::string key(glm::py_strip(key_));
  value_visible_ = !key.empty() && !keys_.contains(key);
  if (value_visible_) start_entry(std::move(key), out);
}

void GlmToolParser::append_value(std::string_view text, std::vector<GlmToolStreamItem>& out) {
  if (!value_visible_) {
    hidden_value_.append(text);
    return;
  }
  last_raw_.append(text);
  if (last_streamable_) {
    std::string escaped;
    glm::append_py_json_string_body(escaped, text);
    emit_args(escaped, out);
  }
}

void GlmToolParser::complete_value(std::vector<GlmToolStreamItem>& out) {
  phase_ = ArgPhase::kBetween;
  if (value_visible_) {
    value_visible_ = false;
    return;
  }
  std::string key(glm::py_strip(key_));
  if (keys_.contains(key)) return;  // a repeated key keeps its first value
  start_entry(std::move(key), out);
  last_raw_ = std::move(hidden_value_);
  hidden_value_.clear();
  if (last_streamable_) {
    std::string escaped;
    glm::append_py_json_string_body(escaped, last_raw_);
    emit_args(escaped, out);
  }
}

const GlmToolParser::Property* GlmToolParser::property(const std::string& key) const {
  if (tool_ == nullptr) return nullptr;
  auto it = tool_->properties.find(key);
  return it == tool_->properties.end() ? nullptr : &it->second;
}

void GlmToolParser::start_entry(std::string key, std::vector<GlmToolStreamItem>& out) {
  std::string text;
  if (has_entry_) {
    close_entry(out);
    text = ", ";
  } else {
    text = "{";
    has_entry_ = true;
  }
  glm::append_py_json_string(text, key);
  text += ": ";
  last_prop_ = property(key);
  // Without a schema every value is a string and streams; with one, only string-only keys stream.
  last_streamable_ = tool_ == nullptr || tool_->properties.empty() || (last_prop_ != nullptr && last_prop_->streamable);
  if (last_streamable_) text += '"';
  emit_args(text, out);
  keys_.insert(key);
  last_key_ = std::move(key);
  last_raw_.clear();
}

void GlmToolParser::close_entry(std::vector<GlmToolStreamItem>& out) {
  if (last_streamable_) {
    emit_args("\"", out);
  } else if (last_prop_ != nullptr && last_prop_->coerce) {
    emit_args(coerce_to_json(last_raw_, last_prop_->types), out);
  } else {
    emit_args(json_string(last_raw_), out);
  }
}

void GlmToolParser::finish_call(std::vector<GlmToolStreamItem>& out) {
  if (has_entry_) {
    close_entry(out);
    emit_args("}", out);
  } else {
    emit_args("{}", out);
  }
}

void GlmToolParser::emit_args(std::string_view text, std::vector<GlmToolStreamItem>& out) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == GlmToolStreamItem::Kind::kToolCall && out.back().tool_call.index == index_) {
    out.back().tool_call.arguments.append(text);
    return;
  }
  GlmToolStreamItem item;
  item.kind = GlmToolStreamItem::Kind::kToolCall;
  item.tool_call.index = index_;
  item.tool_call.arguments.assign(text);
  out.push_back(std::move(item));
}

void GlmToolParser::reset_call() {
  raw_.clear();
  name_.clear();
  accepted_ = false;
  index_ = -1;
  tool_ = nullptr;
  phase_ = ArgPhase::kBetween;
  key_.clear();
  after_key_ws_.clear();
  hidden_value_.clear();
  value_visible_ = false;
  keys_.clear();
  has_entry_ = false;
  last_key_.clear();
  last_raw_.clear();
  last_prop_ = nullptr;
  last_streamable_ = true;
}

GlmToolParseResult GlmToolParser::parse(std::string_view text, const std::vector<GlmToolSpec>& tools,
                                        GlmToolCallIdGenerator make_id) {
  GlmToolParser parser(tools, std::move(make_id));
  std::vector<GlmToolStreamItem> items = parser.feed(text);
  std::vector<GlmToolStreamItem> rest = parser.finish();
  items.insert(items.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return accumulate(items);
}

GlmToolParseResult GlmToolParser::accumulate(const std::vector<GlmToolStreamItem>& items) {
  GlmToolParseResult result;
  std::string content;
  for (const GlmToolStreamItem& item : items) {
    if (item.kind == GlmToolStreamItem::Kind::kContent) {
      content += item.content;
      continue;
    }
    const auto index = static_cast<size_t>(item.tool_call.index);
    if (result.tool_calls.size() <= index) result.tool_calls.resize(index + 1);
    GlmToolCall& call = result.tool_calls[index];
    if (item.tool_call.id) call.id = *item.tool_call.id;
    if (item.tool_call.name) call.name = *item.tool_call.name;
    call.arguments += item.tool_call.arguments;
  }
  if (!content.empty()) result.content = std::move(content);
  return result;
}

}  // namespace kestrel

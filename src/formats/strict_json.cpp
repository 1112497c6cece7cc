// Duplicate-key and nesting checks on top of nlohmann's parser callback.
#include "formats/strict_json.h"

#include <set>
#include <vector>

#include "base/error.h"

namespace kestrel {

namespace {

constexpr size_t kMaxDepth = 64;

// One open object or array while parsing; arrays have no keys.
struct OpenContainer {
  bool is_object = false;
  std::set<std::string, std::less<>> keys;
  std::string last_key;
};

std::string describe_parents(const std::vector<OpenContainer>& open) {
  std::string path;
  // open[0] is the top-level object; each later container sits under its parent's last key.
  for (size_t i = 0; i + 1 < open.size(); ++i) {
    if (!path.empty()) path += " > ";
    path += open[i].is_object ? "'" + open[i].last_key + "'" : "[...]";
  }
  return path;
}

// nlohmann prefixes messages with "[json.exception.parse_error.101] "; the rest is the useful part.
std::string without_exception_id(const std::string& message) {
  const size_t end = message.find("] ");
  return message.starts_with("[json.exception.") && end != std::string::npos ? message.substr(end + 2) : message;
}

}  // namespace

nlohmann::json parse_json_object_strict(std::string_view text, const std::string& source,
                                        std::string_view top_level_noun) {
  using nlohmann::json;
  std::vector<OpenContainer> open;
  const json::parser_callback_t check = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        require(open.size() < kMaxDepth, "{}: JSON nested deeper than {} levels", source, kMaxDepth);
        open.push_back({.is_object = event == json::parse_event_t::object_start, .keys = {}, .last_key = {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        open.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        OpenContainer& object = open.back();
        if (!object.keys.insert(key).second) {
          if (open.size() == 1) fail("{}: {} '{}' appears more than once", source, top_level_noun, key);
          fail("{}: key '{}' appears more than once in {}", source, key, describe_parents(open));
        }
        object.last_key = key;
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& error) {
    fail("{}: invalid JSON: {}", source, without_exception_id(error.what()));
  }
  require(parsed.is_object(), "{}: expected a JSON object, got {}", source, parsed.type_name());
  return parsed;
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string text = value.dump();
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  return text;
}

std::optional<uint64_t> json_non_negative_integer(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() == 0) return 0;
  return std::nullopt;
}

}  // namespace kestrel

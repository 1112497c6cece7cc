// Small helpers to read tokenizer JSON files with errors that name the file and the JSON path at fault.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "base/error.h"

namespace kestrel::text {

inline const nlohmann::json& json_field(const nlohmann::json& object, std::string_view key, const std::string& where) {
  require(object.is_object(), "{}: expected a JSON object", where);
  const auto it = object.find(key);
  require(it != object.end(), "{}: missing field '{}'", where, key);
  return *it;
}

inline std::string json_string(const nlohmann::json& object, std::string_view key, const std::string& where) {
  const auto& value = json_field(object, key, where);
  require(value.is_string(), "{}.{}: expected a string", where, key);
  return value.get<std::string>();
}

inline bool json_bool_or(const nlohmann::json& object, std::string_view key, bool fallback, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  require(it->is_boolean(), "{}.{}: expected true or false", where, key);
  return it->get<bool>();
}

inline std::string json_type(const nlohmann::json& object, const std::string& where) {
  return json_string(object, "type", where);
}

}  // namespace kestrel::text

// JSON parsing for checkpoint headers and indexes. Unlike plain nlohmann::json::parse it rejects a repeated object
// key (nlohmann would silently keep one of the values, hiding e.g. two tensors of the same name) and absurd nesting.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kestrel {

// Parses `text`, which must be one JSON object. Throws Error "<source>: ..." if it is not valid JSON, not an object,
// nests deeper than 64 levels or repeats a key; a repeated top-level key is reported as "<top_level_noun> '<key>'"
// (e.g. "tensor 'a.weight' appears more than once").
nlohmann::json parse_json_object_strict(std::string_view text, const std::string& source,
                                        std::string_view top_level_noun = "key");

// `value` as compact JSON for an error message, cut to about `max_chars` characters.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

// The value of a JSON integer that is >= 0 (nlohmann stores "-0" as a signed integer), else nullopt.
std::optional<uint64_t> json_non_negative_integer(const nlohmann::json& value);

}  // namespace kestrel

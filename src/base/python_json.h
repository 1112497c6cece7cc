// JSON exactly as Python's json module writes and reads it, over py::Value.
// dumps(v, opts) == json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...): the same escapes
// (\uXXXX lower-case hex, surrogate pairs with ensure_ascii), float repr ("1.0", "1e-05", Infinity/NaN), key
// conversion (True -> "true", 1 -> "1"), default separators (", " / ": ", "," with an indent). parse_json reads
// a document into Values keeping key order (a repeated key keeps its first position and last value, as Python's
// dict does); numbers without fraction or exponent become int (int64; larger ones are refused), others float.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/py_value.h"

namespace kestrel::py {

struct JsonDumpOptions {
  bool ensure_ascii = true;
  std::optional<std::string> indent;  // unset: None (one line); "  ": indent=2; "": indent=0
  std::optional<std::string> item_separator, key_separator;  // unset: Python's defaults for the indent
  bool sort_keys = false;
};

std::string json_dumps(const Value& v, const JsonDumpOptions& options = {});
// Throws Error naming the byte offset for malformed input, invalid UTF-8, lone surrogates, nesting beyond
// kMaxNesting or integers beyond int64.
Value parse_json(std::string_view text);

}  // namespace kestrel::py

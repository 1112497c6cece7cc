// Local Python-compatibility helpers for the GLM tool parser: json.dumps(..., ensure_ascii=False) of parsed values,
// json.loads, int()/float() of a string, float repr. Values are nlohmann::ordered_json (key order kept; a repeated
// key keeps its first position and last value, as a Python dict does).
// TODO: fold into src/base/python_json once that lands (being written in parallel).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace kestrel::glm {

using OrderedJson = nlohmann::ordered_json;

// Deepest nesting json_loads accepts (Python would hit its recursion limit around 1000).
constexpr int kMaxJsonNesting = 512;

// json.dumps(s, ensure_ascii=False) of a string, appended to `out`: `"` and `\` escaped, \b \f \n \r \t short,
// other control characters as \u00XX (lower-case hex), everything else (DEL, non-ASCII, invalid bytes) raw.
void append_py_json_string(std::string& out, std::string_view s);
// The same without the surrounding quotes (for streaming a string value piece by piece).
void append_py_json_string_body(std::string& out, std::string_view s);

// json.dumps(v, ensure_ascii=False): separators ", " and ": ", floats as Python's repr. Non-finite floats (which
// json_loads never produces) are written as Python would, NaN / Infinity / -Infinity.
void append_py_json(std::string& out, const OrderedJson& v);
std::string py_json_dumps(const OrderedJson& v);

// Python's repr(float) for a finite double: shortest round-trip digits, "1.0", "0.0001", "1e-05", "1e+16".
std::string py_float_repr(double v);
// str(int(v)) for a finite, integral double (exact, also beyond 64 bits).
std::string py_integral_double_string(double v);

// json.loads(text) where the result is finite (no NaN/Infinity anywhere), else nullopt. Nesting deeper than
// kMaxJsonNesting is refused. Integers beyond 64 bits become floats (Python keeps them exact).
std::optional<OrderedJson> json_loads_finite(std::string_view text);

// str(int(text)) for Python's int(str): surrounding whitespace, a sign, '_' between digits; nullopt if invalid.
std::optional<std::string> py_int_string(std::string_view text);
// float(text) for Python's float(str): whitespace, sign, '_' between digits, inf/nan words; nullopt if invalid.
std::optional<double> py_float(std::string_view text);

}  // namespace kestrel::glm

#include "text/glm_json_compat.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "text/glm_text_scan.h"

namespace kestrel::glm {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != b[i]) return false;
  }
  return true;
}

// Python's digitpart: digit (["_"] digit)*. Appends the digits to `out`; returns the end position, or npos if there
// is no valid digitpart at `pos`.
size_t scan_digitpart(std::string_view s, size_t pos, std::string& out) {
  if (pos >= s.size() || !is_digit(s[pos])) return std::string_view::npos;
  while (pos < s.size()) {
    if (is_digit(s[pos])) {
      out.push_back(s[pos++]);
    } else if (s[pos] == '_' && pos + 1 < s.size() && is_digit(s[pos + 1])) {
      ++pos;
    } else {
      break;
    }
  }
  return pos;
}

bool all_finite(const OrderedJson& v) {
  if (v.is_number_float()) return std::isfinite(v.get<double>());
  if (v.is_array() || v.is_object()) {
    for (const auto& child : v) {
      if (!all_finite(child)) return false;
    }
  }
  return true;
}

bool nesting_within_limit(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  bool escape = false;
  for (char c : text) {
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonNesting) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace

void append_py_json_string_body(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.push_back(ch);
        }
    }
  }
}

void append_py_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  append_py_json_string_body(out, s);
  out.push_back('"');
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exponent);
  const int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(static_cast<size_t>(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out.push_back('.');
      out += digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out.push_back(digits[0]);
    if (n > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    out.push_back('e');
    out.push_back(exponent < 0 ? '-' : '+');
    const int abs_exp = exponent < 0 ? -exponent : exponent;
    if (abs_exp < 10) out.push_back('0');
    out += std::to_string(abs_exp);
  }
  return out;
}

std::string py_integral_double_string(double v) {
  if (std::fabs(v) < 9.0e18) return std::to_string(static_cast<int64_t>(v));
  int exp2 = 0;
  const double frac = std::frexp(std::fabs(v), &exp2);  // |v| = frac * 2^exp2, frac in [0.5, 1)
  auto mantissa = static_cast<uint64_t>(std::ldexp(frac, 53));
  int shift = exp2 - 53;  // |v| = mantissa * 2^shift, shift > 0 here
  std::vector<uint32_t> limbs;  // base 1e9, little-endian
  while (mantissa > 0) {
    limbs.push_back(static_cast<uint32_t>(mantissa % 1000000000u));
    mantissa /= 1000000000u;
  }
  for (; shift > 0; --shift) {
    uint32_t carry = 0;
    for (uint32_t& limb : limbs) {
      const uint64_t x = static_cast<uint64_t>(limb) * 2 + carry;
      limb = static_cast<uint32_t>(x % 1000000000u);
      carry = static_cast<uint32_t>(x / 1000000000u);
    }
    if (carry > 0) limbs.push_back(carry);
  }
  std::string out = v < 0 ? "-" : "";
  out += std::to_string(limbs.back());
  for (size_t i = limbs.size() - 1; i-- > 0;) {
    const std::string part = std::to_string(limbs[i]);
    out.append(9 - part.size(), '0');
    out += part;
  }
  return out;
}

void append_py_json(std::string& out, const OrderedJson& v) {
  switch (v.type()) {
    case OrderedJson::value_t::null: out += "null"; break;
    case OrderedJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case OrderedJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case OrderedJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case OrderedJson::value_t::number_float: out += py_float_repr(v.get<double>()); break;
    case OrderedJson::value_t::string: append_py_json_string(out, v.get_ref<const std::string&>()); break;
    case OrderedJson::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        append_py_json(out, item);
      }
      out.push_back(']');
      break;
    }
    case OrderedJson::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_py_json_string(out, key);
        out += ": ";
        append_py_json(out, item);
      }
      out.push_back('}');
      break;
    }
    case OrderedJson::value_t::binary:
    case OrderedJson::value_t::discarded: out += "null"; break;
  }
}

std::string py_json_dumps(const OrderedJson& v) {
  std::string out;
  append_py_json(out, v);
  return out;
}

std::optional<OrderedJson> json_loads_finite(std::string_view text) {
  if (!nesting_within_limit(text)) return std::nullopt;
  OrderedJson v = OrderedJson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded() || !all_finite(v)) return std::nullopt;
  return v;
}

std::optional<std::string> py_int_string(std::string_view text) {
  std::string_view s = py_strip(text);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  std::string digits;
  if (scan_digitpart(s, 0, digits) != s.size()) return std::nullopt;
  const size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return "0";
  std::string out;
  if (negative) out.push_back('-');
  out.append(digits, first);
  return out;
}

std::optional<double> py_float(std::string_view text) {
  std::string_view s = py_strip(text);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (iequals(s, "inf") || iequals(s, "infinity")) {
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (iequals(s, "nan")) return std::numeric_limits<double>::quiet_NaN();
  std::string clean;
  size_t pos = 0;
  bool int_digits = false;
  if (pos < s.size() && is_digit(s[pos])) {
    pos = scan_digitpart(s, pos, clean);
    int_digits = true;
  }
  bool frac_digits = false;
  if (pos < s.size() && s[pos] == '.') {
    clean.push_back('.');
    ++pos;
    if (pos < s.size() && is_digit(s[pos])) {
      pos = scan_digitpart(s, pos, clean);
      frac_digits = true;
    }
  }
  if (!int_digits && !frac_digits) return std::nullopt;
  if (pos < s.size() && (s[pos] == 'e' || s[pos] == 'E')) {
    clean.push_back('e');
    ++pos;
    if (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) clean.push_back(s[pos++]);
    pos = scan_digitpart(s, pos, clean);
    if (pos == std::string_view::npos) return std::nullopt;
  }
  if (pos != s.size()) return std::nullopt;
  double value = 0.0;
  const auto res = std::from_chars(clean.data(), clean.data() + clean.size(), value);
  if (res.ec == std::errc::result_out_of_range) {
    value = std::strtod(clean.c_str(), nullptr);  // overflow: inf; underflow: 0 or a subnormal
  } else if (res.ec != std::errc() || res.ptr != clean.data() + clean.size()) {
    return std::nullopt;
  }
  return negative ? -value : value;
}

}  // namespace kestrel::glm

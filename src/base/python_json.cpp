#include "base/python_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "base/error.h"
#include "base/py_strings.h"

namespace kestrel::py {

namespace {

void dump_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      }
    } else {
      utf8_append(out, c);
    }
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(d);
}

// json.dumps converts keys: str as is, float via repr, True/False/None to true/false/null, int via int.__repr__.
std::string key_string(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::String:
      return key.str();
    case Value::Kind::Float:
      return float_json(key.as_double());
    case Value::Kind::Bool:
      return key.as_bool() ? "true" : "false";
    case Value::Kind::None:
      return "null";
    case Value::Kind::Int:
      return std::to_string(key.as_int());
    default:
      fail("keys must be str, int, float, bool or None, not {}", key.type_name());
  }
}

struct Dumper {
  const JsonDumpOptions& options;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += *options.indent;
  }

  void dump(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::None:
        out += "null";
        return;
      case Value::Kind::Bool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::Int:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::Float:
        out += float_json(v.as_double());
        return;
      case Value::Kind::String:
        dump_string(out, v.str(), options.ensure_ascii);
        return;
      case Value::Kind::List: {
        const auto& items = v.list_ref().items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (options.indent) newline(level + 1);
          dump(items[i], level + 1);
        }
        if (options.indent) newline(level);
        out += ']';
        return;
      }
      case Value::Kind::Dict: {
        const Dict& d = v.dict_ref();
        if (d.empty()) {
          out += "{}";
          return;
        }
        std::vector<const std::pair<Value, Value>*> items;
        for (const auto& item : d.items()) items.push_back(&item);
        if (options.sort_keys) {
          std::stable_sort(items.begin(), items.end(),
                           [](const auto* a, const auto* b) { return py_less(a->first, b->first); });
        }
        out += '{';
        bool first = true;
        for (const auto* item : items) {
          if (!first) out += item_sep;
          first = false;
          if (options.indent) newline(level + 1);
          dump_string(out, key_string(item->first), options.ensure_ascii);
          out += key_sep;
          dump(item->second, level + 1);
        }
        if (options.indent) newline(level);
        out += '}';
        return;
      }
      default:
        fail("Object of type {} is not JSON serializable", v.type_name());
    }
  }
};

struct Parser {
  std::string_view text;
  size_t pos = 0;

  [[noreturn]] void error(std::string_view what) const { fail("invalid JSON at byte {}: {}", pos, what); }

  void skip_ws() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }

  bool consume(std::string_view word) {
    if (text.substr(pos, word.size()) != word) return false;
    pos += word.size();
    return true;
  }

  unsigned hex4() {
    if (pos + 4 > text.size()) error("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text[pos++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<unsigned>(c - 'A' + 10);
      else
        error("bad \\u escape");
    }
    return v;
  }

  std::string string() {
    ++pos;  // opening quote
    std::string out;
    while (true) {
      if (pos >= text.size()) error("unterminated string");
      const char c = text[pos];
      if (c == '"') {
        ++pos;
        break;
      }
      if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
      if (c != '\\') {
        const size_t start = pos;
        while (pos < text.size() && text[pos] != '"' && text[pos] != '\\' &&
               static_cast<unsigned char>(text[pos]) >= 0x20)
          ++pos;
        out.append(text.substr(start, pos - start));
        continue;
      }
      ++pos;
      if (pos >= text.size()) error("unterminated string");
      const char e = text[pos++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (!consume("\\u")) error("lone surrogate");
            const unsigned low = hex4();
            if (low < 0xdc00 || low > 0xdfff) error("lone surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp <= 0xdfff) {
            error("lone surrogate");
          }
          utf8_append(out, cp);
          break;
        }
        default:
          error("bad escape");
      }
    }
    return out;
  }

  Value number() {
    const size_t start = pos;
    if (text[pos] == '-') ++pos;
    if (pos >= text.size() || !std::isdigit(static_cast<unsigned char>(text[pos]))) error("bad number");
    if (text[pos] == '0') {
      ++pos;
    } else {
      while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
    }
    bool is_float = false;
    if (pos < text.size() && text[pos] == '.') {
      is_float = true;
      ++pos;
      if (pos >= text.size() || !std::isdigit(static_cast<unsigned char>(text[pos]))) error("bad number");
      while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
    }
    if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
      is_float = true;
      ++pos;
      if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) ++pos;
      if (pos >= text.size() || !std::isdigit(static_cast<unsigned char>(text[pos]))) error("bad number");
      while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
    }
    const std::string_view s = text.substr(start, pos - start);
    if (is_float) {
      double d = 0;
      const auto r = std::from_chars(s.data(), s.data() + s.size(), d);
      if (r.ec == std::errc::result_out_of_range) {
        // Python: float('1e400') is inf; underflow gives 0.0.
        const size_t e = s.find_first_of("eE");
        const bool big = e != std::string_view::npos && s[e + 1] != '-';
        d = big ? (s[0] == '-' ? -HUGE_VAL : HUGE_VAL) : (s[0] == '-' ? -0.0 : 0.0);
      } else if (r.ec != std::errc()) {
        error("bad number");
      }
      return Value::floating(d);
    }
    int64_t i = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), i);
    if (r.ec != std::errc()) error("integer out of the int64 range");
    return Value::integer(i);
  }

  // Recursive descent; the depth check keeps recursion within kMaxNesting levels whatever the input.
  Value value(int depth) {
    skip_ws();
    if (pos >= text.size()) error("unexpected end of input");
    if (depth > static_cast<int>(kMaxNesting) - 1) error("nesting too deep");
    const char c = text[pos];
    if (c == '{') {
      ++pos;
      auto d = std::make_shared<Dict>();
      skip_ws();
      if (pos < text.size() && text[pos] == '}') {
        ++pos;
        return Value::dict(d);
      }
      while (true) {
        skip_ws();
        if (pos >= text.size() || text[pos] != '"') error("expected a string key");
        std::string key = string();
        skip_ws();
        if (pos >= text.size() || text[pos] != ':') error("expected ':'");
        ++pos;
        Value v = value(depth + 1);
        d->set(key, std::move(v));
        skip_ws();
        if (pos < text.size() && text[pos] == ',') {
          ++pos;
          continue;
        }
        if (pos < text.size() && text[pos] == '}') {
          ++pos;
          return Value::dict(d);
        }
        error("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++pos;
      std::vector<Value> items;
      skip_ws();
      if (pos < text.size() && text[pos] == ']') {
        ++pos;
        return Value::list(std::move(items));
      }
      while (true) {
        items.push_back(value(depth + 1));
        skip_ws();
        if (pos < text.size() && text[pos] == ',') {
          ++pos;
          continue;
        }
        if (pos < text.size() && text[pos] == ']') {
          ++pos;
          return Value::list(std::move(items));
        }
        error("expected ',' or ']'");
      }
    }
    if (c == '"') return Value::string(string());
    if (c == '-' || (c >= '0' && c <= '9')) {
      if (consume("-Infinity")) return Value::floating(-HUGE_VAL);
      return number();
    }
    if (consume("true")) return Value::boolean(true);
    if (consume("false")) return Value::boolean(false);
    if (consume("null")) return Value::none();
    if (consume("NaN")) return Value::floating(std::nan(""));
    if (consume("Infinity")) return Value::floating(HUGE_VAL);
    error("unexpected character");
  }
};

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  Dumper d{options, options.item_separator.value_or(options.indent ? "," : ", "),
           options.key_separator.value_or(": "), {}};
  d.dump(v, 0);
  return std::move(d.out);
}

Value parse_json(std::string_view text) {
  require(utf8_valid(text), "invalid JSON: not valid UTF-8");
  Parser p{text};
  Value v = p.value(0);
  p.skip_ws();
  if (p.pos != text.size()) p.error("extra data after the document");
  return v;
}

}  // namespace kestrel::py

#include "base/py_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/py_strings.h"

namespace kestrel::py {

std::string Object::repr() const { return fmt::format("<{} object>", type_name()); }

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.i_ = i;
  return v;
}
Value Value::floating(double f) {
  Value v;
  v.kind_ = Kind::Float;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.s_ = std::move(s);
  return v;
}
Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind_ = Kind::List;
  v.list_ = std::make_shared<List>();
  uint32_t depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.depth());
  require(depth < kMaxNesting, "value nesting exceeds {} levels", kMaxNesting);
  v.list_->items = std::move(items);
  v.list_->tuple = tuple;
  v.list_->depth = depth + 1;
  return v;
}
Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::move(d);
  return v;
}
Value Value::dict() { return dict(std::make_shared<Dict>()); }
Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.kind_ = Kind::Object;
  v.obj_ = std::move(o);
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::Float:
      return f_;
    case Kind::Int:
      return static_cast<double>(i_);
    case Kind::Bool:
      return b_ ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

uint32_t Value::depth() const {
  if (kind_ == Kind::List) return list_->depth;
  if (kind_ == Kind::Dict) return dict_->depth();
  return 0;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b_;
    case Kind::Int:
      return i_ != 0;
    case Kind::Float:
      return f_ != 0.0;
    case Kind::String:
      return !s_.empty();
    case Kind::List:
      return !list_->items.empty();
    case Kind::Dict:
      return !dict_->empty();
    case Kind::Object:
      return true;
  }
  return false;
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return list_->tuple ? "tuple" : "list";
    case Kind::Dict:
      return "dict";
    case Kind::Object:
      return obj_->type_name();
  }
  return "object";
}

std::string Dict::hash_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::Undefined:
      return "U";  // jinja2's Undefined is hashable (all instances hash alike)
    case Value::Kind::Object:
      return fmt::format("o{}", static_cast<const void*>(key.object_ptr().get()));
    case Value::Kind::None:
      return "N";
    case Value::Kind::Bool:
    case Value::Kind::Int:
      return fmt::format("i{}", key.as_int());
    case Value::Kind::Float: {
      const double d = key.as_double();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18)
        return fmt::format("i{}", static_cast<int64_t>(d));
      std::string h = "f";
      h += py_float_repr(d);
      return h;
    }
    case Value::Kind::String: {
      std::string h = "s";
      h += key.str();
      return h;
    }
    case Value::Kind::List:
      if (key.list_ref().tuple) {
        std::string h = "t(";
        for (const Value& item : key.list_ref().items) {
          h += hash_key(item);
          h += '\x1f';
        }
        h += ')';
        return h;
      }
      break;
    default:
      break;
  }
  fail("unhashable type: '{}'", key.type_name());
}

const Value* Dict::find(const Value& key) const {
  const auto it = index_.find(hash_key(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Value* Dict::find(std::string_view key) const {
  std::string h = "s";
  h += key;
  const auto it = index_.find(h);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Dict::set(const Value& key, Value value) {
  std::string h = hash_key(key);
  const uint32_t depth = std::max(key.depth(), value.depth()) + 1;
  require(depth <= kMaxNesting, "value nesting exceeds {} levels", kMaxNesting);
  depth_ = std::max(depth_, depth);
  const auto it = index_.find(h);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(std::move(h), items_.size());
  items_.emplace_back(key, std::move(value));
}

bool py_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None:
      return true;
    case K::String:
      return a.str() == b.str();
    case K::List: {
      const List &x = a.list_ref(), &y = b.list_ref();
      if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!py_equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case K::Dict: {
      const Dict &x = a.dict_ref(), &y = b.dict_ref();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* other = y.find(k);
        if (!other || !py_equal(v, *other)) return false;
      }
      return true;
    }
    case K::Object:
      return a.object_ptr() == b.object_ptr();
    default:
      return false;
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list() && a.list_ref().tuple == b.list_ref().tuple) {
    const auto &x = a.list_ref().items, &y = b.list_ref().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);
  // sci: [-]D[.DDD]e[+-]XX
  const bool negative = sci[0] == '-';
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e_pos; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const int decpt = exponent + 1;  // position of the decimal point relative to the digits
  std::string out = negative ? "-" : "";
  const auto n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-decpt), '0');
      out.append(digits);
    } else if (decpt >= n) {
      out.append(digits);
      out.append(static_cast<size_t>(decpt - n), '0');
      out.append(".0");
    } else {
      out.append(digits, 0, static_cast<size_t>(decpt));
      out.push_back('.');
      out.append(digits, static_cast<size_t>(decpt));
    }
    return out;
  }
  out.push_back(digits[0]);
  if (n > 1) {
    out.push_back('.');
    out.append(digits, 1);
  }
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

std::string py_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c < 0x80 || is_printable(c)) {
      utf8_append(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    }
  }
  out += quote;
  return out;
}

std::string py_repr(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::String:
      return py_string_repr(v.str());
    case K::List: {
      const List& l = v.list_ref();
      std::string out = l.tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += py_repr(l.items[i]);
      }
      if (l.tuple && l.items.size() == 1) out += ",";
      out += l.tuple ? ")" : "]";
      return out;
    }
    case K::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict_ref().items()) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(k) + ": " + py_repr(val);
      }
      return out + "}";
    }
    default:
      return py_str(v);
  }
}

std::string py_str(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::Undefined:
      return "";
    case K::None:
      return "None";
    case K::Bool:
      return v.as_bool() ? "True" : "False";
    case K::Int:
      return std::to_string(v.as_int());
    case K::Float:
      return py_float_repr(v.as_double());
    case K::String:
      return v.str();
    case K::Object:
      return v.object_ref().repr();
    default:
      return py_repr(v);
  }
}

}  // namespace kestrel::py

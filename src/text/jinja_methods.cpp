// Methods of str, list and dict objects reachable from templates, under jinja2's immutable sandbox: the
// mutating ones (list.append, dict.update, ...) are unsafe there and fail when used, as in HF's environment.
#include <fmt/format.h>

#include <algorithm>

#include "base/py_strings.h"
#include "text/jinja_builtins.h"
#include "text/jinja_interpreter.h"

namespace kestrel::jinja {

namespace {

constexpr std::string_view kStrMethods[] = {
    "capitalize", "casefold", "center",  "count",      "encode",    "endswith",  "expandtabs", "find",
    "format",     "format_map", "index", "isalnum",    "isalpha",   "isascii",   "isdecimal",  "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",    "join",
    "ljust",      "lower",    "lstrip",  "maketrans",  "partition", "removeprefix", "removesuffix", "replace",
    "rfind",      "rindex",   "rjust",   "rpartition", "rsplit",    "rstrip",    "split",      "splitlines",
    "startswith", "strip",    "swapcase", "title",     "translate", "upper",     "zfill"};
constexpr std::string_view kListMethods[] = {"append", "clear",  "copy",    "count", "extend", "index",
                                             "insert", "pop",    "remove",  "reverse", "sort"};
constexpr std::string_view kListUnsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
constexpr std::string_view kDictMethods[] = {"clear", "copy",  "fromkeys",   "get",    "items",
                                             "keys",  "pop",   "popitem",    "setdefault", "update", "values"};
constexpr std::string_view kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};

template <size_t N>
bool contains(const std::string_view (&table)[N], std::string_view name) {
  return std::find(std::begin(table), std::end(table), name) != std::end(table);
}

std::optional<std::string> opt_str(const Value* v) {
  if (!v || v->is_none()) return std::nullopt;
  require(v->is_string(), "expected a string, not {}", v->type_name());
  return v->str();
}

std::optional<int64_t> opt_int(const Value* v) {
  if (!v || v->is_none()) return std::nullopt;
  require(v->is_int() || v->is_bool(), "slice indices must be integers or None");
  return v->as_int();
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::list(std::move(out));
}

// startswith/endswith over a prefix or a tuple of prefixes, within [start, end) in code points.
bool affix_match(const std::string& s, const Value& affix, const Value* start, const Value* end, bool suffix) {
  std::string_view view = s;
  std::string sliced;
  if ((start && !start->is_none()) || (end && !end->is_none())) {
    const std::u32string u = py::utf8_decode(s);
    const auto n = static_cast<int64_t>(u.size());
    auto norm = [n](int64_t v) { return v < 0 ? std::max<int64_t>(0, v + n) : std::min(v, n); };
    const int64_t b = opt_int(start) ? norm(*opt_int(start)) : 0;
    const int64_t e = opt_int(end) ? norm(*opt_int(end)) : n;
    if (b > e) return false;
    sliced = py::utf8_encode(std::u32string_view(u).substr(static_cast<size_t>(b), static_cast<size_t>(e - b)));
    view = sliced;
  }
  auto one = [&](const Value& a) {
    require(a.is_string(), "{} first arg must be str or a tuple of str, not {}", suffix ? "endswith" : "startswith",
            a.type_name());
    const std::string& x = a.str();
    if (x.size() > view.size()) return false;
    return suffix ? view.substr(view.size() - x.size()) == x : view.substr(0, x.size()) == x;
  };
  if (affix.is_list() && affix.list_ref().tuple) {
    for (const Value& a : affix.list_ref().items)
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where /* -1 left, 0 center, 1 right*/) {
  const auto len = static_cast<int64_t>(py::utf8_length(s));
  if (width <= len) return s;
  require(py::utf8_length(fill) == 1, "The fill character must be exactly one character long");
  const int64_t total = std::min<int64_t>(width - len, 1 << 24);
  int64_t left = 0;
  if (where == 1) left = total;
  if (where == 0) left = total / 2 + (total & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

// str.format: {} {0} {name} with an optional conversion (!r !s) and a format spec for numbers and strings.
std::string str_format(const std::string& format, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '{' && i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    if (c == '}' && i + 1 < format.size() && format[i + 1] == '}') {
      out += '}';
      ++i;
      continue;
    }
    if (c == '}') fail("Single '}}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = format.find('}', i);
    require(close != std::string::npos, "Single '{{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conversion;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = field.substr(bang + 1);
      field.resize(bang);
    }
    const Value* arg = nullptr;
    if (field.empty()) {
      require(auto_index < args.positional.size(), "Replacement index {} out of range", auto_index);
      arg = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t index = std::stoul(field);
      require(index < args.positional.size(), "Replacement index {} out of range", index);
      arg = &args.positional[index];
    } else {
      for (const auto& [k, v] : args.keyword)
        if (k == field) arg = &v;
      require(arg != nullptr, "KeyError: '{}'", field);
    }
    if (conversion == "r") {
      out += py::py_repr(*arg);
      continue;
    }
    if (spec.empty()) {
      out += arg->is_string() ? arg->str() : py::py_str(*arg);
      continue;
    }
    const std::string f = "{:" + spec + "}";
    if (arg->is_float())
      out += fmt::format(fmt::runtime(f), arg->as_double());
    else if (arg->is_int() || arg->is_bool())
      out += fmt::format(fmt::runtime(f), arg->as_int());
    else
      out += fmt::format(fmt::runtime(f), py::py_str(*arg));
  }
  return out;
}

Value str_method(Interpreter& in, const std::string& s, const std::string& name, CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p(name, args, {"chars"});
    return Value::string(py::str_strip(s, opt_str(p.get(0)), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Params p(name, args, {"sep", "maxsplit"});
    const int64_t maxsplit = p.get(1) ? p.get(1)->as_int() : -1;
    std::vector<std::string> parts = name == "split" ? py::str_split(s, opt_str(p.get(0)), maxsplit)
                                                     : py::str_rsplit(s, opt_str(p.get(0)), maxsplit);
    in.step(parts.size());
    return string_list(std::move(parts));
  }
  if (name == "splitlines") {
    Params p(name, args, {"keepends"});
    return string_list(py::str_splitlines(s, p.get_or(0, Value::boolean(false)).truthy()));
  }
  if (name == "startswith" || name == "endswith") {
    Params p(name, args, {"prefix", "start", "end"});
    return Value::boolean(affix_match(s, p.required(0), p.get(1), p.get(2), name == "endswith"));
  }
  if (name == "upper") return Value::string(py::str_upper(s));
  if (name == "lower" || name == "casefold") return Value::string(py::str_lower(s));
  if (name == "title") return Value::string(py::str_title(s));
  if (name == "capitalize") return Value::string(py::str_capitalize(s));
  if (name == "swapcase") return Value::string(py::str_swapcase(s));
  if (name == "replace") {
    Params p(name, args, {"old", "new", "count"});
    require(p.required(0).is_string() && p.required(1).is_string(), "replace() arguments must be str");
    std::string out = py::str_replace(s, p.required(0).str(), p.required(1).str(),
                                      p.get(2) ? p.get(2)->as_int() : -1);
    in.check_size(out.size());
    return Value::string(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    Params p(name, args, {"sub", "start", "end"});
    require(p.required(0).is_string(), "must be str, not {}", p.required(0).type_name());
    const int64_t at = py::str_find(s, p.required(0).str(), opt_int(p.get(1)), opt_int(p.get(2)),
                                    name == "rfind" || name == "rindex");
    if (at < 0 && (name == "index" || name == "rindex")) fail("substring not found");
    return Value::integer(at);
  }
  if (name == "count") {
    Params p(name, args, {"sub"});
    require(p.required(0).is_string(), "must be str, not {}", p.required(0).type_name());
    return Value::integer(py::str_count(s, p.required(0).str()));
  }
  if (name == "join") {
    Params p(name, args, {"iterable"});
    std::string out;
    bool first = true;
    for (const Value& item : in.iterate(p.required(0))) {
      require(item.is_string(), "sequence item: expected str instance, {} found", item.type_name());
      if (!first) out += s;
      first = false;
      out += item.str();
      in.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") {
    std::string out = str_format(s, args);
    in.check_size(out.size());
    return Value::string(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Params p(name, args, {"affix"});
    require(p.required(0).is_string(), "must be str");
    const std::string& a = p.required(0).str();
    if (name == "removeprefix") return Value::string(s.rfind(a, 0) == 0 ? s.substr(a.size()) : s);
    if (s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0 && !a.empty())
      return Value::string(s.substr(0, s.size() - a.size()));
    return Value::string(s);
  }
  if (name == "partition" || name == "rpartition") {
    Params p(name, args, {"sep"});
    require(p.required(0).is_string() && !p.required(0).str().empty(), "empty separator");
    const std::string& sep = p.required(0).str();
    const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      if (name == "partition") return Value::list({Value::string(s), Value::string(""), Value::string("")}, true);
      return Value::list({Value::string(""), Value::string(""), Value::string(s)}, true);
    }
    return Value::list({Value::string(s.substr(0, at)), Value::string(sep), Value::string(s.substr(at + sep.size()))},
                       true);
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    Params p(name, args, {"width", "fillchar"});
    const std::string fill = p.get(1) ? p.get(1)->str() : " ";
    const int64_t width = p.required(0).as_int();
    in.check_size(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(width, 1LL << 40))));
    return Value::string(pad(s, width, fill, name == "center" ? 0 : name == "ljust" ? -1 : 1));
  }
  if (name == "zfill") {
    Params p(name, args, {"width"});
    const int64_t width = p.required(0).as_int();
    const auto len = static_cast<int64_t>(py::utf8_length(s));
    if (width <= len) return Value::string(s);
    in.check_size(static_cast<size_t>(std::min<int64_t>(width, 1LL << 40)));
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    std::string zeros(static_cast<size_t>(width - len), '0');
    return Value::string(sign ? s.substr(0, 1) + zeros + s.substr(1) : zeros + s);
  }
  auto all_chars = [&](auto pred) {
    const std::u32string u = py::utf8_decode(s);
    if (u.empty()) return Value::boolean(false);
    return Value::boolean(std::all_of(u.begin(), u.end(), pred));
  };
  if (name == "isdigit") return all_chars(py::is_digit);
  if (name == "isdecimal") return all_chars(py::is_decimal);
  if (name == "isnumeric") return all_chars([](char32_t c) { return py::is_digit(c) || (py::is_alnum(c) && !py::is_alpha(c)); });
  if (name == "isalpha") return all_chars(py::is_alpha);
  if (name == "isalnum") return all_chars(py::is_alnum);
  if (name == "isspace") return all_chars(py::is_space);
  if (name == "isascii") return Value::boolean(py::is_ascii(s));
  if (name == "isprintable") {
    const std::u32string u = py::utf8_decode(s);
    return Value::boolean(std::all_of(u.begin(), u.end(), py::is_printable));
  }
  if (name == "islower" || name == "isupper") {
    bool cased = false;
    for (char32_t c : py::utf8_decode(s)) {
      if (name == "islower" ? py::is_upper(c) : py::is_lower(c)) return Value::boolean(false);
      cased = cased || (name == "islower" ? py::is_lower(c) : py::is_upper(c));
    }
    return Value::boolean(cased);
  }
  if (name == "istitle") return Value::boolean(!s.empty() && py::str_title(s) == s && py::str_lower(s) != s);
  fail("str.{}() is not supported", name);
}

Value list_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& args) {
  const auto& items = self.list_ref().items;
  if (name == "count") {
    Params p(name, args, {"value"});
    int64_t n = 0;
    for (const Value& v : items) n += py::py_equal(v, p.required(0));
    return Value::integer(n);
  }
  if (name == "index") {
    Params p(name, args, {"value"});
    for (size_t i = 0; i < items.size(); ++i)
      if (py::py_equal(items[i], p.required(0))) return Value::integer(static_cast<int64_t>(i));
    fail("{} is not in list", py::py_repr(p.required(0)));
  }
  if (name == "copy") {
    in.step(items.size());
    return Value::list(items, self.list_ref().tuple);
  }
  fail("list.{}() is not supported", name);
}

Value dict_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& args) {
  const py::Dict& d = self.dict_ref();
  if (name == "get") {
    Params p(name, args, {"key", "default"});
    if (const Value* v = d.find(p.required(0))) return *v;
    return p.get_or(1, Value::none());
  }
  if (name == "items" || name == "keys" || name == "values") {
    Params p(name, args, {});
    std::vector<Value> out;
    out.reserve(d.size());
    for (const auto& [k, v] : d.items()) {
      if (name == "items")
        out.push_back(Value::list({k, v}, true));
      else
        out.push_back(name == "keys" ? k : v);
    }
    in.step(out.size());
    return Value::list(std::move(out));
  }
  if (name == "copy") {
    auto copy = std::make_shared<py::Dict>(d);
    in.step(d.size());
    return Value::dict(copy);
  }
  fail("dict.{}() is not supported", name);
}

}  // namespace

std::string BoundMethod::repr() const {
  return fmt::format("<built-in method {} of {} object>", name_, self_.type_name());
}

Value BoundMethod::call(Interpreter& in, CallArgs& args) { return call_method(in, self_, name_, args); }

std::string Namespace::repr() const { return "<Namespace " + py::py_repr(Value::dict(std::make_shared<py::Dict>(attrs))) + ">"; }

std::optional<Value> method_attribute(const Value& self, std::string_view name) {
  bool unsafe = false;
  if (self.is_string()) {
    if (!contains(kStrMethods, name)) return std::nullopt;
  } else if (self.is_list()) {
    if (self.list_ref().tuple) {
      if (name != "count" && name != "index") return std::nullopt;
    } else {
      if (!contains(kListMethods, name)) return std::nullopt;
      unsafe = contains(kListUnsafe, name);
    }
  } else if (self.is_dict()) {
    if (!contains(kDictMethods, name)) return std::nullopt;
    unsafe = contains(kDictUnsafe, name);
  } else {
    return std::nullopt;
  }
  if (unsafe)
    return Value::undefined(
        fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, self.type_name()));
  return Value::object(std::make_shared<BoundMethod>(self, std::string(name)));
}

Value call_method(Interpreter& in, const Value& self, std::string_view name_view, CallArgs& args) {
  const std::string name(name_view);
  if (self.is_string()) return str_method(in, self.str(), name, args);
  if (self.is_list()) {
    if (!self.list_ref().tuple && contains(kListUnsafe, name))
      fail("access to attribute '{}' of 'list' object is unsafe.", name);
    return list_method(in, self, name, args);
  }
  if (self.is_dict()) {
    if (contains(kDictUnsafe, name)) fail("access to attribute '{}' of 'dict' object is unsafe.", name);
    return dict_method(in, self, name, args);
  }
  fail("'{}' object has no attribute '{}'", self.type_name(), name);
}

}  // namespace kestrel::jinja

// Builtin filters and tests, as jinja2 3.1 defines them (HF overrides tojson with json.dumps, ensure_ascii False).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "base/py_strings.h"
#include "base/python_json.h"
#include "text/jinja_builtins.h"
#include "text/jinja_interpreter.h"

namespace kestrel::jinja {

namespace {

constexpr std::string_view kFilters[] = {
    "abs",     "attr",       "batch",     "capitalize", "center",  "count",     "d",         "default",
    "dictsort", "e",         "escape",    "filesizeformat", "first", "float",   "forceescape", "format",
    "groupby", "indent",     "int",       "items",      "join",    "last",      "length",    "list",
    "lower",   "map",        "max",       "min",        "pprint",  "random",    "reject",    "rejectattr",
    "replace", "reverse",    "round",     "safe",       "select",  "selectattr", "slice",    "sort",
    "string",  "striptags",  "sum",       "title",      "tojson",  "trim",      "truncate",  "unique",
    "upper",   "urlencode",  "urlize",    "wordcount",  "wordwrap", "xmlattr"};

constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq",     "equalto", "escaped", "even",      "false",
    "filter",  "float",    "ge",      "greaterthan", "gt",     "in",      "integer", "iterable",  "le",
    "lessthan", "lower",   "lt",      "mapping",     "ne",     "none",    "number",  "odd",       "sameas",
    "sequence", "string",  "test",    "true",        "undefined", "upper", "==",     "!=",        "<",
    "<=",      ">",        ">="};

// soft_str: str(value); Undefined is "".
std::string soft_str(const Value& v) { return v.is_string() ? v.str() : py::py_str(v); }

[[noreturn]] void undefined_fail(const Value& v) { fail("{}", v.str().empty() ? "value is undefined" : v.str()); }

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String:
      return static_cast<int64_t>(py::utf8_length(v.str()));
    case Value::Kind::List:
      return static_cast<int64_t>(v.list_ref().items.size());
    case Value::Kind::Dict:
      return static_cast<int64_t>(v.dict_ref().size());
    case Value::Kind::Undefined:
      return 0;
    default:
      fail("object of type '{}' has no len()", v.type_name());
  }
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(py::str_lower(v.str())) : v; }

// jinja2's make_attrgetter: "a.b.0" looks up each part with getitem (digits as ints).
Value attr_path(Interpreter& in, Value item, const Value& attribute) {
  if (!attribute.is_string()) return in.getitem(item, attribute);
  std::string_view path = attribute.str();
  while (true) {
    const size_t dot = path.find('.');
    const std::string_view part = path.substr(0, dot);
    int64_t index = 0;
    const auto r = std::from_chars(part.data(), part.data() + part.size(), index);
    if (!part.empty() && r.ec == std::errc() && r.ptr == part.data() + part.size())
      item = in.getitem(item, Value::integer(index));
    else
      item = in.getitem(item, Value::string(std::string(part)));
    if (dot == std::string_view::npos) return item;
    path.remove_prefix(dot + 1);
  }
}

void stable_sort_values(std::vector<Value>& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? py::py_less(b.first, a.first) : py::py_less(a.first, b.first);
  });
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (const auto& [k, i] : keyed) sorted.push_back(items[i]);
  items = std::move(sorted);
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python float(str): surrounding whitespace, underscores between digits, inf/nan words.
std::optional<double> parse_py_float(std::string_view s) {
  const std::string stripped = py::str_strip(s, std::nullopt, true, true);
  std::string t;
  for (size_t i = 0; i < stripped.size(); ++i) {
    if (stripped[i] == '_' && i > 0 && i + 1 < stripped.size() && std::isdigit(static_cast<unsigned char>(stripped[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(stripped[i + 1])))
      continue;
    t += stripped[i];
  }
  if (t.empty()) return std::nullopt;
  std::string lower = py::str_lower(t);
  std::string_view body = lower;
  double sign = 1;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body[0] == '-' ? -1 : 1;
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") return sign * HUGE_VAL;
  if (body == "nan") return std::nan("");
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-'))
      return std::nullopt;
  double d = 0;
  const auto r = std::from_chars(body.data(), body.data() + body.size(), d);
  if (r.ptr != body.data() + body.size()) return std::nullopt;
  if (r.ec == std::errc::result_out_of_range) d = body.find("e-") != std::string_view::npos ? 0.0 : HUGE_VAL;
  else if (r.ec != std::errc()) return std::nullopt;
  return sign * d;
}

std::optional<int64_t> parse_py_int(std::string_view s, int base) {
  const std::string stripped = py::str_strip(s, std::nullopt, true, true);
  std::string t;
  for (char c : stripped)
    if (c != '_') t += c;
  std::string_view body = t;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (base == 16 && body.size() > 2 && body[0] == '0' && (body[1] == 'x' || body[1] == 'X')) body.remove_prefix(2);
  if (base == 8 && body.size() > 2 && body[0] == '0' && (body[1] == 'o' || body[1] == 'O')) body.remove_prefix(2);
  if (base == 2 && body.size() > 2 && body[0] == '0' && (body[1] == 'b' || body[1] == 'B')) body.remove_prefix(2);
  if (body.empty()) return std::nullopt;
  int64_t v = 0;
  const auto r = std::from_chars(body.data(), body.data() + body.size(), v, base);
  if (r.ec != std::errc() || r.ptr != body.data() + body.size()) return std::nullopt;
  return negative ? -v : v;
}

Value round_value(const Value& v, int64_t precision, const std::string& method) {
  require(v.is_number(), "type {} doesn't define __round__ method", v.type_name());
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());
    const double d = v.as_double();
    if (!std::isfinite(d)) return v;
    if (precision < 0 || precision > 300) {
      const double scale = std::pow(10.0, static_cast<double>(precision));
      return Value::floating(std::nearbyint(d * scale) / scale);
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);
    return Value::floating(std::strtod(buf, nullptr));
  }
  require(method == "floor" || method == "ceil", "method must be common, ceil or floor");
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  return Value::floating((method == "floor" ? std::floor(x) : std::ceil(x)) / scale);
}

Value do_tojson(const Value& v, Params& p) {
  py::JsonDumpOptions o;
  o.ensure_ascii = p.get_or(0, Value::boolean(false)).truthy();
  const Value indent = p.get_or(1, Value::none());
  if (indent.is_int() || indent.is_bool())
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent.as_int(), 1 << 16))), ' ');
  else if (indent.is_string())
    o.indent = indent.str();
  else if (!indent.is_none())
    fail("tojson: indent must be an int, a string or None");
  const Value separators = p.get_or(2, Value::none());
  if (!separators.is_none()) {
    require(separators.is_list() && separators.list_ref().items.size() == 2 &&
                separators.list_ref().items[0].is_string() && separators.list_ref().items[1].is_string(),
            "tojson: separators must be a pair of strings");
    o.item_separator = separators.list_ref().items[0].str();
    o.key_separator = separators.list_ref().items[1].str();
  }
  o.sort_keys = p.get_or(3, Value::boolean(false)).truthy();
  return Value::string(py::json_dumps(v, o));
}

// select/reject/selectattr/rejectattr: args after the attribute are (test name, test args...).
Value select_filter(Interpreter& in, const Value& seq, CallArgs& args, bool with_attribute, bool keep_if) {
  std::vector<Value> pos = args.positional;
  Value attribute;
  size_t at = 0;
  if (with_attribute) {
    require(!pos.empty(), "missing attribute");
    attribute = pos[0];
    at = 1;
  }
  std::optional<std::string> test;
  if (at < pos.size()) {
    require(pos[at].is_string(), "test name must be a string");
    test = pos[at].str();
    ++at;
  }
  CallArgs test_args;
  test_args.positional.assign(pos.begin() + static_cast<std::ptrdiff_t>(std::min(at, pos.size())), pos.end());
  test_args.keyword = args.keyword;
  if (test) require(is_known_test(*test), "no test named '{}'", *test);
  std::vector<Value> out;
  for (const Value& item : in.iterate(seq)) {
    const Value subject = with_attribute ? attr_path(in, item, attribute) : item;
    CallArgs call_args = test_args;
    const bool pass = test ? apply_test(in, *test, subject, call_args) : subject.truthy();
    if (pass == keep_if) out.push_back(item);
    in.step();
  }
  return Value::list(std::move(out));
}

std::string indent_text(std::string s, const Value& width, bool first, bool blank) {
  const std::string indention =
      width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  s += "\n";
  std::vector<std::string> lines = py::str_splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

}  // namespace

Params::Params(std::string_view function, CallArgs& args, std::initializer_list<std::string_view> names)
    : function_(function), names_(names), bound_(names.size()) {
  require(args.positional.size() <= names_.size(), "{}() takes at most {} argument(s) ({} given)", function_,
          names_.size(), args.positional.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = args.positional[i];
  for (auto& [key, value] : args.keyword) {
    const auto it = std::find(names_.begin(), names_.end(), key);
    require(it != names_.end(), "{}() got an unexpected keyword argument '{}'", function_, key);
    const auto i = static_cast<size_t>(it - names_.begin());
    require(!bound_[i], "{}() got multiple values for argument '{}'", function_, key);
    bound_[i] = value;
  }
}

const Value& Params::required(size_t i) const {
  require(get(i) != nullptr, "{}() missing required argument '{}'", function_, names_[i]);
  return *get(i);
}

bool is_known_filter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool is_known_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

Value apply_filter(Interpreter& in, std::string_view name, Value v, CallArgs& args) {
  const std::string n(name);
  if (n == "tojson") {
    Params p(n, args, {"ensure_ascii", "indent", "separators", "sort_keys"});
    Value out = do_tojson(v, p);
    in.check_size(out.str().size());
    return out;
  }
  if (n == "length" || n == "count") return Value::integer(length_of(v));
  if (n == "string") return Value::string(soft_str(v));
  if (n == "safe") return Value::string(soft_str(v));
  if (n == "e" || n == "escape" || n == "forceescape") return Value::string(html_escape(soft_str(v)));
  if (n == "upper") return Value::string(py::str_upper(soft_str(v)));
  if (n == "lower") return Value::string(py::str_lower(soft_str(v)));
  if (n == "capitalize") return Value::string(py::str_capitalize(soft_str(v)));
  if (n == "title") {
    // jinja2: split before runs of [-\s({\[<]; each item: first char upper, rest lower.
    const std::u32string u = py::utf8_decode(soft_str(v));
    auto is_sep = [](char32_t c) {
      return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c);
    };
    std::string out;
    bool at_start = true;
    for (char32_t c : u) {
      if (is_sep(c)) {
        py::utf8_append(out, c);
        at_start = true;
      } else if (at_start) {
        out += py::str_upper(py::utf8_encode(std::u32string(1, c)));
        at_start = false;
      } else {
        out += py::str_lower(py::utf8_encode(std::u32string(1, c)));
      }
    }
    return Value::string(std::move(out));
  }
  if (n == "trim") {
    Params p(n, args, {"chars"});
    const Value chars = p.get_or(0, Value::none());
    return Value::string(py::str_strip(soft_str(v), chars.is_none() ? std::nullopt : std::optional(soft_str(chars)),
                                       true, true));
  }
  if (n == "replace") {
    Params p(n, args, {"old", "new", "count"});
    const Value count = p.get_or(2, Value::none());
    std::string out = py::str_replace(soft_str(v), soft_str(p.required(0)), soft_str(p.required(1)),
                                      count.is_none() ? -1 : count.as_int());
    in.check_size(out.size());
    return Value::string(std::move(out));
  }
  if (n == "default" || n == "d") {
    Params p(n, args, {"default_value", "boolean"});
    const bool boolean = p.get_or(1, Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return p.get_or(0, Value::string(""));
    return v;
  }
  if (n == "first") {
    if (v.is_undefined()) return Value::undefined("No first item, sequence was empty.");
    std::vector<Value> items = in.iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (n == "last") {
    if (v.is_undefined()) undefined_fail(v);
    std::vector<Value> items = in.iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (n == "list") return Value::list(in.iterate(v));
  if (n == "items") {
    if (v.is_undefined()) return Value::list();
    require(v.is_dict(), "can only get item pairs from a mapping");
    std::vector<Value> out;
    for (const auto& [k, val] : v.dict_ref().items()) out.push_back(Value::list({k, val}, true));
    return Value::list(std::move(out));
  }
  if (n == "join") {
    Params p(n, args, {"d", "attribute"});
    const std::string sep = soft_str(p.get_or(0, Value::string("")));
    const Value attribute = p.get_or(1, Value::none());
    std::string out;
    bool first = true;
    for (const Value& item : in.iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += soft_str(attribute.is_none() ? item : attr_path(in, item, attribute));
      in.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (n == "reverse") {
    if (v.is_string()) {
      std::u32string u = py::utf8_decode(v.str());
      std::reverse(u.begin(), u.end());
      return Value::string(py::utf8_encode(u));
    }
    std::vector<Value> items = in.iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (n == "sort") {
    Params p(n, args, {"reverse", "case_sensitive", "attribute"});
    const bool reverse = p.get_or(0, Value::boolean(false)).truthy();
    const bool case_sensitive = p.get_or(1, Value::boolean(false)).truthy();
    const Value attribute = p.get_or(2, Value::none());
    std::vector<Value> items = in.iterate(v);
    in.step(items.size());
    stable_sort_values(
        items,
        [&](const Value& item) {
          Value key = attribute.is_none() ? item : attr_path(in, item, attribute);
          return case_sensitive ? key : ignore_case(key);
        },
        reverse);
    return Value::list(std::move(items));
  }
  if (n == "dictsort") {
    Params p(n, args, {"case_sensitive", "by", "reverse"});
    const bool case_sensitive = p.get_or(0, Value::boolean(false)).truthy();
    const std::string by = soft_str(p.get_or(1, Value::string("key")));
    const bool reverse = p.get_or(2, Value::boolean(false)).truthy();
    require(by == "key" || by == "value", "You can only sort by either \"key\" or \"value\"");
    require(v.is_dict(), "dictsort requires a mapping");
    std::vector<Value> items;
    for (const auto& [k, val] : v.dict_ref().items()) items.push_back(Value::list({k, val}, true));
    stable_sort_values(
        items,
        [&](const Value& item) {
          const Value& key = item.list_ref().items[by == "key" ? 0 : 1];
          return case_sensitive ? key : ignore_case(key);
        },
        reverse);
    return Value::list(std::move(items));
  }
  if (n == "unique") {
    Params p(n, args, {"case_sensitive", "attribute"});
    const bool case_sensitive = p.get_or(0, Value::boolean(false)).truthy();
    const Value attribute = p.get_or(1, Value::none());
    std::vector<Value> out, seen;
    for (const Value& item : in.iterate(v)) {
      Value key = attribute.is_none() ? item : attr_path(in, item, attribute);
      if (!case_sensitive) key = ignore_case(key);
      in.step(seen.size() / 16 + 1);
      bool dup = false;
      for (const Value& s : seen)
        if (py::py_equal(s, key)) {
          dup = true;
          break;
        }
      if (dup) continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (n == "min" || n == "max") {
    Params p(n, args, {"case_sensitive", "attribute"});
    const bool case_sensitive = p.get_or(0, Value::boolean(false)).truthy();
    const Value attribute = p.get_or(1, Value::none());
    std::vector<Value> items = in.iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    auto key = [&](const Value& item) {
      Value k = attribute.is_none() ? item : attr_path(in, item, attribute);
      return case_sensitive ? k : ignore_case(k);
    };
    size_t best = 0;
    Value best_key = key(items[0]);
    for (size_t i = 1; i < items.size(); ++i) {
      Value k = key(items[i]);
      if (n == "min" ? py::py_less(k, best_key) : py::py_less(best_key, k)) {
        best = i;
        best_key = std::move(k);
      }
    }
    return items[best];
  }
  if (n == "sum") {
    Params p(n, args, {"attribute", "start"});
    const Value attribute = p.get_or(0, Value::none());
    Value total = p.get_or(1, Value::integer(0));
    for (const Value& item : in.iterate(v)) {
      const Value x = attribute.is_none() ? item : attr_path(in, item, attribute);
      if (total.is_number() && x.is_number()) {
        total = total.is_float() || x.is_float() ? Value::floating(total.as_double() + x.as_double())
                                                 : Value::integer(total.as_int() + x.as_int());
      } else {
        fail("unsupported operand type(s) for +: '{}' and '{}'", total.type_name(), x.type_name());
      }
    }
    return total;
  }
  if (n == "map") {
    std::vector<Value> out;
    const Value* attribute = nullptr;
    Value default_value;
    for (const auto& [k, val] : args.keyword) {
      if (k == "attribute") attribute = &val;
      if (k == "default") default_value = val;
    }
    if (attribute) {
      for (const Value& item : in.iterate(v)) {
        Value x = attr_path(in, item, *attribute);
        out.push_back(x.is_undefined() && !default_value.is_undefined() ? default_value : x);
        in.step();
      }
      return Value::list(std::move(out));
    }
    require(!args.positional.empty() && args.positional[0].is_string(), "map requires a filter name or attribute=");
    const std::string filter = args.positional[0].str();
    require(is_known_filter(filter), "no filter named '{}'", filter);
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& item : in.iterate(v)) {
      CallArgs a = rest;
      out.push_back(apply_filter(in, filter, item, a));
      in.step();
    }
    return Value::list(std::move(out));
  }
  if (n == "select") return select_filter(in, v, args, false, true);
  if (n == "reject") return select_filter(in, v, args, false, false);
  if (n == "selectattr") return select_filter(in, v, args, true, true);
  if (n == "rejectattr") return select_filter(in, v, args, true, false);
  if (n == "attr") {
    Params p(n, args, {"name"});
    return in.getattr(v, soft_str(p.required(0)));
  }
  if (n == "abs") {
    if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
    require(v.is_int() || v.is_bool(), "bad operand type for abs(): '{}'", v.type_name());
    require(v.as_int() != std::numeric_limits<int64_t>::min(), "integer overflow (beyond int64)");
    return Value::integer(std::abs(v.as_int()));
  }
  if (n == "int") {
    Params p(n, args, {"default", "base"});
    const Value fallback = p.get_or(0, Value::integer(0));
    const int64_t base = p.get_or(1, Value::integer(10)).as_int();
    if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
    if (v.is_float()) {
      const double d = v.as_double();
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
      return Value::integer(static_cast<int64_t>(d));
    }
    if (v.is_string()) {
      if (base >= 2 && base <= 36)
        if (auto i = parse_py_int(v.str(), static_cast<int>(base))) return Value::integer(*i);
      if (auto d = parse_py_float(v.str()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
        return Value::integer(static_cast<int64_t>(*d));
    }
    return fallback;
  }
  if (n == "float") {
    Params p(n, args, {"default"});
    const Value fallback = p.get_or(0, Value::floating(0.0));
    if (v.is_number()) return Value::floating(v.as_double());
    if (v.is_string())
      if (auto d = parse_py_float(v.str())) return Value::floating(*d);
    return fallback;
  }
  if (n == "round") {
    Params p(n, args, {"precision", "method"});
    return round_value(v, p.get_or(0, Value::integer(0)).as_int(), soft_str(p.get_or(1, Value::string("common"))));
  }
  if (n == "indent") {
    Params p(n, args, {"width", "first", "blank"});
    std::string out = indent_text(soft_str(v), p.get_or(0, Value::integer(4)), p.get_or(1, Value::boolean(false)).truthy(),
                                  p.get_or(2, Value::boolean(false)).truthy());
    in.check_size(out.size());
    return Value::string(std::move(out));
  }
  if (n == "center") {
    Params p(n, args, {"width"});
    const int64_t width = p.get_or(0, Value::integer(80)).as_int();
    CallArgs a;
    a.positional.push_back(Value::integer(width));
    return call_method(in, Value::string(soft_str(v)), "center", a);
  }
  if (n == "wordcount") return Value::integer(static_cast<int64_t>(py::str_split(soft_str(v), std::nullopt, -1).size()));
  if (n == "batch") {
    Params p(n, args, {"linecount", "fill_with"});
    const int64_t size = p.required(0).as_int();
    require(size > 0, "batch size must be positive");
    const Value* fill = p.get(1);
    std::vector<Value> out, row;
    for (const Value& item : in.iterate(v)) {
      row.push_back(item);
      if (static_cast<int64_t>(row.size()) == size) {
        out.push_back(Value::list(std::move(row)));
        row.clear();
      }
    }
    if (!row.empty()) {
      if (fill && !fill->is_none())
        while (static_cast<int64_t>(row.size()) < size) row.push_back(*fill);
      out.push_back(Value::list(std::move(row)));
    }
    return Value::list(std::move(out));
  }
  if (n == "format") {
    require(args.keyword.empty(), "format with keyword arguments is not supported");
    std::string out = percent_format(soft_str(v), Value::list(args.positional, true));
    in.check_size(out.size());
    return Value::string(std::move(out));
  }
  fail("filter '{}' is not supported", n);
}

bool apply_test(Interpreter& in, std::string_view name, const Value& v, CallArgs& args) {
  const std::string n(name);
  auto arg = [&](size_t i) -> const Value& {
    require(i < args.positional.size(), "test '{}' needs an argument", n);
    return args.positional[i];
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "boolean") return v.is_bool();
  if (n == "false") return v.is_bool() && !v.as_bool();
  if (n == "true") return v.is_bool() && v.as_bool();
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  if (n == "number") return v.is_number();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_dict();
  if (n == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (n == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (n == "callable") return v.is_object() && dynamic_cast<Callable*>(&v.object_ref()) != nullptr;
  if (n == "escaped") return false;
  if (n == "lower") {
    const std::string s = soft_str(v);
    bool cased = false;
    for (char32_t c : py::utf8_decode(s)) {
      if (py::is_upper(c)) return false;
      cased = cased || py::is_lower(c);
    }
    return cased;
  }
  if (n == "upper") {
    const std::string s = soft_str(v);
    bool cased = false;
    for (char32_t c : py::utf8_decode(s)) {
      if (py::is_lower(c)) return false;
      cased = cased || py::is_upper(c);
    }
    return cased;
  }
  if (n == "odd" || n == "even") {
    if (v.is_undefined()) undefined_fail(v);
    require(v.is_int() || v.is_bool(), "odd/even need an integer");
    const bool odd = (v.as_int() % 2) != 0;
    return n == "odd" ? odd : !odd;
  }
  if (n == "divisibleby") {
    const Value& d = arg(0);
    require(v.is_number() && d.is_number(), "divisibleby needs numbers");
    if (v.is_float() || d.is_float()) {
      require(d.as_double() != 0, "float modulo");
      return std::fmod(v.as_double(), d.as_double()) == 0;
    }
    require(d.as_int() != 0, "integer division or modulo by zero");
    return d.as_int() == -1 || v.as_int() % d.as_int() == 0;
  }
  if (n == "eq" || n == "equalto" || n == "==") return py::py_equal(v, arg(0));
  if (n == "ne" || n == "!=") return !py::py_equal(v, arg(0));
  if (n == "lt" || n == "lessthan" || n == "<") return py::py_less(v, arg(0));
  if (n == "le" || n == "<=") return !py::py_less(arg(0), v);
  if (n == "gt" || n == "greaterthan" || n == ">") return py::py_less(arg(0), v);
  if (n == "ge" || n == ">=") return !py::py_less(v, arg(0));
  if (n == "in") return py_contains(arg(0), v);
  if (n == "sameas") {
    const Value& o = arg(0);
    if (v.kind() != o.kind()) return false;
    if (v.is_list()) return v.list_ptr() == o.list_ptr();
    if (v.is_dict()) return v.dict_ptr() == o.dict_ptr();
    if (v.is_object()) return v.object_ptr() == o.object_ptr();
    return py::py_equal(v, o);
  }
  if (n == "filter") return v.is_string() && is_known_filter(v.str());
  if (n == "test") return v.is_string() && is_known_test(v.str());
  (void)in;
  fail("test '{}' is not supported", n);
}

}  // namespace kestrel::jinja

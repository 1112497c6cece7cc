#include "text/jinja.h"

#include <ctime>

#include "base/error.h"
#include "base/py_strings.h"
#include "text/jinja_interpreter.h"
#include "text/jinja_parser.h"

namespace kestrel::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox refuses larger ranges

Value builtin(std::string name, BuiltinFunction::Fn fn) {
  return Value::object(std::make_shared<BuiltinFunction>(std::move(name), std::move(fn)));
}

ScopePtr make_globals() {
  auto g = std::make_shared<Scope>();
  g->vars["range"] = builtin("range", [](Interpreter& in, CallArgs& args) {
    require(args.keyword.empty(), "range() takes no keyword arguments");
    const auto& a = args.positional;
    require(!a.empty() && a.size() <= 3, "range expected 1 to 3 arguments, got {}", a.size());
    for (const Value& v : a) require(v.is_int() || v.is_bool(), "'{}' object cannot be interpreted as an integer", v.type_name());
    int64_t start = 0, stop = 0, stride = 1;
    if (a.size() == 1) {
      stop = a[0].as_int();
    } else {
      start = a[0].as_int();
      stop = a[1].as_int();
      if (a.size() == 3) stride = a[2].as_int();
    }
    require(stride != 0, "range() arg 3 must not be zero");
    const double count = stride > 0 ? std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(stride)))
                                    : std::max(0.0, std::ceil((static_cast<double>(start) - static_cast<double>(stop)) / static_cast<double>(-stride)));
    require(count <= static_cast<double>(kMaxRange),
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
    in.step(static_cast<uint64_t>(count));
    std::vector<Value> items;
    for (int64_t i = start; stride > 0 ? i < stop : i > stop; i += stride) items.push_back(Value::integer(i));
    return Value::list(std::move(items));
  });
  g->vars["namespace"] = builtin("namespace", [](Interpreter& in, CallArgs& args) {
    auto ns = std::make_shared<Namespace>();
    in.track(ns);
    for (const Value& a : args.positional) {
      require(a.is_dict(), "namespace() positional arguments must be mappings");
      for (const auto& [k, v] : a.dict_ref().items()) ns->attrs.set(k, v);
    }
    for (const auto& [k, v] : args.keyword) ns->attrs.set(k, v);
    return Value::object(ns);
  });
  g->vars["dict"] = builtin("dict", [](Interpreter&, CallArgs& args) {
    Value d = Value::dict();
    for (const Value& a : args.positional) {
      require(a.is_dict(), "dict() positional arguments must be mappings");
      for (const auto& [k, v] : a.dict_ref().items()) d.dict_ref().set(k, v);
    }
    for (const auto& [k, v] : args.keyword) d.dict_ref().set(k, v);
    return d;
  });
  g->vars["raise_exception"] = builtin("raise_exception", [](Interpreter&, CallArgs& args) -> Value {
    const std::string message = args.positional.empty() ? std::string() : py::py_str(args.positional[0]);
    throw TemplateError("template raised: " + message);
  });
  g->vars["strftime_now"] = builtin("strftime_now", [](Interpreter&, CallArgs& args) {
    require(args.positional.size() == 1 && args.positional[0].is_string(), "strftime_now(format) takes a string");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, args.positional[0].str().c_str(), &local);
    return Value::string(std::string(buf, n));
  });
  return g;
}

}  // namespace

struct Template::Parsed {
  std::string source;  // normalised
  Body body;
};

Template::Template(std::string_view source, Options options) : options_(options), parsed_(std::make_unique<Parsed>()) {
  require(py::utf8_valid(source), "template is not valid UTF-8");
  parsed_->source = normalise_source(source, options_.keep_trailing_newline);
  parsed_->body = parse_template(parsed_->source, options_);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const py::Dict& variables) const {
  static const ScopePtr globals = make_globals();
  auto context = std::make_shared<Scope>();
  context->parent = globals;
  for (const auto& [k, v] : variables.items()) {
    require(k.is_string(), "template variable names must be strings");
    context->vars[k.str()] = v;
  }
  Interpreter interpreter(parsed_->source, options_);
  std::string out;
  interpreter.render(parsed_->body, context, out);
  return out;
}

}  // namespace kestrel::jinja

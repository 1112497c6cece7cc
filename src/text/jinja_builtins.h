// The engine's runtime pieces shared by the interpreter and the builtin filters, tests and methods:
// call arguments, engine objects (functions, macros, namespaces, loop), and the builtin tables.
#pragma once

#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/py_value.h"

namespace kestrel::jinja {

using py::Value;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Interpreter;

// Something a template can call.
class Callable : public py::Object {
public:
  virtual Value call(Interpreter& in, CallArgs& args) = 0;
  std::string_view type_name() const override { return "function"; }
};

class BuiltinFunction final : public Callable {
public:
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  BuiltinFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  Value call(Interpreter& in, CallArgs& args) override { return fn_(in, args); }
  std::string_view type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return "<function " + name_ + ">"; }

private:
  std::string name_;
  Fn fn_;
};

// A method of a str, list or dict bound to its object (`d.items`, `s.split`).
class BoundMethod final : public Callable {
public:
  BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  Value call(Interpreter& in, CallArgs& args) override;
  std::string_view type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override;

private:
  Value self_;
  std::string name_;
};

// jinja2's namespace(): attributes assignable with {% set ns.attr = ... %}.
class Namespace final : public py::Object {
public:
  py::Dict attrs;
  std::string_view type_name() const override { return "Namespace"; }
  std::string repr() const override;
};

// Binds call arguments to a builtin's parameter names (Python rules: positional then keyword, no duplicates).
class Params {
public:
  Params(std::string_view function, CallArgs& args, std::initializer_list<std::string_view> names);
  const Value* get(size_t i) const { return i < bound_.size() && bound_[i] ? &*bound_[i] : nullptr; }
  Value get_or(size_t i, Value fallback) const { return get(i) ? *get(i) : std::move(fallback); }
  const Value& required(size_t i) const;

private:
  std::string function_;
  std::vector<std::string_view> names_;
  std::vector<std::optional<Value>> bound_;
};

// Builtin tables (jinja_filters.cpp, jinja_methods.cpp).
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
Value apply_filter(Interpreter& in, std::string_view name, Value subject, CallArgs& args);
bool apply_test(Interpreter& in, std::string_view name, const Value& subject, CallArgs& args);
// The attribute `name` of a str/list/dict as a bound method, or nullopt when there is none. Mutating methods
// (append, pop, update, ...) give an Undefined that fails when used: HF renders in jinja2's immutable sandbox.
std::optional<Value> method_attribute(const Value& self, std::string_view name);
Value call_method(Interpreter& in, const Value& self, std::string_view name, CallArgs& args);

}  // namespace kestrel::jinja

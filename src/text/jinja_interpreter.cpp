#include "text/jinja_interpreter.h"

#include <fmt/format.h>
#include <fmt/printf.h>

#include <cmath>
#include <limits>

#include "base/py_strings.h"

namespace kestrel::jinja {

namespace {

bool expr_refers(const Expr* e, const std::string& name);

bool body_refers(const Body& body, const std::string& name) {
  for (const auto& s : body) {
    if (expr_refers(s->expr.get(), name) || expr_refers(s->target.get(), name) || expr_refers(s->cond.get(), name))
      return true;
    for (const auto& d : s->defaults)
      if (expr_refers(d.get(), name)) return true;
    for (const auto& [t, v] : s->assigns)
      if (expr_refers(v.get(), name)) return true;
    if (body_refers(s->body, name) || body_refers(s->else_body, name)) return true;
  }
  return false;
}

bool expr_refers(const Expr* e, const std::string& name) {
  if (!e) return false;
  if (e->kind == ExprKind::Name && e->name == name) return true;
  for (const auto& item : e->items)
    if (expr_refers(item.get(), name)) return true;
  for (const auto& a : e->args)
    if (expr_refers(a.value.get(), name)) return true;
  return expr_refers(e->dyn_args.get(), name) || expr_refers(e->dyn_kwargs.get(), name);
}

class Macro final : public Callable {
public:
  Macro(const Stmt& stmt, ScopePtr closure, std::string name)
      : stmt_(stmt), closure_(std::move(closure)), name_(std::move(name)) {}
  Value call(Interpreter& in, CallArgs& args) override { return Value::string(in.run_macro(stmt_, closure_, args, {})); }
  std::string_view type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + name_ + "'>"; }

private:
  const Stmt& stmt_;
  ScopePtr closure_;
  std::string name_;
};

class LoopObject final : public Callable, public std::enable_shared_from_this<LoopObject> {
public:
  LoopObject(std::vector<Value> loop_items, int loop_depth, const Stmt* recursive, ScopePtr scope)
      : items(std::move(loop_items)), depth(loop_depth), recursive_(recursive), scope_(std::move(scope)) {}
  std::string_view type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return fmt::format("<LoopContext {}/{}>", index0 + 1, items.size());
  }
  Value call(Interpreter& in, CallArgs& args) override {
    if (!recursive_) fail("the loop is not recursive; mark it with 'recursive' to call loop()");
    if (args.positional.size() != 1) fail("loop() takes exactly one argument");
    return Value::string(in.run_loop(*recursive_, scope_, args.positional[0], depth + 1));
  }

  Value attribute(Interpreter& in, std::string_view name) {
    const auto n = static_cast<int64_t>(items.size());
    if (name == "index") return Value::integer(index0 + 1);
    if (name == "index0") return Value::integer(index0);
    if (name == "revindex") return Value::integer(n - index0);
    if (name == "revindex0") return Value::integer(n - index0 - 1);
    if (name == "first") return Value::boolean(index0 == 0);
    if (name == "last") return Value::boolean(index0 == n - 1);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(depth);
    if (name == "depth0") return Value::integer(depth - 1);
    if (name == "previtem")
      return index0 > 0 ? items[static_cast<size_t>(index0 - 1)]
                        : Value::undefined("there is no previous item");
    if (name == "nextitem")
      return index0 + 1 < n ? items[static_cast<size_t>(index0 + 1)] : Value::undefined("there is no next item");
    if (name == "cycle") {
      auto self = shared_from_this();
      return Value::object(std::make_shared<BuiltinFunction>("cycle", [self](Interpreter&, CallArgs& a) {
        if (a.positional.empty()) fail("no items for cycling given");
        return a.positional[static_cast<size_t>(self->index0) % a.positional.size()];
      }));
    }
    if (name == "changed") {
      auto self = shared_from_this();
      return Value::object(std::make_shared<BuiltinFunction>("changed", [self](Interpreter&, CallArgs& a) {
        Value now = Value::list(a.positional, true);
        if (self->has_last_changed && py::py_equal(now, self->last_changed)) return Value::boolean(false);
        self->last_changed = now;
        self->has_last_changed = true;
        return Value::boolean(true);
      }));
    }
    (void)in;
    return Value::undefined(fmt::format("'LoopContext object' has no attribute '{}'", name));
  }

  std::vector<Value> items;
  int64_t index0 = 0;
  int depth;
  Value last_changed;
  bool has_last_changed = false;

private:
  const Stmt* recursive_;
  ScopePtr scope_;
};

// Nested exec/eval frames allowed in one render: far above real templates (a macro call costs about 6), far
// below what overflows an 8 MB stack even under AddressSanitizer.
constexpr int kMaxEvalDepth = 1500;

struct DepthGuard {
  int& depth;
  explicit DepthGuard(int& d) : depth(d) {
    if (++depth > kMaxEvalDepth) {
      --depth;
      throw TemplateError("template error: evaluation nested too deeply (macro recursion?)");
    }
  }
  ~DepthGuard() { --depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

[[noreturn]] void undefined_error(const Value& v) {
  fail("{}", v.str().empty() ? "value is undefined" : v.str());
}

int64_t checked(bool overflow, int64_t v) {
  require(!overflow, "integer overflow (beyond int64)");
  return v;
}

double py_fmod(double a, double b) {
  double mod = std::fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

double py_floordiv(double a, double b) {
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div != 0) {
    const double floordiv = std::floor(div);
    return div - floordiv > 0.5 ? floordiv + 1.0 : floordiv;
  }
  return std::copysign(0.0, a / b);
}

}  // namespace

std::string percent_format(std::string_view format, const Value& args_value) {
  std::vector<Value> args;
  const bool tuple = args_value.is_list() && args_value.list_ref().tuple;
  if (tuple)
    args = args_value.list_ref().items;
  else
    args.push_back(args_value);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    size_t j = i + 1;
    if (j < format.size() && format[j] == '%') {
      out += '%';
      i = j;
      continue;
    }
    std::string spec = "%";
    while (j < format.size() && std::string_view("-+ #0123456789.").find(format[j]) != std::string_view::npos)
      spec += format[j++];
    require(j < format.size(), "incomplete format");
    const char conv = format[j];
    i = j;
    require(next < args.size(), "not enough arguments for format string");
    const Value& a = args[next++];
    switch (conv) {
      case 's':
        out += fmt::sprintf(spec + "s", py::py_str(a));
        break;
      case 'r':
        out += fmt::sprintf(spec + "s", py::py_repr(a));
        break;
      case 'd':
      case 'i':
      case 'u':
        require(a.is_number(), "%d format: a real number is required, not {}", a.type_name());
        out += fmt::sprintf(spec + "d", a.is_float() ? static_cast<int64_t>(a.as_double()) : a.as_int());
        break;
      case 'x':
      case 'X':
      case 'o':
        require(a.is_int() || a.is_bool(), "%{} format: an integer is required, not {}", conv, a.type_name());
        out += fmt::sprintf(spec + conv, a.as_int());
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        require(a.is_number(), "must be real number, not {}", a.type_name());
        out += fmt::sprintf(spec + conv, a.as_double());
        break;
      default:
        fail("unsupported format character '{}'", conv);
    }
  }
  require(next == args.size() || !tuple, "not all arguments converted during string formatting");
  return out;
}

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

bool py_contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::String:
      require(item.is_string(), "'in <string>' requires string as left operand, not {}", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::List:
      for (const Value& v : container.list_ref().items)
        if (py::py_equal(v, item)) return true;
      return false;
    case Value::Kind::Dict:
      return container.dict_ref().find(item) != nullptr;
    case Value::Kind::Undefined:
      return false;
    default:
      fail("argument of type '{}' is not iterable", container.type_name());
  }
}

Interpreter::~Interpreter() {
  for (const auto& weak : captured_scopes_)
    if (auto scope = weak.lock()) {
      auto vars = std::move(scope->vars);  // destroyed here, after the scope no longer refers to them
      scope->vars.clear();
    }
  for (const auto& weak : namespaces_)
    if (auto ns = weak.lock()) {
      py::Dict attrs = std::move(ns->attrs);
      ns->attrs = py::Dict();
    }
}

std::string Interpreter::location(size_t offset) const {
  const SourcePos p = source_pos(source_, offset);
  return fmt::format("line {}, column {}", p.line, p.column);
}

void Interpreter::step(uint64_t n) {
  steps_ += n;
  if (steps_ > options_.max_steps)
    throw TemplateError(fmt::format("template error: exceeded the limit of {} evaluation steps", options_.max_steps));
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > options_.max_output_bytes)
    throw TemplateError(
        fmt::format("template error: a string or the output exceeds the limit of {} bytes", options_.max_output_bytes));
}

void Interpreter::append(std::string& out, std::string_view text) {
  check_size(out.size() + text.size());
  out += text;
}

void Interpreter::render(const Body& body, const ScopePtr& scope, std::string& out) { exec_body(body, scope, out); }

Interpreter::Flow Interpreter::exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    const Flow f = exec(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
  step();
  DepthGuard guard(depth_);
  switch (s.kind) {
    case StmtKind::Text:
      append(out, s.text);
      return Flow::Normal;
    case StmtKind::Output: {
      const Value v = eval(*s.expr, scope);
      if (v.is_string())
        append(out, v.str());
      else
        append(out, py::py_str(v));
      return Flow::Normal;
    }
    case StmtKind::If:
      if (eval(*s.expr, scope).truthy()) return exec_body(s.body, scope, out);
      return exec_body(s.else_body, scope, out);
    case StmtKind::For:
      exec_for(s, scope, eval(*s.expr, scope), 1, out);
      return Flow::Normal;
    case StmtKind::Set:
      assign(*s.target, eval(*s.expr, scope), scope);
      return Flow::Normal;
    case StmtKind::SetBlock: {
      std::string captured;
      exec_body(s.body, std::make_shared<Scope>(Scope{{}, scope}), captured);
      Value v = Value::string(std::move(captured));
      if (s.expr) {
        // The filter chain's innermost subject is null: apply it from the inside out.
        std::vector<const Expr*> chain;
        for (const Expr* f = s.expr.get(); f; f = f->items[0].get()) chain.push_back(f);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          CallArgs args;
          eval_args(**it, scope, args);
          try {
            v = apply_filter(*this, (*it)->name, std::move(v), args);
          } catch (const TemplateError&) {
            throw;
          } catch (const Error& e) {
            throw TemplateError(fmt::format("template error at {}: {}", location((*it)->offset), e.what()));
          }
        }
      }
      assign(*s.target, std::move(v), scope);
      return Flow::Normal;
    }
    case StmtKind::Macro:
      scope->vars[s.name] = make_macro(s, scope);
      return Flow::Normal;
    case StmtKind::CallBlock: {
      const Expr& call = *s.expr;
      track(scope);
      auto caller = Value::object(std::make_shared<Macro>(s, scope, "caller"));
      const Value callee = eval(*call.items[0], scope);
      CallArgs args;
      eval_args(call, scope, args);
      args.keyword.emplace_back("caller", caller);
      Value result;
      try {
        result = this->call(callee, args);
      } catch (const TemplateError&) {
        throw;
      } catch (const Error& e) {
        throw TemplateError(fmt::format("template error at {}: {}", location(call.offset), e.what()));
      }
      append(out, py::py_str(result));
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      std::string captured;
      exec_body(s.body, scope, captured);
      Value v = Value::string(std::move(captured));
      std::vector<const Expr*> chain;
      for (const Expr* f = s.expr.get(); f; f = f->items[0].get()) chain.push_back(f);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        CallArgs args;
        eval_args(**it, scope, args);
        v = apply_filter(*this, (*it)->name, std::move(v), args);
      }
      append(out, py::py_str(v));
      return Flow::Normal;
    }
    case StmtKind::Break:
      return Flow::Break;
    case StmtKind::Continue:
      return Flow::Continue;
    case StmtKind::With: {
      auto inner = std::make_shared<Scope>(Scope{{}, scope});
      for (const auto& [target, value] : s.assigns) assign(*target, eval(*value, scope), inner);
      exec_body(s.body, inner, out);
      return Flow::Normal;
    }
    case StmtKind::Generation:
      return exec_body(s.body, scope, out);
  }
  return Flow::Normal;
}

void Interpreter::exec_for(const Stmt& s, const ScopePtr& scope, const Value& iterable, int depth, std::string& out) {
  std::vector<Value> items = iterate(iterable);
  if (s.cond) {
    std::vector<Value> kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>(Scope{{}, scope});
      assign(*s.target, item, probe);
      if (eval(*s.cond, probe).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec_body(s.else_body, std::make_shared<Scope>(Scope{{}, scope}), out);
    return;
  }
  if (s.recursive) track(scope);
  auto loop = std::make_shared<LoopObject>(items, depth, s.recursive ? &s : nullptr, s.recursive ? scope : nullptr);
  const Value loop_value = Value::object(loop);
  for (size_t i = 0; i < loop->items.size(); ++i) {
    step();
    loop->index0 = static_cast<int64_t>(i);
    auto inner = std::make_shared<Scope>(Scope{{}, scope});
    assign(*s.target, loop->items[i], inner);
    inner->vars["loop"] = loop_value;
    if (exec_body(s.body, inner, out) == Flow::Break) break;
  }
}

std::string Interpreter::run_loop(const Stmt& loop, const ScopePtr& scope, const Value& iterable, int depth) {
  if (++call_depth_ > options_.max_call_depth) {
    --call_depth_;
    fail("maximum recursion depth ({}) exceeded", options_.max_call_depth);
  }
  std::string out;
  try {
    exec_for(loop, scope, iterable, depth, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return out;
}

void Interpreter::assign(const Expr& target, Value value, const ScopePtr& scope) {
  if (target.kind == ExprKind::Name) {
    scope->vars[target.name] = std::move(value);
    return;
  }
  if (target.kind == ExprKind::Tuple) {
    std::vector<Value> items = iterate(value);
    const size_t n = target.items.size();
    if (items.size() > n) fail("too many values to unpack (expected {})", n);
    if (items.size() < n) fail("not enough values to unpack (expected {}, got {})", n, items.size());
    for (size_t i = 0; i < n; ++i) assign(*target.items[i], std::move(items[i]), scope);
    return;
  }
  if (target.kind == ExprKind::GetAttr) {
    const Value* ns = scope->find(target.items[0]->name);
    if (!ns || !ns->is_object() || !dynamic_cast<Namespace*>(&ns->object_ref()))
      throw TemplateError(fmt::format("template error at {}: cannot assign attribute on non-namespace object",
                                      location(target.offset)));
    static_cast<Namespace&>(ns->object_ref()).attrs.set(target.name, std::move(value));
    return;
  }
  fail("cannot assign to this expression");
}

Value Interpreter::make_macro(const Stmt& s, const ScopePtr& scope) {
  track(scope);
  return Value::object(std::make_shared<Macro>(s, scope, s.name));
}

std::string Interpreter::run_macro(const Stmt& macro, const ScopePtr& closure, CallArgs& args, const Value& caller) {
  if (call_depth_ + 1 > options_.max_call_depth)
    fail("maximum recursion depth ({}) exceeded in macro '{}'", options_.max_call_depth, macro.name);
  auto scope = std::make_shared<Scope>(Scope{{}, closure});
  const bool is_caller = macro.kind == StmtKind::CallBlock;
  const std::string name = is_caller ? "caller" : macro.name;
  const size_t n = macro.params.size();
  std::vector<bool> bound(n, false);
  std::vector<Value> varargs;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < n) {
      scope->vars[macro.params[i]] = args.positional[i];
      bound[i] = true;
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  const bool catch_varargs = body_refers(macro.body, "varargs");
  const bool catch_kwargs = body_refers(macro.body, "kwargs");
  if (!varargs.empty() && !catch_varargs) fail("macro '{}' takes not more than {} argument(s)", name, n);
  Value kwargs = Value::dict();
  Value caller_value = caller;
  for (auto& [key, value] : args.keyword) {
    bool matched = false;
    for (size_t i = 0; i < n; ++i) {
      if (macro.params[i] != key) continue;
      if (bound[i]) fail("macro '{}' got multiple values for argument '{}'", name, key);
      scope->vars[key] = value;
      bound[i] = true;
      matched = true;
    }
    if (matched) continue;
    if (key == "caller" && !is_caller) {
      caller_value = value;
      continue;
    }
    if (!catch_kwargs) fail("macro '{}' takes no keyword argument '{}'", name, key);
    kwargs.dict_ref().set(key, value);
  }
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) continue;
    if (macro.defaults[i])
      scope->vars[macro.params[i]] = eval(*macro.defaults[i], scope);
    else
      scope->vars[macro.params[i]] = Value::undefined(fmt::format("parameter '{}' was not provided", macro.params[i]));
  }
  scope->vars["varargs"] = Value::list(std::move(varargs), true);
  scope->vars["kwargs"] = kwargs;
  if (!is_caller) {
    if (caller_value.is_undefined())
      scope->vars["caller"] = Value::undefined("No caller defined");
    else
      scope->vars["caller"] = caller_value;
  }
  ++call_depth_;
  std::string out;
  try {
    exec_body(macro.body, scope, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return out;
}

Value Interpreter::call(const Value& callable, CallArgs& args) {
  if (callable.is_object()) {
    if (auto* c = dynamic_cast<Callable*>(&callable.object_ref())) return c->call(*this, args);
  }
  if (callable.is_undefined()) undefined_error(callable);
  fail("'{}' object is not callable", callable.type_name());
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::List:
      return v.list_ref().items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_ref().size());
      for (const auto& [k, val] : v.dict_ref().items()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      const std::string& s = v.str();
      for (size_t i = 0; i < s.size();) {
        size_t j = i + 1;
        while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xc0) == 0x80) ++j;
        chars.push_back(Value::string(s.substr(i, j - i)));
        i = j;
      }
      return chars;
    }
    case Value::Kind::Undefined:
      return {};
    default:
      fail("'{}' object is not iterable", v.type_name());
  }
}

Value Interpreter::getattr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      undefined_error(obj);
    case Value::Kind::Dict: {
      if (auto m = method_attribute(obj, name)) return *m;
      if (const Value* v = obj.dict_ref().find(name)) return *v;
      return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
    }
    case Value::Kind::String:
    case Value::Kind::List:
      if (auto m = method_attribute(obj, name)) return *m;
      return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
    case Value::Kind::Object:
      if (auto* ns = dynamic_cast<Namespace*>(&obj.object_ref())) {
        if (const Value* v = ns->attrs.find(name)) return *v;
      } else if (auto* loop = dynamic_cast<LoopObject*>(&obj.object_ref())) {
        return loop->attribute(*this, name);
      }
      return Value::undefined(fmt::format("'{}' has no attribute '{}'", obj.type_name(), name));
    case Value::Kind::None:
      return Value::undefined(fmt::format("'None' has no attribute '{}'", name));
    default:
      return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
  }
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if ((key.is_list() && !key.list_ref().tuple) || key.is_dict())
      return Value::undefined(fmt::format("unhashable type: '{}'", key.type_name()));
    if (const Value* v = obj.dict_ref().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list_ref().items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list_ref().items[static_cast<size_t>(i)];
    } else {
      const std::u32string u = py::utf8_decode(obj.str());
      const auto n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        std::string ch;
        py::utf8_append(ch, u[static_cast<size_t>(i)]);
        return Value::string(std::move(ch));
      }
    }
  }
  if (key.is_string()) return getattr(obj, key.str());
  return Value::undefined(fmt::format("'{} object' has no element {}", obj.type_name(), py::py_repr(key)));
}

void Interpreter::eval_args(const Expr& e, const ScopePtr& scope, CallArgs& args) {
  for (const Arg& a : e.args) {
    if (a.name.empty())
      args.positional.push_back(eval(*a.value, scope));
    else
      args.keyword.emplace_back(a.name, eval(*a.value, scope));
  }
  if (e.dyn_args) {
    const Value v = eval(*e.dyn_args, scope);
    for (Value& item : iterate(v)) args.positional.push_back(std::move(item));
  }
  if (e.dyn_kwargs) {
    const Value v = eval(*e.dyn_kwargs, scope);
    require(v.is_dict(), "argument after ** must be a mapping, not {}", v.type_name());
    for (const auto& [k, val] : v.dict_ref().items()) {
      require(k.is_string(), "keywords must be strings");
      args.keyword.emplace_back(k.str(), val);
    }
  }
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  step();
  DepthGuard guard(depth_);
  try {
    return eval_inner(e, scope);
  } catch (const TemplateError&) {
    throw;
  } catch (const Error& err) {
    throw TemplateError(fmt::format("template error at {}: {}", location(e.offset), err.what()));
  }
}

Value Interpreter::eval_inner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::Const:
      return e.value;
    case ExprKind::Name: {
      if (const Value* v = scope->find(e.name)) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& item : e.items) items.push_back(eval(*item, scope));
      return Value::list(std::move(items), e.kind == ExprKind::Tuple);
    }
    case ExprKind::Dict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value key = eval(*e.items[i], scope);
        d.dict_ref().set(key, eval(*e.items[i + 1], scope));
      }
      return d;
    }
    case ExprKind::GetAttr:
      return getattr(eval(*e.items[0], scope), e.name);
    case ExprKind::GetItem: {
      const Value obj = eval(*e.items[0], scope);
      return getitem(obj, eval(*e.items[1], scope));
    }
    case ExprKind::Slice: {
      const Value obj = eval(*e.items[0], scope);
      std::optional<int64_t> part[3];
      for (int k = 0; k < 3; ++k) {
        if (!e.items[static_cast<size_t>(k) + 1]) continue;
        const Value v = eval(*e.items[static_cast<size_t>(k) + 1], scope);
        if (v.is_none()) continue;
        if (!v.is_int() && !v.is_bool())
          return Value::undefined("slice indices must be integers or None");
        part[k] = v.as_int();
      }
      if (obj.is_undefined()) undefined_error(obj);
      if (!obj.is_list() && !obj.is_string()) return Value::undefined(fmt::format("'{}' object is not subscriptable", obj.type_name()));
      const int64_t stride = part[2].value_or(1);
      require(stride != 0, "slice step cannot be zero");
      std::u32string chars;
      const bool is_str = obj.is_string();
      if (is_str) chars = py::utf8_decode(obj.str());
      const int64_t n = is_str ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.list_ref().items.size());
      auto clamp = [&](std::optional<int64_t> v, int64_t dflt, bool is_stop) {
        if (!v) return dflt;
        int64_t x = *v;
        if (x < 0) {
          x += n;
          if (x < 0) x = stride < 0 ? -1 : 0;
        } else if (x >= n) {
          x = stride < 0 ? n - 1 : n;
        }
        (void)is_stop;
        return x;
      };
      const int64_t start = clamp(part[0], stride < 0 ? n - 1 : 0, false);
      const int64_t stop = clamp(part[1], stride < 0 ? -1 : n, true);
      std::vector<Value> items;
      std::u32string sub;
      for (int64_t i = start; stride > 0 ? i < stop : i > stop; i += stride) {
        if (is_str)
          sub += chars[static_cast<size_t>(i)];
        else
          items.push_back(obj.list_ref().items[static_cast<size_t>(i)]);
      }
      if (is_str) return Value::string(py::utf8_encode(sub));
      return Value::list(std::move(items), obj.list_ref().tuple);
    }
    case ExprKind::Call: {
      const Expr& callee = *e.items[0];
      CallArgs args;
      if (callee.kind == ExprKind::GetAttr) {
        const Value obj = eval(*callee.items[0], scope);
        if ((obj.is_string() || obj.is_list() || obj.is_dict()) && method_attribute(obj, callee.name)) {
          eval_args(e, scope, args);
          return call_method(*this, obj, callee.name, args);
        }
        const Value fn = getattr(obj, callee.name);
        eval_args(e, scope, args);
        return call(fn, args);
      }
      const Value fn = eval(callee, scope);
      eval_args(e, scope, args);
      return call(fn, args);
    }
    case ExprKind::Filter: {
      Value subject = eval(*e.items[0], scope);
      if (!is_known_filter(e.name)) fail("no filter named '{}'", e.name);
      CallArgs args;
      eval_args(e, scope, args);
      return apply_filter(*this, e.name, std::move(subject), args);
    }
    case ExprKind::Test: {
      const Value subject = eval(*e.items[0], scope);
      if (!is_known_test(e.name)) fail("no test named '{}'", e.name);
      CallArgs args;
      eval_args(e, scope, args);
      return Value::boolean(apply_test(*this, e.name, subject, args));
    }
    case ExprKind::Not:
      return Value::boolean(!eval(*e.items[0], scope).truthy());
    case ExprKind::Neg:
    case ExprKind::Pos: {
      const Value v = eval(*e.items[0], scope);
      if (v.is_undefined()) undefined_error(v);
      if (v.is_float()) return Value::floating(e.kind == ExprKind::Neg ? -v.as_double() : v.as_double());
      if (v.is_int() || v.is_bool()) {
        if (e.kind == ExprKind::Pos) return Value::integer(v.as_int());
        require(v.as_int() != std::numeric_limits<int64_t>::min(), "integer overflow (beyond int64)");
        return Value::integer(-v.as_int());
      }
      fail("bad operand type for unary {}: '{}'", e.kind == ExprKind::Neg ? '-' : '+', v.type_name());
    }
    case ExprKind::Binary: {
      const Value a = eval(*e.items[0], scope);
      const Value b = eval(*e.items[1], scope);
      return binary(e.name, a, b);
    }
    case ExprKind::Compare: {
      Value left = eval(*e.items[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.items[i + 1], scope);
        if (!compare(e.ops[i], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::And: {
      Value a = eval(*e.items[0], scope);
      if (!a.truthy()) return a;
      return eval(*e.items[1], scope);
    }
    case ExprKind::Or: {
      Value a = eval(*e.items[0], scope);
      if (a.truthy()) return a;
      return eval(*e.items[1], scope);
    }
    case ExprKind::CondExpr:
      if (eval(*e.items[1], scope).truthy()) return eval(*e.items[0], scope);
      if (e.items[2]) return eval(*e.items[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    case ExprKind::Concat: {
      std::string out;
      for (const auto& item : e.items) {
        const Value v = eval(*item, scope);
        out += v.is_string() ? v.str() : py::py_str(v);
        check_size(out.size());
      }
      return Value::string(std::move(out));
    }
  }
  fail("unhandled expression");
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py::py_equal(a, b);
  if (op == "!=") return !py::py_equal(a, b);
  if (op == "in") return py_contains(b, a);
  if (op == "notin") return !py_contains(b, a);
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  try {
    if (op == "<") return py::py_less(a, b);
    if (op == ">") return py::py_less(b, a);
    if (op == "<=") return !py::py_less(b, a);
    if (op == ">=") return !py::py_less(a, b);
  } catch (const Error&) {
    fail("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name());
  }
  fail("unknown comparison {}", op);
}

Value Interpreter::binary(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
  };
  if (op == "+") {
    if (floats) return Value::floating(a.as_double() + b.as_double());
    if (numbers) {
      int64_t r = 0;
      const bool overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
      return Value::integer(checked(overflow, r));
    }
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return Value::string(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.list_ref().tuple == b.list_ref().tuple) {
      std::vector<Value> items = a.list_ref().items;
      items.insert(items.end(), b.list_ref().items.begin(), b.list_ref().items.end());
      step(items.size());
      return Value::list(std::move(items), a.list_ref().tuple);
    }
    if (a.is_list() && b.is_list())
      fail("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(), a.type_name());
    return unsupported();
  }
  if (op == "-") {
    if (floats) return Value::floating(a.as_double() - b.as_double());
    if (numbers) {
      int64_t r = 0;
      const bool overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
      return Value::integer(checked(overflow, r));
    }
    return unsupported();
  }
  if (op == "*") {
    if (floats) return Value::floating(a.as_double() * b.as_double());
    if (numbers) {
      int64_t r = 0;
      const bool overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      return Value::integer(checked(overflow, r));
    }
    const Value* seq = nullptr;
    const Value* count = nullptr;
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
      seq = &a;
      count = &b;
    } else if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
      seq = &b;
      count = &a;
    }
    if (!seq) return unsupported();
    const int64_t n = std::max<int64_t>(0, count->as_int());
    if (seq->is_string()) {
      if (n > 0) check_size(seq->str().size() * static_cast<size_t>(std::min<int64_t>(n, 1LL << 40)));
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += seq->str();
      return Value::string(std::move(out));
    }
    const auto& items = seq->list_ref().items;
    if (n > 0 && !items.empty()) step(items.size() * static_cast<uint64_t>(std::min<int64_t>(n, 1LL << 40)));
    std::vector<Value> out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
    return Value::list(std::move(out), seq->list_ref().tuple);
  }
  if (op == "/") {
    if (!numbers) return unsupported();
    require(b.as_double() != 0.0, "division by zero");
    return Value::floating(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!numbers) return unsupported();
    if (floats) {
      require(b.as_double() != 0.0, "float floor division by zero");
      return Value::floating(py_floordiv(a.as_double(), b.as_double()));
    }
    require(b.as_int() != 0, "integer division or modulo by zero");
    const int64_t x = a.as_int(), y = b.as_int();
    require(!(x == std::numeric_limits<int64_t>::min() && y == -1), "integer overflow (beyond int64)");
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::integer(q);
  }
  if (op == "%") {
    if (a.is_string()) {
      std::string s = percent_format(a.str(), b);
      check_size(s.size());
      return Value::string(std::move(s));
    }
    if (!numbers) return unsupported();
    if (floats) {
      require(b.as_double() != 0.0, "float modulo");
      return Value::floating(py_fmod(a.as_double(), b.as_double()));
    }
    require(b.as_int() != 0, "integer division or modulo by zero");
    const int64_t x = a.as_int(), y = b.as_int();
    if (y == -1) return Value::integer(0);
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::integer(r);
  }
  if (op == "**") {
    if (!numbers) return unsupported();
    if (!floats && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int(), e = b.as_int();
      while (e > 0) {
        if (e & 1) checked(__builtin_mul_overflow(result, base, &result), 0);
        e >>= 1;
        if (e > 0) checked(__builtin_mul_overflow(base, base, &base), 0);
      }
      return Value::integer(result);
    }
    if (a.as_double() == 0.0 && b.as_double() < 0) fail("0.0 cannot be raised to a negative power");
    const double r = std::pow(a.as_double(), b.as_double());
    require(!std::isnan(r) || std::isnan(a.as_double()) || std::isnan(b.as_double()),
            "negative number cannot be raised to a fractional power");
    return Value::floating(r);
  }
  fail("unknown operator {}", op);
}

}  // namespace kestrel::jinja

// The Jinja interpreter: walks the AST with jinja2's scoping (a for body gets a fresh scope each iteration, if
// does not, macros close over their defining scope and see its later assignments), Python value semantics and
// the sandbox rules HF renders under. Limits: evaluation steps, macro call depth, string and output size.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "base/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"
#include "text/jinja_lexer.h"

namespace kestrel::jinja {

// An error that already names its place in the template (or needs none, like raise_exception's); the
// interpreter adds "line L, column C" to any other Error thrown while evaluating a node.
class TemplateError : public Error {
public:
  using Error::Error;
};

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* find(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
public:
  Interpreter(const std::string& source, const Options& options) : source_(source), options_(options) {}
  // Breaks the reference cycles a render can build (a macro stored in the scope it closes over, a namespace
  // holding itself) by emptying every captured scope and namespace.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Scopes captured by macros and loops, and namespaces, are tracked so the destructor can clear them.
  void track(const ScopePtr& scope) { captured_scopes_.push_back(scope); }
  void track(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }

  void render(const Body& body, const ScopePtr& scope, std::string& out);

  // Python/jinja2 semantics shared with the builtins.
  Value getattr(const Value& obj, std::string_view name);
  Value getitem(const Value& obj, const Value& key);
  std::vector<Value> iterate(const Value& v);
  Value call(const Value& callable, CallArgs& args);
  void check_size(size_t bytes) const;
  void step(uint64_t n = 1);
  std::string location(size_t offset) const;

  // Runs a macro body (used by Macro objects) and a recursive loop call.
  std::string run_macro(const Stmt& macro, const ScopePtr& closure, CallArgs& args, const Value& caller);
  std::string run_loop(const Stmt& loop, const ScopePtr& scope, const Value& iterable, int depth);

private:
  enum class Flow { Normal, Break, Continue };
  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_for(const Stmt& s, const ScopePtr& scope, const Value& iterable, int depth, std::string& out);
  void assign(const Expr& target, Value value, const ScopePtr& scope);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_inner(const Expr& e, const ScopePtr& scope);
  void eval_args(const Expr& e, const ScopePtr& scope, CallArgs& args);
  Value binary(const std::string& op, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);
  Value make_macro(const Stmt& s, const ScopePtr& scope);
  void append(std::string& out, std::string_view text);

  const std::string& source_;
  const Options& options_;
  std::vector<std::weak_ptr<Scope>> captured_scopes_;
  std::vector<std::weak_ptr<Namespace>> namespaces_;
  uint64_t steps_ = 0;
  int depth_ = 0;  // nested exec/eval calls: bounds the C++ stack whatever the mix of macros, loops and expressions
  int call_depth_ = 0;
};

// Python's printf-style "format % args" (args a tuple, or one value).
std::string percent_format(std::string_view format, const Value& args);

// Python's `x in container`.
bool py_contains(const Value& container, const Value& item);

}  // namespace kestrel::jinja

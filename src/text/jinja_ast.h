// Jinja AST: expressions and statements as the parser builds them (jinja2's node set, reduced to what templates use).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/py_value.h"

namespace kestrel::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Const,     // value
  Name,      // name
  List,      // items
  Tuple,     // items
  Dict,      // items: key, value, key, value...
  GetAttr,   // items[0].name
  GetItem,   // items[0][items[1]]
  Slice,     // items[0][items[1]:items[2]:items[3]] (null parts allowed)
  Call,      // items[0](args)
  Filter,    // items[0] | name(args); items[0] null in a filter block
  Test,      // items[0] is name(args)
  Not,       // not items[0]
  Neg,       // -items[0]
  Pos,       // +items[0]
  Binary,    // items[0] name items[1]: + - * / // % **
  Compare,   // items[0] ops[0] items[1] ops[1] items[2] ...: == != < <= > >= in notin
  And,       // items[0] and items[1]
  Or,        // items[0] or items[1]
  CondExpr,  // items[0] if items[1] else items[2] (items[2] may be null)
  Concat,    // items joined with ~
};

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  size_t offset = 0;
  py::Value value;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;
  std::vector<Arg> args;
  ExprPtr dyn_args, dyn_kwargs;
  bool soft = false;  // a Filter/Test inside an if or conditional: an unknown name fails when reached, not at parse
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,         // text
  Output,       // {{ expr }}
  If,           // if expr: body else else_body (elif is a nested If in else_body)
  For,          // for target in expr [if cond] [recursive]: body else else_body
  Set,          // set target = expr
  SetBlock,     // set target [| filter] body endset
  Macro,        // macro name(params = defaults) body
  CallBlock,    // call(params) expr body
  FilterBlock,  // filter expr(Filter chain with a null innermost subject) body
  Break,
  Continue,
  With,         // with assigns body
  Generation,   // body (HF's {% generation %}: renders its body)
};

struct Stmt {
  StmtKind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr, target, cond;
  Body body, else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null when none
  bool recursive = false;
  std::vector<std::pair<ExprPtr, ExprPtr>> assigns;
};

}  // namespace kestrel::jinja

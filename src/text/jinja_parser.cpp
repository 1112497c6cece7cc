#include "text/jinja_parser.h"

#include <charconv>
#include <cmath>
#include <initializer_list>

#include "base/error.h"
#include "text/jinja_builtins.h"

namespace kestrel::jinja {

namespace {

// Nesting of expressions and of blocks: far above real templates, far below the stack limit.
constexpr int kMaxDepth = 96;

class Parser {
public:
  Parser(const std::string& src, std::vector<Token> tokens) : src_(src), tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = subparse({});
    if (cur().type != Tok::Eof) error(cur().offset, "unexpected tag");
    return body;
  }

private:
  // ---- token helpers
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == Tok::Name && cur().text == name; }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) error(cur().offset, fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error(cur().offset, fmt::format("expected a name, got {}", describe(cur())));
    std::string name = cur().text;
    next();
    return name;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error(cur().offset, fmt::format("expected end of block, got {}", describe(cur())));
    next();
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof:
        return "end of template";
      case Tok::BlockEnd:
        return "end of block '%}'";
      case Tok::VarEnd:
        return "end of print statement '}}'";
      case Tok::Text:
        return "template data";
      case Tok::String:
        return "a string";
      default:
        return fmt::format("'{}'", t.text);
    }
  }
  [[noreturn]] void error(size_t offset, std::string_view what) const {
    const SourcePos p = source_pos(src_, offset);
    fail("template syntax error at line {}, column {}: {}", p.line, p.column, what);
  }

  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& parser, size_t offset) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.error(offset, "template nesting too deep");
    }
    ~DepthGuard() { --p.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
  };

  ExprPtr make(ExprKind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // ---- statements
  // Parses until a block tag whose first name is in end_names (left unconsumed, positioned at that name), or EOF.
  Body subparse(std::initializer_list<std::string_view> end_names) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (end_names.size()) error(t.offset, fmt::format("unexpected end of template, expected '{}'", *end_names.begin()));
        return body;
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->offset = t.offset;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->offset = t.offset;
        next();
        s->expr = parse_tuple(true, {}, false);
        if (cur().type != Tok::VarEnd) error(cur().offset, fmt::format("expected '}}}}', got {}", describe(cur())));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& tag = peek();
        if (tag.type != Tok::Name) error(tag.offset, "tag name expected");
        for (std::string_view end : end_names) {
          if (tag.text == end) {
            next();
            return body;
          }
        }
        next();
        body.push_back(statement());
      } else {
        error(t.offset, "unexpected token");
      }
    }
  }

  StmtPtr new_stmt(StmtKind kind, size_t offset) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->offset = offset;
    return s;
  }

  StmtPtr statement() {
    const size_t offset = cur().offset;
    DepthGuard guard(*this, offset);
    const std::string tag = expect_name();
    if (tag == "if") return parse_if(offset);
    if (tag == "for") return parse_for(offset);
    if (tag == "set") return parse_set(offset);
    if (tag == "macro") return parse_macro(offset);
    if (tag == "call") return parse_call_block(offset);
    if (tag == "filter") return parse_filter_block(offset);
    if (tag == "with") return parse_with(offset);
    if (tag == "generation") {
      auto s = new_stmt(StmtKind::Generation, offset);
      expect_block_end();
      s->body = subparse({"endgeneration"});
      next();
      expect_block_end();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error(offset, fmt::format("'{}' outside of a loop", tag));
      expect_block_end();
      return new_stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, offset);
    }
    error(offset, fmt::format("encountered unknown tag '{}'", tag));
  }

  StmtPtr parse_if(size_t offset) {
    auto s = new_stmt(StmtKind::If, offset);
    const bool was_soft = soft_;
    soft_ = true;
    s->expr = parse_tuple(false, {}, false);
    expect_block_end();
    s->body = subparse({"elif", "else", "endif"});
    const std::string which = cur().text;
    const size_t at = cur().offset;
    next();
    if (which == "elif") {
      s->else_body.push_back(parse_if(at));
      soft_ = was_soft;
      return s;  // the nested if consumed endif
    }
    if (which == "else") {
      expect_block_end();
      s->else_body = subparse({"endif"});
      next();
    }
    expect_block_end();
    soft_ = was_soft;
    return s;
  }

  StmtPtr parse_for(size_t offset) {
    auto s = new_stmt(StmtKind::For, offset);
    const bool was_soft = soft_;
    soft_ = false;
    s->target = parse_assign_target({"in"}, false);
    if (!accept_name("in")) error(cur().offset, "expected 'in'");
    s->expr = parse_tuple(false, {"recursive"}, false);
    if (accept_name("if")) s->cond = parse_expression(true);
    if (accept_name("recursive")) s->recursive = true;
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (cur().text == "else") {
      next();
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->else_body = subparse({"endfor"});
      loop_depth_ = saved;
    }
    next();
    expect_block_end();
    soft_ = was_soft;
    return s;
  }

  StmtPtr parse_set(size_t offset) {
    ExprPtr target = parse_assign_target({}, true);
    if (accept_op("=")) {
      auto s = new_stmt(StmtKind::Set, offset);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    auto s = new_stmt(StmtKind::SetBlock, offset);
    s->target = std::move(target);
    if (is_op("|")) s->expr = parse_filter_chain(nullptr);
    expect_block_end();
    s->body = subparse({"endset"});
    next();
    expect_block_end();
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      const size_t at = cur().offset;
      std::string param = expect_name();
      if (param == "true" || param == "false" || param == "none" || param == "True" || param == "False" ||
          param == "None")
        error(at, fmt::format("cannot assign to '{}'", param));
      s.params.push_back(std::move(param));
      if (accept_op("="))
        s.defaults.push_back(parse_expression(true));
      else if (!s.defaults.empty() && s.defaults.back())
        error(at, "non-default argument follows default argument");
      else
        s.defaults.push_back(nullptr);
    }
    next();
  }

  StmtPtr parse_macro(size_t offset) {
    auto s = new_stmt(StmtKind::Macro, offset);
    s->name = expect_name();
    parse_signature(*s);
    expect_block_end();
    const bool was_soft = soft_;
    const int saved_loop = loop_depth_;
    soft_ = false;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"});
    soft_ = was_soft;
    loop_depth_ = saved_loop;
    next();
    if (cur().type == Tok::Name) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(size_t offset) {
    auto s = new_stmt(StmtKind::CallBlock, offset);
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) error(s->expr->offset, "expected call");
    expect_block_end();
    const bool was_soft = soft_;
    const int saved_loop = loop_depth_;
    soft_ = false;
    loop_depth_ = 0;
    s->body = subparse({"endcall"});
    soft_ = was_soft;
    loop_depth_ = saved_loop;
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(size_t offset) {
    auto s = new_stmt(StmtKind::FilterBlock, offset);
    s->expr = parse_filter_chain(nullptr, /*leading_pipe=*/false);
    expect_block_end();
    s->body = subparse({"endfilter"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(size_t offset) {
    auto s = new_stmt(StmtKind::With, offset);
    while (cur().type != Tok::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      ExprPtr target = parse_assign_target({}, false);
      expect_op("=");
      s->assigns.emplace_back(std::move(target), parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"});
    next();
    expect_block_end();
    return s;
  }

  // name | name, name | (name, name) | ns.attr (with_namespace)
  ExprPtr parse_assign_target(std::initializer_list<std::string_view> extra_end, bool with_namespace) {
    const size_t offset = cur().offset;
    if (with_namespace && cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      auto obj = make(ExprKind::Name, offset);
      obj->name = expect_name();
      next();
      auto e = make(ExprKind::GetAttr, offset);
      e->name = expect_name();
      e->items.push_back(std::move(obj));
      return e;
    }
    auto check = [&](const Expr& target) {
      auto ok = [&](const Expr& n) {
        if (n.kind != ExprKind::Name) error(n.offset, "can't assign to this expression");
        if (n.name == "true" || n.name == "false" || n.name == "none" || n.name == "True" || n.name == "False" ||
            n.name == "None")
          error(n.offset, fmt::format("cannot assign to '{}'", n.name));
      };
      if (target.kind == ExprKind::Tuple) {
        for (const auto& item : target.items) ok(*item);
      } else {
        ok(target);
      }
    };
    ExprPtr target = parse_tuple(false, extra_end, false, /*simplified=*/true);
    check(*target);
    return target;
  }

  // ---- expressions
  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.type == Tok::Eof) return true;
    if (t.type == Tok::Op && t.text == ")") return true;
    if (t.type == Tok::Name)
      for (std::string_view e : extra_end)
        if (t.text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end, bool explicit_parens,
                      bool simplified = false) {
    const size_t offset = cur().offset;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified)
        items.push_back(parse_primary());
      else
        items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) error(cur().offset, fmt::format("expected an expression, got {}", describe(cur())));
    }
    auto e = make(ExprKind::Tuple, offset);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this, cur().offset);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const size_t offset = cur().offset;
    ExprPtr expr1 = parse_or();
    while (accept_name("if")) {
      const bool was_soft = soft_;
      soft_ = true;
      ExprPtr cond = parse_or();
      ExprPtr expr3 = accept_name("else") ? parse_condexpr() : nullptr;
      soft_ = was_soft;
      auto e = make(ExprKind::CondExpr, offset);
      e->items.push_back(std::move(expr1));
      e->items.push_back(std::move(cond));
      e->items.push_back(std::move(expr3));
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprPtr binary(ExprKind kind, ExprPtr left, ExprPtr right, size_t offset, std::string op = {}) {
    auto e = make(kind, offset);
    e->name = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    const size_t offset = cur().offset;
    ExprPtr left = parse_and();
    while (accept_name("or")) left = binary(ExprKind::Or, std::move(left), parse_and(), offset);
    return left;
  }

  ExprPtr parse_and() {
    const size_t offset = cur().offset;
    ExprPtr left = parse_not();
    while (accept_name("and")) left = binary(ExprKind::And, std::move(left), parse_not(), offset);
    return left;
  }

  ExprPtr parse_not() {
    const size_t offset = cur().offset;
    if (accept_name("not")) {
      DepthGuard guard(*this, offset);
      auto e = make(ExprKind::Not, offset);
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const size_t offset = cur().offset;
    ExprPtr first = parse_math1();
    auto e = make(ExprKind::Compare, offset);
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (accept_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      e->ops.push_back(op);
      e->items.push_back(parse_math1());
    }
    if (e->ops.empty()) return first;
    e->items.insert(e->items.begin(), std::move(first));
    return e;
  }

  ExprPtr parse_math1() {
    const size_t offset = cur().offset;
    ExprPtr left = parse_concat();
    while (cur().type == Tok::Op && (cur().text == "+" || cur().text == "-")) {
      std::string op = cur().text;
      next();
      left = binary(ExprKind::Binary, std::move(left), parse_concat(), offset, op);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const size_t offset = cur().offset;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(ExprKind::Concat, offset);
    e->items.push_back(std::move(first));
    while (accept_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    const size_t offset = cur().offset;
    ExprPtr left = parse_pow();
    while (cur().type == Tok::Op &&
           (cur().text == "*" || cur().text == "/" || cur().text == "//" || cur().text == "%")) {
      std::string op = cur().text;
      next();
      left = binary(ExprKind::Binary, std::move(left), parse_pow(), offset, op);
    }
    return left;
  }

  ExprPtr parse_pow() {
    const size_t offset = cur().offset;
    ExprPtr left = parse_unary(true);
    while (accept_op("**")) left = binary(ExprKind::Binary, std::move(left), parse_unary(true), offset, "**");
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const size_t offset = cur().offset;
    DepthGuard guard(*this, offset);
    ExprPtr node;
    if (accept_op("-")) {
      node = make(ExprKind::Neg, offset);
      node->items.push_back(parse_unary(false));
    } else if (accept_op("+")) {
      node = make(ExprKind::Pos, offset);
      node->items.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const size_t offset = t.offset;
    DepthGuard guard(*this, offset);
    switch (t.type) {
      case Tok::Name: {
        auto e = make(ExprKind::Const, offset);
        if (t.text == "true" || t.text == "True") {
          e->value = py::Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = py::Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = py::Value::none();
        } else {
          e->kind = ExprKind::Name;
          e->name = t.text;
        }
        next();
        return e;
      }
      case Tok::String: {
        std::string s = t.text;
        next();
        while (cur().type == Tok::String) {
          s += cur().text;
          next();
        }
        auto e = make(ExprKind::Const, offset);
        e->value = py::Value::string(std::move(s));
        return e;
      }
      case Tok::Integer: {
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) error(offset, "integer literal out of the int64 range");
        auto e = make(ExprKind::Const, offset);
        e->value = py::Value::integer(v);
        next();
        return e;
      }
      case Tok::Float: {
        double d = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), d);
        if (r.ec == std::errc::result_out_of_range)
          d = t.text.find("e-") != std::string::npos || t.text.find("E-") != std::string::npos ? 0.0 : HUGE_VAL;
        auto e = make(ExprKind::Const, offset);
        e->value = py::Value::floating(d);
        next();
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          next();
          auto e = make(ExprKind::List, offset);
          while (!is_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("]")) break;
            e->items.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(ExprKind::Dict, offset);
          while (!is_op("}")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("}")) break;
            e->items.push_back(parse_expression(true));
            expect_op(":");
            e->items.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        break;
      default:
        break;
    }
    error(offset, fmt::format("unexpected {}", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const size_t offset = cur().offset;
    DepthGuard guard(*this, offset);
    if (accept_op(".")) {
      if (cur().type == Tok::Name) {
        auto e = make(ExprKind::GetAttr, offset);
        e->name = cur().text;
        e->items.push_back(std::move(node));
        next();
        return e;
      }
      if (cur().type == Tok::Integer) {
        auto e = make(ExprKind::GetItem, offset);
        e->items.push_back(std::move(node));
        auto index = make(ExprKind::Const, cur().offset);
        int64_t v = 0;
        std::from_chars(cur().text.data(), cur().text.data() + cur().text.size(), v);
        index->value = py::Value::integer(v);
        e->items.push_back(std::move(index));
        next();
        return e;
      }
      error(cur().offset, "expected name or number after '.'");
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      args.push_back(parse_subscribed());
    }
    next();
    ExprPtr index;
    if (args.size() > 1)
      for (const auto& a : args)
        if (a->kind == ExprKind::Slice) error(a->offset, "slices inside a tuple subscript are not supported");
    if (args.size() == 1) {
      index = std::move(args[0]);
    } else {
      if (args.empty()) error(offset, "expected an index");
      index = make(ExprKind::Tuple, offset);
      index->items = std::move(args);
    }
    if (index->kind == ExprKind::Slice) {
      index->items.insert(index->items.begin(), std::move(node));
      return index;
    }
    auto e = make(ExprKind::GetItem, offset);
    e->items.push_back(std::move(node));
    e->items.push_back(std::move(index));
    return e;
  }

  // An index or a slice: [start]:[stop][:[step]]. A Slice node is returned with items {start, stop, step}.
  ExprPtr parse_subscribed() {
    const size_t offset = cur().offset;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();
    auto e = make(ExprKind::Slice, offset);
    e->items.push_back(std::move(start));
    ExprPtr stop, step;
    if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
    if (accept_op(":"))
      if (!is_op("]") && !is_op(",")) step = parse_expression(true);
    e->items.push_back(std::move(stop));
    e->items.push_back(std::move(step));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (accept_op("*")) {
        e.dyn_args = parse_expression(true);
      } else if (accept_op("**")) {
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string name = cur().text;
        next();
        next();
        e.args.push_back({std::move(name), parse_expression(true)});
      } else {
        if (e.dyn_args || e.dyn_kwargs || (!e.args.empty() && !e.args.back().name.empty()))
          error(cur().offset, "invalid syntax for function call expression");
        e.args.push_back({{}, parse_expression(true)});
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    const size_t offset = cur().offset;
    DepthGuard guard(*this, offset);
    auto e = make(ExprKind::Call, offset);
    e->items.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  // | name[(args)] | name ... ; node may be null (filter blocks, block set).
  ExprPtr parse_filter_chain(ExprPtr node, bool leading_pipe = true) {
    bool first = true;
    while (first ? (!leading_pipe || is_op("|")) : is_op("|")) {
      if (!first || leading_pipe) next();
      first = false;
      const size_t offset = cur().offset;
      DepthGuard guard(*this, offset);
      std::string name = expect_name();
      while (is_op(".") && peek().type == Tok::Name) {
        next();
        name += '.';
        name += expect_name();
      }
      if (!soft_ && !is_known_filter(name)) error(offset, fmt::format("no filter named '{}'", name));
      auto e = make(ExprKind::Filter, offset);
      e->name = std::move(name);
      e->soft = soft_;
      e->items.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const size_t offset = cur().offset;
    DepthGuard guard(*this, offset);
    next();  // is
    const bool negated = accept_name("not");
    const size_t name_offset = cur().offset;
    std::string name = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      next();
      name += '.';
        name += expect_name();
    }
    if (!soft_ && !is_known_test(name)) error(name_offset, fmt::format("no test named '{}'", name));
    auto e = make(ExprKind::Test, offset);
    e->name = std::move(name);
    e->soft = soft_;
    e->items.push_back(std::move(node));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Integer ||
                cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) error(cur().offset, "you cannot chain multiple tests with is");
      ExprPtr arg = parse_postfix(parse_primary());
      e->args.push_back({{}, std::move(arg)});
    }
    if (!negated) return e;
    auto n = make(ExprKind::Not, offset);
    n->items.push_back(std::move(e));
    return n;
  }

  const std::string& src_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  bool soft_ = false;
};

}  // namespace

Body parse_template(const std::string& normalised_source, const Options& options) {
  return Parser(normalised_source, tokenize(normalised_source, options)).parse();
}

}  // namespace kestrel::jinja

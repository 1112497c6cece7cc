// Jinja parser: tokens -> statement list, following jinja2's grammar and precedence
// (or < and < not < comparisons < + - < ~ < * / // % < ** < unary - + < postfix . [] () < | filter / is test).
#pragma once

#include <string>

#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace kestrel::jinja {

// Throws Error("template syntax error at line L, column C: ...") for malformed templates, unknown tags, and
// unknown filters or tests outside an if (as jinja2's compiler does).
Body parse_template(const std::string& normalised_source, const Options& options);

}  // namespace kestrel::jinja

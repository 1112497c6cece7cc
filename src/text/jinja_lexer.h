// Jinja lexer: template source -> tokens, with jinja2's whitespace rules (the environment HF uses:
// trim_blocks, lstrip_blocks, keep_trailing_newline false; "-" and "+" modifiers; raw blocks; comments).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::jinja {

struct Options {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  uint64_t max_steps = 20'000'000;      // evaluation steps before a render is aborted
  int max_call_depth = 100;             // nested macro calls
  size_t max_output_bytes = 64u << 20;  // rendered text and any one string built by the template
};

enum class Tok : uint8_t {
  Text,        // template data
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // value already unescaped
  Integer,
  Float,
  Op,          // operator or punctuation, in text
  Eof,
};

struct Token {
  Tok type;
  std::string text;
  size_t offset;  // into the normalised source
};

// Newlines normalised to "\n" and one trailing newline dropped, as jinja2 does before lexing.
std::string normalise_source(std::string_view source, bool keep_trailing_newline);

// Throws Error("template syntax error at line L, column C: ...").
std::vector<Token> tokenize(const std::string& source, const Options& options);

// 1-based line and column of an offset in the normalised source.
struct SourcePos {
  int line, column;
};
SourcePos source_pos(const std::string& source, size_t offset);

}  // namespace kestrel::jinja

#include "text/jinja_lexer.h"

#include <algorithm>
#include <cctype>

#include "base/error.h"
#include "base/py_strings.h"

namespace kestrel::jinja {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip_ws(std::string_view s) {
  size_t end = s.size();
  while (end > 0 && is_ws(s[end - 1])) --end;
  return std::string(s.substr(0, end));
}

// Python's "unicode-escape" decoding of a string literal body (jinja2 does exactly this).
std::string unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int n) -> int64_t {
      int64_t v = 0;
      for (int k = 1; k <= n; ++k) {
        if (i + static_cast<size_t>(k) >= body.size()) return -1;
        const char h = body[i + static_cast<size_t>(k)];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return -1;
        v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        const int64_t v = hex(n);
        if (v < 0 || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) fail("invalid \\{} escape in string literal", e);
        py::utf8_append(out, static_cast<char32_t>(v));
        i += static_cast<size_t>(n);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            v = v * 8 + (body[++i] - '0');
          py::utf8_append(out, static_cast<char32_t>(v));
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
public:
  Lexer(const std::string& src, const Options& options) : src_(src), options_(options) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        emit_text(std::move(text), pos_);
        pos_ = tag;
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      const bool is_raw = kind == '%' && raw_begin_end(tag) != 0;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        text = lstrip_line(text, line_starting);
      }
      emit_text(std::move(text), pos_);
      if (kind == '#') {
        line_starting = comment(tag);
      } else if (is_raw) {
        line_starting = raw(tag);
      } else {
        line_starting = tag_body(tag, kind);
      }
    }
    tokens_.push_back({Tok::Eof, "", src_.size()});
    return std::move(tokens_);
  }

private:
  [[noreturn]] void error(size_t offset, std::string_view what) const {
    const SourcePos p = source_pos(src_, offset);
    fail("template syntax error at line {}, column {}: {}", p.line, p.column, what);
  }

  size_t find_tag(size_t from) const {
    size_t i = from;
    while (true) {
      i = src_.find('{', i);
      if (i == std::string::npos || i + 1 >= src_.size()) return src_.size();
      const char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
      ++i;
    }
  }

  static std::string lstrip_line(const std::string& text, bool line_starting) {
    const size_t newline = text.rfind('\n');
    const size_t l_pos = newline == std::string::npos ? 0 : newline + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    for (size_t i = l_pos; i < text.size(); ++i)
      if (!is_ws(text[i])) return text;
    return text.substr(0, l_pos);
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), offset});
  }

  // Consumes whitespace after a "-" end marker, or one "\n" (trim_blocks) after a plain block/comment end.
  // Returns whether what was consumed ends with a newline (jinja2's line_starting).
  bool after_end(bool strip, bool trim, bool plus) {
    if (strip) {
      const size_t start = pos_;
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
      return pos_ > start && src_[pos_ - 1] == '\n';
    }
    if (trim && !plus && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      return true;
    }
    return false;
  }

  bool comment(size_t tag) {
    size_t end = src_.find("#}", tag + 2);
    if (end == std::string::npos) error(tag, "missing end of comment tag");
    const bool strip = end > tag + 2 && src_[end - 1] == '-';
    pos_ = end + 2;
    return after_end(strip, true, false);
  }

  // If a "{% raw %}" (with modifiers) starts at tag, returns the offset just past it; else 0.
  size_t raw_begin_end(size_t tag) const {
    size_t i = tag + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return 0;
    i += 3;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    if (src_.compare(i, 3, "-%}") == 0) return i + 3;
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return 0;
  }

  bool raw(size_t tag) {
    const size_t after = raw_begin_end(tag);
    pos_ = after;
    if (src_[after - 3] == '-') after_end(true, false, false);
    // Find "{%[-+]? endraw [-+]?%}".
    size_t search = pos_;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) error(tag, "missing end of raw directive");
      size_t i = open + 2;
      const char sign = i < src_.size() ? src_[i] : '\0';
      if (sign == '-' || sign == '+') ++i;
      while (i < src_.size() && is_ws(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      i += 6;
      while (i < src_.size() && is_ws(src_[i])) ++i;
      bool strip = false, plus = false;
      if (src_.compare(i, 3, "-%}") == 0) {
        strip = true;
        i += 3;
      } else if (src_.compare(i, 3, "+%}") == 0) {
        plus = true;
        i += 3;
      } else if (src_.compare(i, 2, "%}") == 0) {
        i += 2;
      } else {
        search = open + 2;
        continue;
      }
      std::string text = src_.substr(pos_, open - pos_);
      if (sign == '-')
        text = rstrip_ws(text);
      else if (sign != '+' && options_.lstrip_blocks)
        text = lstrip_line(text, false);
      emit_text(std::move(text), pos_);
      pos_ = i;
      return after_end(strip, true, plus);
    }
  }

  bool tag_body(size_t tag, char kind) {
    const bool block = kind == '%';
    tokens_.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", tag});
    pos_ = tag + 2;
    if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) ++pos_;
    const char close = block ? '%' : '}';
    int depth = 0;  // brackets, so "}}" inside a dict literal in {{ }} does not end the tag
    while (true) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) error(tag, block ? "unexpected end of template inside a block tag"
                                                : "unexpected end of template inside a variable tag");
      const char c = src_[pos_];
      // End markers.
      if (depth == 0) {
        if ((c == '-' || c == '+') && pos_ + 2 < src_.size() && src_[pos_ + 1] == close &&
            src_[pos_ + 2] == '}') {
          const bool strip = c == '-';
          tokens_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", pos_});
          pos_ += 3;
          return after_end(strip, block, c == '+');
        }
        if (c == close && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
          tokens_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", pos_});
          pos_ += 2;
          return after_end(false, block, false);
        }
      }
      const size_t start = pos_;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        tokens_.push_back({Tok::Name, src_.substr(start, pos_ - start), start});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number(start);
      } else if (c == '\'' || c == '"') {
        size_t i = pos_ + 1;
        while (i < src_.size() && src_[i] != c) {
          if (src_[i] == '\\') ++i;
          ++i;
        }
        if (i >= src_.size()) error(start, "unterminated string");
        try {
          tokens_.push_back({Tok::String, unescape(std::string_view(src_).substr(pos_ + 1, i - pos_ - 1)), start});
        } catch (const Error& e) {
          error(start, e.what());
        }
        pos_ = i + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}", ";"};
        std::string op;
        for (const char* candidate : kOps) {
          if (src_.compare(pos_, std::char_traits<char>::length(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (op.empty()) error(start, fmt::format("unexpected character '{}'", c));
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        pos_ += op.size();
        tokens_.push_back({Tok::Op, std::move(op), start});
      }
    }
  }

  void number(size_t start) {
    auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) ||
              (src_[pos_] == '_' && pos_ + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1])))))
        ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t i = pos_ + 1;
      if (i < src_.size() && (src_[i] == '+' || src_[i] == '-')) ++i;
      if (i < src_.size() && std::isdigit(static_cast<unsigned char>(src_[i]))) {
        is_float = true;
        pos_ = i;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({is_float ? Tok::Float : Tok::Integer, std::move(text), start});
  }

  const std::string& src_;
  const Options& options_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::string normalise_source(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<Token> tokenize(const std::string& source, const Options& options) {
  return Lexer(source, options).run();
}

SourcePos source_pos(const std::string& source, size_t offset) {
  offset = std::min(offset, source.size());
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return {line, static_cast<int>(py::utf8_length(std::string_view(source).substr(line_start, offset - line_start))) + 1};
}

}  // namespace kestrel::jinja

#include "base/py_strings.h"

#include <utf8proc.h>

#include <algorithm>

#include "base/error.h"

namespace kestrel::py {

namespace {

// Decodes one code point at s[i]; invalid sequences yield U+FFFD and consume one byte.
char32_t decode_one(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int len = 0;
  char32_t cp = 0;
  if ((c & 0xe0) == 0xc0) {
    len = 2;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    len = 3;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    len = 4;
    cp = c & 0x07;
  } else {
    ++i;
    return 0xfffd;
  }
  if (i + static_cast<size_t>(len) > s.size()) {
    ++i;
    return 0xfffd;
  }
  for (int k = 1; k < len; ++k) {
    const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((d & 0xc0) != 0x80) {
      ++i;
      return 0xfffd;
    }
    cp = (cp << 6) | (d & 0x3f);
  }
  const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
    ++i;
    return 0xfffd;
  }
  i += static_cast<size_t>(len);
  return cp;
}

utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

template <typename F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) f(out, decode_one(s, i));
  return out;
}

char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

// Python's full case mappings that differ from the simple ones and matter in practice.
void append_upper(std::string& out, char32_t c) {
  if (c == 0xdf) {  // ß
    out += "SS";
    return;
  }
  utf8_append(out, to_upper(c));
}

void append_lower(std::string& out, char32_t c) {
  if (c == 0x130) {  // İ
    out += "i\xcc\x87";
    return;
  }
  utf8_append(out, to_lower(c));
}

void append_title(std::string& out, char32_t c) {
  if (c == 0xdf) {
    out += "Ss";
    return;
  }
  utf8_append(out, to_title(c));
}

bool in_chars(char32_t c, const std::u32string& chars) { return chars.find(c) != std::u32string::npos; }

}  // namespace

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out += decode_one(s, i);
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t before = i;
    const char32_t c = decode_one(s, i);
    if (c == 0xfffd && !(i - before == 3 && s.substr(before, 3) == "\xef\xbf\xbd")) return false;
  }
  return true;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

bool is_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  if (c == 0x85) return true;
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return false;
    default:
      return true;
  }
}

bool is_alpha(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_LO;
}
bool is_decimal(char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }
bool is_digit(char32_t c) {
  if (is_decimal(c)) return true;
  // Superscripts and circled digits carry a digit value in Python; approximate with these ranges.
  return c == 0xb2 || c == 0xb3 || c == 0xb9 || (c >= 0x2070 && c <= 0x2079) || (c >= 0x2080 && c <= 0x2089) ||
         (c >= 0x2460 && c <= 0x2468) || (c >= 0x2474 && c <= 0x247c) || (c >= 0x2488 && c <= 0x2490) ||
         (c >= 0x24f5 && c <= 0x24fd) || c == 0x24ea || c == 0x24ff || (c >= 0x2776 && c <= 0x277e) ||
         (c >= 0x2780 && c <= 0x2788) || (c >= 0x278a && c <= 0x2792);
}
bool is_alnum(char32_t c) {
  const auto cat = category(c);
  return is_alpha(c) || is_digit(c) || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}
bool is_upper(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || (cat != UTF8PROC_CATEGORY_LL && to_lower(c) != c);
}
bool is_lower(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LL || (cat != UTF8PROC_CATEGORY_LU && to_upper(c) != c && to_title(c) != c);
}
bool is_cased(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         to_lower(c) != c || to_upper(c) != c;
}

std::string str_upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return out;
  }
  return map_chars(s, [](std::string& out, char32_t c) { append_upper(out, c); });
}

std::string str_lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return out;
  }
  return map_chars(s, [](std::string& out, char32_t c) { append_lower(out, c); });
}

std::string str_swapcase(std::string_view s) {
  return map_chars(s, [](std::string& out, char32_t c) {
    if (is_upper(c))
      append_lower(out, c);
    else if (is_lower(c))
      append_upper(out, c);
    else
      utf8_append(out, c);
  });
}

std::string str_title(std::string_view s) {
  bool previous_cased = false;
  return map_chars(s, [&](std::string& out, char32_t c) {
    if (previous_cased)
      append_lower(out, c);
    else
      append_title(out, c);
    previous_cased = is_cased(c);
  });
}

std::string str_capitalize(std::string_view s) {
  bool first = true;
  return map_chars(s, [&](std::string& out, char32_t c) {
    if (first)
      append_title(out, c);
    else
      append_lower(out, c);
    first = false;
  });
}

std::string str_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string u = utf8_decode(s);
  const std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip = [&](char32_t c) { return chars ? in_chars(c, set) : is_space(c); };
  size_t begin = 0, end = u.size();
  if (left)
    while (begin < end && strip(u[begin])) ++begin;
  if (right)
    while (end > begin && strip(u[end - 1])) --end;
  return utf8_encode(std::u32string_view(u).substr(begin, end - begin));
}

std::vector<std::string> str_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    require(!sep->empty(), "empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t found = s.find(*sep, pos);
      if (found == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, found - pos));
      pos = found + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::u32string u = utf8_decode(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t end = u.size();
      while (end > i && is_space(u[end - 1])) --end;
      out.push_back(utf8_encode(std::u32string_view(u).substr(i, end - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_space(u[j])) ++j;
    out.push_back(utf8_encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> str_rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return str_split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    require(!sep->empty(), "empty separator");
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t found = s.rfind(*sep, end - sep->size());
      if (found == std::string_view::npos) break;
      out.emplace_back(s.substr(found + sep->size(), end - found - sep->size()));
      end = found;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::u32string u = utf8_decode(s);
  size_t j = u.size();
  while (true) {
    while (j > 0 && is_space(u[j - 1])) --j;
    if (j == 0) break;
    if (static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t begin = 0;
      while (begin < j && is_space(u[begin])) ++begin;
      out.push_back(utf8_encode(std::u32string_view(u).substr(begin, j - begin)));
      break;
    }
    size_t i = j;
    while (i > 0 && !is_space(u[i - 1])) --i;
    out.push_back(utf8_encode(std::u32string_view(u).substr(i, j - i)));
    j = i;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> str_splitlines(std::string_view s, bool keepends) {
  const std::u32string u = utf8_decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < u.size()) {
    const char32_t c = u[i];
    const bool newline = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                         c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!newline) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (c == '\r' && eol < u.size() && u[eol] == '\n') ++eol;
    out.push_back(utf8_encode(std::u32string_view(u).substr(start, (keepends ? eol : i) - start)));
    start = i = eol;
  }
  if (start < u.size()) out.push_back(utf8_encode(std::u32string_view(u).substr(start)));
  return out;
}

std::string str_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts repl between every character (and at both ends).
    const std::u32string u = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < u.size()) utf8_append(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t found = s.find(old, pos);
    if (found == std::string_view::npos) break;
    out.append(s.substr(pos, found - pos));
    out.append(repl);
    pos = found + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t str_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = s.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

int64_t str_find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
                 bool reverse) {
  const std::u32string u = utf8_decode(s), needle = utf8_decode(sub);
  const auto n = static_cast<int64_t>(u.size());
  auto norm = [n](int64_t v) { return v < 0 ? std::max<int64_t>(0, v + n) : std::min(v, n); };
  const int64_t b = start ? norm(*start) : 0, e = end ? norm(*end) : n;
  const auto m = static_cast<int64_t>(needle.size());
  if (e - b < m) return -1;
  if (!reverse) {
    for (int64_t i = b; i + m <= e; ++i)
      if (std::u32string_view(u).substr(static_cast<size_t>(i), static_cast<size_t>(m)) == needle) return i;
  } else {
    for (int64_t i = e - m; i >= b; --i)
      if (std::u32string_view(u).substr(static_cast<size_t>(i), static_cast<size_t>(m)) == needle) return i;
  }
  return -1;
}

}  // namespace kestrel::py

#include "text/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "base/error.h"

namespace kestrel::text {

namespace {

// Length of the valid UTF-8 sequence at s[pos], or 0 when it is invalid or truncated. `prefix_len` receives how
// many bytes of it form a valid prefix (the "maximal subpart" of the Unicode standard, at least 1 byte).
size_t valid_sequence(std::string_view s, size_t pos, size_t* prefix_len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    if (prefix_len) *prefix_len = 1;
    return 0;
  }
  size_t i = 1;
  for (; i <= need; ++i) {
    if (pos + i >= s.size()) break;
    const auto b = static_cast<unsigned char>(s[pos + i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (i == need + 1) return need + 1;
  if (prefix_len) *prefix_len = i;
  return 0;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = valid_sequence(s, pos, nullptr);
    if (n == 0) return pos;
    pos += n;
  }
  return std::nullopt;
}

bool ends_with_incomplete_utf8(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const auto b = static_cast<unsigned char>(s[s.size() - back]);
    if ((b & 0xC0) == 0x80) continue;
    if (b < 0x80) return false;
    size_t prefix = 0;
    const size_t n = valid_sequence(s, s.size() - back, &prefix);
    return n == 0 && prefix == back && utf8_length(b) > back;
  }
  return false;
}

char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  const size_t n = utf8_length(b0);
  char32_t cp = b0 & (0xFF >> (n + 1));
  for (size_t i = 1; i < n && pos + i < s.size(); ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_rust_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {
utf8proc_category_t category(char32_t cp) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(cp)));
}
}  // namespace

bool is_rust_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_regex_word(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;   // Join_Control
  if (cp >= 0x24B6 && cp <= 0x24E9) return true;   // circled letters: So but Alphabetic
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool is_punctuation(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
                        (cp >= 0x7B && cp <= 0x7E);
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const auto b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++pos;
      continue;
    }
    const char32_t cp = next_code_point(s, pos);
    if (cp == 0x130) {
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (const char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &result,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(result, &std::free);
  require(n >= 0, "Unicode normalization failed: {}", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
}

namespace {

struct ByteMaps {
  std::array<std::string, 256> to_char;
  std::array<int, 324> from_char{};  // all mapped code points are < 324
  ByteMaps() {
    from_char.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const int cp = printable ? b : 256 + extra++;
      append_utf8(to_char[static_cast<size_t>(b)], static_cast<char32_t>(cp));
      from_char[static_cast<size_t>(cp)] = b;
    }
  }
};

const ByteMaps& byte_maps() {
  static const ByteMaps maps;
  return maps;
}

}  // namespace

const std::string& byte_to_char_utf8(uint8_t byte) { return byte_maps().to_char[byte]; }

int char_to_byte(char32_t cp) { return cp < 324 ? byte_maps().from_char[cp] : -1; }

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t prefix = 1;
    const size_t n = valid_sequence(bytes, pos, &prefix);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out += "\xEF\xBF\xBD";
      pos += prefix;
    }
  }
  return out;
}

}  // namespace kestrel::text

#include "text/glm_text_scan.h"

#include <algorithm>
#include <cstring>

namespace kestrel::glm {

namespace {

constexpr char32_t kInvalid = 0xFFFFFFFF;

// Decodes one UTF-8 code point at the start of `text` (non-empty). Returns the code point and its byte length;
// an invalid or truncated sequence decodes as kInvalid of length 1.
std::pair<char32_t, size_t> decode_utf8(std::string_view text) {
  const auto b0 = static_cast<unsigned char>(text[0]);
  if (b0 < 0x80) return {b0, 1};
  size_t len = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {kInvalid, 1};
  }
  if (text.size() < len) return {kInvalid, 1};
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if ((b & 0xC0) != 0x80) return {kInvalid, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kInvalid, 1};
  return {cp, len};
}

// The code point that ends at the end of `text` (non-empty) and its byte length; kInvalid of length 1 if the last
// byte does not end a valid sequence.
std::pair<char32_t, size_t> decode_utf8_last(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto b = static_cast<unsigned char>(text[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    auto [cp, len] = decode_utf8(text.substr(n - back));
    if (cp != kInvalid && len == back) return {cp, len};
    return {kInvalid, 1};
  }
  return {kInvalid, 1};
}

}  // namespace

bool is_py_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t leading_py_space_char(std::string_view text) {
  if (text.empty()) return 0;
  auto [cp, len] = decode_utf8(text);
  return cp != kInvalid && is_py_space(cp) ? len : 0;
}

size_t py_lstrip_length(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = leading_py_space_char(text.substr(pos));
    if (len == 0) break;
    pos += len;
  }
  return pos;
}

size_t py_rstrip_length(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    auto [cp, len] = decode_utf8_last(text.substr(0, end));
    if (cp == kInvalid || !is_py_space(cp)) break;
    end -= len;
  }
  return end;
}

std::string_view py_strip(std::string_view text) {
  const size_t start = py_lstrip_length(text);
  text.remove_prefix(start);
  return text.substr(0, py_rstrip_length(text));
}

bool is_py_space_only(std::string_view text) { return py_lstrip_length(text) == text.size(); }

size_t incomplete_utf8_tail(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto b = static_cast<unsigned char>(text[n - back]);
    if ((b & 0xC0) == 0x80) continue;
    size_t need = 0;
    if ((b & 0xE0) == 0xC0) {
      need = 2;
    } else if ((b & 0xF0) == 0xE0) {
      need = 3;
    } else if ((b & 0xF8) == 0xF0) {
      need = 4;
    }
    return need > back ? back : 0;
  }
  return 0;
}

size_t partial_tag_suffix(std::string_view text, std::span<const std::string_view> tags) {
  size_t longest = 0;
  for (std::string_view tag : tags) longest = std::max(longest, tag.size());
  if (longest == 0) return 0;
  for (size_t k = std::min(longest - 1, text.size()); k > 0; --k) {
    std::string_view suffix = text.substr(text.size() - k);
    if (suffix[0] != '<') continue;
    for (std::string_view tag : tags) {
      if (tag.size() > k && tag.starts_with(suffix)) return k;
    }
  }
  return 0;
}

TagHit find_first_tag(std::string_view text, size_t from, std::span<const std::string_view> tags) {
  while (from < text.size()) {
    const void* found = std::memchr(text.data() + from, '<', text.size() - from);
    if (found == nullptr) break;
    const size_t pos = static_cast<size_t>(static_cast<const char*>(found) - text.data());
    std::string_view rest = text.substr(pos);
    for (size_t i = 0; i < tags.size(); ++i) {
      if (rest.starts_with(tags[i])) return {pos, static_cast<int>(i)};
    }
    from = pos + 1;
  }
  return {};
}

void TagScanner::append(std::string_view delta) {
  if (pos_ > 0) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
  buffer_.append(delta);
}

TagScanner::Piece TagScanner::next(std::span<const std::string_view> tags, bool final) {
  if (pos_ >= buffer_.size()) return {};
  std::string_view rest = std::string_view(buffer_).substr(pos_);
  const TagHit hit = find_first_tag(rest, 0, tags);
  if (hit.pos == 0) {
    const auto tag_size = tags[static_cast<size_t>(hit.tag)].size();
    pos_ += tag_size;
    return Piece{true, hit.tag, rest.substr(0, tag_size)};
  }
  size_t take = 0;
  if (hit.pos != std::string_view::npos) {
    take = hit.pos;
  } else {
    const size_t hold = final ? 0 : std::max(partial_tag_suffix(rest, tags), incomplete_utf8_tail(rest));
    take = rest.size() - hold;
  }
  if (take == 0) return {};
  pos_ += take;
  return Piece{false, -1, rest.substr(0, take)};
}

}  // namespace kestrel::glm

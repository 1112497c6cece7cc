// Small text helpers shared by the GLM reasoning and tool-call parsers: Python's notion of whitespace (str.isspace,
// str.strip, regex \s), UTF-8 boundaries, and an incremental tag scanner that never decides on a tag split across
// deltas (a tail that could still become a tag, or an incomplete UTF-8 sequence, is held back until the next delta).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace kestrel::glm {

// Python's str.isspace() for one code point.
bool is_py_space(char32_t cp);

// Byte length of `text` after Python's str.rstrip() (Unicode whitespace; invalid UTF-8 bytes are not whitespace).
size_t py_rstrip_length(std::string_view text);
// Byte length of the leading whitespace str.lstrip() removes.
size_t py_lstrip_length(std::string_view text);
std::string_view py_strip(std::string_view text);
bool is_py_space_only(std::string_view text);

// Length of the first code point at the start of `text` if it is Python whitespace, else 0.
size_t leading_py_space_char(std::string_view text);

// Number of bytes at the end of `text` that form an incomplete (but so far valid) UTF-8 sequence: 0..3.
size_t incomplete_utf8_tail(std::string_view text);

// Length of the longest suffix of `text` that is a proper prefix of one of `tags` (0 if none).
size_t partial_tag_suffix(std::string_view text, std::span<const std::string_view> tags);

struct TagHit {
  size_t pos = std::string_view::npos;  // npos: no tag
  int tag = -1;                         // index into the tag list
};
// The earliest occurrence of one of `tags` in `text` at or after `from`.
TagHit find_first_tag(std::string_view text, size_t from, std::span<const std::string_view> tags);

// Buffers a stream of deltas and cuts it into text runs and tags. The tag set is chosen per step by the caller (it
// depends on the parser state, which a tag may change). Usage per delta:
//   scanner.append(delta);
//   while (auto piece = scanner.next(tags, final)) { ... }
// With final=false, a tail that may still grow into a tag or a split UTF-8 character is kept for the next delta.
class TagScanner {
public:
  struct Piece {
    bool is_tag = false;
    int tag = -1;           // when is_tag
    std::string_view text;  // the run, or the tag's text; valid until the next call
    explicit operator bool() const { return is_tag || !text.empty(); }
  };

  void append(std::string_view delta);
  Piece next(std::span<const std::string_view> tags, bool final);
  bool empty() const { return pos_ >= buffer_.size(); }

private:
  std::string buffer_;
  size_t pos_ = 0;
};

}  // namespace kestrel::glm

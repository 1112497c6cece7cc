// The "pattern" of Split / Replace in tokenizer.json: {"String": literal} or {"Regex": expression}, and the way HF
// splits a string by the matches of a pattern (SplitDelimiterBehavior).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/regex.h"

namespace kestrel::text {

// A [begin, end) byte range of a string and whether it is a match of the pattern.
struct Segment {
  size_t begin, end;
  bool is_match;
};

class Pattern {
public:
  static Pattern literal(std::string text);
  static Pattern regex(std::string_view expression, const std::string& where);

  // Segments covering all of `text` in order: matches and the gaps between them (HF Pattern::find_matches).
  std::vector<Segment> find_matches(std::string_view text) const;
  std::string replace_all(std::string_view text, std::string_view content) const;

private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

// Parses {"String": ...} / {"Regex": ...}.
Pattern parse_pattern(const nlohmann::json& config, const std::string& where);

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_split_behavior(const nlohmann::json& value, const std::string& where);

// The pieces (byte ranges, non-empty) of a string split at `segments` with `behavior` (HF NormalizedString::split).
std::vector<std::pair<size_t, size_t>> split_segments(std::vector<Segment> segments, SplitBehavior behavior);

// Segments of `text` where each character for which `predicate` holds is a one-character match.
template <typename Predicate>
std::vector<Segment> find_char_matches(std::string_view text, Predicate&& predicate);

}  // namespace kestrel::text

#include "text/unicode.h"

namespace kestrel::text {

template <typename Predicate>
std::vector<Segment> find_char_matches(std::string_view text, Predicate&& predicate) {
  std::vector<Segment> out;
  size_t last = 0, pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t cp = next_code_point(text, pos);
    if (predicate(cp)) {
      if (last < start) out.push_back({last, start, false});
      out.push_back({start, pos, true});
      last = pos;
    }
  }
  if (last < text.size() || out.empty()) out.push_back({last, text.size(), false});
  return out;
}

}  // namespace kestrel::text

#include "text/pattern.h"

#include <algorithm>

#include "base/error.h"

namespace kestrel::text {

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

Pattern Pattern::regex(std::string_view expression, const std::string& where) {
  Pattern p;
  p.regex_ = std::make_shared<const Regex>(expression, where);
  return p;
}

std::vector<Segment> Pattern::find_matches(std::string_view text) const {
  std::vector<Segment> out;
  if (text.empty()) {
    out.push_back({0, 0, false});
    return out;
  }
  if (!regex_ && literal_.empty()) {
    out.push_back({0, text.size(), false});
    return out;
  }
  size_t prev = 0;
  auto add = [&](size_t b, size_t e) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  };
  if (regex_) {
    for (const auto& [b, e] : regex_->find_all(text)) add(b, e);
  } else {
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      add(pos, pos + literal_.size());
      pos += literal_.size();
    }
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
  return out;
}

std::string Pattern::replace_all(std::string_view text, std::string_view content) const {
  std::string out;
  out.reserve(text.size());
  for (const Segment& s : find_matches(text)) {
    if (s.is_match) {
      out += content;
    } else {
      out += text.substr(s.begin, s.end - s.begin);
    }
  }
  return out;
}

Pattern parse_pattern(const nlohmann::json& config, const std::string& where) {
  require(config.is_object() && config.size() == 1, "{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  if (const auto it = config.find("String"); it != config.end()) {
    require(it->is_string(), "{}.String: expected a string", where);
    return Pattern::literal(it->get<std::string>());
  }
  if (const auto it = config.find("Regex"); it != config.end()) {
    require(it->is_string(), "{}.Regex: expected a string", where);
    return Pattern::regex(it->get<std::string>(), where + ".Regex");
  }
  fail("{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
}

SplitBehavior parse_split_behavior(const nlohmann::json& value, const std::string& where) {
  require(value.is_string(), "{}: expected a split behavior string", where);
  const std::string s = value.get<std::string>();
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: unknown split behavior '{}' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)", where,
       s);
}

std::vector<std::pair<size_t, size_t>> split_segments(std::vector<Segment> segments, SplitBehavior behavior) {
  // Each entry: range and whether it is removed.
  std::vector<Segment> splits;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (auto s : segments) splits.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::Removed:
      splits = std::move(segments);
      break;
    case SplitBehavior::Contiguous: {
      bool previous = false;
      for (const auto& s : segments) {
        if (s.is_match == previous && !splits.empty()) {
          splits.back().end = s.end;
        } else {
          splits.push_back({s.begin, s.end, false});
        }
        previous = s.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous = false;
      for (const auto& s : segments) {
        if (s.is_match && !previous && !splits.empty()) {
          splits.back().end = s.end;
        } else {
          splits.push_back({s.begin, s.end, false});
        }
        previous = s.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous = it->is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(splits.size());
  for (const auto& s : splits) {
    if (!s.is_match && s.begin != s.end) out.emplace_back(s.begin, s.end);
  }
  return out;
}

}  // namespace kestrel::text

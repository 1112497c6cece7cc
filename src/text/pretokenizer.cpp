#include "text/pretokenizer.h"

#include <algorithm>

#include "base/error.h"
#include "text/json_access.h"
#include "text/pattern.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

// Replaces every piece by the pieces `split` cuts it into (ranges of the piece's text); empty pieces vanish.
template <typename SplitFn>
void split_pieces(std::vector<Piece>& pieces, SplitFn&& split) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (auto& piece : pieces) {
    piece.origin_span = std::min(piece.origin_span, piece.text.size());
    const std::vector<std::pair<size_t, size_t>> ranges = split(piece.text);
    if (ranges.size() == 1 && ranges[0].first == 0 && ranges[0].second == piece.text.size()) {
      out.push_back(std::move(piece));
      continue;
    }
    for (const auto& [b, e] : ranges) {
      if (b == e) continue;
      out.push_back({piece.text.substr(b, e - b), b < piece.origin_span ? std::min(piece.origin_span, e) - b : 0});
    }
  }
  pieces = std::move(out);
}

class SplitPreTokenizer final : public PreTokenizer {
public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const std::string& text) {
      std::vector<Segment> segments = pattern_.find_matches(text);
      if (invert_) {
        for (auto& s : segments) s.is_match = !s.is_match;
      }
      return split_segments(std::move(segments), behavior_);
    });
  }

private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, where);
  }
  void apply(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& piece : pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') {
          piece.text.insert(0, 1, ' ');
          if (piece.origin_span > 0) ++piece.origin_span;
        }
      }
    }
    if (regex_) {
      split_pieces(pieces, [&](const std::string& text) {
        std::vector<std::pair<size_t, size_t>> ranges;
        size_t prev = 0;
        for (const auto& [b, e] : regex_->find_all(text)) {
          if (prev != b) ranges.emplace_back(prev, b);
          ranges.emplace_back(b, e);
          prev = e;
        }
        if (prev != text.size()) ranges.emplace_back(prev, text.size());
        return ranges;
      });
    }
    for (auto& piece : pieces) {
      piece.origin_span = std::min(piece.origin_span, piece.text.size());
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (size_t i = 0; i < piece.text.size(); ++i) {
        mapped += byte_to_char_utf8(static_cast<uint8_t>(piece.text[i]));
        if (i + 1 == piece.origin_span) piece.origin_span = mapped.size();
      }
      piece.text = std::move(mapped);
    }
  }

private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePreTokenizer final : public PreTokenizer {
public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (auto& piece : pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + replacement_.size());
      size_t span = 0;
      piece.origin_span = std::min(piece.origin_span, piece.text.size());
      for (size_t i = 0; i < piece.text.size(); ++i) {
        if (piece.text[i] == ' ') {
          replaced += replacement_;
        } else {
          replaced.push_back(piece.text[i]);
        }
        if (i + 1 == piece.origin_span) span = replaced.size();
      }
      const bool starts = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && span > 0))) {
        replaced.insert(0, replacement_);
        if (span > 0) span += replacement_.size();
      }
      piece.origin_span = span;
      piece.text = std::move(replaced);
    }
    if (split_) {
      const Pattern pattern = Pattern::literal(replacement_);
      split_pieces(pieces, [&](const std::string& text) {
        return split_segments(pattern.find_matches(text), SplitBehavior::MergedWithNext);
      });
    }
  }

private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

template <typename Predicate>
class CharSplitPreTokenizer final : public PreTokenizer {
public:
  CharSplitPreTokenizer(Predicate predicate, SplitBehavior behavior) : predicate_(predicate), behavior_(behavior) {}
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const std::string& text) {
      return split_segments(find_char_matches(text, predicate_), behavior_);
    });
  }

private:
  Predicate predicate_;
  SplitBehavior behavior_;
};

template <typename Predicate>
std::unique_ptr<PreTokenizer> char_split(Predicate predicate, SplitBehavior behavior) {
  return std::make_unique<CharSplitPreTokenizer<Predicate>>(predicate, behavior);
}

// HF Whitespace: the matches of \w+|[^\w\s]+ (Oniguruma's Unicode \w: letters, marks, decimal digits, connectors).
class WhitespacePreTokenizer final : public PreTokenizer {
public:
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [](const std::string& text) {
      std::vector<std::pair<size_t, size_t>> ranges;
      size_t pos = 0;
      int current = -1;  // 0: word run, 1: other run
      size_t run_start = 0;
      while (pos < text.size()) {
        const size_t start = pos;
        const char32_t cp = next_code_point(text, pos);
        const int kind = is_word(cp) ? 0 : (is_space(cp) ? -1 : 1);
        if (kind != current) {
          if (current >= 0) ranges.emplace_back(run_start, start);
          current = kind;
          run_start = start;
        }
      }
      if (current >= 0) ranges.emplace_back(run_start, text.size());
      return ranges;
    });
  }

private:
  static bool is_word(char32_t cp) { return is_regex_word(cp); }
  static bool is_space(char32_t cp) { return is_rust_whitespace(cp); }
};

class SequencePreTokenizer final : public PreTokenizer {
public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> items) : items_(std::move(items)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& item : items_) item->apply(pieces);
  }

private:
  std::vector<std::unique_ptr<PreTokenizer>> items_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = json_type(config, where);
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        parse_pattern(json_field(config, "pattern", where), where + ".pattern"),
        parse_split_behavior(json_field(config, "behavior", where), where + ".behavior"),
        json_bool_or(config, "invert", false, where));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(json_bool_or(config, "add_prefix_space", true, where),
                                                   json_bool_or(config, "use_regex", true, where), where);
  }
  if (type == "Metaspace") {
    const std::string replacement = json_string(config, "replacement", where);
    require(!replacement.empty() && !find_invalid_utf8(replacement) &&
                utf8_length(static_cast<unsigned char>(replacement[0])) == replacement.size(),
            "{}.replacement: expected one character", where);
    PrependScheme scheme = PrependScheme::Always;
    if (const auto it = config.find("prepend_scheme"); it != config.end() && !it->is_null()) {
      require(it->is_string(), "{}.prepend_scheme: expected \"always\", \"first\" or \"never\"", where);
      const std::string s = it->get<std::string>();
      if (s == "always") {
        scheme = PrependScheme::Always;
      } else if (s == "first") {
        scheme = PrependScheme::First;
      } else if (s == "never") {
        scheme = PrependScheme::Never;
      } else {
        fail("{}.prepend_scheme: expected \"always\", \"first\" or \"never\", got '{}'", where, s);
      }
    } else if (!json_bool_or(config, "add_prefix_space", true, where)) {
      scheme = PrependScheme::Never;
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, json_bool_or(config, "split", true, where));
  }
  if (type == "Digits") {
    const bool individual = json_bool_or(config, "individual_digits", false, where);
    return char_split([](char32_t cp) { return is_rust_numeric(cp); },
                      individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  }
  if (type == "Punctuation") {
    SplitBehavior behavior = SplitBehavior::Isolated;
    if (const auto it = config.find("behavior"); it != config.end()) {
      behavior = parse_split_behavior(*it, where + ".behavior");
    }
    return char_split([](char32_t cp) { return is_punctuation(cp); }, behavior);
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") {
    return char_split([](char32_t cp) { return is_rust_whitespace(cp); }, SplitBehavior::Removed);
  }
  if (type == "Sequence") {
    const auto& list = json_field(config, "pretokenizers", where);
    require(list.is_array(), "{}.pretokenizers: expected an array", where);
    std::vector<std::unique_ptr<PreTokenizer>> items;
    for (size_t i = 0; i < list.size(); ++i) {
      auto item = make_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
      if (item) items.push_back(std::move(item));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(items));
  }
  fail("{}: unsupported pre-tokenizer type '{}' (supported: Split, ByteLevel, Metaspace, Digits, Punctuation, "
       "Whitespace, WhitespaceSplit, Sequence)",
       where, type);
}

}  // namespace kestrel::text

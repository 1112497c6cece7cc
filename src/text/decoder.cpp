#include "text/decoder.h"

#include "base/error.h"
#include "text/json_access.h"
#include "text/pattern.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

class ByteLevelDecoder final : public Decoder {
public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const auto& token : tokens) {
      const size_t mark = bytes.size();
      size_t pos = 0;
      bool all = true;
      while (pos < token.size()) {
        const int b = char_to_byte(next_code_point(token, pos));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    return {utf8_lossy(bytes)};
  }
};

class MetaspaceDecoder final : public Decoder {
public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)),
                                                                strip_first_(strip_first) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && strip_first_)) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      tokens[i] = std::move(out);
    }
    return tokens;
  }

private:
  std::string replacement_;
  bool strip_first_;
};

class ByteFallbackDecoder final : public Decoder {
public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (!find_invalid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& token : tokens) {
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' && is_hex(token[3]) &&
          is_hex(token[4])) {
        pending.push_back(static_cast<char>(hex(token[3]) * 16 + hex(token[4])));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    return out;
  }

private:
  static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
  static int hex(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
};

class FuseDecoder final : public Decoder {
public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string joined;
    for (const auto& t : tokens) joined += t;
    return {joined};
  }
};

class StripDecoder final : public Decoder {
public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start),
                                                                 stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& token : tokens) {
      // Works on characters: strip up to start_ leading and stop_ trailing occurrences of the content character.
      std::vector<std::pair<size_t, size_t>> chars;
      for (size_t pos = 0; pos < token.size();) {
        const size_t b = pos;
        pos += utf8_length(static_cast<unsigned char>(token[pos]));
        chars.emplace_back(b, std::min(pos, token.size()));
      }
      size_t left = 0, right = chars.size();
      auto is_content = [&](size_t i) {
        return token.compare(chars[i].first, chars[i].second - chars[i].first, content_) == 0;
      };
      for (size_t n = 0; n < start_ && left < right && is_content(left); ++n) ++left;
      for (size_t n = 0; n < stop_ && right > left && is_content(right - 1); ++n) --right;
      if (left == right) {
        token.clear();
      } else {
        token = token.substr(chars[left].first, chars[right - 1].second - chars[left].first);
      }
    }
    return tokens;
  }

private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) t = pattern_.replace_all(t, content_);
    return tokens;
  }

private:
  Pattern pattern_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> items) : items_(std::move(items)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& item : items_) tokens = item->decode_chain(std::move(tokens));
    return tokens;
  }

private:
  std::vector<std::unique_ptr<Decoder>> items_;
};

size_t json_count(const nlohmann::json& config, std::string_view key, const std::string& where) {
  const auto& v = json_field(config, key, where);
  require(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
          "{}.{}: expected a non-negative integer", where, key);
  return v.get<size_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = json_type(config, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool strip_first = true;
    if (const auto it = config.find("prepend_scheme"); it != config.end() && !it->is_null()) {
      require(it->is_string(), "{}.prepend_scheme: expected a string", where);
      strip_first = it->get<std::string>() != "never";
    } else {
      strip_first = json_bool_or(config, "add_prefix_space", true, where);
    }
    return std::make_unique<MetaspaceDecoder>(json_string(config, "replacement", where), strip_first);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(json_string(config, "content", where), json_count(config, "start", where),
                                          json_count(config, "stop", where));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(parse_pattern(json_field(config, "pattern", where), where + ".pattern"),
                                            json_string(config, "content", where));
  }
  if (type == "Sequence") {
    const auto& list = json_field(config, "decoders", where);
    require(list.is_array(), "{}.decoders: expected an array", where);
    std::vector<std::unique_ptr<Decoder>> items;
    for (size_t i = 0; i < list.size(); ++i) {
      auto item = make_decoder(list[i], fmt::format("{}.decoders[{}]", where, i));
      if (item) items.push_back(std::move(item));
    }
    return std::make_unique<SequenceDecoder>(std::move(items));
  }
  fail("{}: unsupported decoder type '{}' (supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
       "Sequence)",
       where, type);
}

}  // namespace kestrel::text

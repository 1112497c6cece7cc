#include "text/normalizer.h"

#include <vector>

#include "base/error.h"
#include "text/json_access.h"
#include "text/pattern.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

class FormNormalizer final : public Normalizer {
public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  std::string normalize(std::string_view text) const override { return text::normalize(text, form_); }

private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
public:
  std::string normalize(std::string_view text) const override { return lowercase(text); }
};

class StripNormalizer final : public Normalizer {
public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!is_rust_whitespace(next_code_point(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t pos = start;
        if (!is_rust_whitespace(next_code_point(text, pos))) break;
        end = start;
      }
    }
    return std::string(text.substr(begin, end - begin));
  }

private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return {};
    return prefix_ + std::string(text);
  }

private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
public:
  ReplaceNormalizer(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string_view text) const override { return pattern_.replace_all(text, content_); }

private:
  Pattern pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> items) : items_(std::move(items)) {}
  std::string normalize(std::string_view text) const override {
    std::string current(text);
    for (const auto& item : items_) current = item->normalize(current);
    return current;
  }

private:
  std::vector<std::unique_ptr<Normalizer>> items_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = json_type(config, where);
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_bool_or(config, "strip_left", true, where),
                                             json_bool_or(config, "strip_right", true, where));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_string(config, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(parse_pattern(json_field(config, "pattern", where), where + ".pattern"),
                                               json_string(config, "content", where));
  }
  if (type == "Sequence") {
    const auto& list = json_field(config, "normalizers", where);
    require(list.is_array(), "{}.normalizers: expected an array", where);
    std::vector<std::unique_ptr<Normalizer>> items;
    for (size_t i = 0; i < list.size(); ++i) {
      auto item = make_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
      if (item) items.push_back(std::move(item));
    }
    return std::make_unique<SequenceNormalizer>(std::move(items));
  }
  fail("{}: unsupported normalizer type '{}' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend, "
       "Sequence)",
       where, type);
}

}  // namespace kestrel::text

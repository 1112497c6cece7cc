#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <functional>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "formats/strict_json.h"
#include "text/bpe.h"
#include "text/decoder.h"
#include "text/json_access.h"
#include "text/normalizer.h"
#include "text/pretokenizer.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace fs = std::filesystem;
using nlohmann::json;

// Finds added tokens in a text, leftmost first and longest among those starting at the same place (as HF's
// aho-corasick LeftmostLongest). Patterns are grouped by first byte, longest first.
struct Tokenizer::AddedMatcher {
  struct Entry {
    std::string pattern;
    size_t token;  // index into added_
  };
  std::array<std::vector<Entry>, 256> by_first_byte;
  bool empty = true;

  void add(std::string pattern, size_t token) {
    if (pattern.empty()) return;
    auto& bucket = by_first_byte[static_cast<uint8_t>(pattern[0])];
    bucket.push_back({std::move(pattern), token});
    empty = false;
  }
  void finish() {
    for (auto& bucket : by_first_byte) {
      std::stable_sort(bucket.begin(), bucket.end(),
                       [](const Entry& a, const Entry& b) { return a.pattern.size() > b.pattern.size(); });
    }
  }
  // The first match starting at or after `from`: (begin, entry) or (npos, nullptr).
  std::pair<size_t, const Entry*> find(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      const auto& bucket = by_first_byte[static_cast<uint8_t>(text[i])];
      for (const Entry& e : bucket) {
        if (text.compare(i, e.pattern.size(), e.pattern) == 0) return {i, &e};
      }
    }
    return {std::string_view::npos, nullptr};
  }
};

// One post-processing template: the sequence ($A) or fixed special-token ids.
struct Tokenizer::PostStep {
  std::vector<std::vector<int32_t>> items;  // an empty vector marks the sequence
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

namespace {

std::string read_file(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "{}: cannot open {}", path.string(), what);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int32_t json_id(const json& value, const std::string& where) {
  require(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < (int64_t{1} << 31),
          "{}: expected a non-negative integer token id", where);
  return value.get<int32_t>();
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  return is_regex_word(next_code_point(s, pos));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t pos = 0;
  return is_regex_word(next_code_point(s, pos));
}

// Start of the run of trailing whitespace of s.
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!is_rust_whitespace(next_code_point(s, pos))) break;
    end = start;
  }
  return end;
}

// Length of the run of leading whitespace of s.
size_t leading_space_length(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!is_rust_whitespace(next_code_point(s, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const fs::path& path) {
  return from_json(read_file(path, "the tokenizer"), path.string());
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  const json root = parse_json_object_strict(json_text, source);
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  const std::string at = source + ": ";

  const auto model = root.find("model");
  require(model != root.end() && model->is_object(), "{}: missing the \"model\" object", source);
  tok->model_ = std::make_unique<BpeModel>(*model, at + "model");
  tok->normalizer_ = make_normalizer(root.value("normalizer", json()), at + "normalizer");
  tok->pre_tokenizer_ = make_pre_tokenizer(root.value("pre_tokenizer", json()), at + "pre_tokenizer");
  tok->decoder_ = make_decoder(root.value("decoder", json()), at + "decoder");
  std::function<bool(const json&)> has_byte_fallback = [&](const json& d) {
    if (!d.is_object()) return false;
    if (d.value("type", "") == "ByteFallback") return true;
    const auto list = d.find("decoders");
    return list != d.end() && list->is_array() && std::any_of(list->begin(), list->end(), has_byte_fallback);
  };
  tok->groups_byte_tokens_ = has_byte_fallback(root.value("decoder", json()));

  if (const auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    require(it->is_array(), "{}added_tokens: expected an array", at);
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string where = fmt::format("{}added_tokens[{}]", at, i);
      AddedToken a;
      a.id = json_id(json_field(t, "id", where), where + ".id");
      a.content = json_string(t, "content", where);
      require(!find_invalid_utf8(a.content), "{}.content: not valid UTF-8", where);
      a.special = json_bool_or(t, "special", false, where);
      a.single_word = json_bool_or(t, "single_word", false, where);
      a.lstrip = json_bool_or(t, "lstrip", false, where);
      a.rstrip = json_bool_or(t, "rstrip", false, where);
      a.normalized = json_bool_or(t, "normalized", !a.special, where);
      require(!tok->added_by_id_.contains(a.id), "{}.id: id {} is used by two added tokens", where, a.id);
      tok->added_by_id_[a.id] = tok->added_.size();
      tok->added_.push_back(std::move(a));
    }
  }
  tok->raw_matcher_ = std::make_unique<AddedMatcher>();
  tok->normalized_matcher_ = std::make_unique<AddedMatcher>();
  for (size_t i = 0; i < tok->added_.size(); ++i) {
    AddedToken& a = tok->added_[i];
    a.decoded = a.normalized && tok->normalizer_ ? tok->normalizer_->normalize(a.content) : a.content;
    if (a.normalized) {
      tok->normalized_matcher_->add(a.decoded, i);
    } else {
      tok->raw_matcher_->add(a.content, i);
    }
  }
  tok->raw_matcher_->finish();
  tok->normalized_matcher_->finish();

  // Post-processor: the single-sequence template as a list of steps.
  std::function<void(const json&, const std::string&)> add_post = [&](const json& p, const std::string& where) {
    if (p.is_null()) return;
    const std::string type = json_type(p, where);
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      const json& list = json_field(p, "processors", where);
      require(list.is_array(), "{}.processors: expected an array", where);
      for (size_t i = 0; i < list.size(); ++i) add_post(list[i], fmt::format("{}.processors[{}]", where, i));
      return;
    }
    PostStep step;
    if (type == "TemplateProcessing") {
      const json& single = json_field(p, "single", where);
      const json& specials = json_field(p, "special_tokens", where);
      require(single.is_array(), "{}.single: expected an array", where);
      require(specials.is_object(), "{}.special_tokens: expected an object", where);
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string w = fmt::format("{}.single[{}]", where, i);
        const json& item = single[i];
        require(item.is_object() && item.size() == 1, "{}: expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}",
                w);
        if (item.contains("Sequence")) {
          step.items.emplace_back();
          continue;
        }
        const json& st = json_field(item, "SpecialToken", w);
        const std::string name = json_string(st, "id", w + ".SpecialToken");
        const auto found = specials.find(name);
        require(found != specials.end(), "{}: special token \"{}\" is not in special_tokens", w, name);
        const json& ids = json_field(*found, "ids", where + ".special_tokens." + name);
        require(ids.is_array() && !ids.empty(), "{}.special_tokens.{}.ids: expected a non-empty array", where, name);
        std::vector<int32_t> v;
        for (const auto& id : ids) v.push_back(json_id(id, where + ".special_tokens." + name + ".ids"));
        step.items.push_back(std::move(v));
      }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      auto pair_id = [&](const char* key) {
        const json& v = json_field(p, key, where);
        require(v.is_array() && v.size() == 2 && v[0].is_string(), "{}.{}: expected [\"token\", id]", where, key);
        return json_id(v[1], fmt::format("{}.{}[1]", where, key));
      };
      step.items = {{pair_id("cls")}, {}, {pair_id("sep")}};
    } else {
      fail("{}: unsupported post-processor type '{}' (supported: TemplateProcessing, RobertaProcessing, "
           "BertProcessing, ByteLevel, Sequence)",
           where, type);
    }
    tok->post_single_.push_back(std::move(step));
  };
  add_post(root.value("post_processor", json()), at + "post_processor");
  return tok;
}

void Tokenizer::split_added(std::string_view text, const AddedMatcher& matcher, bool split_special,
                            size_t origin_span, std::vector<Segment>& out) const {
  if (text.empty()) return;
  if (matcher.empty) {
    out.push_back({std::string(text), -1, origin_span});
    return;
  }
  size_t start_offset = 0, search = 0;
  auto push_text = [&](size_t b, size_t e) {
    if (b < e) out.push_back({std::string(text.substr(b, e - b)), -1, b < origin_span ? origin_span - b : 0});
  };
  while (search < text.size()) {
    const auto [found, entry] = matcher.find(text, search);
    if (!entry) break;
    size_t start = found, stop = found + entry->pattern.size();
    search = stop;
    const AddedToken& token = added_[entry->token];
    if (!split_special && token.special) continue;
    if (token.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    push_text(start_offset, start);
    out.push_back({std::string(), token.id, 0});
    start_offset = stop;  // the search goes on after the match itself, as HF's does, not after stripped spaces
  }
  push_text(start_offset, text.size());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  if (const auto bad = find_invalid_utf8(text)) {
    fail("the text to tokenize is not valid UTF-8 (invalid byte 0x{:02X} at offset {})",
         static_cast<unsigned>(static_cast<unsigned char>(text[*bad])), *bad);
  }
  std::vector<Segment> first, second;
  split_added(text, *raw_matcher_, options.split_special_tokens,
              text.empty() ? 0 : utf8_length(static_cast<unsigned char>(text[0])), first);
  for (auto& segment : first) {
    if (segment.id >= 0) {
      second.push_back(std::move(segment));
      continue;
    }
    if (!normalizer_) {
      split_added(segment.text, *normalized_matcher_, options.split_special_tokens, segment.origin_span, second);
      continue;
    }
    const std::string normalized = normalizer_->normalize(segment.text);
    size_t span = 0;
    if (segment.origin_span > 0 && !normalized.empty()) {
      // The normalized bytes that stem from the input's first character (HF aligns them to original offset 0).
      const std::string head = normalizer_->normalize(std::string_view(segment.text).substr(0, segment.origin_span));
      span = normalized.starts_with(head) ? head.size()
                                          : (head.empty() ? 0 : utf8_length(static_cast<unsigned char>(normalized[0])));
    }
    split_added(normalized, *normalized_matcher_, options.split_special_tokens, span, second);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Piece> pieces;
  for (auto& segment : second) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({std::move(segment.text), segment.origin_span});
    if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
    for (const Piece& p : pieces) model_->encode_piece(p.text, ids);
  }
  if (!options.add_special_tokens || post_single_.empty()) return ids;
  for (const PostStep& step : post_single_) {
    std::vector<int32_t> next;
    next.reserve(ids.size() + 4);
    for (const auto& item : step.items) {
      if (item.empty()) {
        next.insert(next.end(), ids.begin(), ids.end());
      } else {
        next.insert(next.end(), item.begin(), item.end());
      }
    }
    ids = std::move(next);
  }
  return ids;
}

const std::string* Tokenizer::id_to_token(int32_t id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return &added_[it->second].decoded;
  return model_->id_to_token(id);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }
  return model_->token_to_id(token);
}

bool Tokenizer::is_byte_token(int32_t id) const {
  const std::string* t = id_to_token(id);
  return t && t->size() == 6 && t->starts_with("<0x") && (*t)[5] == '>' && std::isxdigit(static_cast<unsigned char>((*t)[3])) &&
         std::isxdigit(static_cast<unsigned char>((*t)[4]));
}

bool Tokenizer::is_special(int32_t id) const {
  const auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

size_t Tokenizer::vocab_size() const {
  int64_t max_id = model_->max_id();
  for (const AddedToken& a : added_) max_id = std::max<int64_t>(max_id, a.id);
  return static_cast<size_t>(max_id + 1);
}

std::string Tokenizer::decode_tokens(std::vector<std::string> tokens) const {
  if (!decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  std::string out;
  for (const auto& s : decoder_->decode_chain(std::move(tokens))) out += s;
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* t = id_to_token(id);
    if (!t || (skip_special_tokens && is_special(id))) continue;
    tokens.push_back(*t);
  }
  return decode_tokens(std::move(tokens));
}

namespace {

std::optional<std::string> token_string(const json& config, const char* key, const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  require(it->is_object(), "{}.{}: expected a string or an AddedToken object", where, key);
  return json_string(*it, "content", where + "." + key);
}

std::optional<bool> optional_bool(const json& config, const char* key, const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  require(it->is_boolean(), "{}.{}: expected true or false", where, key);
  return it->get<bool>();
}

}  // namespace

TokenizerConfig load_tokenizer_config(const fs::path& dir, const Tokenizer* tokenizer) {
  TokenizerConfig config;
  if (const fs::path path = dir / "tokenizer_config.json"; fs::exists(path)) {
    const std::string where = path.string();
    const json root = parse_json_object_strict(read_file(path, "the tokenizer config"), where);
    config.bos_token = token_string(root, "bos_token", where);
    config.eos_token = token_string(root, "eos_token", where);
    config.pad_token = token_string(root, "pad_token", where);
    config.unk_token = token_string(root, "unk_token", where);
    config.add_bos_token = optional_bool(root, "add_bos_token", where);
    config.add_eos_token = optional_bool(root, "add_eos_token", where);
    if (const auto it = root.find("chat_template"); it != root.end() && !it->is_null()) {
      if (it->is_string()) {
        config.chat_template = it->get<std::string>();
      } else {
        require(it->is_array(), "{}: chat_template: expected a string or a list of {{name, template}}", where);
        for (size_t i = 0; i < it->size(); ++i) {
          const std::string w = fmt::format("{}: chat_template[{}]", where, i);
          const std::string name = json_string((*it)[i], "name", w);
          config.named_templates[name] = json_string((*it)[i], "template", w);
        }
        if (const auto d = config.named_templates.find("default"); d != config.named_templates.end()) {
          config.chat_template = d->second;
        }
      }
    }
  }
  if (config.chat_template.empty()) {
    if (const fs::path path = dir / "chat_template.jinja"; fs::exists(path)) {
      config.chat_template = read_file(path, "the chat template");
    }
  }
  bool have_eos_ids = false;
  if (const fs::path path = dir / "generation_config.json"; fs::exists(path)) {
    const std::string where = path.string();
    const json root = parse_json_object_strict(read_file(path, "the generation config"), where);
    if (const auto it = root.find("eos_token_id"); it != root.end() && !it->is_null()) {
      have_eos_ids = true;
      if (it->is_array()) {
        for (size_t i = 0; i < it->size(); ++i) {
          config.eos_token_ids.push_back(json_id((*it)[i], fmt::format("{}: eos_token_id[{}]", where, i)));
        }
      } else {
        config.eos_token_ids.push_back(json_id(*it, where + ": eos_token_id"));
      }
    }
    if (const auto it = root.find("pad_token_id"); it != root.end() && !it->is_null()) {
      config.pad_token_id = json_id(*it, where + ": pad_token_id");
    }
  }
  if (!have_eos_ids && tokenizer && config.eos_token) {
    if (const auto id = tokenizer->token_to_id(*config.eos_token)) config.eos_token_ids.push_back(*id);
  }
  return config;
}

}  // namespace kestrel::text

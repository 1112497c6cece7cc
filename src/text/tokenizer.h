// A Hugging Face `tokenizer.json` tokenizer of the BPE family, byte-for-byte compatible with HF `tokenizers` (0.23):
//   encode: added tokens are cut out first (leftmost-longest, non-normalized ones on the raw text, then normalized
//   ones on each normalized remainder), the rest is normalized, pre-tokenized and BPE-encoded piece by piece; the
//   post-processor adds BOS/EOS when `add_special_tokens` is set.
//   decode: ids → token strings (special ones dropped when `skip_special_tokens`), then the decoder chain.
// Input text must be valid UTF-8 (HF receives a Python str, which cannot hold invalid UTF-8): anything else is
// rejected with an Error. `truncation` and `padding` in tokenizer.json are ignored (encode never truncates or pads).
// Thread-safe: encode and decode may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kestrel::text {

class BpeModel;
class Normalizer;
class PreTokenizer;
class Decoder;

struct AddedToken {
  std::string content;
  std::string decoded;  // what decode shows: the normalized content for a normalized token, as HF 0.23 does
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

struct EncodeOptions {
  bool add_special_tokens = true;  // run the post-processor (BOS/EOS where the tokenizer defines them)
  bool split_special_tokens = true;  // false: special added tokens in the text are encoded as plain text
};

class Tokenizer {
public:
  // Loads `path` (a tokenizer.json). Throws Error naming the file and the JSON path at fault.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& path);
  // Parses tokenizer.json text; `source` names it in errors.
  static std::unique_ptr<Tokenizer> from_json(std::string_view json_text, const std::string& source);
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The token string of an id (added token or model vocab), or nullptr for an unknown id.
  const std::string* id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // One more than the largest id (model vocab or added token).
  size_t vocab_size() const;

  // True when the decoder has a ByteFallback step: "<0xXX>" tokens then form groups whose text is only known when a
  // non-byte token ends the group (an invalid group turns every byte of it into U+FFFD, even ones shown earlier).
  bool groups_byte_tokens() const { return groups_byte_tokens_; }
  bool is_byte_token(int32_t id) const;

  // Decoder step used by the streaming detokenizer: the text of `tokens` (token strings) through the decoder chain.
  std::string decode_tokens(std::vector<std::string> tokens) const;

private:
  Tokenizer();
  struct AddedMatcher;
  struct PostStep;

  struct Segment {
    std::string text;
    int32_t id;          // an added token's id, or -1 for text
    size_t origin_span;  // see Piece::origin_span
  };
  void split_added(std::string_view text, const AddedMatcher& matcher, bool split_special, size_t origin_span,
                   std::vector<Segment>& out) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unique_ptr<AddedMatcher> raw_matcher_, normalized_matcher_;
  std::vector<PostStep> post_single_;  // empty: no post-processor
  bool groups_byte_tokens_ = false;
};

// What the server needs from tokenizer_config.json and generation_config.json.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;
  std::string chat_template;                            // the default template ("" when none)
  std::map<std::string, std::string> named_templates;   // from the list-of-{name, template} form
  std::vector<int32_t> eos_token_ids;                   // generation_config.json eos_token_id (int or list)
  std::optional<int32_t> pad_token_id;                  // generation_config.json pad_token_id
};

// Reads DIR/tokenizer_config.json and DIR/generation_config.json when present (each optional). When `tokenizer` is
// given and generation_config has no eos_token_id, eos_token_ids holds the id of eos_token.
TokenizerConfig load_tokenizer_config(const std::filesystem::path& dir, const Tokenizer* tokenizer = nullptr);

}  // namespace kestrel::text

// The BPE model of HF tokenizer.json ("model": {"type": "BPE"}): vocab, ranked merges (as "a b" strings or ["a", "b"]
// pairs), unk_token / fuse_unk, byte_fallback, ignore_merges, continuing_subword_prefix, end_of_word_suffix. Encodes
// one pre-tokenized piece at a time, with a cache of recent pieces. dropout must be null (or 0).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kestrel::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
public:
  // `where` names the file and JSON path ("tokenizer.json: model") for errors.
  BpeModel(const nlohmann::json& config, const std::string& where);

  // Appends the ids of one piece to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id is not in the vocab
  size_t vocab_size() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

private:
  struct MergeValue {
    uint32_t rank;
    int32_t new_id;
  };
  void merge_word(std::string_view piece, std::vector<int32_t>& out) const;
  const MergeValue* find_merge(int32_t a, int32_t b) const;

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, MergeValue> merges_;
  std::optional<int32_t> unk_id_;
  std::string unk_token_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  int32_t byte_ids_[256];  // <0xXX> ids for byte_fallback, -1 when absent

  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedPiece = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace kestrel::text

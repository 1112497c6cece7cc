#include "text/bpe.h"

#include <queue>

#include "base/error.h"
#include "text/json_access.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

std::optional<std::string> optional_string(const nlohmann::json& config, std::string_view key,
                                           const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  require(it->is_string(), "{}.{}: expected a string or null", where, key);
  return it->get<std::string>();
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& config, const std::string& where) {
  require(config.is_object(), "{}: expected a JSON object", where);
  if (const auto it = config.find("type"); it != config.end()) {
    require(it->is_string() && it->get<std::string>() == "BPE",
            "{}.type: unsupported model type {} (only BPE is supported)", where, it->dump());
  }
  if (const auto it = config.find("dropout"); it != config.end() && !it->is_null()) {
    require(it->is_number() && it->get<double>() == 0.0,
            "{}.dropout: BPE dropout {} is not supported (must be null: encoding would be random)", where, it->dump());
  }
  fuse_unk_ = json_bool_or(config, "fuse_unk", false, where);
  byte_fallback_ = json_bool_or(config, "byte_fallback", false, where);
  ignore_merges_ = json_bool_or(config, "ignore_merges", false, where);
  continuing_subword_prefix_ = optional_string(config, "continuing_subword_prefix", where).value_or("");
  end_of_word_suffix_ = optional_string(config, "end_of_word_suffix", where).value_or("");

  const auto& vocab = json_field(config, "vocab", where);
  require(vocab.is_object(), "{}.vocab: expected an object of token → id", where);
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    require(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 31),
            "{}.vocab[\"{}\"]: expected a non-negative integer id", where, token);
    require(!find_invalid_utf8(token), "{}.vocab: a token is not valid UTF-8", where);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  require(max_id < 16 * int64_t{1} << 20, "{}.vocab: id {} is implausibly large", where, max_id);
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    const auto i = id.get<int32_t>();
    vocab_.emplace(token, i);
    id_to_token_[static_cast<size_t>(i)] = token;
    has_id_[static_cast<size_t>(i)] = true;
  }

  if (auto unk = optional_string(config, "unk_token", where)) {
    unk_token_ = *unk;
    unk_id_ = token_to_id(*unk);  // an unk token outside the vocab fails at encode time, as in HF
  }
  for (int b = 0; b < 256; ++b) {
    const auto id = token_to_id(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = id ? *id : -1;
  }

  const auto& merges = json_field(config, "merges", where);
  require(merges.is_array(), "{}.merges: expected an array", where);
  merges_.reserve(merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      require(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
              "{}.merges[{}]: expected \"left right\" (two tokens separated by one space), got \"{}\"", where, rank, s);
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {
      require(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
              "{}.merges[{}]: expected a string \"a b\" or a pair [\"a\", \"b\"]", where, rank);
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    const auto ia = token_to_id(a), ib = token_to_id(b);
    require(ia.has_value(), "{}.merges[{}]: token \"{}\" is not in the vocab", where, rank, a);
    require(ib.has_value(), "{}.merges[{}]: token \"{}\" is not in the vocab", where, rank, b);
    std::string merged = a;
    if (prefix_len > 0 && b.compare(0, prefix_len, continuing_subword_prefix_) == 0) {
      merged += b.substr(prefix_len);
    } else {
      merged += b;
    }
    const auto id = token_to_id(merged);
    require(id.has_value(), "{}.merges[{}]: the merged token \"{}\" is not in the vocab", where, rank, merged);
    merges_[pair_key(*ia, *ib)] = MergeValue{static_cast<uint32_t>(rank), *id};
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[static_cast<size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

const BpeModel::MergeValue* BpeModel::find_merge(int32_t a, int32_t b) const {
  const auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(piece)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (const auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(piece), std::move(ids));
  }
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  int32_t pending_unk = -1;  // an unk id waiting to be added (fuse_unk joins runs)
  std::string scratch;
  size_t pos = 0;
  while (pos < w.size()) {
    const size_t start = pos;
    pos = std::min(w.size(), pos + utf8_length(static_cast<unsigned char>(w[pos])));
    std::string_view s = w.substr(start, pos - start);
    const bool is_first = start == 0, is_last = pos == w.size();
    if ((!is_first && !continuing_subword_prefix_.empty()) || (is_last && !end_of_word_suffix_.empty())) {
      scratch.clear();
      if (!is_first) scratch += continuing_subword_prefix_;
      scratch += s;
      if (is_last) scratch += end_of_word_suffix_;
      s = scratch;
    }
    if (const auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : s) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // HF adds the byte tokens without flushing a pending unk first (it stays pending).
        for (const char c : s) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (!unk_token_.empty() || unk_id_) {
      require(unk_id_.has_value(), "the unk_token \"{}\" of the BPE model is not in its vocab", unk_token_);
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeValue* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.removed || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[static_cast<size_t>(next_pos)];
    const MergeValue* m = find_merge(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.next = right.next;
    symbols[static_cast<size_t>(next_pos)].removed = true;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeValue* pm = find_merge(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        queue.push({pm->rank, cur.prev, pm->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const MergeValue* nm = find_merge(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) out.push_back(s.id);
  }
}

}  // namespace kestrel::text

// The engine's cache blocks (vLLM's BlockPool): a fixed number of ids with reference counts, the free ids kept in
// the order they were freed (the least recently used is handed out first), and the prefix cache's index of full
// blocks by content. A full block is identified by the cache id of the block before it (or, for a first block, the
// request's cache salt) and its tokens, compared exactly, so that a hit is never a hash collision; chaining through
// the parent's id makes the identity cover the whole prefix. A cached block whose last reference is dropped stays
// findable until its id is handed out again.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/id_list.h"
#include "engine/paged_rows.h"

namespace kestrel {

struct CachedBlock {
  int32_t block;
  uint64_t cache_id;  // never reused; 0 means "no parent" in a key
};

class BlockPool final : public BlockSource {
public:
  BlockPool(int64_t num_blocks, int64_t block_tokens);

  int64_t num_blocks() const { return static_cast<int64_t>(references_.size()); }
  // Ids not referenced by any sequence (cached ones among them can still be hit).
  int64_t num_free() const { return free_.size(); }

  // The least recently freed id; a cached one loses its cache entry (the evict hook hears of it first).
  int32_t allocate() override;
  void retain(int32_t block) override;
  void release(int32_t block) override;

  // Called with a cached block's id just before its entry is dropped to reuse the id.
  void set_evict_hook(std::function<void(int32_t block)> hook) { evict_hook_ = std::move(hook); }

  // The cached block holding `tokens` after the block with cache id `parent` (0: at the start, under `salt`).
  std::optional<CachedBlock> find(uint64_t parent, std::string_view salt, std::span<const int32_t> tokens) const;
  // Indexes the full block `block` under that key and returns its cache id. When an equal block is indexed already,
  // `block` stays unindexed and the existing entry is returned.
  CachedBlock insert(int32_t block, uint64_t parent, std::string_view salt, std::span<const int32_t> tokens);
  bool is_cached(int32_t block) const { return cache_ids_[static_cast<size_t>(block)] != 0; }
  int64_t num_cached() const { return static_cast<int64_t>(index_.size()); }

private:
  struct Key {
    uint64_t parent = 0;
    std::string salt;
    std::vector<int32_t> tokens;
  };
  static uint64_t hash_of(uint64_t parent, std::string_view salt, std::span<const int32_t> tokens);
  bool key_matches(int32_t block, uint64_t parent, std::string_view salt, std::span<const int32_t> tokens) const;
  void uncache(int32_t block);

  int64_t block_tokens_;
  std::vector<int32_t> references_;  // by id
  IdList free_;                      // unreferenced ids, least recently freed first
  std::vector<uint64_t> cache_ids_;  // by id; 0: not cached
  std::vector<Key> keys_;            // by id, for cached blocks
  std::unordered_multimap<uint64_t, int32_t> index_;  // key hash -> cached block
  uint64_t next_cache_id_ = 1;
  std::function<void(int32_t)> evict_hook_;
};

}  // namespace kestrel

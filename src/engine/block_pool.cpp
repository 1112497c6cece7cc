#include "engine/block_pool.h"

#include <algorithm>

#include "base/error.h"

namespace kestrel {

namespace {

// A 64-bit mixing step (the splitmix64 finaliser): the index only needs spread, exactness comes from key_matches.
uint64_t mix(uint64_t h, uint64_t value) {
  h ^= value + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

}  // namespace

BlockPool::BlockPool(int64_t num_blocks, int64_t block_tokens)
    : block_tokens_(block_tokens),
      references_(static_cast<size_t>(num_blocks), 0),
      free_(num_blocks),
      cache_ids_(static_cast<size_t>(num_blocks), 0),
      keys_(static_cast<size_t>(num_blocks)) {
  require(num_blocks > 0 && num_blocks < INT32_MAX, "the cache needs between 1 and {} blocks, got {}", INT32_MAX - 1,
          num_blocks);
  for (int32_t id = 0; id < static_cast<int32_t>(num_blocks); ++id) free_.push_back(id);
}

int32_t BlockPool::allocate() {
  require(!free_.empty(), "the KV cache has no free block left (all {} in use)", num_blocks());
  const int32_t block = free_.front();
  free_.remove(block);
  if (is_cached(block)) uncache(block);
  references_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockPool::retain(int32_t block) {
  // A free block is retained only on a prefix-cache hit: it leaves the free list.
  if (references_[static_cast<size_t>(block)]++ == 0) free_.remove(block);
}

void BlockPool::release(int32_t block) {
  if (--references_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

uint64_t BlockPool::hash_of(uint64_t parent, std::string_view salt, std::span<const int32_t> tokens) {
  uint64_t h = mix(0, parent);
  for (const char c : salt) h = mix(h, static_cast<unsigned char>(c));
  h = mix(h, salt.size());
  for (const int32_t token : tokens) h = mix(h, static_cast<uint32_t>(token));
  return h;
}

bool BlockPool::key_matches(int32_t block, uint64_t parent, std::string_view salt,
                            std::span<const int32_t> tokens) const {
  const Key& key = keys_[static_cast<size_t>(block)];
  return key.parent == parent && key.salt == salt && std::ranges::equal(key.tokens, tokens);
}

std::optional<CachedBlock> BlockPool::find(uint64_t parent, std::string_view salt,
                                           std::span<const int32_t> tokens) const {
  if (parent != 0) salt = {};  // the salt is part of the first block's key only; the chain carries it on
  const auto [begin, end] = index_.equal_range(hash_of(parent, salt, tokens));
  for (auto it = begin; it != end; ++it) {
    if (key_matches(it->second, parent, salt, tokens)) {
      return CachedBlock{.block = it->second, .cache_id = cache_ids_[static_cast<size_t>(it->second)]};
    }
  }
  return std::nullopt;
}

CachedBlock BlockPool::insert(int32_t block, uint64_t parent, std::string_view salt,
                              std::span<const int32_t> tokens) {
  require(static_cast<int64_t>(tokens.size()) == block_tokens_, "only full blocks are cached");
  if (const auto existing = find(parent, salt, tokens)) return *existing;
  if (parent != 0) salt = {};
  const uint64_t cache_id = next_cache_id_++;
  cache_ids_[static_cast<size_t>(block)] = cache_id;
  keys_[static_cast<size_t>(block)] = Key{.parent = parent, .salt = std::string(salt),
                                          .tokens = std::vector<int32_t>(tokens.begin(), tokens.end())};
  index_.emplace(hash_of(parent, salt, tokens), block);
  return CachedBlock{.block = block, .cache_id = cache_id};
}

void BlockPool::uncache(int32_t block) {
  if (evict_hook_) evict_hook_(block);
  const Key& key = keys_[static_cast<size_t>(block)];
  const auto [begin, end] = index_.equal_range(hash_of(key.parent, key.salt, key.tokens));
  for (auto it = begin; it != end; ++it) {
    if (it->second == block) {
      index_.erase(it);
      break;
    }
  }
  cache_ids_[static_cast<size_t>(block)] = 0;
  keys_[static_cast<size_t>(block)] = Key{};
}

}  // namespace kestrel

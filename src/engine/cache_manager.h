// The engine's cache manager: MLA latents and indexer rows paged in fixed blocks from one BlockPool, the KDA state
// of each running sequence in a slot (a SequenceState, one per max_num_seqs, made on first use), and automatic prefix
// caching. Full blocks of a prompt are indexed by content once computed, some with a snapshot of the KDA state at
// their end (see plan_snapshots); a new sequence resumes on the longest indexed prefix of its prompt that ends at a
// snapshot, so the hit restores exactly the state an uncached run would have there. The scheduler decides; this
// class only grants, indexes and frees.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "engine/block_pool.h"
#include "engine/kda_snapshot_pool.h"
#include "formats/glm5_next_config.h"
#include "model/sequence_state.h"

namespace kestrel {

struct CacheConfig {
  int64_t block_size = 16;          // tokens per block, a multiple of index_kpool
  int64_t num_blocks = 0;
  int64_t num_slots = 0;            // sequences holding KDA state at once (max_num_seqs)
  int64_t num_kda_snapshots = 0;
  bool enable_prefix_caching = true;
  CacheDtype latent_dtype = CacheDtype::float32;  // --kv-cache-dtype
};

// A KDA snapshot to write once the sequence has computed `num_tokens` tokens.
struct SnapshotTarget {
  int64_t num_tokens;
  std::span<float> kda_state;
};

// What the cache manager keeps for one admitted sequence.
struct SequenceCache {
  int32_t slot = -1;
  SequenceState* state = nullptr;
  int64_t num_indexed_blocks = 0;  // prompt blocks found in or added to the prefix index, in order
  uint64_t last_cache_id = 0;      // cache id of the last of them: the parent of the next
  struct PendingSnapshot {
    int64_t block_index;
    int32_t snapshot;
  };
  std::vector<PendingSnapshot> pending;  // being written this step
};

struct CacheStats {
  int64_t num_blocks = 0, num_free_blocks = 0, num_cached_blocks = 0;
  int64_t num_kda_snapshots = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in prompt tokens, once per request, as vLLM counts them
};

class CacheManager {
public:
  // The cache pools and sequence states live in `backend`'s memory.
  CacheManager(const Glm5NextConfig& model, Backend& backend, const CacheConfig& config);

  int64_t block_size() const { return config_.block_size; }
  int64_t num_free_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  // Fraction of blocks referenced by sequences (cached but unreferenced blocks count as free, as in vLLM).
  double usage() const;
  CacheStats stats() const;

  // Takes a free slot (there must be one) for a sequence whose `num_prompt_tokens` first tokens are its prompt, and
  // with prefix caching resumes it on the longest cached prefix of that prompt ending at a KDA snapshot — at most
  // up to the last token still to compute, whose logits are needed. `num_computed` receives the tokens reused.
  SequenceCache open(std::span<const int32_t> tokens, int64_t num_prompt_tokens, std::string_view salt,
                     int64_t& num_computed);
  // Counts a request's first admission in the hit counters: `num_hit` of its `num_prompt_tokens` came from the cache.
  void record_prefix_query(int64_t num_prompt_tokens, int64_t num_hit) {
    queries_ += num_prompt_tokens;
    hits_ += num_hit;
  }
  // Blocks for `num_tokens` tokens in all; false, allocating nothing, when too few are free.
  bool allocate(SequenceCache& sequence, int64_t num_tokens);
  // The snapshots to take while computing tokens [start, end): at most two, at the ends of full `prompt` blocks in
  // (start, end] — the deepest block other prompts share without a snapshot yet, and the last new block that ends
  // before the prompt's last token.
  std::vector<SnapshotTarget> plan_snapshots(SequenceCache& sequence, std::span<const int32_t> prompt,
                                             std::string_view salt, int64_t start, int64_t end);
  // After a step computed the sequence up to `num_computed` tokens: indexes its new full prompt blocks with their
  // snapshots.
  void commit(SequenceCache& sequence, std::span<const int32_t> prompt, std::string_view salt, int64_t num_computed);
  // Frees the slot and drops the sequence's references to its blocks (indexed ones stay findable until reused).
  void close(SequenceCache& sequence);

private:
  void drop_snapshot_of(int32_t block);

  Glm5NextConfig model_;
  CacheConfig config_;
  BlockPool blocks_;
  CachePools pools_;
  std::vector<std::unique_ptr<SequenceState>> slots_;
  std::vector<int32_t> free_slots_;
  int64_t kda_state_size_;
  KdaSnapshotPool snapshots_;
  std::vector<int32_t> snapshot_of_block_;  // by block id, -1: none
  std::vector<int32_t> block_of_snapshot_;  // by snapshot id, -1: none
  int64_t queries_ = 0, hits_ = 0;
};

}  // namespace kestrel

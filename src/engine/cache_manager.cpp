#include "engine/cache_manager.h"

#include <algorithm>

#include "base/error.h"

namespace kestrel {

CacheManager::CacheManager(const Glm5NextConfig& model, Backend& backend, const CacheConfig& config)
    : model_(model),
      config_(config),
      blocks_(config.num_blocks, config.block_size),
      pools_(model_, backend, config.block_size, blocks_, config.num_blocks, config.latent_dtype),
      slots_(static_cast<size_t>(config.num_slots)),
      kda_state_size_(SequenceState::kda_state_size(model)),
      snapshots_(kda_state_size_ > 0 ? config.num_kda_snapshots : 0, kda_state_size_),
      snapshot_of_block_(static_cast<size_t>(config.num_blocks), -1),
      block_of_snapshot_(static_cast<size_t>(snapshots_.capacity()), -1) {
  for (auto slot = static_cast<int32_t>(config.num_slots); slot-- > 0;) free_slots_.push_back(slot);
  blocks_.set_evict_hook([this](int32_t block) { drop_snapshot_of(block); });
  snapshots_.set_evict_hook([this](int32_t snapshot) {
    snapshot_of_block_[static_cast<size_t>(block_of_snapshot_[static_cast<size_t>(snapshot)])] = -1;
    block_of_snapshot_[static_cast<size_t>(snapshot)] = -1;
  });
}

double CacheManager::usage() const {
  return 1.0 - static_cast<double>(blocks_.num_free()) / static_cast<double>(blocks_.num_blocks());
}

CacheStats CacheManager::stats() const {
  return CacheStats{.num_blocks = blocks_.num_blocks(),
                    .num_free_blocks = blocks_.num_free(),
                    .num_cached_blocks = blocks_.num_cached(),
                    .num_kda_snapshots = snapshots_.num_in_use(),
                    .prefix_cache_queries = queries_,
                    .prefix_cache_hits = hits_};
}

void CacheManager::drop_snapshot_of(int32_t block) {
  int32_t& snapshot = snapshot_of_block_[static_cast<size_t>(block)];
  if (snapshot < 0) return;
  block_of_snapshot_[static_cast<size_t>(snapshot)] = -1;
  snapshots_.release(snapshot);
  snapshot = -1;
}

SequenceCache CacheManager::open(std::span<const int32_t> tokens, int64_t num_prompt_tokens, std::string_view salt,
                                 int64_t& num_computed) {
  require(!free_slots_.empty(), "no free sequence slot (max_num_seqs = {})", config_.num_slots);
  SequenceCache sequence;
  sequence.slot = free_slots_.back();
  free_slots_.pop_back();
  auto& state = slots_[static_cast<size_t>(sequence.slot)];
  if (!state) state = std::make_unique<SequenceState>(model_, pools_);
  sequence.state = state.get();
  num_computed = 0;
  if (!config_.enable_prefix_caching) return sequence;

  // Only whole prompt blocks are indexed, and the last token still to compute must be left to compute.
  const int64_t B = config_.block_size;
  const auto num_tokens = static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = num_tokens > num_prompt_tokens ? num_prompt_tokens / B : (num_prompt_tokens - 1) / B;
  std::vector<CachedBlock> found;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const auto hit = blocks_.find(found.empty() ? 0 : found.back().cache_id, salt, tokens.subspan(b * B, B));
    if (!hit) break;
    found.push_back(*hit);
  }
  // The hit must end where a KDA snapshot restores the recurrent state.
  while (kda_state_size_ > 0 && !found.empty() && snapshot_of_block_[static_cast<size_t>(found.back().block)] < 0) {
    found.pop_back();
  }
  if (found.empty()) return sequence;

  std::vector<int32_t> ids;
  for (const CachedBlock& hit : found) ids.push_back(hit.block);
  sequence.state->resume_on(ids);
  if (kda_state_size_ > 0) {
    const int32_t snapshot = snapshot_of_block_[static_cast<size_t>(found.back().block)];
    sequence.state->load_kda_state(snapshots_.data(snapshot));
    snapshots_.touch(snapshot);
  }
  sequence.num_indexed_blocks = static_cast<int64_t>(found.size());
  sequence.last_cache_id = found.back().cache_id;
  num_computed = sequence.num_indexed_blocks * B;
  return sequence;
}

bool CacheManager::allocate(SequenceCache& sequence, int64_t num_tokens) {
  const int64_t needed = (num_tokens + config_.block_size - 1) / config_.block_size - sequence.state->blocks().size();
  if (needed > blocks_.num_free()) return false;
  sequence.state->reserve(num_tokens);
  return true;
}

std::vector<SnapshotTarget> CacheManager::plan_snapshots(SequenceCache& sequence, std::span<const int32_t> prompt,
                                                         std::string_view salt, int64_t start, int64_t end) {
  std::vector<SnapshotTarget> targets;
  if (!config_.enable_prefix_caching || kda_state_size_ == 0) return targets;
  const int64_t B = config_.block_size;
  // Of the full prompt blocks ending in (start, end], follow the prefix index as far as it knows them: the deepest
  // one indexed without a snapshot is a prefix other prompts share; the last one not indexed that ends before the
  // prompt's last token is where a repeat of this prompt resumes (a hit leaves that token to compute). A hit only
  // resumes at a snapshot, and taking every boundary would flood the pool (a snapshot of the real model is ~100 MiB),
  // so those two are taken; blocks indexed with a snapshot need none.
  std::optional<int64_t> shared, longest;
  uint64_t parent = sequence.last_cache_id;
  bool chained = sequence.num_indexed_blocks == start / B;  // the index can be followed from here
  for (int64_t b = start / B; b < std::min<int64_t>(end, static_cast<int64_t>(prompt.size())) / B; ++b) {
    std::optional<CachedBlock> hit;
    if (chained) hit = blocks_.find(parent, salt, prompt.subspan(static_cast<size_t>(b * B), static_cast<size_t>(B)));
    chained = hit.has_value();
    if (!hit) {
      if ((b + 1) * B < static_cast<int64_t>(prompt.size())) longest = b;
      continue;
    }
    parent = hit->cache_id;
    if (snapshot_of_block_[static_cast<size_t>(hit->block)] < 0) shared = b;
  }
  for (const std::optional<int64_t>& block : {shared, longest}) {
    if (!block) continue;
    const auto snapshot = snapshots_.acquire();
    if (!snapshot) break;  // every snapshot is being written this step
    sequence.pending.push_back({.block_index = *block, .snapshot = *snapshot});
    targets.push_back(SnapshotTarget{.num_tokens = (*block + 1) * B, .kda_state = snapshots_.data(*snapshot)});
  }
  return targets;  // in token order, as the runner takes them: a shared block comes before any new one
}

void CacheManager::commit(SequenceCache& sequence, std::span<const int32_t> prompt, std::string_view salt,
                          int64_t num_computed) {
  if (!config_.enable_prefix_caching) return;
  const int64_t B = config_.block_size;
  const int64_t num_full = std::min<int64_t>(num_computed, static_cast<int64_t>(prompt.size())) / B;
  const std::vector<int32_t>& ids = sequence.state->blocks().ids();
  for (int64_t b = sequence.num_indexed_blocks; b < num_full; ++b) {
    const CachedBlock entry = blocks_.insert(ids[static_cast<size_t>(b)], sequence.last_cache_id, salt,
                                             prompt.subspan(static_cast<size_t>(b * B), static_cast<size_t>(B)));
    sequence.last_cache_id = entry.cache_id;
    sequence.num_indexed_blocks = b + 1;
    const auto pending = std::ranges::find(sequence.pending, b, &SequenceCache::PendingSnapshot::block_index);
    if (pending == sequence.pending.end()) continue;
    // An equal block indexed earlier holds the same computation: it takes the snapshot if it has none.
    if (snapshot_of_block_[static_cast<size_t>(entry.block)] < 0) {
      snapshot_of_block_[static_cast<size_t>(entry.block)] = pending->snapshot;
      block_of_snapshot_[static_cast<size_t>(pending->snapshot)] = entry.block;
      snapshots_.unpin(pending->snapshot);
    } else {
      snapshots_.release(pending->snapshot);
    }
    sequence.pending.erase(pending);
  }
}

void CacheManager::close(SequenceCache& sequence) {
  for (const auto& pending : sequence.pending) snapshots_.release(pending.snapshot);
  sequence.pending.clear();
  sequence.state->reset();
  free_slots_.push_back(sequence.slot);
  sequence = SequenceCache{};
}

}  // namespace kestrel

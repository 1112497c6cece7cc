// The engine's cache memory without a model forward: block ids with reference counts and LRU reuse, the prefix index
// (exact keys chained through parents, salts, eviction), KDA snapshots (pinning, LRU), and the cache manager that
// combines them (a hit needs a snapshot at its end, leaves the last prompt token to compute, is counted once).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "../formats/expect_error.h"
#include "../model/golden_fixture.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/block_pool.h"
#include "engine/cache_manager.h"
#include "engine/kda_snapshot_pool.h"

namespace kestrel {
namespace {

std::vector<int32_t> iota_tokens(int32_t first, int64_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

TEST(BlockPool, HandsOutTheLeastRecentlyFreedIdFirst) {
  BlockPool pool(4, 2);
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.num_free(), 2);
  pool.release(1);
  pool.release(0);
  EXPECT_EQ(pool.allocate(), 2);  // never-used ids were freed first of all
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 0);
  testing::expect_error([&] { pool.allocate(); }, {"no free block", "4"});
}

TEST(BlockPool, ABlockIsFreedOnlyWhenItsLastReferenceIsDropped) {
  BlockPool pool(2, 2);
  const int32_t block = pool.allocate();
  pool.retain(block);
  pool.release(block);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(block);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPool, FindsCachedBlocksByExactTokensParentAndSalt) {
  BlockPool pool(8, 2);
  const int32_t first = pool.allocate(), second = pool.allocate();
  const CachedBlock a = pool.insert(first, 0, "salt", std::vector<int32_t>{1, 2});
  const CachedBlock b = pool.insert(second, a.cache_id, "salt", std::vector<int32_t>{3, 4});
  EXPECT_EQ(pool.num_cached(), 2);

  const auto hit = pool.find(0, "salt", std::vector<int32_t>{1, 2});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->block, first);
  EXPECT_EQ(pool.find(a.cache_id, "salt", std::vector<int32_t>{3, 4})->block, second);
  // The salt separates first blocks only; later blocks inherit it through the parent chain.
  EXPECT_FALSE(pool.find(0, "other", std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(pool.find(a.cache_id, "other", std::vector<int32_t>{3, 4}));
  EXPECT_FALSE(pool.find(0, "salt", std::vector<int32_t>{1, 3}));
  EXPECT_FALSE(pool.find(b.cache_id, "salt", std::vector<int32_t>{3, 4}));  // wrong parent
  EXPECT_FALSE(pool.find(0, "salt", std::vector<int32_t>{3, 4}));

  // An equal block indexed again keeps the first entry.
  const int32_t third = pool.allocate();
  const CachedBlock again = pool.insert(third, 0, "salt", std::vector<int32_t>{1, 2});
  EXPECT_EQ(again.block, first);
  EXPECT_EQ(again.cache_id, a.cache_id);
  EXPECT_FALSE(pool.is_cached(third));
  testing::expect_error([&] { pool.insert(third, 0, "", std::vector<int32_t>{1}); }, {"full blocks"});
}

TEST(BlockPool, FreedCachedBlocksStayFindableUntilEvictedInLruOrder) {
  BlockPool pool(3, 1);
  std::vector<int32_t> evicted;
  pool.set_evict_hook([&](int32_t block) { evicted.push_back(block); });
  const int32_t x = pool.allocate(), y = pool.allocate(), z = pool.allocate();
  pool.insert(x, 0, "", std::vector<int32_t>{10});
  pool.insert(y, 0, "", std::vector<int32_t>{11});
  pool.release(y);  // freed first: evicted first
  pool.release(x);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_TRUE(pool.find(0, "", std::vector<int32_t>{11}));

  // A hit on a free block takes it off the free list.
  pool.retain(y);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(y);  // now the most recently freed

  EXPECT_EQ(pool.allocate(), x);
  EXPECT_EQ(evicted, std::vector<int32_t>{x});
  EXPECT_FALSE(pool.find(0, "", std::vector<int32_t>{10}));
  EXPECT_TRUE(pool.find(0, "", std::vector<int32_t>{11}));
  EXPECT_EQ(pool.num_cached(), 1);
  (void)z;
}

TEST(KdaSnapshotPool, ReusesTheLeastRecentlyUsedUnpinnedSnapshot) {
  KdaSnapshotPool pool(2, 3);
  std::vector<int32_t> evicted;
  pool.set_evict_hook([&](int32_t id) { evicted.push_back(id); });
  const auto a = pool.acquire(), b = pool.acquire();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(pool.data(*a).size(), 3u);
  EXPECT_FALSE(pool.acquire());  // both pinned while being written
  pool.unpin(*a);
  pool.unpin(*b);
  pool.touch(*a);  // a read by a hit: b is now the least recently used
  EXPECT_EQ(pool.acquire(), b);
  EXPECT_EQ(evicted, std::vector<int32_t>{*b});
  pool.release(*a);
  EXPECT_EQ(pool.num_in_use(), 1);
  EXPECT_EQ(pool.acquire(), a);  // released: reused without eviction
  EXPECT_EQ(evicted.size(), 1u);
}

class CacheManagerTest : public ::testing::Test {
protected:
  Glm5NextConfig model = load_glm5_next_config(testing::golden_dir("bf16_hc4_kp4") + "/config.json");
  static constexpr int64_t B = 4;

  CpuBackend backend;

  CacheManager make(int64_t num_blocks, int64_t num_snapshots, bool prefix_caching = true) {
    return CacheManager(model, backend,
                        CacheConfig{.block_size = B,
                                    .num_blocks = num_blocks,
                                    .num_slots = 2,
                                    .num_kda_snapshots = num_snapshots,
                                    .enable_prefix_caching = prefix_caching});
  }

  // Opens, grants and "computes" a prompt fully (the runner's part is only the snapshot writes), then closes it.
  static void compute_prompt(CacheManager& cache, const std::vector<int32_t>& prompt) {
    int64_t reused = 0;
    SequenceCache sequence = cache.open(prompt, static_cast<int64_t>(prompt.size()), "", reused);
    ASSERT_TRUE(cache.allocate(sequence, static_cast<int64_t>(prompt.size())));
    const auto targets = cache.plan_snapshots(sequence, prompt, "", reused, static_cast<int64_t>(prompt.size()));
    for (const SnapshotTarget& target : targets) {
      std::fill(target.kda_state.begin(), target.kda_state.end(), static_cast<float>(target.num_tokens));
    }
    cache.commit(sequence, prompt, "", static_cast<int64_t>(prompt.size()));
    cache.close(sequence);
  }
};

TEST_F(CacheManagerTest, APromptResumesOnItsLongestCachedPrefixWithTheSnapshotOfThatBoundary) {
  CacheManager cache = make(16, 8);
  const std::vector<int32_t> prompt = iota_tokens(1, 11);  // blocks [0,4) [4,8) and a partial one
  compute_prompt(cache, prompt);
  EXPECT_EQ(cache.stats().num_cached_blocks, 2);
  EXPECT_EQ(cache.stats().num_kda_snapshots, 1);  // at token 8 only: where a repeat of this prompt resumes

  std::vector<int32_t> longer = prompt;
  longer.push_back(99);
  int64_t reused = -1;
  SequenceCache sequence = cache.open(longer, static_cast<int64_t>(longer.size()), "", reused);
  EXPECT_EQ(reused, 8);
  EXPECT_EQ(sequence.state->num_tokens(), 8);
  std::vector<float> state(static_cast<size_t>(SequenceState::kda_state_size(model)));
  sequence.state->save_kda_state(state);
  EXPECT_TRUE(std::ranges::all_of(state, [](float v) { return v == 8.0f; }));  // the snapshot taken at token 8
  EXPECT_EQ(cache.usage(), 2.0 / 16.0);
  cache.close(sequence);

  // A prompt sharing only the first block finds no snapshot there; computing it snapshots that shared block, so the
  // next prompt sharing it resumes after it.
  std::vector<int32_t> diverging = prompt;
  diverging[5] = 200;
  SequenceCache diverged = cache.open(diverging, 11, "", reused);
  EXPECT_EQ(reused, 0);
  cache.close(diverged);
  compute_prompt(cache, diverging);
  std::vector<int32_t> third = prompt;
  third[6] = 201;
  SequenceCache resumed = cache.open(third, 11, "", reused);
  EXPECT_EQ(reused, 4);
  resumed.state->save_kda_state(state);
  EXPECT_TRUE(std::ranges::all_of(state, [](float v) { return v == 4.0f; }));
  cache.close(resumed);
  // Another salt matches nothing.
  SequenceCache other = cache.open(prompt, 11, "another salt", reused);
  EXPECT_EQ(reused, 0);
  cache.close(other);
}

TEST_F(CacheManagerTest, AHitLeavesTheLastPromptTokenToCompute) {
  CacheManager cache = make(16, 8);
  const std::vector<int32_t> prompt = iota_tokens(1, 8);  // exactly two blocks
  compute_prompt(cache, prompt);
  int64_t reused = 0;
  SequenceCache sequence = cache.open(prompt, 8, "", reused);
  EXPECT_EQ(reused, 4);  // the logits of token 8 are needed, so block 2 is recomputed
  cache.close(sequence);
}

TEST_F(CacheManagerTest, AHitStopsAtTheLastBlockWithASnapshot) {
  CacheManager cache = make(16, 1);
  const std::vector<int32_t> prompt = iota_tokens(1, 13);
  compute_prompt(cache, prompt);
  EXPECT_EQ(cache.stats().num_cached_blocks, 3);
  EXPECT_EQ(cache.stats().num_kda_snapshots, 1);
  int64_t reused = 0;
  SequenceCache sequence = cache.open(prompt, 13, "", reused);
  EXPECT_EQ(reused, 12);
  cache.close(sequence);
  // A prompt sharing only two of those blocks finds no snapshot at token 8 and starts from scratch.
  std::vector<int32_t> shorter = iota_tokens(1, 9);
  sequence = cache.open(shorter, 9, "", reused);
  EXPECT_EQ(reused, 0);
  cache.close(sequence);
  // Computing it snapshots the shared block ending at token 8, reusing the pool's only snapshot: now both prompts
  // resume at token 8.
  compute_prompt(cache, shorter);
  EXPECT_EQ(cache.stats().num_kda_snapshots, 1);
  sequence = cache.open(shorter, 9, "", reused);
  EXPECT_EQ(reused, 8);
  cache.close(sequence);
  sequence = cache.open(prompt, 13, "", reused);
  EXPECT_EQ(reused, 8);
  cache.close(sequence);
}

TEST_F(CacheManagerTest, EvictedBlocksAndTheirSnapshotsAreNoLongerHit) {
  CacheManager cache = make(4, 8);
  compute_prompt(cache, iota_tokens(1, 9));  // caches blocks of tokens [0,8)
  compute_prompt(cache, iota_tokens(50, 16));  // needs all 4 blocks: evicts the first prompt's
  EXPECT_EQ(cache.stats().num_free_blocks, 4);
  EXPECT_EQ(cache.stats().num_cached_blocks, 4);
  int64_t reused = 0;
  SequenceCache sequence = cache.open(iota_tokens(1, 9), 9, "", reused);
  EXPECT_EQ(reused, 0);
  cache.close(sequence);
  EXPECT_EQ(cache.stats().num_kda_snapshots, 1);  // the second prompt's; the first one's went with its block
}

TEST_F(CacheManagerTest, AllocateRefusesWithoutGrantingWhenBlocksRunOut) {
  CacheManager cache = make(4, 8, false);
  int64_t reused = 0;
  SequenceCache a = cache.open(iota_tokens(1, 12), 12, "", reused);
  ASSERT_TRUE(cache.allocate(a, 12));
  SequenceCache b = cache.open(iota_tokens(1, 8), 8, "", reused);
  EXPECT_EQ(reused, 0);  // prefix caching off
  EXPECT_FALSE(cache.allocate(b, 8));
  EXPECT_EQ(b.state->blocks().size(), 0);
  EXPECT_TRUE(cache.allocate(b, 4));
  EXPECT_EQ(cache.stats().num_free_blocks, 0);
  EXPECT_EQ(cache.num_free_slots(), 0);
  cache.close(a);
  EXPECT_EQ(cache.stats().num_free_blocks, 3);
  EXPECT_EQ(cache.num_free_slots(), 1);
  cache.close(b);
}

TEST_F(CacheManagerTest, HitCountersCountWhatTheCallerRecords) {
  CacheManager cache = make(16, 8);
  cache.record_prefix_query(11, 0);
  cache.record_prefix_query(11, 8);
  EXPECT_EQ(cache.stats().prefix_cache_queries, 22);
  EXPECT_EQ(cache.stats().prefix_cache_hits, 8);
}

}  // namespace
}  // namespace kestrel

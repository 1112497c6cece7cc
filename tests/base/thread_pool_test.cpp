// ThreadPool::parallel_for: every index is visited exactly once, by disjoint contiguous ranges that honour
// min_chunk, for many sizes and thread counts.
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace kestrel {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7, 16}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 5, 16, 17, 100, 1000, 12345}) {
      for (int64_t min_chunk : {1, 3, 64, 100000}) {
        std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
        std::mutex mutex;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        pool.parallel_for(
            n,
            [&](int64_t begin, int64_t end) {
              for (int64_t i = begin; i < end; ++i) visits[static_cast<size_t>(i)]++;
              std::lock_guard lock(mutex);
              ranges.emplace_back(begin, end);
            },
            min_chunk);
        const std::string where = "threads " + std::to_string(threads) + " n " + std::to_string(n) + " min_chunk " +
                                  std::to_string(min_chunk);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[static_cast<size_t>(i)].load(), 1) << where << " index " << i;
        if (n == 0) {
          EXPECT_TRUE(ranges.empty()) << where;
          continue;
        }
        std::sort(ranges.begin(), ranges.end());
        EXPECT_LE(ranges.size(), static_cast<size_t>(threads)) << where;
        int64_t expected_begin = 0;
        for (const auto& [begin, end] : ranges) {
          EXPECT_EQ(begin, expected_begin) << where;
          EXPECT_GT(end, begin) << where;
          if (n >= min_chunk) {
            EXPECT_GE(end - begin, min_chunk) << where;
          }
          expected_begin = end;
        }
        EXPECT_EQ(expected_begin, n) << where;
      }
    }
  }
}

TEST(ThreadPoolTest, ReusableAcrossManyCalls) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  for (int call = 0; call < 500; ++call) {
    pool.parallel_for(37, [&](int64_t begin, int64_t end) { total += end - begin; });
  }
  EXPECT_EQ(total.load(), 500 * 37);
}

TEST(ThreadPoolTest, NonPositiveThreadCountMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int64_t covered = 0;
  pool.parallel_for(10, [&](int64_t begin, int64_t end) { covered += end - begin; });
  EXPECT_EQ(covered, 10);
}

}  // namespace
}  // namespace kestrel

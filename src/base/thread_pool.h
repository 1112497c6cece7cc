// A fixed pool of worker threads for data-parallel loops on the CPU backend.
// parallel_for splits [0, n) into contiguous ranges, one per worker, and returns when all are done. Each range is
// computed by exactly one thread in a fixed order, so results do not depend on timing (and, for reductions kept
// inside one range, not on the thread count either). A forward calls it for every op, often a few microseconds of
// work each, so waiting threads spin briefly before they sleep: a worker woken through the condition variable for
// each op spent more time in the kernel's scheduler than in the op.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kestrel {

class ThreadPool {
public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) on disjoint ranges covering [0, n). Ranges hold at least min_chunk items.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& body, int64_t min_chunk = 1);

  // The process-wide pool; its size is KESTREL_THREADS, else the number of hardware threads.
  static ThreadPool& global();

private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0;
  int num_ranges_ = 0;
  // Written under mutex_; atomic so that the spinning threads can read them without it.
  std::atomic<int> pending_ = 0;
  std::atomic<uint64_t> generation_ = 0;
  std::atomic<bool> stopping_ = false;
};

}  // namespace kestrel

#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>

namespace kestrel {

namespace {

struct Range {
  int64_t begin, end;
};

Range range_of(int64_t n, int num_ranges, int index) {
  const int64_t base = n / num_ranges, extra = n % num_ranges;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

// Set while a thread runs a parallel_for body: a nested parallel_for then runs serially instead of deadlocking.
thread_local bool inside_parallel_body = false;

// How long a waiting thread polls before it sleeps on the condition variable: longer than the gap between two ops
// of a forward, short enough that an idle pool costs nothing measurable.
constexpr auto kSpinTime = std::chrono::microseconds(100);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `done` for up to kSpinTime; true when it held.
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= deadline) return false;
    cpu_relax();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(num_threads, 1) - 1;
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body, int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t max_ranges = std::max<int64_t>(1, n / std::max<int64_t>(min_chunk, 1));
  const int ranges = static_cast<int>(std::min<int64_t>(num_threads(), max_ranges));
  if (ranges == 1 || inside_parallel_body) {
    body(0, n);
    return;
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    n_ = n;
    num_ranges_ = ranges;
    pending_ = ranges - 1;
    ++generation_;
  }
  work_ready_.notify_all();
  inside_parallel_body = true;
  try {
    const Range own = range_of(n, ranges, 0);
    body(own.begin, own.end);
  } catch (...) {
    error = std::current_exception();
  }
  inside_parallel_body = false;
  const auto finished = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished)) {
    std::unique_lock lock(mutex_);
    work_done_.wait(lock, finished);
  }
  std::lock_guard lock(mutex_);
  body_ = nullptr;
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const auto woken = [&] { return stopping_.load(std::memory_order_acquire) || generation_.load() != seen; };
    (void)spin_until(woken);
    std::unique_lock lock(mutex_);
    work_ready_.wait(lock, woken);
    if (stopping_) return;
    seen = generation_;
    if (index >= num_ranges_) continue;
    const auto* body = body_;
    const Range range = range_of(n_, num_ranges_, index);
    lock.unlock();
    // Kernels called here do not throw on valid shapes; a throw would be a bug, so terminate loudly.
    inside_parallel_body = true;
    (*body)(range.begin, range.end);
    inside_parallel_body = false;
    lock.lock();
    if (--pending_ == 0) work_done_.notify_one();
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("KESTREL_THREADS")) {
      const int requested = std::atoi(env);
      if (requested > 0) return requested;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

}  // namespace kestrel

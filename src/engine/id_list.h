// An ordered set of small integer ids [0, capacity) as a doubly linked list threaded through two arrays: O(1)
// append, removal from anywhere and access to the oldest. The engine keeps free blocks and snapshots in use in
// least-recently-used order with it.
#pragma once

#include <cstdint>
#include <vector>

namespace kestrel {

class IdList {
public:
  explicit IdList(int64_t capacity)
      : next_(static_cast<size_t>(capacity) + 1, kAbsent), prev_(static_cast<size_t>(capacity) + 1, kAbsent) {
    next_[sentinel()] = prev_[sentinel()] = static_cast<int32_t>(capacity);
  }

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(int32_t id) const { return next_[static_cast<size_t>(id)] != kAbsent; }
  int32_t front() const { return next_[sentinel()]; }

  void push_back(int32_t id) {
    const int32_t last = prev_[sentinel()];
    next_[static_cast<size_t>(last)] = id;
    prev_[static_cast<size_t>(id)] = last;
    next_[static_cast<size_t>(id)] = static_cast<int32_t>(sentinel());
    prev_[sentinel()] = id;
    ++size_;
  }

  void remove(int32_t id) {
    const int32_t before = prev_[static_cast<size_t>(id)], after = next_[static_cast<size_t>(id)];
    next_[static_cast<size_t>(before)] = after;
    prev_[static_cast<size_t>(after)] = before;
    next_[static_cast<size_t>(id)] = prev_[static_cast<size_t>(id)] = kAbsent;
    --size_;
  }

private:
  static constexpr int32_t kAbsent = -1;
  size_t sentinel() const { return next_.size() - 1; }

  std::vector<int32_t> next_, prev_;  // index capacity is the sentinel
  int64_t size_ = 0;
};

}  // namespace kestrel

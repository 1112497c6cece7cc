#include "engine/kda_snapshot_pool.h"

namespace kestrel {

KdaSnapshotPool::KdaSnapshotPool(int64_t capacity, int64_t floats_per_snapshot)
    : floats_(floats_per_snapshot), storage_(static_cast<size_t>(capacity)), lru_(capacity) {
  for (auto id = static_cast<int32_t>(capacity); id-- > 0;) unused_.push_back(id);
}

std::optional<int32_t> KdaSnapshotPool::acquire() {
  int32_t id;
  if (!unused_.empty()) {
    id = unused_.back();
    unused_.pop_back();
  } else if (!lru_.empty()) {
    id = lru_.front();
    lru_.remove(id);
    if (evict_hook_) evict_hook_(id);
  } else {
    return std::nullopt;
  }
  auto& storage = storage_[static_cast<size_t>(id)];
  if (!storage) storage = std::make_unique<float[]>(static_cast<size_t>(floats_));
  return id;
}

void KdaSnapshotPool::unpin(int32_t id) { lru_.push_back(id); }

void KdaSnapshotPool::touch(int32_t id) {
  lru_.remove(id);
  lru_.push_back(id);
}

void KdaSnapshotPool::release(int32_t id) {
  if (lru_.contains(id)) lru_.remove(id);
  unused_.push_back(id);
}

std::span<float> KdaSnapshotPool::data(int32_t id) {
  return {storage_[static_cast<size_t>(id)].get(), static_cast<size_t>(floats_)};
}

}  // namespace kestrel

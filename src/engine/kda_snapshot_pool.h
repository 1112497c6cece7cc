// Copies of a sequence's KDA state (conv + recurrent, every KDA layer) taken at block boundaries of prompts. The
// recurrent state summarises the whole prefix and is not paged, so a prefix-cache hit must load the copy taken at the
// boundary it resumes from. A fixed number of snapshots, each made when first used; once all are in use, the least
// recently used one is reused. A snapshot being written in the current step is pinned and never reused meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/id_list.h"

namespace kestrel {

class KdaSnapshotPool {
public:
  KdaSnapshotPool(int64_t capacity, int64_t floats_per_snapshot);

  int64_t capacity() const { return static_cast<int64_t>(storage_.size()); }
  int64_t num_in_use() const { return capacity() - static_cast<int64_t>(unused_.size()); }

  // A pinned snapshot to write; reuses the least recently used unpinned one (the evict hook hears of it first).
  // nullopt when every snapshot is pinned.
  std::optional<int32_t> acquire();
  // Written: now the most recently used, and reusable.
  void unpin(int32_t id);
  // Read by a hit: the most recently used.
  void touch(int32_t id);
  void release(int32_t id);
  std::span<float> data(int32_t id);

  void set_evict_hook(std::function<void(int32_t id)> hook) { evict_hook_ = std::move(hook); }

private:
  int64_t floats_;
  std::vector<std::unique_ptr<float[]>> storage_;
  std::vector<int32_t> unused_;
  IdList lru_;  // in use and unpinned, least recently used first
  std::function<void(int32_t)> evict_hook_;
};

}  // namespace kestrel

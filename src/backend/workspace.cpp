#include "backend/workspace.h"

#include <algorithm>
#include <limits>

#include "backend/backend.h"
#include "base/error.h"

namespace kestrel {

namespace {

constexpr size_t kAlignFloats = 16;            // 64 bytes: vector loads and cache lines
constexpr size_t kMinChunkFloats = size_t{1} << 16;

size_t aligned(size_t count) { return (count + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

float* Workspace::floats(int64_t count) {
  require(count >= 0, "workspace request for {} floats", count);
  const size_t size = aligned(static_cast<size_t>(count));
  // Move on to the next chunk until one has room; a kept chunk too small for the request is replaced.
  while (chunks_.empty() || chunks_[current_].used + size > chunks_[current_].array.size()) {
    const size_t next = chunks_.empty() ? 0 : current_ + 1;
    if (next < chunks_.size() && chunks_[next].array.size() < size) {
      chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(next));
    }
    if (next == chunks_.size()) {
      const size_t previous = chunks_.empty() ? 0 : chunks_.back().array.size();
      const size_t capacity = std::max({size, 2 * previous, kMinChunkFloats});
      chunks_.push_back(Chunk{.array = BackendArray(backend_, capacity), .used = 0});
    }
    current_ = next;
  }
  Chunk& chunk = chunks_[current_];
  float* out = chunk.array.data() + chunk.used;
  chunk.used += size;
#ifndef NDEBUG
  backend_.fill(out, count, std::numeric_limits<float>::quiet_NaN());
#endif
  return out;
}

void Workspace::rewind(size_t chunk, size_t used) {
  for (size_t i = chunk + 1; i < chunks_.size(); ++i) chunks_[i].used = 0;
  if (chunk < chunks_.size()) chunks_[chunk].used = used;
  current_ = chunk;
}

size_t Workspace::capacity() const {
  size_t total = 0;
  for (const Chunk& chunk : chunks_) total += chunk.array.size();
  return total;
}

}  // namespace kestrel

#include "engine/paged_rows.h"

#include <algorithm>
#include <utility>

#include "backend/backend.h"
#include "base/error.h"

namespace kestrel {

int32_t GrowingBlockSource::allocate() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<int32_t>(references_.size());
    references_.push_back(0);
  }
  references_[static_cast<size_t>(id)] = 1;
  return id;
}

void GrowingBlockSource::retain(int32_t block) { ++references_[static_cast<size_t>(block)]; }

void GrowingBlockSource::release(int32_t block) {
  if (--references_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

RowBlockPool::RowBlockPool(Backend& backend, RowFormat format, int64_t block_rows, int64_t num_blocks)
    : backend_(backend), format_(format), block_rows_(block_rows), fixed_(num_blocks > 0) {
  if (fixed_) reserve_blocks(num_blocks);
}

void RowBlockPool::reserve_blocks(int64_t num_blocks) {
  if (num_blocks <= capacity_blocks_) return;
  require(!fixed_ || capacity_blocks_ == 0, "block id {} is outside the cache's {} blocks", num_blocks - 1,
          capacity_blocks_);
  const int64_t capacity = fixed_ ? num_blocks : std::max(num_blocks, 2 * capacity_blocks_);
  BackendArray grown(backend_, static_cast<size_t>((capacity * block_bytes() + 3) / 4));
  if (capacity_blocks_ > 0) {
    backend_.copy(grown.data(), storage_.data(), static_cast<size_t>(capacity_blocks_ * block_bytes()));
  }
  storage_ = std::move(grown);
  capacity_blocks_ = capacity;
}

void BlockTable::grow_to(int64_t num_blocks) {
  const size_t from = ids_.size();
  while (size() < num_blocks) ids_.push_back(source_->allocate());
  mirror_from(from);
}

void BlockTable::share(std::span<const int32_t> blocks) {
  const size_t from = ids_.size();
  for (const int32_t id : blocks) {
    source_->retain(id);
    ids_.push_back(id);
  }
  mirror_from(from);
}

void BlockTable::mirror_from(size_t from) {
  if (ids_.size() > mirror_.size()) {
    BackendArray grown(*backend_, std::max<size_t>({ids_.size(), 2 * mirror_.size(), 16}));
    if (from > 0) backend_->copy(grown.int32s(), mirror_.int32s(), from * sizeof(int32_t));
    mirror_ = std::move(grown);
  }
  if (ids_.size() > from) {
    backend_->copy_to_backend(mirror_.int32s() + from, ids_.data() + from, (ids_.size() - from) * sizeof(int32_t));
  }
}

void BlockTable::clear() {
  // Last block first: an evicting source then reuses a sequence's tail before the prefix other prompts may share.
  while (!ids_.empty()) {
    source_->release(ids_.back());
    ids_.pop_back();
  }
}

float* PagedRows::append() { return append_run(1).rows; }

RowRun PagedRows::append_run(int64_t count) {
  const int64_t first = num_rows_;
  const int64_t taken = append_block(count);
  return RowRun{.rows = row(first), .count = taken};
}

int64_t PagedRows::append_block(int64_t count) {
  const int64_t block_rows = pool_->block_rows();
  const int64_t block_index = num_rows_ / block_rows;
  if (block_index >= table_->size()) table_->grow_to(block_index + 1);
  pool_->reserve_blocks(table_->ids()[static_cast<size_t>(block_index)] + int64_t{1});
  const int64_t taken = std::min(count, block_rows - num_rows_ % block_rows);
  num_rows_ += taken;
  return taken;
}

int64_t PagedRows::append_rows(int64_t count) {
  const int64_t first = num_rows_;
  for (int64_t left = count; left > 0;) left -= append_block(left);
  return first;
}

std::byte* PagedRows::row_bytes(int64_t index) {
  const int64_t block_rows = pool_->block_rows();
  return pool_->block(table_->ids()[static_cast<size_t>(index / block_rows)]) +
         (index % block_rows) * pool_->format().row_bytes();
}

const std::byte* PagedRows::row_bytes(int64_t index) const {
  const int64_t block_rows = pool_->block_rows();
  return std::as_const(*pool_).block(table_->ids()[static_cast<size_t>(index / block_rows)]) +
         (index % block_rows) * pool_->format().row_bytes();
}

float* PagedRows::as_floats(std::byte* row) const {
  require(pool_->format().dtype == CacheDtype::float32, "a {} cache row read as float32",
          cache_dtype_name(pool_->format().dtype));
  return reinterpret_cast<float*>(row);
}

const float* PagedRows::as_floats(const std::byte* row) const { return as_floats(const_cast<std::byte*>(row)); }

}  // namespace kestrel

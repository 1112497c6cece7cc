#include "engine/paged_rows.h"

#include <utility>

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

RowBlockPool::RowBlockPool(int64_t row_width, int64_t block_rows, int64_t num_blocks)
    : row_width_(row_width), block_rows_(block_rows), blocks_(static_cast<size_t>(num_blocks)) {}

float* RowBlockPool::block(int32_t id) {
  const auto index = static_cast<size_t>(id);
  if (index >= blocks_.size()) blocks_.resize(index + 1);
  if (!blocks_[index]) blocks_[index] = std::make_unique<float[]>(static_cast<size_t>(row_width_ * block_rows_));
  return blocks_[index].get();
}

void BlockTable::grow_to(int64_t num_blocks) {
  while (size() < num_blocks) ids_.push_back(source_->allocate());
}

void BlockTable::share(std::span<const int32_t> blocks) {
  for (const int32_t id : blocks) {
    source_->retain(id);
    ids_.push_back(id);
  }
}

void BlockTable::clear() {
  // Last block first: an evicting source then reuses a sequence's tail before the prefix other prompts may share.
  while (!ids_.empty()) {
    source_->release(ids_.back());
    ids_.pop_back();
  }
}

float* PagedRows::append() {
  const int64_t block_index = num_rows_ / pool_->block_rows();
  if (block_index >= table_->size()) table_->grow_to(block_index + 1);
  return row(num_rows_++);
}

float* PagedRows::row(int64_t index) {
  const int64_t block_rows = pool_->block_rows();
  return pool_->block(table_->ids()[static_cast<size_t>(index / block_rows)]) + (index % block_rows) * row_width();
}

const float* PagedRows::row(int64_t index) const {
  const int64_t block_rows = pool_->block_rows();
  const float* block = std::as_const(*pool_).block(table_->ids()[static_cast<size_t>(index / block_rows)]);
  return block + (index % block_rows) * row_width();
}

}  // namespace kestrel

#include "engine/paged_rows.h"

#include <utility>

namespace kestrel {

int32_t RowBlockPool::allocate() {
  if (!free_.empty()) {
    const int32_t index = free_.back();
    free_.pop_back();
    return index;
  }
  blocks_.push_back(std::make_unique<float[]>(static_cast<size_t>(row_width_ * block_rows_)));
  return static_cast<int32_t>(blocks_.size() - 1);
}

void RowBlockPool::release(int32_t block) { free_.push_back(block); }

PagedRows::~PagedRows() { truncate(0); }

PagedRows::PagedRows(PagedRows&& other) noexcept
    : pool_(other.pool_), block_table_(std::move(other.block_table_)), num_rows_(std::exchange(other.num_rows_, 0)) {
  other.block_table_.clear();
}

float* PagedRows::append() {
  if (num_rows_ == static_cast<int64_t>(block_table_.size()) * pool_->block_rows()) {
    block_table_.push_back(pool_->allocate());
  }
  return row(num_rows_++);
}

float* PagedRows::row(int64_t index) {
  const int64_t block_rows = pool_->block_rows();
  return pool_->block(block_table_[static_cast<size_t>(index / block_rows)]) + (index % block_rows) * pool_->row_width();
}

const float* PagedRows::row(int64_t index) const {
  const int64_t block_rows = pool_->block_rows();
  return pool_->block(block_table_[static_cast<size_t>(index / block_rows)]) + (index % block_rows) * pool_->row_width();
}

void PagedRows::truncate(int64_t num_rows) {
  if (num_rows >= num_rows_) return;
  num_rows_ = num_rows;
  const auto blocks_needed = static_cast<size_t>((num_rows + pool_->block_rows() - 1) / pool_->block_rows());
  while (block_table_.size() > blocks_needed) {
    pool_->release(block_table_.back());
    block_table_.pop_back();
  }
}

}  // namespace kestrel

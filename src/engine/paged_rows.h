// Per-token cache rows (MLA latents, indexer keys and gates, pooled indexer keys) kept in fixed-size blocks drawn
// from a shared pool, so that many sequences can share one cache and a scheduler can grant or reclaim memory a block
// at a time. A sequence sees its rows through a block table, like vLLM's paged KV cache.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace kestrel {

// A pool of blocks, each holding `block_rows` rows of `row_width` floats.
class RowBlockPool {
public:
  RowBlockPool(int64_t row_width, int64_t block_rows) : row_width_(row_width), block_rows_(block_rows) {}

  int64_t row_width() const { return row_width_; }
  int64_t block_rows() const { return block_rows_; }

  int32_t allocate();
  void release(int32_t block);
  float* block(int32_t index) { return blocks_[static_cast<size_t>(index)].get(); }
  const float* block(int32_t index) const { return blocks_[static_cast<size_t>(index)].get(); }
  int64_t num_allocated() const { return static_cast<int64_t>(blocks_.size() - free_.size()); }

private:
  int64_t row_width_;
  int64_t block_rows_;
  std::vector<std::unique_ptr<float[]>> blocks_;
  std::vector<int32_t> free_;
};

// One sequence's rows in a pool: append-only, addressed by token position; truncate() supports rollback.
class PagedRows {
public:
  explicit PagedRows(RowBlockPool& pool) : pool_(&pool) {}
  ~PagedRows();
  PagedRows(const PagedRows&) = delete;
  PagedRows& operator=(const PagedRows&) = delete;
  PagedRows(PagedRows&& other) noexcept;
  PagedRows& operator=(PagedRows&&) = delete;

  int64_t size() const { return num_rows_; }
  int64_t row_width() const { return pool_->row_width(); }
  // Appends a row and returns it for the caller to fill.
  float* append();
  float* row(int64_t index);
  const float* row(int64_t index) const;
  void truncate(int64_t num_rows);
  const std::vector<int32_t>& block_table() const { return block_table_; }

private:
  RowBlockPool* pool_;
  std::vector<int32_t> block_table_;
  int64_t num_rows_ = 0;
};

}  // namespace kestrel

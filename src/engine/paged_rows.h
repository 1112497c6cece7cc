// Per-token cache rows (MLA latents, indexer keys and gates, pooled indexer keys) kept in fixed-size blocks, so that
// many sequences share one cache and a scheduler grants or reclaims memory a block at a time, like vLLM's paged KV
// cache. One block id names the same span of tokens in every pool of a cache: block b of a sequence holds its tokens
// [b·block_tokens, (b+1)·block_tokens) — their rows in each layer's latent, indexer-key and gate pools, and the
// pooled keys of the k-pools inside that span in the pooled-key pools (block_tokens / kpool rows per block). A
// sequence's ids form one BlockTable that all of its PagedRows index. A full block can be shared by several sequences
// (prefix caching), so ids are reference-counted by the BlockSource that hands them out.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kestrel {

// Hands out block ids. Not thread-safe: the engine sizes block tables on its own thread before forwards run in
// parallel, so a forward never allocates.
class BlockSource {
public:
  virtual ~BlockSource() = default;
  virtual int32_t allocate() = 0;           // a block with one reference; throws Error when none is left
  virtual void retain(int32_t block) = 0;   // one more reference
  virtual void release(int32_t block) = 0;  // one reference fewer; at zero the id may be handed out again
};

// Ids from 0 up, reused once released, without limit: for a model used outside the engine (kestrel logits, tests).
class GrowingBlockSource final : public BlockSource {
public:
  int32_t allocate() override;
  void retain(int32_t block) override;
  void release(int32_t block) override;

private:
  std::vector<int32_t> references_;  // by id
  std::vector<int32_t> free_;
};

// Storage of one pool: `block_rows` rows of `row_width` floats per block id, created when a block is first written.
// With `num_blocks` given, the table of blocks never grows, so forwards on different sequences (different blocks) may
// create storage concurrently.
class RowBlockPool {
public:
  RowBlockPool(int64_t row_width, int64_t block_rows, int64_t num_blocks = 0);

  int64_t row_width() const { return row_width_; }
  int64_t block_rows() const { return block_rows_; }

  float* block(int32_t id);
  const float* block(int32_t id) const { return blocks_[static_cast<size_t>(id)].get(); }

private:
  int64_t row_width_;
  int64_t block_rows_;
  std::vector<std::unique_ptr<float[]>> blocks_;  // by id; null until first written
};

// The block ids of one sequence in token order, shared by all of its PagedRows. Holds one reference per block.
class BlockTable {
public:
  explicit BlockTable(BlockSource& source) : source_(&source) {}
  ~BlockTable() { clear(); }
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  const std::vector<int32_t>& ids() const { return ids_; }
  int64_t size() const { return static_cast<int64_t>(ids_.size()); }

  // Grows to `num_blocks` blocks with fresh ids (no-op when already that long).
  void grow_to(int64_t num_blocks);
  // Appends blocks another sequence filled, taking a reference on each.
  void share(std::span<const int32_t> blocks);
  // Releases every block.
  void clear();

private:
  BlockSource* source_;
  std::vector<int32_t> ids_;
};

// One sequence's rows in one pool, appended in order; row r lives in block table entry r / pool.block_rows().
class PagedRows {
public:
  PagedRows(RowBlockPool& pool, BlockTable& table) : pool_(&pool), table_(&table) {}

  int64_t size() const { return num_rows_; }
  int64_t row_width() const { return pool_->row_width(); }
  // Appends a row and returns it for the caller to fill; grows the table when the row starts a new block.
  float* append();
  float* row(int64_t index);
  const float* row(int64_t index) const;
  // Sets the number of valid rows: shrinking forgets rows, growing adopts rows already in the table's blocks.
  void resize(int64_t num_rows) { num_rows_ = num_rows; }

private:
  RowBlockPool* pool_;
  BlockTable* table_;
  int64_t num_rows_ = 0;
};

}  // namespace kestrel

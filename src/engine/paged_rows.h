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

#include "backend/backend_array.h"
#include "engine/cache_row_format.h"

namespace kestrel {

class Backend;

// Hands out block ids. Not thread-safe: the engine sizes block tables on its own thread before a forward runs, so a
// forward never allocates.
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

// Storage of one pool in the backend's memory: `block_rows` rows of `format` per block id, block b at
// bytes() + b * block_rows * format.row_bytes() (one array, so a GPU kernel reaches any block from the base). With
// `num_blocks` given (the engine), the storage is made once and never moves; without, it grows with reserve_blocks,
// which moves it.
class RowBlockPool {
public:
  RowBlockPool(Backend& backend, RowFormat format, int64_t block_rows, int64_t num_blocks = 0);
  // float32 rows of `row_width`.
  RowBlockPool(Backend& backend, int64_t row_width, int64_t block_rows, int64_t num_blocks = 0)
      : RowBlockPool(backend, RowFormat{.width = row_width}, block_rows, num_blocks) {}

  const RowFormat& format() const { return format_; }
  int64_t row_width() const { return format_.width; }
  int64_t block_rows() const { return block_rows_; }
  int64_t capacity_blocks() const { return capacity_blocks_; }
  // Makes room for block ids below `num_blocks`, keeping the rows written (growing a fixed pool is an Error).
  void reserve_blocks(int64_t num_blocks);

  std::byte* bytes() { return reinterpret_cast<std::byte*>(storage_.data()); }
  const std::byte* bytes() const { return reinterpret_cast<const std::byte*>(storage_.data()); }
  std::byte* block(int32_t id) { return bytes() + id * block_bytes(); }
  const std::byte* block(int32_t id) const { return bytes() + id * block_bytes(); }

private:
  int64_t block_bytes() const { return format_.row_bytes() * block_rows_; }

  Backend& backend_;
  RowFormat format_;
  int64_t block_rows_;
  bool fixed_;
  int64_t capacity_blocks_ = 0;
  BackendArray storage_;
};

// The block ids of one sequence in token order, shared by all of its PagedRows. Holds one reference per block. The
// ids are mirrored in the backend's memory for kernels that walk the table.
class BlockTable {
public:
  BlockTable(BlockSource& source, Backend& backend) : source_(&source), backend_(&backend) {}
  ~BlockTable() { clear(); }
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  const std::vector<int32_t>& ids() const { return ids_; }
  int64_t size() const { return static_cast<int64_t>(ids_.size()); }
  // ids() in the backend's memory.
  const int32_t* backend_ids() const { return mirror_.int32s(); }

  // Grows to `num_blocks` blocks with fresh ids (no-op when already that long).
  void grow_to(int64_t num_blocks);
  // Appends blocks another sequence filled, taking a reference on each.
  void share(std::span<const int32_t> blocks);
  // Releases every block.
  void clear();

private:
  // Copies ids [from, size) to the mirror, growing it as needed.
  void mirror_from(size_t from);

  BlockSource* source_;
  Backend* backend_;
  std::vector<int32_t> ids_;
  BackendArray mirror_;
};

// A run of float32 rows that are consecutive in memory: rows of one block.
struct RowRun {
  float* rows;
  int64_t count;
};

// One sequence's rows in one pool, appended in order; row r lives in block table entry r / pool.block_rows().
class PagedRows {
public:
  PagedRows(RowBlockPool& pool, BlockTable& table) : pool_(&pool), table_(&table) {}

  int64_t size() const { return num_rows_; }
  int64_t row_width() const { return pool_->row_width(); }
  const RowFormat& format() const { return pool_->format(); }
  const RowBlockPool& pool() const { return *pool_; }
  const BlockTable& table() const { return *table_; }
  // Appends a row and returns it for the caller to fill; grows the table (and a growing pool) when the row starts a
  // new block.
  float* append();
  // Appends up to `count` rows, as many as fit in the current block, and returns them.
  RowRun append_run(int64_t count);
  // Appends `count` rows across as many blocks as they take, for Backend::write_rows to fill in one pass; returns
  // the first one's index.
  int64_t append_rows(int64_t count);
  // A row as floats: float32 pools only (append, append_run and row are an Error on any other format).
  float* row(int64_t index) { return as_floats(row_bytes(index)); }
  const float* row(int64_t index) const { return as_floats(row_bytes(index)); }
  // A row's stored bytes, any format.
  std::byte* row_bytes(int64_t index);
  const std::byte* row_bytes(int64_t index) const;
  // Sets the number of valid rows: shrinking forgets rows, growing adopts rows already in the table's blocks.
  void resize(int64_t num_rows) { num_rows_ = num_rows; }

private:
  // Appends up to `count` rows, as many as fit in the current block; returns how many.
  int64_t append_block(int64_t count);
  float* as_floats(std::byte* row) const;
  const float* as_floats(const std::byte* row) const;

  RowBlockPool* pool_;
  BlockTable* table_;
  int64_t num_rows_ = 0;
};

}  // namespace kestrel

// Everything one sequence carries between forward calls. KDA layers keep fixed-size state (the last K-1 convolution
// inputs and the [heads, head_dim, head_dim] recurrent state) — the unit the engine keeps in a slot pool and
// snapshots at block boundaries for prefix caching. DSA layers keep per-token rows in paged blocks: the MLA latent
// (kv_lora_rank), the indexer key and compression gate (index_head_dim each) and one pooled key per complete k-pool;
// one block table, shared by all layers, says which blocks hold them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend_array.h"
#include "engine/paged_rows.h"
#include "formats/glm5_next_config.h"

namespace kestrel {

class Backend;

// In the backend's memory.
struct KdaLayerState {
  BackendArray conv;       // [3 (q, k, v), kernel - 1, heads * head_dim]
  BackendArray recurrent;  // [heads, head_dim (k), head_dim (v)]
};

struct MlaLayerState {
  PagedRows latents;      // [tokens, kv_lora_rank]
  PagedRows index_keys;   // [tokens, index_head_dim]   (full indexer layers only)
  PagedRows index_gates;  // [tokens, index_head_dim]
  PagedRows pooled_keys;  // [complete pools, index_head_dim]
};

// Block pools shared by all sequences of a model, one set per DSA layer (main layers only), in the backend's memory.
// A block holds `block_tokens` tokens, a multiple of index_kpool so that a k-pool never straddles two blocks.
class CachePools {
public:
  // Ids from a source of its own, without limit, in blocks of about 16 tokens (a model used outside the engine).
  CachePools(const Glm5NextConfig& config, Backend& backend, CacheDtype latent_dtype = CacheDtype::float32);
  // Ids [0, num_blocks) from `source` (the engine's block pool); the pools' storage is made here, once.
  CachePools(const Glm5NextConfig& config, Backend& backend, int64_t block_tokens, BlockSource& source,
             int64_t num_blocks, CacheDtype latent_dtype);

  int64_t block_tokens() const { return block_tokens_; }
  BlockSource& source() { return *source_; }
  // Bytes one block id takes across every pool of `config`, the latents' rows in `latent_dtype`.
  static size_t block_bytes(const Glm5NextConfig& config, int64_t block_tokens, CacheDtype latent_dtype);
  Backend& backend() { return backend_; }

  std::vector<std::unique_ptr<RowBlockPool>> latents, index_keys, index_gates, pooled_keys;  // indexed by layer

private:
  void add_layers(const Glm5NextConfig& config, int64_t num_blocks, CacheDtype latent_dtype);

  Backend& backend_;
  int64_t block_tokens_;
  std::unique_ptr<BlockSource> own_source_;
  BlockSource* source_;
};

class SequenceState {
public:
  SequenceState(const Glm5NextConfig& config, CachePools& pools);
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t block_tokens() const { return block_tokens_; }
  void advance(int64_t tokens) { num_tokens_ += tokens; }

  KdaLayerState& kda(int64_t layer) { return kda_[static_cast<size_t>(layer)]; }
  MlaLayerState& mla(int64_t layer) { return *mla_[static_cast<size_t>(layer)]; }

  // For the engine: slots reused across requests, prefix caching and preemption.
  const BlockTable& blocks() const { return blocks_; }
  // Grows the block table (and growing pools) to hold `num_tokens` tokens, so that no op of a forward allocates.
  void reserve(int64_t num_tokens);
  // Starts an empty sequence on a prefix other sequences computed: shares `blocks` (full ones) and sets every row
  // count as a forward over their tokens leaves it. The KDA state of that boundary is the caller's to load.
  void resume_on(std::span<const int32_t> blocks);
  // Empty again: blocks released, KDA state zeroed.
  void reset();

  // The KDA state of all KDA layers as one flat host array (conv, then recurrent, layer by layer) of this many
  // floats.
  static int64_t kda_state_size(const Glm5NextConfig& config);
  void save_kda_state(std::span<float> out) const;
  void load_kda_state(std::span<const float> in);

private:
  void zero_kda_state();

  Backend& backend_;
  std::vector<RowBlockPool*> pools_;  // every pool the table's ids index, for reserve
  int64_t num_tokens_ = 0;
  int64_t block_tokens_;
  int64_t kpool_;
  int64_t kda_state_size_;
  BlockTable blocks_;
  std::vector<KdaLayerState> kda_;                    // empty entries for DSA layers
  std::vector<std::unique_ptr<MlaLayerState>> mla_;   // null for KDA layers
  std::vector<bool> full_indexer_;                    // DSA layers that append indexer rows
};

}  // namespace kestrel

// Everything one sequence carries between forward calls. KDA layers keep fixed-size state (the last K-1 convolution
// inputs and the [heads, head_dim, head_dim] recurrent state) — the unit a later engine keeps in a slot pool and
// snapshots for prefix caching and speculative rollback. DSA layers keep per-token rows in paged blocks: the MLA
// latent (kv_lora_rank), the indexer key and compression gate (index_head_dim each) and one pooled key per complete
// k-pool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/paged_rows.h"
#include "formats/glm5_next_config.h"

namespace kestrel {

struct KdaLayerState {
  std::vector<float> conv;       // [3 (q, k, v), kernel - 1, heads * head_dim]
  std::vector<float> recurrent;  // [heads, head_dim (k), head_dim (v)]
};

struct MlaLayerState {
  PagedRows latents;      // [tokens, kv_lora_rank]
  PagedRows index_keys;   // [tokens, index_head_dim]   (full indexer layers only)
  PagedRows index_gates;  // [tokens, index_head_dim]
  PagedRows pooled_keys;  // [complete pools, index_head_dim]
};

// Block pools shared by all sequences of a model, one set per DSA layer (main layers only).
struct CachePools {
  explicit CachePools(const Glm5NextConfig& config, int64_t block_tokens = 16);
  std::vector<std::unique_ptr<RowBlockPool>> latents, index_keys, index_gates, pooled_keys;  // indexed by layer
};

class SequenceState {
public:
  SequenceState(const Glm5NextConfig& config, CachePools& pools);

  int64_t num_tokens() const { return num_tokens_; }
  void advance(int64_t tokens) { num_tokens_ += tokens; }

  KdaLayerState& kda(int64_t layer) { return kda_[static_cast<size_t>(layer)]; }
  MlaLayerState& mla(int64_t layer) { return *mla_[static_cast<size_t>(layer)]; }

private:
  int64_t num_tokens_ = 0;
  std::vector<KdaLayerState> kda_;                    // empty entries for DSA layers
  std::vector<std::unique_ptr<MlaLayerState>> mla_;   // null for KDA layers
};

}  // namespace kestrel

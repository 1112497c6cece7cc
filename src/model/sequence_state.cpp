#include "model/sequence_state.h"

namespace kestrel {

CachePools::CachePools(const Glm5NextConfig& c, int64_t block_tokens) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool dsa = c.layer_types[static_cast<size_t>(i)] == LayerType::sparse_attention;
    latents.push_back(dsa ? std::make_unique<RowBlockPool>(c.kv_lora_rank, block_tokens) : nullptr);
    index_keys.push_back(dsa ? std::make_unique<RowBlockPool>(c.index_head_dim, block_tokens) : nullptr);
    index_gates.push_back(dsa ? std::make_unique<RowBlockPool>(c.index_head_dim, block_tokens) : nullptr);
    pooled_keys.push_back(dsa ? std::make_unique<RowBlockPool>(c.index_head_dim, block_tokens) : nullptr);
  }
}

SequenceState::SequenceState(const Glm5NextConfig& c, CachePools& pools) {
  const int64_t channels = c.linear_num_heads * c.linear_head_dim;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto layer = static_cast<size_t>(i);
    if (c.layer_types[layer] == LayerType::linear_attention) {
      kda_.push_back(KdaLayerState{
          .conv = std::vector<float>(static_cast<size_t>(3 * (c.linear_conv_kernel_dim - 1) * channels), 0.0f),
          .recurrent = std::vector<float>(static_cast<size_t>(channels * c.linear_head_dim), 0.0f)});
      mla_.push_back(nullptr);
    } else {
      kda_.emplace_back();
      mla_.push_back(std::make_unique<MlaLayerState>(
          MlaLayerState{.latents = PagedRows(*pools.latents[layer]),
                        .index_keys = PagedRows(*pools.index_keys[layer]),
                        .index_gates = PagedRows(*pools.index_gates[layer]),
                        .pooled_keys = PagedRows(*pools.pooled_keys[layer])}));
    }
  }
}

}  // namespace kestrel

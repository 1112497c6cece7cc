// The glm5_next text model's weights, bound by name from a checkpoint (names as the official release stores them,
// under `model.language_model.`). Matrices stay memory-mapped in their on-disk format (LinearWeight); small vectors
// (norms, biases, gates' parameters, convolution taps) are converted to float32. place_glm5_next_weights then hands
// what the forward uses to the backend, which may keep copies in its own memory. Binding checks every shape and dtype
// against the config and accounts for every tensor in the checkpoint: each is bound, or recognised and skipped on
// purpose (the vision tower), or the load fails naming it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "formats/checkpoint.h"
#include "formats/glm5_next_config.h"

namespace kestrel {

struct KdaWeights {
  LinearWeight q_proj, k_proj, v_proj;  // [heads * head_dim, hidden]
  WeightVector q_conv, k_conv, v_conv;  // [heads * head_dim, kernel]
  LinearWeight f_a_proj;                // [head_dim, hidden]
  LinearWeight f_b_proj;                // [heads * head_dim, head_dim]
  WeightVector a_log;                   // [heads]
  WeightVector dt_bias;                 // [heads * head_dim]
  LinearWeight b_proj;                  // [heads, hidden]
  LinearWeight g_a_proj;                // [head_dim, hidden]
  LinearWeight g_b_proj;                // [heads * head_dim, head_dim]
  WeightVector o_norm;                  // [head_dim]
  LinearWeight o_proj;                  // [hidden, heads * head_dim]
};

struct IndexerWeights {
  LinearWeight wq_b;                    // [index_heads * index_head_dim, q_lora_rank]
  LinearWeight wk;                      // [index_head_dim, hidden]
  WeightVector k_norm_weight, k_norm_bias;  // [index_head_dim] (LayerNorm, eps 1e-6)
  LinearWeight weights_proj;            // [index_heads, hidden]
  WeightVector compress_ape;            // [kpool, index_head_dim]
  LinearWeight compress_gate;           // [index_head_dim, hidden]
};

struct MlaWeights {
  LinearWeight q_a_proj;                // [q_lora_rank, hidden]
  WeightVector q_a_norm;                // [q_lora_rank]
  LinearWeight q_b_proj;                // [heads * qk_head_dim, q_lora_rank]
  LinearWeight kv_a_proj;               // [kv_lora_rank, hidden] (NoPE: no rope rows)
  WeightVector kv_a_norm;               // [kv_lora_rank]
  LinearWeight kv_b_proj;               // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  LinearWeight o_proj;                  // [hidden, heads * v_head_dim]
  std::optional<IndexerWeights> indexer;  // absent on "shared" indexer layers
};

struct MlpWeights {
  LinearWeight gate_proj, up_proj;      // [intermediate, hidden]
  LinearWeight down_proj;               // [hidden, intermediate]
};

struct MoeWeights {
  LinearWeight router;                  // [experts, hidden]
  WeightVector correction_bias;        // [experts]
  std::vector<ExpertWeights> experts;
  std::shared_ptr<const PlacedWeight> placed_experts;  // the backend's form of `experts` (null on the CPU)
  MlpWeights shared;                    // width moe_intermediate_size * n_shared_experts
};

struct LayerWeights {
  LayerType type;
  MlpType mlp_type;
  WeightVector input_norm, post_attention_norm;  // [hidden]
  MhcWeights attn_hc, ffn_hc;
  KdaWeights kda;   // linear_attention layers
  MlaWeights mla;   // sparse_attention layers
  MlpWeights dense; // dense mlp layers
  MoeWeights moe;   // sparse mlp layers
};

// The MTP (next-token prediction) layer: bound and checked so the checkpoint loads whole; used by speculative
// decoding later.
struct MtpLayerWeights {
  WeightVector enorm, hnorm, shared_head_norm, input_norm, post_attention_norm;  // [hidden]
  LinearWeight eh_proj;                 // [hidden, 2 * hidden]
  MlaWeights mla;
  MlpType mlp_type;
  MlpWeights dense;
  MoeWeights moe;
};

struct Glm5NextWeights {
  LinearWeight embed_tokens;            // [vocab, hidden]
  LinearWeight lm_head;                 // [vocab, hidden] (the embedding when tied)
  WeightVector final_norm;              // [hidden]
  std::vector<LayerWeights> layers;
  std::vector<MtpLayerWeights> mtp_layers;
  int64_t num_vision_tensors_skipped = 0;
};

Glm5NextWeights bind_glm5_next_weights(const Checkpoint& checkpoint, const Glm5NextConfig& config);

// Places every weight of the main layers, the embedding, the final norm and the head in the backend (the MTP layer
// stays on the host until speculative decoding uses it).
void place_glm5_next_weights(Glm5NextWeights& weights, const Glm5NextConfig& config, Backend& backend);

}  // namespace kestrel

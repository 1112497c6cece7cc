// The engine's limits, named as vLLM's flags (`--max-model-len`, `--max-num-seqs`, `--max-num-batched-tokens`,
// `--block-size`, `--enable-prefix-caching`, `--gpu-memory-utilization`), their defaults, and the sizing of the cache
// from the device's memory (vLLM's "GPU KV cache size").
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "formats/glm5_next_config.h"

namespace kestrel {

struct EngineConfig {
  int64_t max_model_len = 0;             // prompt + output tokens; 0: the model's max_position_embeddings
  int64_t max_num_seqs = 16;             // sequences running at once (and KDA state slots)
  int64_t max_num_batched_tokens = 2048; // tokens computed per step; at least block_size
  int64_t block_size = 16;               // tokens per cache block and prompt forward call; a multiple of index_kpool
  int64_t num_blocks = 0;                // 0: from the device's memory on a GPU, else max_num_seqs sequences of
                                         // max_model_len capped at 65536 blocks
  double gpu_memory_utilization = 0.9;   // fraction of the GPU's memory the process may hold, cache included
  bool enable_prefix_caching = true;
  CacheDtype kv_cache_dtype = CacheDtype::float32;  // the MLA latents' rows (`--kv-cache-dtype`, auto: float32)
  int64_t num_kda_snapshots = 0;         // 0: 2 per sequence slot
  int64_t max_logprobs = 20;
  std::vector<int32_t> eos_token_ids{};  // end a request unless ignore_eos (config.json and generation_config.json)
};

// Fills the defaults for `model` and checks every limit; throws Error naming the setting at fault. With `memory` (a
// GPU's, read after the weights are placed and a forward ran, so the activations' share is in use) and no block
// count requested, the cache gets what gpu_memory_utilization leaves after the memory in use and the KDA state
// slots: an Error, with the longest context that would fit, when one max_model_len sequence does not.
EngineConfig resolve_engine_config(EngineConfig requested, const Glm5NextConfig& model,
                                   const std::optional<DeviceMemory>& memory = std::nullopt);

// EOS ids of a checkpoint directory: config.json's eos_token_id and generation_config.json's, without repeats.
std::vector<int32_t> model_eos_token_ids(const std::filesystem::path& dir, const Glm5NextConfig& model);

}  // namespace kestrel

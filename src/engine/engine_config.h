// The engine's limits, named as vLLM's flags (`--max-model-len`, `--max-num-seqs`, `--max-num-batched-tokens`,
// `--block-size`, `--enable-prefix-caching`), and their defaults for the CPU backend.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "formats/glm5_next_config.h"

namespace kestrel {

struct EngineConfig {
  int64_t max_model_len = 0;             // prompt + output tokens; 0: the model's max_position_embeddings
  int64_t max_num_seqs = 16;             // sequences running at once (and KDA state slots)
  int64_t max_num_batched_tokens = 2048; // tokens computed per step; at least block_size
  int64_t block_size = 16;               // tokens per cache block and prompt forward call; a multiple of index_kpool
  int64_t num_blocks = 0;                // 0: max_num_seqs sequences of max_model_len, capped at 65536 blocks
  bool enable_prefix_caching = true;
  int64_t num_kda_snapshots = 0;         // 0: 2 per sequence slot
  int64_t max_logprobs = 20;
  bool parallel_sequences = true;        // run short chunks of different sequences in parallel
  std::vector<int32_t> eos_token_ids{};  // end a request unless ignore_eos (config.json and generation_config.json)
};

// Fills the defaults for `model` and checks every limit; throws Error naming the setting at fault.
EngineConfig resolve_engine_config(EngineConfig requested, const Glm5NextConfig& model);

// EOS ids of a checkpoint directory: config.json's eos_token_id and generation_config.json's, without repeats.
std::vector<int32_t> model_eos_token_ids(const std::filesystem::path& dir, const Glm5NextConfig& model);

}  // namespace kestrel

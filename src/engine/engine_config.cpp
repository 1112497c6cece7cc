#include "engine/engine_config.h"

#include <algorithm>

#include "base/error.h"
#include "model/sequence_state.h"
#include "text/tokenizer.h"

namespace kestrel {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The blocks that fit in the device's memory budget (see resolve_engine_config).
int64_t blocks_for_memory(const EngineConfig& c, const Glm5NextConfig& model, const DeviceMemory& memory,
                          int64_t blocks_per_sequence) {
  require(c.gpu_memory_utilization > 0.0 && c.gpu_memory_utilization <= 1.0,
          "gpu_memory_utilization must be in (0, 1], got {}", c.gpu_memory_utilization);
  const double in_use = static_cast<double>(memory.total_bytes - std::min(memory.free_bytes, memory.total_bytes));
  const double slots = static_cast<double>(SequenceState::kda_state_size(model) * sizeof(float)) * static_cast<double>(c.max_num_seqs);
  const double budget = c.gpu_memory_utilization * static_cast<double>(memory.total_bytes) - in_use - slots;
  const auto block_bytes = static_cast<double>(CachePools::block_bytes(model, c.block_size, c.kv_cache_dtype));
  const int64_t blocks = budget > 0 && block_bytes > 0 ? static_cast<int64_t>(budget / block_bytes) : 0;
  if (block_bytes > 0 && blocks < blocks_per_sequence) {
    fail("one sequence of max_model_len {} tokens needs {:.2f} GiB of cache, more than the {:.2f} GiB left for it "
         "({:.0f} % of {:.1f} GiB, {:.2f} GiB in use, {:.2f} GiB of KDA state for {} sequences); the longest "
         "context that fits is {} tokens: lower --max-model-len or --max-num-seqs, or raise "
         "--gpu-memory-utilization",
         c.max_model_len, static_cast<double>(blocks_per_sequence) * block_bytes / kGiB, std::max(budget, 0.0) / kGiB,
         100.0 * c.gpu_memory_utilization, static_cast<double>(memory.total_bytes) / kGiB, in_use / kGiB,
         slots / kGiB, c.max_num_seqs, blocks * c.block_size);
  }
  // A model without DSA layers keeps nothing per token; one sequence's worth of ids keeps the scheduler's arithmetic.
  return block_bytes > 0 ? blocks : c.max_num_seqs * blocks_per_sequence;
}

}  // namespace

EngineConfig resolve_engine_config(EngineConfig c, const Glm5NextConfig& model,
                                   const std::optional<DeviceMemory>& memory) {
  if (c.max_model_len == 0) c.max_model_len = model.max_position_embeddings;
  require(c.max_model_len > 0, "max_model_len must be positive, got {}", c.max_model_len);
  require(c.max_num_seqs > 0, "max_num_seqs must be positive, got {}", c.max_num_seqs);
  require(c.block_size > 0 && c.block_size % model.index_kpool == 0,
          "block_size {} must be a positive multiple of the model's index_kpool ({})", c.block_size,
          model.index_kpool);
  require(c.max_num_batched_tokens >= c.block_size,
          "max_num_batched_tokens ({}) must be at least block_size ({}): prompt chunks are whole blocks",
          c.max_num_batched_tokens, c.block_size);
  const int64_t blocks_per_sequence = (c.max_model_len + c.block_size - 1) / c.block_size;
  if (c.num_blocks == 0 && memory) {
    c.num_blocks = blocks_for_memory(c, model, *memory, blocks_per_sequence);
  } else if (c.num_blocks == 0) {
    c.num_blocks = std::max(blocks_per_sequence, std::min<int64_t>(c.max_num_seqs * blocks_per_sequence, 65536));
  }
  require(c.num_blocks >= blocks_per_sequence,
          "{} cache blocks of {} tokens cannot hold one sequence of max_model_len ({}) tokens; raise the block count "
          "or lower max_model_len",
          c.num_blocks, c.block_size, c.max_model_len);
  if (c.num_kda_snapshots == 0) c.num_kda_snapshots = 2 * c.max_num_seqs;
  require(c.num_kda_snapshots >= 0, "num_kda_snapshots must not be negative, got {}", c.num_kda_snapshots);
  require(c.max_logprobs >= 0, "max_logprobs must not be negative, got {}", c.max_logprobs);
  for (const int32_t id : c.eos_token_ids) {
    require(id >= 0 && id < model.vocab_size, "EOS token id {} is outside the vocabulary [0, {})", id,
            model.vocab_size);
  }
  return c;
}

std::vector<int32_t> model_eos_token_ids(const std::filesystem::path& dir, const Glm5NextConfig& model) {
  std::vector<int32_t> ids;
  for (const int64_t id : model.eos_token_ids) ids.push_back(static_cast<int32_t>(id));
  for (const int32_t id : text::load_tokenizer_config(dir).eos_token_ids) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace kestrel

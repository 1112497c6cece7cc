#include "engine/engine_config.h"

#include <algorithm>

#include "base/error.h"
#include "text/tokenizer.h"

namespace kestrel {

EngineConfig resolve_engine_config(EngineConfig c, const Glm5NextConfig& model) {
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
  if (c.num_blocks == 0) {
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

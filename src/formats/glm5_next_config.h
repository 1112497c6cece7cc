// The `glm5_next` config.json, read the way transformers' Glm5NextConfig / Glm5NextTextConfig read it (5.17):
// text fields nested under "text_config" or flat at the top level; `linear_attn_config` keys mapped onto the linear_*
// fields; defaults for `layer_types` (KDA unless i % 4 == 3), `mlp_layer_types` (3 dense, then sparse) and
// `indexer_types` (`index_topk_pattern` "FS..." or list, else index_topk_freq / index_skip_topk_offset);
// "full_attention" read as "deepseek_sparse_attention"; `eos_token_id` an int or a list; `head_dim` overwritten
// by qk_rope_head_dim and qk_head_dim = qk_nope + qk_rope. Inconsistent values are an Error naming the file and field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel {

enum class LayerType { linear_attention, sparse_attention };  // "linear_attention" | "deepseek_sparse_attention"
enum class MlpType { dense, sparse };
enum class IndexerType { full, shared };

struct QuantizationConfig {
  std::string quant_method;          // "fp8", "exl3", ...
  std::string json;                  // the whole object as written, for reporting
  // fp8 (or an exl3 checkpoint made from an fp8 one, whose unquantized tensors stay block-fp8): block shape of
  // `weight_scale_inv` (rows, cols); official checkpoints use 128 x 128.
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
  std::vector<std::string> modules_to_not_convert;
  // exl3: the average bits per weight and the model-wide codebook as recorded (informative: each tensor's own shape
  // and marker are authoritative); 0 and "" when not given.
  double exl3_bits = 0;
  std::string exl3_codebook;
};

struct Glm5NextConfig {
  std::string source;  // path of config.json, for messages

  // Text model.
  int64_t vocab_size = 154880;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 12288;
  int64_t moe_intermediate_size = 2048;
  int64_t num_hidden_layers = 45;
  int64_t num_nextn_predict_layers = 0;
  int64_t num_attention_heads = 64;
  int64_t num_key_value_heads = 64;
  int64_t n_shared_experts = 1;
  int64_t n_routed_experts = 288;
  double routed_scaling_factor = 2.5;
  int64_t kv_lora_rank = 512;
  int64_t q_lora_rank = 1536;
  int64_t qk_rope_head_dim = 0;
  int64_t qk_nope_head_dim = 256;
  int64_t qk_head_dim = 256;
  int64_t v_head_dim = 256;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t num_experts_per_tok = 8;
  bool norm_topk_prob = true;
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 1048576;
  double rms_norm_eps = 1e-5;
  std::optional<int64_t> pad_token_id = 154820;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  bool tie_word_embeddings = false;
  std::vector<LayerType> layer_types;
  std::vector<MlpType> mlp_layer_types;
  std::vector<IndexerType> indexer_types;
  int64_t index_topk = 2048;
  int64_t index_head_dim = 128;
  int64_t index_n_heads = 32;
  int64_t index_kpool = 16;
  bool index_kpool_always_select_tail = true;
  double swiglu_limit = 10.0;
  int64_t linear_head_dim = 128;
  int64_t linear_num_heads = 64;
  int64_t linear_conv_kernel_dim = 4;
  std::optional<double> linear_lower_bound = -5.0;  // unset: the softplus gate
  int64_t hc_mult = 4;
  double hc_eps = 1e-6;
  int64_t hc_sinkhorn_iters = 20;
  std::string dtype;  // "bfloat16", "float32", ... as the file says (informational)

  // Top level.
  bool has_vision_config = false;
  int64_t image_token_id = 154854;
  int64_t video_token_id = 154855;
  std::optional<QuantizationConfig> quantization;

  int64_t num_sparse_attention_layers() const;
  int64_t num_linear_attention_layers() const;
  std::string summary() const;  // one line for the load log
};

// Parses and validates; `source` names the file in error messages.
Glm5NextConfig parse_glm5_next_config(std::string_view json_text, const std::string& source);
// Reads `path` and parses it.
Glm5NextConfig load_glm5_next_config(const std::string& path);

}  // namespace kestrel

// Parsing and validation of the glm5_next config.json, mirroring transformers 5.17's Glm5NextTextConfig.__post_init__
// and validate_architecture, plus the checks our implementation relies on (see glm5_next_config.h).
#include "formats/glm5_next_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/mapped_file.h"
#include "formats/strict_json.h"

namespace kestrel {

namespace {

using nlohmann::json;

// Guards the per-layer vectors against a corrupt count; real models have tens of layers.
constexpr int64_t kMaxLayers = 1 << 16;

// Typed access to the fields of one JSON object. Errors read "<source>: <prefix><key>: <what>", where the prefix
// names the enclosing object ("text_config.", "linear_attn_config.") so the field can be found in the file.
class FieldReader {
public:
  FieldReader(const json& object, const std::string& source, std::string prefix)
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  // The value of `key`, or nullptr when the key is absent. A JSON null is returned as is.
  const json* find(std::string_view key) const {
    const auto found = object_.find(key);
    return found == object_.end() ? nullptr : &*found;
  }
  // True when `key` is present with a non-null value.
  bool has(std::string_view key) const {
    const json* value = find(key);
    return value != nullptr && !value->is_null();
  }

  template <typename... Args>
  [[noreturn]] void fail_field(std::string_view key, fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {}{}: {}", source_, prefix_, key, fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void require_field(bool condition, std::string_view key, fmt::format_string<Args...> format, Args&&... args) const {
    if (!condition) fail_field(key, format, std::forward<Args>(args)...);
  }

  int64_t as_int(const json& value, std::string_view key) const {
    require_field(value.is_number_integer(), key, "expected an integer, got {}", describe(value));
    require_field(!value.is_number_unsigned() ||
                      value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                  key, "{} is out of range", json_excerpt(value));
    return value.get<int64_t>();
  }
  double as_double(const json& value, std::string_view key) const {
    require_field(value.is_number(), key, "expected a number, got {}", describe(value));
    const double number = value.get<double>();
    require_field(std::isfinite(number), key, "{} is not finite", value.dump());
    return number;
  }

  // Each read leaves `out` at its default when the key is absent. A null is an error unless the field is optional.
  void read_int(std::string_view key, int64_t& out) const {
    if (const json* value = find(key)) out = as_int(*value, key);
  }
  void read_positive(std::string_view key, int64_t& out) const {
    read_int(key, out);
    require_field(out > 0, key, "must be positive, got {}", out);
  }
  void read_non_negative(std::string_view key, int64_t& out) const {
    read_int(key, out);
    require_field(out >= 0, key, "must be >= 0, got {}", out);
  }
  void read_optional_int(std::string_view key, std::optional<int64_t>& out) const {
    if (const json* value = find(key)) out = value->is_null() ? std::nullopt : std::optional(as_int(*value, key));
  }
  void read_double(std::string_view key, double& out) const {
    if (const json* value = find(key)) out = as_double(*value, key);
  }
  void read_positive(std::string_view key, double& out) const {
    read_double(key, out);
    require_field(out > 0, key, "must be positive, got {}", out);
  }
  void read_optional_double(std::string_view key, std::optional<double>& out) const {
    if (const json* value = find(key)) {
      out = value->is_null() ? std::nullopt : std::optional(as_double(*value, key));
    }
  }
  void read_bool(std::string_view key, bool& out) const {
    if (const json* value = find(key)) {
      require_field(value->is_boolean(), key, "expected true or false, got {}", describe(*value));
      out = value->get<bool>();
    }
  }
  void read_string(std::string_view key, std::string& out) const {
    if (const json* value = find(key)) {
      require_field(value->is_string(), key, "expected a string, got {}", describe(*value));
      out = value->get<std::string>();
    }
  }

  // An int or a list of ints (eos_token_id); null means none.
  void read_int_or_int_list(std::string_view key, std::vector<int64_t>& out) const {
    const json* value = find(key);
    if (value == nullptr) return;
    out.clear();
    if (value->is_array()) {
      for (size_t i = 0; i < value->size(); ++i) out.push_back(as_int((*value)[i], fmt::format("{}[{}]", key, i)));
    } else if (!value->is_null()) {
      require_field(value->is_number_integer(), key, "expected an integer or a list of integers, got {}",
                    describe(*value));
      out.push_back(as_int(*value, key));
    }
  }

  // A list of enum strings; absent or null leaves `out` empty (the caller fills the default).
  template <typename Enum>
  void read_enum_list(std::string_view key, const std::vector<std::pair<std::string_view, Enum>>& names,
                      std::vector<Enum>& out) const {
    const json* value = find(key);
    if (value == nullptr || value->is_null()) return;
    require_field(value->is_array(), key, "expected a list of strings, got {}", describe(*value));
    for (size_t i = 0; i < value->size(); ++i) {
      out.push_back(as_enum((*value)[i], fmt::format("{}[{}]", key, i), names));
    }
  }

  template <typename Enum>
  Enum as_enum(const json& value, std::string_view key,
               const std::vector<std::pair<std::string_view, Enum>>& names) const {
    require_field(value.is_string(), key, "expected a string, got {}", describe(value));
    const std::string& text = value.get_ref<const std::string&>();
    std::string known;
    for (const auto& [name, item] : names) {
      if (name == text) return item;
      known += fmt::format("{}'{}'", known.empty() ? "" : ", ", name);
    }
    fail_field(key, "unknown value '{}' (expected one of {})", text, known);
  }

  const json& object() const { return object_; }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

private:
  static std::string describe(const json& value) {
    return value.is_null() ? "null" : fmt::format("{} {}", value.type_name(), json_excerpt(value));
  }

  const json& object_;
  const std::string& source_;
  std::string prefix_;
};

const std::vector<std::pair<std::string_view, LayerType>> kLayerTypeNames = {
    {"linear_attention", LayerType::linear_attention},
    {"deepseek_sparse_attention", LayerType::sparse_attention},
    {"full_attention", LayerType::sparse_attention},  // transformers renames it to deepseek_sparse_attention
};
const std::vector<std::pair<std::string_view, MlpType>> kMlpTypeNames = {{"dense", MlpType::dense},
                                                                         {"sparse", MlpType::sparse}};
const std::vector<std::pair<std::string_view, IndexerType>> kIndexerTypeNames = {{"full", IndexerType::full},
                                                                                 {"shared", IndexerType::shared}};

QuantizationConfig parse_quantization(const FieldReader& parent, const std::string& key = "quantization_config") {
  const json& object = *parent.find(key);
  parent.require_field(object.is_object(), key, "expected an object, got {}", object.type_name());
  const FieldReader fields(object, parent.source(), parent.prefix() + key + ".");
  QuantizationConfig quantization;
  quantization.json = object.dump();
  fields.require_field(fields.has("quant_method"), "quant_method", "missing");
  fields.read_string("quant_method", quantization.quant_method);
  if (quantization.quant_method == "exl3") {
    if (const json* bits = fields.find("bits"); bits != nullptr && !bits->is_null()) {
      quantization.exl3_bits = fields.as_double(*bits, "bits");
      fields.require_field(quantization.exl3_bits > 0 && quantization.exl3_bits <= 8, "bits",
                           "must be in (0, 8], got {}", bits->dump());
    }
    fields.read_string("codebook", quantization.exl3_codebook);
    fields.require_field(quantization.exl3_codebook.empty() || quantization.exl3_codebook == "mcg" ||
                             quantization.exl3_codebook == "mul1" || quantization.exl3_codebook == "3inst",
                         "codebook", "expected \"mcg\", \"mul1\" or \"3inst\", got \"{}\"",
                         quantization.exl3_codebook);
    // Tensors left unquantized keep the source checkpoint's format, block-fp8 included.
    if (fields.has("original_quantization_config")) {
      const QuantizationConfig original = parse_quantization(fields, "original_quantization_config");
      quantization.fp8_block_rows = original.fp8_block_rows;
      quantization.fp8_block_cols = original.fp8_block_cols;
      quantization.modules_to_not_convert = original.modules_to_not_convert;
    }
    return quantization;
  }
  fields.require_field(quantization.quant_method == "fp8", "quant_method",
                       "\"{}\" is not supported (Kestrel reads \"fp8\" and \"exl3\" checkpoints)",
                       quantization.quant_method);

  const json* block = fields.find("weight_block_size");
  fields.require_field(block != nullptr && !block->is_null(), "weight_block_size", "missing (required for fp8)");
  fields.require_field(block->is_array() && block->size() == 2, "weight_block_size", "expected [rows, cols], got {}",
                       json_excerpt(*block));
  quantization.fp8_block_rows = fields.as_int((*block)[0], "weight_block_size[0]");
  quantization.fp8_block_cols = fields.as_int((*block)[1], "weight_block_size[1]");
  fields.require_field(quantization.fp8_block_rows > 0 && quantization.fp8_block_cols > 0, "weight_block_size",
                       "must be positive, got {}", block->dump());

  if (const json* modules = fields.find("modules_to_not_convert"); modules != nullptr && !modules->is_null()) {
    fields.require_field(modules->is_array(), "modules_to_not_convert", "expected a list of strings, got {}",
                         modules->type_name());
    for (size_t i = 0; i < modules->size(); ++i) {
      const json& module = (*modules)[i];
      fields.require_field(module.is_string(), fmt::format("modules_to_not_convert[{}]", i),
                           "expected a string, got {}", json_excerpt(module));
      quantization.modules_to_not_convert.push_back(module.get<std::string>());
    }
  }
  return quantization;
}

// linear_attn_config overrides the linear_* fields the way Glm5NextTextConfig.__post_init__ does.
void read_linear_attn_config(const FieldReader& text, Glm5NextConfig& config) {
  const json* value = text.find("linear_attn_config");
  if (value == nullptr || value->is_null()) return;
  text.require_field(value->is_object(), "linear_attn_config", "expected an object, got {}", value->type_name());
  const FieldReader fields(*value, text.source(), text.prefix() + "linear_attn_config.");
  fields.read_positive("head_dim", config.linear_head_dim);
  fields.read_positive("num_heads", config.linear_num_heads);
  fields.read_positive("short_conv_kernel_size", config.linear_conv_kernel_dim);
  fields.read_optional_double("gate_lower_bound", config.linear_lower_bound);
  // Python's `dict.get("safe_gate", True)`: absent means true, null is falsy.
  bool safe_gate = true;
  if (const json* flag = fields.find("safe_gate"); flag != nullptr && flag->is_null()) {
    safe_gate = false;
  } else {
    fields.read_bool("safe_gate", safe_gate);
  }
  if (safe_gate && !config.linear_lower_bound) config.linear_lower_bound = -5.0;
}

// indexer_types when the file does not list them: index_topk_pattern ("FS..." or a list), else every
// index_topk_freq-th layer from index_skip_topk_offset - 1 on runs its own indexer.
void default_indexer_types(const FieldReader& text, Glm5NextConfig& config) {
  if (const json* pattern = text.find("index_topk_pattern"); pattern != nullptr && !pattern->is_null()) {
    if (pattern->is_string()) {
      const std::string& letters = pattern->get_ref<const std::string&>();
      for (size_t i = 0; i < letters.size(); ++i) {
        text.require_field(letters[i] == 'F' || letters[i] == 'S', "index_topk_pattern",
                           "character {} is '{}', expected 'F' (full) or 'S' (shared)", i, letters[i]);
        config.indexer_types.push_back(letters[i] == 'F' ? IndexerType::full : IndexerType::shared);
      }
    } else {
      text.require_field(pattern->is_array(), "index_topk_pattern", "expected a string of F/S or a list, got {}",
                         pattern->type_name());
      text.read_enum_list("index_topk_pattern", kIndexerTypeNames, config.indexer_types);
    }
    return;
  }
  int64_t freq = 1, offset = 2;
  text.read_int("index_topk_freq", freq);
  text.read_int("index_skip_topk_offset", offset);
  freq = std::max<int64_t>(freq, 1);
  text.require_field(offset >= -kMaxLayers && offset <= kMaxLayers, "index_skip_topk_offset", "{} is out of range",
                     offset);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const bool full = std::max<int64_t>(i - offset + 1, 0) % freq == 0;
    config.indexer_types.push_back(full ? IndexerType::full : IndexerType::shared);
  }
}

void read_text_fields(const FieldReader& text, Glm5NextConfig& config) {
  text.read_positive("vocab_size", config.vocab_size);
  text.read_positive("hidden_size", config.hidden_size);
  text.read_positive("intermediate_size", config.intermediate_size);
  text.read_positive("moe_intermediate_size", config.moe_intermediate_size);
  text.read_positive("num_hidden_layers", config.num_hidden_layers);
  text.require_field(config.num_hidden_layers <= kMaxLayers, "num_hidden_layers", "{} is implausibly large",
                     config.num_hidden_layers);
  text.read_non_negative("num_nextn_predict_layers", config.num_nextn_predict_layers);
  text.read_positive("num_attention_heads", config.num_attention_heads);
  // transformers: a null num_key_value_heads means "same as num_attention_heads".
  if (const json* value = text.find("num_key_value_heads"); value != nullptr && value->is_null()) {
    config.num_key_value_heads = config.num_attention_heads;
  } else {
    text.read_positive("num_key_value_heads", config.num_key_value_heads);
  }
  text.read_non_negative("n_shared_experts", config.n_shared_experts);
  text.read_positive("n_routed_experts", config.n_routed_experts);
  text.read_positive("routed_scaling_factor", config.routed_scaling_factor);
  text.read_positive("kv_lora_rank", config.kv_lora_rank);
  text.require_field(text.has("q_lora_rank"), "q_lora_rank", "required (DSA attention uses a low-rank query)");
  text.read_positive("q_lora_rank", config.q_lora_rank);
  text.read_int("qk_rope_head_dim", config.qk_rope_head_dim);
  text.require_field(config.qk_rope_head_dim == 0, "qk_rope_head_dim", "must be 0 (NoPE attention), got {}",
                     config.qk_rope_head_dim);
  text.read_positive("qk_nope_head_dim", config.qk_nope_head_dim);
  // transformers ignores `head_dim` and derives qk_head_dim; a stored qk_head_dim must agree with it.
  config.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim;
  int64_t stored_qk_head_dim = config.qk_head_dim;
  text.read_int("qk_head_dim", stored_qk_head_dim);
  text.require_field(stored_qk_head_dim == config.qk_head_dim, "qk_head_dim",
                     "{} != qk_nope_head_dim + qk_rope_head_dim = {}", stored_qk_head_dim, config.qk_head_dim);
  text.read_positive("v_head_dim", config.v_head_dim);
  text.read_positive("n_group", config.n_group);
  text.read_positive("topk_group", config.topk_group);
  text.read_positive("num_experts_per_tok", config.num_experts_per_tok);
  text.read_bool("norm_topk_prob", config.norm_topk_prob);
  text.read_string("hidden_act", config.hidden_act);
  text.read_positive("max_position_embeddings", config.max_position_embeddings);
  text.read_positive("rms_norm_eps", config.rms_norm_eps);
  text.read_optional_int("pad_token_id", config.pad_token_id);
  text.read_optional_int("bos_token_id", config.bos_token_id);
  text.read_positive("index_topk", config.index_topk);
  text.read_positive("index_head_dim", config.index_head_dim);
  text.read_positive("index_n_heads", config.index_n_heads);
  text.read_int("index_kpool", config.index_kpool);
  text.read_bool("index_kpool_always_select_tail", config.index_kpool_always_select_tail);
  text.read_positive("swiglu_limit", config.swiglu_limit);
  text.read_positive("linear_head_dim", config.linear_head_dim);
  text.read_positive("linear_num_heads", config.linear_num_heads);
  text.read_positive("linear_conv_kernel_dim", config.linear_conv_kernel_dim);
  text.read_optional_double("linear_lower_bound", config.linear_lower_bound);
  read_linear_attn_config(text, config);
  text.read_positive("hc_mult", config.hc_mult);
  text.read_positive("hc_eps", config.hc_eps);
  text.read_positive("hc_sinkhorn_iters", config.hc_sinkhorn_iters);

  const int64_t layers = config.num_hidden_layers;
  text.read_enum_list("layer_types", kLayerTypeNames, config.layer_types);
  if (!text.has("layer_types")) {
    for (int64_t i = 0; i < layers; ++i) {
      config.layer_types.push_back(i % 4 != 3 ? LayerType::linear_attention : LayerType::sparse_attention);
    }
  }
  text.read_enum_list("mlp_layer_types", kMlpTypeNames, config.mlp_layer_types);
  if (!text.has("mlp_layer_types")) {
    for (int64_t i = 0; i < layers; ++i) config.mlp_layer_types.push_back(i < 3 ? MlpType::dense : MlpType::sparse);
  }
  text.read_enum_list("indexer_types", kIndexerTypeNames, config.indexer_types);
  const bool indexer_types_listed = text.has("indexer_types");
  if (!indexer_types_listed) default_indexer_types(text, config);

  const auto require_per_layer = [&](std::string_view key, size_t size) {
    text.require_field(size == static_cast<size_t>(layers), key, "{} entries, but num_hidden_layers is {}", size,
                       layers);
  };
  require_per_layer("layer_types", config.layer_types.size());
  require_per_layer("mlp_layer_types", config.mlp_layer_types.size());
  require_per_layer(indexer_types_listed || !text.has("index_topk_pattern") ? "indexer_types" : "index_topk_pattern",
                    config.indexer_types.size());
}

void validate(const FieldReader& text, const Glm5NextConfig& config) {
  text.require_field(config.num_attention_heads == config.num_key_value_heads, "num_key_value_heads",
                     "{} != num_attention_heads {} (MLA keeps one KV head per query head)", config.num_key_value_heads,
                     config.num_attention_heads);
  text.require_field(config.index_kpool >= 1, "index_kpool", "must be >= 1, got {}", config.index_kpool);
  text.require_field(config.index_topk % config.index_kpool == 0, "index_topk", "{} is not divisible by index_kpool {}",
                     config.index_topk, config.index_kpool);
  text.require_field(config.hidden_act == "silu", "hidden_act", "'{}' is not supported (only 'silu')",
                     config.hidden_act);
  std::string scoring_func = "sigmoid";
  text.read_string("scoring_func", scoring_func);
  text.require_field(scoring_func == "sigmoid", "scoring_func", "'{}' is not supported (only 'sigmoid')", scoring_func);

  text.require_field(config.n_routed_experts % config.n_group == 0, "n_group",
                     "n_routed_experts {} is not divisible by n_group {}", config.n_routed_experts, config.n_group);
  // The group-limited router scores each group by the sum of its top-2 experts.
  text.require_field(config.n_group == 1 || config.n_routed_experts / config.n_group >= 2, "n_group",
                     "{} groups of {} routed experts: each group needs at least 2", config.n_group,
                     config.n_routed_experts / config.n_group);
  text.require_field(config.topk_group <= config.n_group, "topk_group", "{} > n_group {}", config.topk_group,
                     config.n_group);
  const bool any_sparse_mlp = std::find(config.mlp_layer_types.begin(), config.mlp_layer_types.end(),
                                        MlpType::sparse) != config.mlp_layer_types.end();
  text.require_field(!any_sparse_mlp || config.num_experts_per_tok <= config.n_routed_experts, "num_experts_per_tok",
                     "{} > n_routed_experts {}", config.num_experts_per_tok, config.n_routed_experts);

  // A shared indexer reuses the top-k that layer i-1 hands on, which only a full DSA layer does.
  for (size_t i = 0; i < config.layer_types.size(); ++i) {
    if (config.layer_types[i] != LayerType::sparse_attention || config.indexer_types[i] != IndexerType::shared) {
      continue;
    }
    const bool previous_is_full_dsa = i > 0 && config.layer_types[i - 1] == LayerType::sparse_attention &&
                                      config.indexer_types[i - 1] == IndexerType::full;
    text.require_field(previous_is_full_dsa, fmt::format("indexer_types[{}]", i), "is 'shared' but {}",
                       i == 0 ? std::string("layer 0 has no previous layer to share with")
                              : fmt::format("layer {} is not a full DSA layer", i - 1));
  }
}

}  // namespace

int64_t Glm5NextConfig::num_sparse_attention_layers() const {
  return std::count(layer_types.begin(), layer_types.end(), LayerType::sparse_attention);
}

int64_t Glm5NextConfig::num_linear_attention_layers() const {
  return std::count(layer_types.begin(), layer_types.end(), LayerType::linear_attention);
}

std::string Glm5NextConfig::summary() const {
  const int64_t dense = std::count(mlp_layer_types.begin(), mlp_layer_types.end(), MlpType::dense);
  int64_t full_indexers = 0;
  for (size_t i = 0; i < layer_types.size(); ++i) {
    full_indexers += layer_types[i] == LayerType::sparse_attention && indexer_types[i] == IndexerType::full;
  }
  std::string quantization_text = "none";
  if (quantization) {
    quantization_text = quantization->quant_method;
    if (quantization->quant_method == "fp8") {
      quantization_text += fmt::format(" {}x{} blocks, {} modules unquantized", quantization->fp8_block_rows,
                                       quantization->fp8_block_cols, quantization->modules_to_not_convert.size());
    } else if (quantization->exl3_bits > 0 || !quantization->exl3_codebook.empty()) {
      quantization_text += fmt::format(" {} bpw {}", quantization->exl3_bits, quantization->exl3_codebook);
    }
  }
  return fmt::format(
      "glm5_next: {} layers ({} KDA + {} DSA, {} with their own indexer), FFN {} dense + {} MoE ({} experts top-{}, "
      "{} shared), hidden {}, vocab {}, hc_mult {}, index_kpool {}, index_topk {}, KDA gate lower bound {}, "
      "{} MTP layers, vision {}, quantization {}",
      num_hidden_layers, num_linear_attention_layers(), num_sparse_attention_layers(), full_indexers, dense,
      static_cast<int64_t>(mlp_layer_types.size()) - dense, n_routed_experts, num_experts_per_tok, n_shared_experts,
      hidden_size, vocab_size, hc_mult, index_kpool, index_topk,
      linear_lower_bound ? fmt::format("{}", *linear_lower_bound) : std::string("none (softplus)"),
      num_nextn_predict_layers, has_vision_config ? "yes" : "no", quantization_text);
}

Glm5NextConfig parse_glm5_next_config(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& error) {
    fail("{}: invalid JSON: {}", source, error.what());
  }
  require(root.is_object(), "{}: expected a JSON object, got {}", source, root.type_name());
  const FieldReader top(root, source, "");
  top.require_field(top.has("model_type"), "model_type", "missing (expected 'glm5_next')");
  std::string model_type;
  top.read_string("model_type", model_type);
  top.require_field(model_type == "glm5_next", "model_type", "'{}' is not 'glm5_next'", model_type);

  // Nested (text_config) or flat: like Glm5NextConfig, a missing or null text_config means the text fields are
  // at the top level.
  const json* text_object = &root;
  std::string text_prefix;
  if (top.has("text_config")) {
    text_object = top.find("text_config");
    top.require_field(text_object->is_object(), "text_config", "expected an object, got {}", text_object->type_name());
    text_prefix = "text_config.";
  }
  const FieldReader text(*text_object, source, text_prefix);
  if (text_object != &root && text.has("model_type")) {
    std::string text_model_type;
    text.read_string("model_type", text_model_type);
    text.require_field(text_model_type == "glm5_next_text", "model_type", "'{}' is not 'glm5_next_text'",
                       text_model_type);
  }

  Glm5NextConfig config;
  config.source = source;
  read_text_fields(text, config);
  validate(text, config);

  // Fields either level may carry: the text config's value wins for the text model, the top level's
  // quantization_config for the checkpoint (that is where transformers looks for it).
  const auto either = [&](std::string_view key, bool text_first) -> const FieldReader& {
    const FieldReader& first = text_first ? text : top;
    const FieldReader& second = text_first ? top : text;
    return first.has(key) ? first : second;
  };
  either("eos_token_id", true).read_int_or_int_list("eos_token_id", config.eos_token_ids);
  either("tie_word_embeddings", true).read_bool("tie_word_embeddings", config.tie_word_embeddings);
  either("dtype", true).read_string("dtype", config.dtype);
  if (config.dtype.empty()) either("torch_dtype", true).read_string("torch_dtype", config.dtype);
  if (const FieldReader& holder = either("quantization_config", false); holder.has("quantization_config")) {
    config.quantization = parse_quantization(holder);
  }

  if (const json* vision = top.find("vision_config"); vision != nullptr && !vision->is_null()) {
    top.require_field(vision->is_object(), "vision_config", "expected an object, got {}", vision->type_name());
    config.has_vision_config = true;
  }
  top.read_int("image_token_id", config.image_token_id);
  top.read_int("video_token_id", config.video_token_id);
  return config;
}

Glm5NextConfig load_glm5_next_config(const std::string& path) {
  const MappedFile file(path);
  return parse_glm5_next_config(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()), path);
}

}  // namespace kestrel

// Glm5NextConfig: the official GLM-5.3-Flash config (reconstructed from docs/glm53-flash-architecture.md section 1),
// its flat variant, transformers' defaults and overrides, and one test per validation error.
#include "formats/glm5_next_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "expect_error.h"
#include "safetensors_builder.h"

namespace kestrel {
namespace {

using nlohmann::json;
using testing::expect_error;

constexpr const char* kSource = "/ckpt/config.json";

// The official zai-org/GLM-5.3-Flash config.json as far as the architecture notes reconstruct it (1509
// modules_to_not_convert entries shortened to three).
constexpr const char* kOfficialConfig = R"json({
  "architectures": ["Glm5NextForConditionalGeneration"],
  "model_type": "glm5_next",
  "tie_word_embeddings": false,
  "image_token_id": 154854, "video_token_id": 154855,
  "image_start_token_id": 154830, "image_end_token_id": 154831,
  "video_start_token_id": 154832, "video_end_token_id": 154833,
  "text_config": {
    "model_type": "glm5_next_text", "dtype": "bfloat16",
    "vocab_size": 154880, "hidden_size": 4096,
    "num_hidden_layers": 45, "num_nextn_predict_layers": 1,
    "intermediate_size": 12288,
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu", "swiglu_limit": 10.0,
    "attention_bias": false,
    "eos_token_id": [154820, 154827, 154829], "pad_token_id": 154820,
    "layer_types": [
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention",
      "linear_attention"
    ],
    "mlp_layer_types": [
      "dense", "dense", "dense", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse",
      "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse",
      "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse",
      "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse",
      "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse"
    ],
    "first_k_dense_replace": 3,
    "indexer_types": [
      "full", "full", "full", "full", "full", "full", "full", "full", "full",
      "full", "full", "full", "full", "full", "full", "full", "full", "full",
      "full", "full", "full", "full", "full", "full", "full", "full", "full",
      "full", "full", "full", "full", "full", "full", "full", "full", "full",
      "full", "full", "full", "full", "full", "full", "full", "full", "full"
    ],
    "linear_attn_config": {
      "num_heads": 64, "head_dim": 128, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
      "kda_layers": [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16, 17, 18, 20, 21, 22, 24, 25, 26, 28, 29, 30, 32,
                     33, 34, 36, 37, 38, 40, 41, 42, 44],
      "full_attn_layers": [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43]
    },
    "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256,
    "qk_head_dim": 256, "head_dim": 0, "mla_use_nope": true,
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
    "index_kpool": 4, "index_kpool_compress": true,
    "index_kpool_always_select_tail": true,
    "index_share_for_mtp_iteration": true,
    "indexer_rope_interleave": true,
    "n_routed_experts": 288, "num_experts_per_tok": 8, "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "norm_topk_prob": true, "routed_scaling_factor": 2.5,
    "n_group": 1, "topk_group": 1, "moe_router_dtype": "float32",
    "mhc": true, "hc_mult": 4, "hc_eps": 1e-06, "hc_sinkhorn_iters": 20
  },
  "vision_config": {
    "model_type": "glm5_next_vision", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
    "num_heads": 16, "image_size": 448, "patch_size": 14, "temporal_patch_size": 2,
    "spatial_merge_size": 2, "out_hidden_size": 4096,
    "projection_intermediate_size": 10240, "in_channels": 3, "attention_bias": true,
    "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-05
  },
  "quantization_config": {
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
    "modules_to_not_convert": ["lm_head", "model.visual.blocks.0.attn.qkv", "model.language_model.embed_tokens"]
  }
})json";

json official() { return json::parse(kOfficialConfig); }

// The official config with the text fields moved to the top level (the flat, text-only form).
json flat_official() {
  json config = official();
  const json text = config["text_config"];
  config.erase("text_config");
  for (const auto& [key, value] : text.items()) {
    if (key != "model_type") config[key] = value;
  }
  return config;
}

// A small flat config: `layers` layers, all DSA and MoE unless the test changes them.
json small_config(int layers) {
  return {{"model_type", "glm5_next"},
          {"num_hidden_layers", layers},
          {"layer_types", std::vector<std::string>(static_cast<size_t>(layers), "deepseek_sparse_attention")},
          {"mlp_layer_types", std::vector<std::string>(static_cast<size_t>(layers), "sparse")},
          {"q_lora_rank", 64}};
}

Glm5NextConfig parse(const json& config) { return parse_glm5_next_config(config.dump(), kSource); }

// Expects parsing to fail with "<source>: <field>: ..." containing every fragment.
void expect_invalid(const json& config, std::string_view field, std::initializer_list<std::string_view> fragments) {
  const std::string message = expect_error([&] { parse(config); }, fragments);
  EXPECT_TRUE(message.starts_with(fmt::format("{}: {}: ", kSource, field))) << message;
}

// The official config with text_config[key] = value.
json official_with(const std::string& key, json value) {
  json config = official();
  config["text_config"][key] = std::move(value);
  return config;
}

json official_without(const std::string& key) {
  json config = official();
  config["text_config"].erase(key);
  return config;
}

void expect_official_text_model(const Glm5NextConfig& config) {
  ASSERT_EQ(config.layer_types.size(), 45u);
  for (size_t i = 0; i < 45; ++i) {
    EXPECT_EQ(config.layer_types[i], i % 4 != 3 ? LayerType::linear_attention : LayerType::sparse_attention) << i;
    EXPECT_EQ(config.mlp_layer_types[i], i < 3 ? MlpType::dense : MlpType::sparse) << i;
    EXPECT_EQ(config.indexer_types[i], IndexerType::full) << i;
  }
  EXPECT_EQ(config.num_linear_attention_layers(), 34);
  EXPECT_EQ(config.num_sparse_attention_layers(), 11);
  EXPECT_EQ(config.num_hidden_layers, 45);
  EXPECT_EQ(config.num_nextn_predict_layers, 1);
  EXPECT_EQ(config.vocab_size, 154880);
  EXPECT_EQ(config.hidden_size, 4096);
  EXPECT_EQ(config.intermediate_size, 12288);
  EXPECT_EQ(config.moe_intermediate_size, 2048);
  EXPECT_EQ(config.index_kpool, 4);
  EXPECT_EQ(config.index_topk, 2048);
  EXPECT_EQ(config.index_n_heads, 32);
  EXPECT_EQ(config.index_head_dim, 128);
  EXPECT_EQ(config.qk_head_dim, 256);
  EXPECT_EQ(config.qk_rope_head_dim, 0);
  EXPECT_EQ(config.v_head_dim, 256);
  EXPECT_EQ(config.q_lora_rank, 1536);
  EXPECT_EQ(config.kv_lora_rank, 512);
  EXPECT_EQ(config.n_routed_experts, 288);
  EXPECT_EQ(config.num_experts_per_tok, 8);
  EXPECT_EQ(config.n_shared_experts, 1);
  EXPECT_DOUBLE_EQ(config.routed_scaling_factor, 2.5);
  EXPECT_EQ(config.linear_num_heads, 64);
  EXPECT_EQ(config.linear_head_dim, 128);
  EXPECT_EQ(config.linear_conv_kernel_dim, 4);
  ASSERT_TRUE(config.linear_lower_bound.has_value());
  EXPECT_DOUBLE_EQ(*config.linear_lower_bound, -5.0);
  EXPECT_EQ(config.hc_mult, 4);
  EXPECT_DOUBLE_EQ(config.hc_eps, 1e-6);
  EXPECT_EQ(config.hc_sinkhorn_iters, 20);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(config.swiglu_limit, 10.0);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{154820, 154827, 154829}));
  EXPECT_EQ(config.pad_token_id, 154820);
  EXPECT_FALSE(config.bos_token_id.has_value());
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_EQ(config.dtype, "bfloat16");
  ASSERT_TRUE(config.quantization.has_value());
  EXPECT_EQ(config.quantization->quant_method, "fp8");
  EXPECT_EQ(config.quantization->fp8_block_rows, 128);
  EXPECT_EQ(config.quantization->fp8_block_cols, 128);
  EXPECT_EQ(config.quantization->modules_to_not_convert.size(), 3u);
  EXPECT_EQ(config.quantization->modules_to_not_convert[0], "lm_head");
  EXPECT_EQ(json::parse(config.quantization->json)["activation_scheme"], "dynamic");
}

TEST(Glm5NextConfigTest, OfficialConfig) {
  const Glm5NextConfig config = parse(official());
  EXPECT_EQ(config.source, kSource);
  expect_official_text_model(config);
  EXPECT_TRUE(config.has_vision_config);
  EXPECT_EQ(config.image_token_id, 154854);
  EXPECT_EQ(config.video_token_id, 154855);
}

TEST(Glm5NextConfigTest, FlatConfig) {
  const Glm5NextConfig config = parse(flat_official());
  expect_official_text_model(config);
  EXPECT_TRUE(config.has_vision_config);
}

TEST(Glm5NextConfigTest, SummaryNamesTheShape) {
  const std::string summary = parse(official()).summary();
  for (const char* fragment : {"45 layers", "34 KDA", "11 DSA", "288 experts", "top-8", "hc_mult 4", "index_kpool 4",
                               "fp8 128x128", "lower bound -5"}) {
    EXPECT_NE(summary.find(fragment), std::string::npos) << fragment << " not in: " << summary;
  }
  EXPECT_EQ(summary.find('\n'), std::string::npos);
}

TEST(Glm5NextConfigTest, DefaultScheduleWhenListsAbsent) {
  json config = official();
  for (const char* key : {"layer_types", "mlp_layer_types", "indexer_types"}) config["text_config"].erase(key);
  expect_official_text_model(parse(config));
}

TEST(Glm5NextConfigTest, NullListsMeanDefaults) {
  json config = official();
  for (const char* key : {"layer_types", "mlp_layer_types", "indexer_types"}) config["text_config"][key] = nullptr;
  expect_official_text_model(parse(config));
}

// Only q_lora_rank must be spelled out (stricter than transformers, whose class default is 1536).
TEST(Glm5NextConfigTest, TransformersDefaultsForAMinimalConfig) {
  const Glm5NextConfig config = parse(json{{"model_type", "glm5_next"}, {"q_lora_rank", 1536}});
  EXPECT_EQ(config.num_hidden_layers, 45);
  EXPECT_EQ(config.num_nextn_predict_layers, 0);
  EXPECT_EQ(config.index_kpool, 16);
  EXPECT_EQ(config.q_lora_rank, 1536);
  EXPECT_DOUBLE_EQ(*config.linear_lower_bound, -5.0);
  EXPECT_EQ(config.num_sparse_attention_layers(), 11);
  EXPECT_TRUE(config.eos_token_ids.empty());
  EXPECT_FALSE(config.quantization.has_value());
  EXPECT_FALSE(config.has_vision_config);
  EXPECT_EQ(config.pad_token_id, 154820);
}

TEST(Glm5NextConfigTest, FullAttentionIsAnAliasForDsa) {
  json config = official();
  config["text_config"]["layer_types"][3] = "full_attention";
  EXPECT_EQ(parse(config).layer_types[3], LayerType::sparse_attention);
}

TEST(Glm5NextConfigTest, LinearAttnConfigOverridesLinearFields) {
  json config = official();
  config["text_config"]["linear_attn_config"] = {
      {"head_dim", 64}, {"num_heads", 32}, {"short_conv_kernel_size", 3}, {"gate_lower_bound", -3.5}};
  const Glm5NextConfig parsed = parse(config);
  EXPECT_EQ(parsed.linear_head_dim, 64);
  EXPECT_EQ(parsed.linear_num_heads, 32);
  EXPECT_EQ(parsed.linear_conv_kernel_dim, 3);
  EXPECT_DOUBLE_EQ(*parsed.linear_lower_bound, -3.5);
}

TEST(Glm5NextConfigTest, MissingGateLowerBoundKeepsDefault) {
  json config = official();
  config["text_config"]["linear_attn_config"].erase("gate_lower_bound");
  EXPECT_DOUBLE_EQ(*parse(config).linear_lower_bound, -5.0);
}

TEST(Glm5NextConfigTest, NullGateLowerBoundWithSafeGateFalseIsUnset) {
  json config = official();
  config["text_config"]["linear_attn_config"]["gate_lower_bound"] = nullptr;
  config["text_config"]["linear_attn_config"]["safe_gate"] = false;
  EXPECT_FALSE(parse(config).linear_lower_bound.has_value());
}

TEST(Glm5NextConfigTest, NullGateLowerBoundWithSafeGateDefaultIsMinusFive) {
  json config = official();
  config["text_config"]["linear_attn_config"]["gate_lower_bound"] = nullptr;
  EXPECT_DOUBLE_EQ(*parse(config).linear_lower_bound, -5.0);
}

TEST(Glm5NextConfigTest, NullLinearLowerBoundWithoutLinearAttnConfigIsUnset) {
  json config = official_without("linear_attn_config");
  config["text_config"]["linear_lower_bound"] = nullptr;
  EXPECT_FALSE(parse(config).linear_lower_bound.has_value());
}

TEST(Glm5NextConfigTest, HeadDimIsIgnored) {
  const Glm5NextConfig config = parse(official_with("head_dim", 64));
  EXPECT_EQ(config.qk_head_dim, 256);
}

TEST(Glm5NextConfigTest, NullKeyValueHeadsMeansAttentionHeads) {
  json config = official_with("num_key_value_heads", nullptr);
  config["text_config"]["num_attention_heads"] = 32;
  EXPECT_EQ(parse(config).num_key_value_heads, 32);
}

TEST(Glm5NextConfigTest, IndexTopkPatternString) {
  json config = small_config(4);
  config["index_topk_pattern"] = "FSFS";
  EXPECT_EQ(parse(config).indexer_types,
            (std::vector<IndexerType>{IndexerType::full, IndexerType::shared, IndexerType::full, IndexerType::shared}));
}

TEST(Glm5NextConfigTest, IndexTopkPatternList) {
  json config = small_config(3);
  config["index_topk_pattern"] = {"full", "shared", "shared"};
  config["layer_types"][2] = "linear_attention";  // a shared indexer on a KDA layer is never used
  EXPECT_EQ(parse(config).indexer_types,
            (std::vector<IndexerType>{IndexerType::full, IndexerType::shared, IndexerType::shared}));
}

TEST(Glm5NextConfigTest, IndexerTypesWinOverPattern) {
  json config = small_config(2);
  config["indexer_types"] = {"full", "full"};
  config["index_topk_pattern"] = "FS";
  EXPECT_EQ(parse(config).indexer_types, (std::vector<IndexerType>{IndexerType::full, IndexerType::full}));
}

TEST(Glm5NextConfigTest, IndexTopkFreqAndOffset) {
  json config = small_config(6);
  config["index_topk_freq"] = 2;
  config["index_skip_topk_offset"] = 2;
  // full where max(i - 1, 0) % 2 == 0: layers 0, 1, 3, 5.
  EXPECT_EQ(parse(config).indexer_types,
            (std::vector<IndexerType>{IndexerType::full, IndexerType::full, IndexerType::shared, IndexerType::full,
                                      IndexerType::shared, IndexerType::full}));
}

TEST(Glm5NextConfigTest, IndexTopkFreqBelowOneMeansEveryLayer) {
  json config = small_config(3);
  config["index_topk_freq"] = 0;
  EXPECT_EQ(parse(config).indexer_types, std::vector<IndexerType>(3, IndexerType::full));
}

TEST(Glm5NextConfigTest, EosTokenIdAsInt) {
  EXPECT_EQ(parse(official_with("eos_token_id", 154820)).eos_token_ids, (std::vector<int64_t>{154820}));
}

TEST(Glm5NextConfigTest, EosTokenIdNullIsEmpty) {
  EXPECT_TRUE(parse(official_with("eos_token_id", nullptr)).eos_token_ids.empty());
}

TEST(Glm5NextConfigTest, EosTokenIdFromTopLevel) {
  json config = official_without("eos_token_id");
  config["eos_token_id"] = {1, 2};
  EXPECT_EQ(parse(config).eos_token_ids, (std::vector<int64_t>{1, 2}));
}

TEST(Glm5NextConfigTest, TextConfigEosWinsOverTopLevel) {
  json config = official();
  config["eos_token_id"] = 7;
  EXPECT_EQ(parse(config).eos_token_ids.size(), 3u);
}

TEST(Glm5NextConfigTest, QuantizationConfigInsideTextConfig) {
  json config = official();
  config["text_config"]["quantization_config"] = config["quantization_config"];
  config.erase("quantization_config");
  ASSERT_TRUE(parse(config).quantization.has_value());
  EXPECT_EQ(parse(config).quantization->fp8_block_cols, 128);
}

TEST(Glm5NextConfigTest, Exl3QuantizationConfigIsParsed) {
  json config = official();
  config["quantization_config"] = {{"quant_method", "exl3"}, {"bits", 4.0}, {"codebook", "mcg"},
                                   {"calibration", {{"rows", 100}}}};
  const Glm5NextConfig parsed = parse(config);
  ASSERT_TRUE(parsed.quantization.has_value());
  EXPECT_EQ(parsed.quantization->quant_method, "exl3");
  EXPECT_EQ(parsed.quantization->exl3_bits, 4.0);
  EXPECT_EQ(parsed.quantization->exl3_codebook, "mcg");
  EXPECT_EQ(json::parse(parsed.quantization->json)["calibration"]["rows"], 100);
  EXPECT_EQ(parsed.quantization->fp8_block_rows, 0);
  EXPECT_NE(parsed.summary().find("quantization exl3 4 bpw mcg"), std::string::npos);
}

TEST(Glm5NextConfigTest, Exl3FromFp8KeepsTheFp8BlockShape) {
  json config = official();
  json fp8 = config["quantization_config"];
  config["quantization_config"] = {{"quant_method", "exl3"}, {"bits", 4}, {"original_quantization_config", fp8}};
  const Glm5NextConfig parsed = parse(config);
  EXPECT_EQ(parsed.quantization->quant_method, "exl3");
  EXPECT_EQ(parsed.quantization->fp8_block_rows, 128);
  EXPECT_EQ(parsed.quantization->fp8_block_cols, 128);
}

TEST(Glm5NextConfigTest, BadQuantizationConfigsAreRejected) {
  const auto with = [](json quantization) {
    json config = official();
    config["quantization_config"] = std::move(quantization);
    return config;
  };
  expect_invalid(with({{"quant_method", "gptq"}}), "quantization_config.quant_method", {"\"gptq\" is not supported"});
  expect_invalid(with({{"quant_method", "exl3"}, {"bits", 12}}), "quantization_config.bits", {"must be in (0, 8]"});
  expect_invalid(with({{"quant_method", "exl3"}, {"bits", "4"}}), "quantization_config.bits", {"expected a number"});
  expect_invalid(with({{"quant_method", "exl3"}, {"codebook", "e8p"}}), "quantization_config.codebook",
                 {"expected \"mcg\", \"mul1\" or \"3inst\""});
  expect_invalid(with({{"quant_method", "exl3"}, {"original_quantization_config", {{"quant_method", "fp8"}}}}),
                 "quantization_config.original_quantization_config.weight_block_size", {"missing"});
}

TEST(Glm5NextConfigTest, NullQuantizationConfigMeansNone) {
  json config = official();
  config["quantization_config"] = nullptr;
  EXPECT_FALSE(parse(config).quantization.has_value());
}

TEST(Glm5NextConfigTest, AcceptsGroupedRouting) {
  json config = official_with("n_group", 8);
  config["text_config"]["topk_group"] = 4;
  EXPECT_EQ(parse(config).n_group, 8);
}

TEST(Glm5NextConfigTest, TooManyExpertsPerTokenIsFineWithoutMoeLayers) {
  json config = small_config(2);
  config["mlp_layer_types"] = {"dense", "dense"};
  config["n_routed_experts"] = 4;
  config["num_experts_per_tok"] = 8;
  EXPECT_EQ(parse(config).num_experts_per_tok, 8);
}

TEST(Glm5NextConfigTest, SharedIndexerAfterFullDsaLayer) {
  json config = small_config(3);
  config["indexer_types"] = {"full", "shared", "full"};
  EXPECT_EQ(parse(config).indexer_types[1], IndexerType::shared);
}

TEST(Glm5NextConfigTest, LoadsFromFile) {
  testing::ScratchDir dir;
  testing::write_file(dir.file("config.json"), kOfficialConfig);
  const Glm5NextConfig config = load_glm5_next_config(dir.file("config.json"));
  EXPECT_EQ(config.source, dir.file("config.json"));
  EXPECT_EQ(config.index_kpool, 4);
}

TEST(Glm5NextConfigTest, LoadOfMissingFileNamesIt) {
  testing::ScratchDir dir;
  expect_error([&] { load_glm5_next_config(dir.file("config.json")); }, {dir.file("config.json"), "cannot open"});
}

// Validation errors.

TEST(Glm5NextConfigErrorTest, InvalidJson) {
  expect_error([] { parse_glm5_next_config("{\"model_type\": ", kSource); }, {kSource, "invalid JSON"});
}

TEST(Glm5NextConfigErrorTest, NotAnObject) {
  expect_error([] { parse_glm5_next_config("[1]", kSource); }, {kSource, "expected a JSON object"});
}

TEST(Glm5NextConfigErrorTest, MissingModelType) {
  json config = official();
  config.erase("model_type");
  expect_invalid(config, "model_type", {"missing"});
}

TEST(Glm5NextConfigErrorTest, WrongModelType) {
  json config = official();
  config["model_type"] = "glm4_moe_lite";
  expect_invalid(config, "model_type", {"'glm4_moe_lite' is not 'glm5_next'"});
}

TEST(Glm5NextConfigErrorTest, WrongTextModelType) {
  expect_invalid(official_with("model_type", "kimi_linear"), "text_config.model_type", {"'kimi_linear'"});
}

TEST(Glm5NextConfigErrorTest, TextConfigNotAnObject) {
  json config = official();
  config["text_config"] = json::array();
  expect_invalid(config, "text_config", {"expected an object"});
}

TEST(Glm5NextConfigErrorTest, StringWhereIntegerExpected) {
  expect_invalid(official_with("hidden_size", "4096"), "text_config.hidden_size", {"expected an integer"});
}

TEST(Glm5NextConfigErrorTest, FloatWhereIntegerExpected) {
  expect_invalid(official_with("num_hidden_layers", 45.0), "text_config.num_hidden_layers", {"expected an integer"});
}

TEST(Glm5NextConfigErrorTest, NullWhereIntegerExpected) {
  expect_invalid(official_with("vocab_size", nullptr), "text_config.vocab_size", {"expected an integer, got null"});
}

TEST(Glm5NextConfigErrorTest, IntegerOutOfRange) {
  expect_invalid(official_with("hidden_size", json(UINT64_MAX)), "text_config.hidden_size", {"out of range"});
}

TEST(Glm5NextConfigErrorTest, StringWhereBoolExpected) {
  expect_invalid(official_with("norm_topk_prob", "true"), "text_config.norm_topk_prob", {"expected true or false"});
}

TEST(Glm5NextConfigErrorTest, StringWhereNumberExpected) {
  expect_invalid(official_with("routed_scaling_factor", "2.5"), "text_config.routed_scaling_factor",
                 {"expected a number"});
}

TEST(Glm5NextConfigErrorTest, LayerTypesNotAList) {
  expect_invalid(official_with("layer_types", "linear_attention"), "text_config.layer_types",
                 {"expected a list of strings"});
}

TEST(Glm5NextConfigErrorTest, LayerTypeNotAString) {
  json config = official();
  config["text_config"]["layer_types"][7] = 1;
  expect_invalid(config, "text_config.layer_types[7]", {"expected a string"});
}

TEST(Glm5NextConfigErrorTest, EosTokenIdWrongType) {
  expect_invalid(official_with("eos_token_id", "</s>"), "text_config.eos_token_id",
                 {"expected an integer or a list of integers"});
}

TEST(Glm5NextConfigErrorTest, EosTokenIdListOfWrongType) {
  expect_invalid(official_with("eos_token_id", {1, "2"}), "text_config.eos_token_id[1]", {"expected an integer"});
}

TEST(Glm5NextConfigErrorTest, LinearAttnConfigNotAnObject) {
  expect_invalid(official_with("linear_attn_config", {1, 2}), "text_config.linear_attn_config", {"expected an object"});
}

TEST(Glm5NextConfigErrorTest, LinearAttnConfigFieldWrongType) {
  json config = official();
  config["text_config"]["linear_attn_config"]["gate_lower_bound"] = "-5";
  expect_invalid(config, "text_config.linear_attn_config.gate_lower_bound", {"expected a number"});
}

TEST(Glm5NextConfigErrorTest, NonPositiveHiddenSize) {
  expect_invalid(official_with("hidden_size", 0), "text_config.hidden_size", {"must be positive, got 0"});
}

TEST(Glm5NextConfigErrorTest, NegativeVocabSize) {
  expect_invalid(official_with("vocab_size", -1), "text_config.vocab_size", {"must be positive, got -1"});
}

TEST(Glm5NextConfigErrorTest, NonPositiveLinearHeads) {
  json config = official();
  config["text_config"]["linear_attn_config"]["num_heads"] = 0;
  expect_invalid(config, "text_config.linear_attn_config.num_heads", {"must be positive"});
}

TEST(Glm5NextConfigErrorTest, NonPositiveRmsNormEps) {
  expect_invalid(official_with("rms_norm_eps", 0.0), "text_config.rms_norm_eps", {"must be positive"});
}

TEST(Glm5NextConfigErrorTest, NegativeNextnLayers) {
  expect_invalid(official_with("num_nextn_predict_layers", -1), "text_config.num_nextn_predict_layers",
                 {"must be >= 0"});
}

TEST(Glm5NextConfigErrorTest, ImplausibleLayerCount) {
  expect_invalid(official_with("num_hidden_layers", int64_t{1} << 40), "text_config.num_hidden_layers",
                 {"implausibly large"});
}

TEST(Glm5NextConfigErrorTest, LayerTypesLengthMismatch) {
  json config = official();
  config["text_config"]["layer_types"].erase(44);
  expect_invalid(config, "text_config.layer_types", {"44 entries, but num_hidden_layers is 45"});
}

TEST(Glm5NextConfigErrorTest, MlpLayerTypesLengthMismatch) {
  json config = official();
  config["text_config"]["mlp_layer_types"].push_back("sparse");
  expect_invalid(config, "text_config.mlp_layer_types", {"46 entries, but num_hidden_layers is 45"});
}

TEST(Glm5NextConfigErrorTest, IndexerTypesLengthMismatch) {
  expect_invalid(official_with("indexer_types", {"full"}), "text_config.indexer_types",
                 {"1 entries, but num_hidden_layers is 45"});
}

TEST(Glm5NextConfigErrorTest, IndexTopkPatternLengthMismatch) {
  json config = official_without("indexer_types");
  config["text_config"]["index_topk_pattern"] = "FF";
  expect_invalid(config, "text_config.index_topk_pattern", {"2 entries, but num_hidden_layers is 45"});
}

TEST(Glm5NextConfigErrorTest, UnknownLayerType) {
  json config = official();
  config["text_config"]["layer_types"][0] = "mamba";
  expect_invalid(config, "text_config.layer_types[0]", {"unknown value 'mamba'", "'linear_attention'"});
}

TEST(Glm5NextConfigErrorTest, UnknownMlpType) {
  json config = official();
  config["text_config"]["mlp_layer_types"][5] = "moe";
  expect_invalid(config, "text_config.mlp_layer_types[5]", {"unknown value 'moe'"});
}

TEST(Glm5NextConfigErrorTest, UnknownIndexerType) {
  json config = official();
  config["text_config"]["indexer_types"][3] = "partial";
  expect_invalid(config, "text_config.indexer_types[3]", {"unknown value 'partial'"});
}

TEST(Glm5NextConfigErrorTest, UnknownPatternLetter) {
  json config = small_config(2);
  config["index_topk_pattern"] = "Fx";
  expect_invalid(config, "index_topk_pattern", {"character 1 is 'x'"});
}

TEST(Glm5NextConfigErrorTest, KeyValueHeadsDifferFromAttentionHeads) {
  expect_invalid(official_with("num_key_value_heads", 8), "text_config.num_key_value_heads",
                 {"8 != num_attention_heads 64"});
}

TEST(Glm5NextConfigErrorTest, IndexKpoolBelowOne) {
  expect_invalid(official_with("index_kpool", 0), "text_config.index_kpool", {"must be >= 1, got 0"});
}

TEST(Glm5NextConfigErrorTest, IndexTopkNotDivisibleByKpool) {
  expect_invalid(official_with("index_topk", 2050), "text_config.index_topk",
                 {"2050 is not divisible by index_kpool 4"});
}

TEST(Glm5NextConfigErrorTest, RopeDimensionNotZero) {
  expect_invalid(official_with("qk_rope_head_dim", 64), "text_config.qk_rope_head_dim", {"must be 0", "got 64"});
}

TEST(Glm5NextConfigErrorTest, QkHeadDimDisagrees) {
  expect_invalid(official_with("qk_head_dim", 192), "text_config.qk_head_dim", {"192 != qk_nope_head_dim"});
}

TEST(Glm5NextConfigErrorTest, QLoraRankNull) {
  expect_invalid(official_with("q_lora_rank", nullptr), "text_config.q_lora_rank", {"required"});
}

TEST(Glm5NextConfigErrorTest, QLoraRankMissing) {
  expect_invalid(official_without("q_lora_rank"), "text_config.q_lora_rank", {"required"});
}

TEST(Glm5NextConfigErrorTest, ExpertsNotDivisibleIntoGroups) {
  expect_invalid(official_with("n_group", 5), "text_config.n_group", {"288 is not divisible by n_group 5"});
}

TEST(Glm5NextConfigErrorTest, TopkGroupAboveGroups) {
  expect_invalid(official_with("topk_group", 2), "text_config.topk_group", {"2 > n_group 1"});
}

TEST(Glm5NextConfigErrorTest, GroupsOfOneExpert) {
  json config = official_with("n_routed_experts", 16);
  config["text_config"]["n_group"] = 16;
  config["text_config"]["topk_group"] = 4;
  expect_invalid(config, "text_config.n_group", {"16 groups of 1", "at least 2"});
}

TEST(Glm5NextConfigErrorTest, MoreExpertsPerTokenThanExperts) {
  expect_invalid(official_with("num_experts_per_tok", 300), "text_config.num_experts_per_tok",
                 {"300 > n_routed_experts 288"});
}

TEST(Glm5NextConfigErrorTest, ScoringFuncNotSigmoid) {
  expect_invalid(official_with("scoring_func", "softmax"), "text_config.scoring_func", {"'softmax' is not supported"});
}

TEST(Glm5NextConfigErrorTest, HiddenActNotSilu) {
  expect_invalid(official_with("hidden_act", "gelu"), "text_config.hidden_act", {"'gelu' is not supported"});
}

TEST(Glm5NextConfigErrorTest, SharedIndexerAfterKdaLayer) {
  json config = official();
  config["text_config"]["indexer_types"][7] = "shared";
  expect_invalid(config, "text_config.indexer_types[7]", {"is 'shared' but layer 6 is not a full DSA layer"});
}

TEST(Glm5NextConfigErrorTest, SharedIndexerOnFirstLayer) {
  json config = small_config(2);
  config["indexer_types"] = {"shared", "full"};
  expect_invalid(config, "indexer_types[0]", {"is 'shared' but layer 0 has no previous layer to share with"});
}

TEST(Glm5NextConfigErrorTest, SharedIndexerAfterSharedLayer) {
  json config = small_config(3);
  config["index_topk_pattern"] = "FSS";
  expect_invalid(config, "indexer_types[2]", {"layer 1 is not a full DSA layer"});
}

TEST(Glm5NextConfigErrorTest, Fp8WithoutBlockSize) {
  json config = official();
  config["quantization_config"].erase("weight_block_size");
  expect_invalid(config, "quantization_config.weight_block_size", {"missing (required for fp8)"});
}

TEST(Glm5NextConfigErrorTest, Fp8BlockSizeNotAPair) {
  json config = official();
  config["quantization_config"]["weight_block_size"] = {128};
  expect_invalid(config, "quantization_config.weight_block_size", {"expected [rows, cols]"});
}

TEST(Glm5NextConfigErrorTest, Fp8BlockSizeNotPositive) {
  json config = official();
  config["quantization_config"]["weight_block_size"] = {128, 0};
  expect_invalid(config, "quantization_config.weight_block_size", {"must be positive"});
}

TEST(Glm5NextConfigErrorTest, Fp8BlockSizeNotIntegers) {
  json config = official();
  config["quantization_config"]["weight_block_size"] = {128.5, 128};
  expect_invalid(config, "quantization_config.weight_block_size[0]", {"expected an integer"});
}

TEST(Glm5NextConfigErrorTest, QuantMethodMissing) {
  json config = official();
  config["quantization_config"].erase("quant_method");
  expect_invalid(config, "quantization_config.quant_method", {"missing"});
}

TEST(Glm5NextConfigErrorTest, QuantMethodNotAString) {
  json config = official();
  config["quantization_config"] = {{"quant_method", 8}};
  expect_invalid(config, "quantization_config.quant_method", {"expected a string"});
}

TEST(Glm5NextConfigErrorTest, ModulesToNotConvertNotStrings) {
  json config = official();
  config["quantization_config"]["modules_to_not_convert"] = {"lm_head", 3};
  expect_invalid(config, "quantization_config.modules_to_not_convert[1]", {"expected a string"});
}

TEST(Glm5NextConfigErrorTest, QuantizationConfigNotAnObject) {
  json config = official();
  config["quantization_config"] = "fp8";
  expect_invalid(config, "quantization_config", {"expected an object"});
}

TEST(Glm5NextConfigErrorTest, VisionConfigNotAnObject) {
  json config = official();
  config["vision_config"] = 1;
  expect_invalid(config, "vision_config", {"expected an object"});
}

}  // namespace
}  // namespace kestrel

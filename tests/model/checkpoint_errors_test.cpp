// Malformed checkpoints at the model level: each test starts from a golden fixture (tests/data/golden), breaks one
// thing in a scratch copy (a tensor re-emitted through SafetensorsBuilder with a changed name, shape or dtype, or an
// edited config.json, with unchanged weight files symlinked rather than copied), and checks that
// Glm5NextModel::load throws kestrel::Error naming the file and the tensor or field at fault. Also: forward() on
// token ids outside the vocabulary and on an empty token list.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../formats/expect_error.h"
#include "../formats/safetensors_builder.h"
#include "broken_checkpoint.h"
#include "backend/cpu/cpu_backend.h"
#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/glm5_next.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::SafetensorsBuilder;
using testing::ScratchDir;
using testing::write_file;
using namespace kestrel::testing;

// Fixtures used as starting points (see each one's meta.json).
constexpr const char* kBf16 = "bf16_hc4_kp4";                              // 6 layers, shared indexer at layer 4
constexpr const char* kFp8 = "fp8_block16_hc4_kp4";                        // block-fp8 with weight_scale_inv
constexpr const char* kVision = "f32_hc4_kp4_shared_vision";               // model.visual.* tensors
constexpr const char* kMtp = "f32_kp1_mtp";                                // MTP layer stored as layers.5.*
constexpr const char* kSharded = "f32_hc2_kp2_softplus_group_sharded";     // 4 shards + index

constexpr const char* kShard1 = "model-00001-of-00004.safetensors";
constexpr const char* kShard2 = "model-00002-of-00004.safetensors";
constexpr const char* kShard3 = "model-00003-of-00004.safetensors";

const std::string kLayers = "model.language_model.layers.";

// --- The copy procedure itself is sound: an unmodified re-emitted copy loads. ---

TEST(CheckpointErrorsTest, UnmodifiedCopyLoads) {
  const BrokenCheckpoint checkpoint(kBf16);
  checkpoint.write_single_file({});
  CpuBackend backend;
  const auto model = Glm5NextModel::load(checkpoint.dir(), backend);
  EXPECT_EQ(model->config().num_hidden_layers, 6);
}

TEST(CheckpointErrorsTest, TiedEmbeddingsNeedNoLmHead) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["tie_word_embeddings"] = true;
  checkpoint.write_single_file(drop("lm_head.weight"));
  CpuBackend backend;
  const auto model = Glm5NextModel::load(checkpoint.dir(), backend);
  EXPECT_EQ(model->weights().lm_head.data, model->weights().embed_tokens.data);
}

// --- Missing tensors ---

TEST(CheckpointErrorsTest, MissingKdaTensor) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "0.self_attn.q_proj.weight";
  checkpoint.write_single_file(drop(name));
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(name), checkpoint.config_path()});
}

TEST(CheckpointErrorsTest, MissingKdaConvTaps) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "2.self_attn.v_conv1d.weight";
  checkpoint.write_single_file(drop(name));
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(name), checkpoint.config_path()});
}

TEST(CheckpointErrorsTest, MissingMlaTensor) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "3.self_attn.kv_b_proj.weight";
  checkpoint.write_single_file(drop(name));
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(name), checkpoint.config_path()});
}

TEST(CheckpointErrorsTest, MissingIndexerTensorOfFullLayer) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "1.self_attn.indexer.index_kpool_compress_ape";
  checkpoint.write_single_file(drop(name));
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(name), checkpoint.config_path()});
}

TEST(CheckpointErrorsTest, MissingRoutedExpert) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "5.mlp.experts.7.down_proj.weight";
  checkpoint.write_single_file(drop(name));
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(name), checkpoint.config_path()});
}

TEST(CheckpointErrorsTest, MissingLmHeadWhenNotTied) {
  const BrokenCheckpoint checkpoint(kBf16);
  ASSERT_FALSE(checkpoint.copy_tensors(kSingleFile).tensors().empty());
  checkpoint.write_single_file(drop("lm_head.weight"));
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing("lm_head.weight"), checkpoint.config_path()});
}

TEST(CheckpointErrorsTest, MissingMtpTensor) {
  const BrokenCheckpoint checkpoint(kMtp);
  const std::string name = kLayers + "5.shared_head.norm.weight";
  checkpoint.write_single_file(drop(name));
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(name), checkpoint.config_path()});
}

// --- Wrong shapes ---

TEST(CheckpointErrorsTest, MatrixWithWrongShape) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "0.self_attn.q_proj.weight";  // [64, 32], stored transposed
  checkpoint.write_single_file(change(name, [](Tensor& tensor) { tensor.shape = {32, 64}; }));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has shape [32, 64]",
                                checkpoint.config_path() + " implies [64, 32]"});
}

TEST(CheckpointErrorsTest, ExpertMatrixWithWrongShape) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "2.mlp.experts.3.up_proj.weight";  // [16, 32]
  checkpoint.write_single_file(change(name, [](Tensor& tensor) { tensor.shape = {8, 64}; }));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has shape [8, 64]",
                                checkpoint.config_path() + " implies [16, 32]"});
}

TEST(CheckpointErrorsTest, NormVectorWithWrongShape) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "1.input_layernorm.weight";  // [32]; same element count as [1, 32]
  checkpoint.write_single_file(change(name, [](Tensor& tensor) { tensor.shape = {1, 32}; }));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has shape [1, 32]",
                                checkpoint.config_path() + " implies [32]"});
}

TEST(CheckpointErrorsTest, ShortNormVector) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "0.self_attn.o_norm.weight";  // [16] BF16
  checkpoint.write_single_file(change(name, [](Tensor& tensor) {
    tensor.shape = {8};
    tensor.bytes.resize(16);
  }));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has shape [8]",
                                checkpoint.config_path() + " implies [16]"});
}

TEST(CheckpointErrorsTest, ConvTapsWithoutChannelDimension) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "0.self_attn.k_conv1d.weight";  // [64, 1, 4]
  checkpoint.write_single_file(change(name, [](Tensor& tensor) { tensor.shape = {64, 4}; }));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has shape [64, 4]",
                                "implies [64, 1, 4]"});
}

TEST(CheckpointErrorsTest, ShapeErrorInShardNamesTheShard) {
  BrokenCheckpoint checkpoint(kSharded);
  checkpoint.write_config();
  checkpoint.link_weights({kShard3});
  const std::string name = kLayers + "3.mlp.gate_proj.weight";
  SafetensorsBuilder shard = checkpoint.copy_tensors(kShard3, change(name, [](Tensor& tensor) {
    std::reverse(tensor.shape.begin(), tensor.shape.end());
  }));
  shard.write(checkpoint.file(kShard3));
  load_error(checkpoint.dir(), {checkpoint.file(kShard3) + ": tensor '" + name + "' has shape", "implies"});
}

// --- Wrong dtypes ---

TEST(CheckpointErrorsTest, MatrixStoredAsI32) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "3.self_attn.q_a_proj.weight";
  checkpoint.write_single_file(retype(name, "I32", 4));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has dtype I32",
                                "expected F32, F16, BF16 or F8_E4M3"});
}

TEST(CheckpointErrorsTest, NormStoredAsF8) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "3.self_attn.q_a_layernorm.weight";
  checkpoint.write_single_file(retype(name, "F8_E4M3", 1));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has dtype F8_E4M3",
                                "expected F32, F16 or BF16"});
}

TEST(CheckpointErrorsTest, FinalNormStoredAsI64) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = "model.language_model.norm.weight";
  checkpoint.write_single_file(retype(name, "I64", 8));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has dtype I64"});
}

// --- FP8 block scales ---

TEST(CheckpointErrorsTest, F8MatrixWithoutQuantizationConfig) {
  const BrokenCheckpoint checkpoint(kBf16);
  const std::string name = kLayers + "0.self_attn.q_proj.weight";
  checkpoint.write_single_file(retype(name, "F8_E4M3", 1));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' is F8_E4M3",
                                checkpoint.config_path() + " has no fp8 quantization_config"});
}

TEST(CheckpointErrorsTest, Fp8CheckpointWithQuantizationConfigRemoved) {
  BrokenCheckpoint checkpoint(kFp8);
  ASSERT_EQ(checkpoint.config().erase("quantization_config"), 1u);
  checkpoint.write_config();
  checkpoint.link_weights();
  // The first F8 matrix bound: layer 0's dense MLP (after the norms, mHC and the BF16 KDA block).
  const std::string name = kLayers + "0.mlp.gate_proj.weight";
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' is F8_E4M3",
                                "has no fp8 quantization_config"});
}

TEST(CheckpointErrorsTest, F8MatrixMissingItsScale) {
  const BrokenCheckpoint checkpoint(kFp8);
  const std::string name = kLayers + "2.self_attn.q_b_proj.weight_scale_inv";
  checkpoint.write_single_file(drop(name));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + kLayers +
                                    "2.self_attn.q_b_proj.weight' is F8_E4M3 but its block scale '" + name +
                                    "' is missing"});
}

TEST(CheckpointErrorsTest, ScaleWithWrongShape) {
  const BrokenCheckpoint checkpoint(kFp8);
  // down_proj [40, 56] in 16 x 16 blocks (ragged) needs [3, 4] scales; [4, 3] has the same size.
  const std::string name = kLayers + "0.mlp.down_proj.weight_scale_inv";
  checkpoint.write_single_file(change(name, [](Tensor& tensor) { tensor.shape = {4, 3}; }));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has shape [4, 3]",
                                "implies [3, 4]"});
}

TEST(CheckpointErrorsTest, ScaleComputedWithoutRaggedEdge) {
  const BrokenCheckpoint checkpoint(kFp8);
  // Flooring instead of rounding up: [40, 56] / 16 -> [2, 3] rather than [3, 4].
  const std::string name = kLayers + "0.mlp.down_proj.weight_scale_inv";
  checkpoint.write_single_file(change(name, [](Tensor& tensor) {
    tensor.shape = {2, 3};
    tensor.bytes.resize(2 * 3 * 4);
  }));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has shape [2, 3]",
                                "implies [3, 4]"});
}

TEST(CheckpointErrorsTest, ScaleStoredAsI32) {
  const BrokenCheckpoint checkpoint(kFp8);
  const std::string name = kLayers + "1.mlp.experts.4.gate_proj.weight_scale_inv";
  checkpoint.write_single_file(retype(name, "I32", 4));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + name + "' has dtype I32",
                                "block scales must be F32 or BF16"});
}

TEST(CheckpointErrorsTest, ScaleNextToBf16Weight) {
  const BrokenCheckpoint checkpoint(kFp8);
  const std::string weight = kLayers + "0.self_attn.q_proj.weight";  // BF16 [64, 40]
  SafetensorsBuilder builder = checkpoint.copy_tensors(kSingleFile);
  builder.add_values<float>(weight + "_scale_inv", "F32", {4, 3}, std::vector<float>(12, 1.0f));
  checkpoint.write_config();
  builder.write(checkpoint.file(kSingleFile));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + weight + "' has a block scale '" +
                                    weight + "_scale_inv' but is BF16, not F8_E4M3"});
}

// --- Tensors the model does not account for ---

TEST(CheckpointErrorsTest, UnknownExtraTensorsAreNamedAndCounted) {
  const BrokenCheckpoint checkpoint(kBf16);
  SafetensorsBuilder builder = checkpoint.copy_tensors(kSingleFile);
  builder.add_values<float>("model.language_model.zz_extra.weight", "F32", {2}, {1.0f, 2.0f});
  builder.add_values<float>(kLayers + "0.self_attn.extra_proj.weight", "F32", {2}, {1.0f, 2.0f});
  builder.add_values<float>("lm_head.bias", "F32", {2}, {1.0f, 2.0f});
  checkpoint.write_config();
  builder.write(checkpoint.file(kSingleFile));
  // The first unknown name in sorted order is reported, and the other two are counted.
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor 'lm_head.bias' is not part of the glm5_next " +
                                    "model described by " + checkpoint.config_path() + " (2 more unknown tensors)"});
}

TEST(CheckpointErrorsTest, SingleUnknownTensorHasNoCount) {
  const BrokenCheckpoint checkpoint(kBf16);
  SafetensorsBuilder builder = checkpoint.copy_tensors(kSingleFile);
  const std::string name = kLayers + "4.self_attn.indexer.wk.weight";  // layer 4's indexer is "shared"
  builder.add_values<float>(name, "F32", {16, 32}, std::vector<float>(16 * 32, 0.0f));
  checkpoint.write_config();
  builder.write(checkpoint.file(kSingleFile));
  const std::string message =
      load_error(checkpoint.dir(), {"tensor '" + name + "' is not part of the glm5_next model"});
  EXPECT_EQ(message.find("more unknown"), std::string::npos) << message;
}

// Number of tensors in the fixture's single file whose name starts with `prefix`, and the first of them.
std::pair<size_t, std::string> tensors_with_prefix(const std::string& fixture, const std::string& prefix) {
  const SafetensorsFile file(golden_fixture_dir(fixture) + "/" + kSingleFile);
  std::vector<std::string> names;
  for (const TensorView& view : file.tensors()) {
    if (view.name.starts_with(prefix)) names.push_back(view.name);
  }
  std::sort(names.begin(), names.end());
  return {names.size(), names.empty() ? std::string() : names.front()};
}

TEST(CheckpointErrorsTest, VisionTensorsWithoutVisionConfig) {
  BrokenCheckpoint checkpoint(kVision);
  ASSERT_EQ(checkpoint.config().erase("vision_config"), 1u);
  checkpoint.write_config();
  checkpoint.link_weights();
  const auto [count, first] = tensors_with_prefix(kVision, "model.visual.");
  ASSERT_GT(count, 1u);
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + first + "' is not part of",
                                fmt::format("({} more unknown tensors)", count - 1)});
}

TEST(CheckpointErrorsTest, MtpTensorsWhenConfigHasNoMtpLayer) {
  BrokenCheckpoint checkpoint(kMtp);
  checkpoint.text_config()["num_nextn_predict_layers"] = 0;
  checkpoint.write_config();
  checkpoint.link_weights();
  const auto [count, first] = tensors_with_prefix(kMtp, kLayers + "5.");
  ASSERT_GT(count, 1u);
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + first + "' is not part of",
                                fmt::format("({} more unknown tensors)", count - 1)});
}

TEST(CheckpointErrorsTest, ConfigWithMoreMtpLayersThanPresent) {
  BrokenCheckpoint checkpoint(kMtp);
  checkpoint.text_config()["num_nextn_predict_layers"] = 2;
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(kLayers + "6.enorm.weight")});
}

// --- Config inconsistent with the weights ---

TEST(CheckpointErrorsTest, ConfigWithMoreLayersThanPresent) {
  BrokenCheckpoint checkpoint(kBf16);
  json& text = checkpoint.text_config();
  text["num_hidden_layers"] = 7;
  text["layer_types"].push_back("linear_attention");
  text["mlp_layer_types"].push_back("dense");
  text["indexer_types"].push_back("full");
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(),
             {checkpoint.dir() + ": " + missing(kLayers + "6.input_layernorm.weight"), checkpoint.config_path()});
}

TEST(CheckpointErrorsTest, ConfigWithFewerLayersThanPresent) {
  BrokenCheckpoint checkpoint(kBf16);
  json& text = checkpoint.text_config();
  text["num_hidden_layers"] = 5;
  for (const char* key : {"layer_types", "mlp_layer_types", "indexer_types"}) text[key].erase(5);
  checkpoint.write_config();
  checkpoint.link_weights();
  const auto [count, first] = tensors_with_prefix(kBf16, kLayers + "5.");
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + first + "' is not part of",
                                fmt::format("({} more unknown tensors)", count - 1)});
}

TEST(CheckpointErrorsTest, ConfigHiddenSizeInconsistentWithWeights) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["hidden_size"] = 48;
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(),
             {checkpoint.file(kSingleFile) + ": tensor 'model.language_model.embed_tokens.weight' has shape [256, 32]",
              checkpoint.config_path() + " implies [256, 48]"});
}

TEST(CheckpointErrorsTest, ConfigVocabSizeInconsistentWithWeights) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["vocab_size"] = 300;
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {"tensor 'model.language_model.embed_tokens.weight' has shape [256, 32]",
                                "implies [300, 32]"});
}

TEST(CheckpointErrorsTest, ConfigLayerTypeDisagreesWithWeights) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["layer_types"][0] = "deepseek_sparse_attention";  // layer 0 holds KDA weights
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(kLayers + "0.self_attn.q_a_proj.weight")});
}

TEST(CheckpointErrorsTest, ConfigMlpTypeDisagreesWithWeights) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["mlp_layer_types"][0] = "sparse";  // layer 0 holds a dense MLP
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(kLayers + "0.mlp.gate.weight")});
}

TEST(CheckpointErrorsTest, ConfigFullIndexerWhereWeightsHaveNone) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["indexer_types"][4] = "full";  // layer 4 is stored as a shared-indexer layer
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.dir() + ": " + missing(kLayers + "4.self_attn.indexer.wq_b.weight")});
}

TEST(CheckpointErrorsTest, ConfigSharedIndexerAfterKdaLayer) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["indexer_types"][3] = "shared";  // layer 3 is DSA, layer 2 is KDA
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": text_config.indexer_types[3]: is 'shared'",
                                "layer 2 is not a full DSA layer"});
}

TEST(CheckpointErrorsTest, ConfigSharedIndexerAfterSharedLayer) {
  BrokenCheckpoint checkpoint(kVision);  // layers: KDA, DSA full, DSA shared, KDA, KDA
  json& text = checkpoint.text_config();
  text["layer_types"][3] = "deepseek_sparse_attention";
  text["indexer_types"][3] = "shared";
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": text_config.indexer_types[3]: is 'shared'",
                                "layer 2 is not a full DSA layer"});
}

TEST(CheckpointErrorsTest, ConfigSharedIndexerOnFirstLayer) {
  BrokenCheckpoint checkpoint(kSharded);  // layer 0 is DSA
  checkpoint.text_config()["indexer_types"][0] = "shared";
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": text_config.indexer_types[0]: is 'shared'"});
}

// --- config.json itself ---

TEST(CheckpointErrorsTest, ConfigMissing) {
  const BrokenCheckpoint checkpoint(kBf16);
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": cannot open"});
}

TEST(CheckpointErrorsTest, ConfigNotJson) {
  const BrokenCheckpoint checkpoint(kBf16);
  checkpoint.link_weights();
  write_file(checkpoint.config_path(), "{\"model_type\": \"glm5_next\", \"text_config\": {");
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": invalid JSON"});
}

TEST(CheckpointErrorsTest, ConfigIsAJsonArray) {
  const BrokenCheckpoint checkpoint(kBf16);
  checkpoint.link_weights();
  write_file(checkpoint.config_path(), "[1, 2, 3]");
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": expected a JSON object"});
}

TEST(CheckpointErrorsTest, ConfigModelTypeWrong) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.config()["model_type"] = "glm4_moe";
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": model_type: 'glm4_moe' is not 'glm5_next'"});
}

TEST(CheckpointErrorsTest, ConfigFieldOfWrongType) {
  BrokenCheckpoint checkpoint(kBf16);
  checkpoint.text_config()["hidden_size"] = "32";
  checkpoint.write_config();
  checkpoint.link_weights();
  load_error(checkpoint.dir(), {checkpoint.config_path() + ": text_config.hidden_size: expected an integer"});
}

// --- Weight files ---

TEST(CheckpointErrorsTest, ModelDirectoryMissing) {
  const ScratchDir scratch;
  const std::string dir = scratch.file("no_such_model");
  load_error(dir, {dir + ": not a directory"});
}

TEST(CheckpointErrorsTest, NoWeightFiles) {
  const BrokenCheckpoint checkpoint(kBf16);
  checkpoint.write_config();
  load_error(checkpoint.dir(), {checkpoint.dir() + ": no model.safetensors or model.safetensors.index.json"});
}

TEST(CheckpointErrorsTest, TruncatedSingleFile) {
  const BrokenCheckpoint checkpoint(kBf16);
  SafetensorsBuilder builder = checkpoint.copy_tensors(kSingleFile);
  const std::string last = builder.tensors().back().name;  // its data ends the file
  builder.corrupt().truncate_to = builder.build().size() - 1;
  checkpoint.write_config();
  builder.write(checkpoint.file(kSingleFile));
  load_error(checkpoint.dir(), {checkpoint.file(kSingleFile) + ": tensor '" + last + "'", "exceed the data section"});
}

TEST(CheckpointErrorsTest, TruncatedShard) {
  const BrokenCheckpoint checkpoint(kSharded);
  checkpoint.write_config();
  checkpoint.link_weights({kShard2});
  SafetensorsBuilder shard = checkpoint.copy_tensors(kShard2);
  const std::string last = shard.tensors().back().name;
  shard.corrupt().truncate_to = shard.build().size() - 1;
  shard.write(checkpoint.file(kShard2));
  load_error(checkpoint.dir(), {checkpoint.file(kShard2) + ": tensor '" + last + "'", "exceed the data section"});
}

TEST(CheckpointErrorsTest, ShardTruncatedInsideHeaderLength) {
  const BrokenCheckpoint checkpoint(kSharded);
  checkpoint.write_config();
  checkpoint.link_weights({kShard3});
  SafetensorsBuilder shard = checkpoint.copy_tensors(kShard3);
  shard.corrupt().truncate_to = 5;
  shard.write(checkpoint.file(kShard3));
  load_error(checkpoint.dir(), {checkpoint.file(kShard3) + ": file is 5 bytes, shorter than the 8-byte header length"});
}

// The smallest tensor name the fixture's index assigns to `shard`.
std::string first_listed_in(const json& index, const std::string& shard) {
  std::string first;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    if (file == shard && (first.empty() || name < first)) first = name;
  }
  return first;
}

TEST(CheckpointErrorsTest, IndexNamesMissingShard) {
  const BrokenCheckpoint checkpoint(kSharded);
  checkpoint.write_config();
  checkpoint.link_weights({kShard3});
  const std::string listed = first_listed_in(read_json(checkpoint.source_file(kIndexFile)), kShard3);
  ASSERT_FALSE(listed.empty());
  load_error(checkpoint.dir(), {checkpoint.file(kIndexFile) + ": tensor '" + listed + "' is listed in shard '" +
                                    kShard3 + "', which does not exist"});
}

TEST(CheckpointErrorsTest, IndexAssignsTensorToWrongShard) {
  const BrokenCheckpoint checkpoint(kSharded);
  checkpoint.write_config();
  checkpoint.link_weights({kIndexFile});
  json index = read_json(checkpoint.source_file(kIndexFile));
  ASSERT_EQ(index["weight_map"]["lm_head.weight"], kShard1);
  index["weight_map"]["lm_head.weight"] = kShard2;
  write_file(checkpoint.file(kIndexFile), index.dump(2));
  load_error(checkpoint.dir(), {checkpoint.file(kShard1) + ": tensor 'lm_head.weight' is in this shard, but " +
                                    kIndexFile + " assigns it to '" + kShard2 + "'"});
}

TEST(CheckpointErrorsTest, IndexListsTensorInShardThatLacksIt) {
  const BrokenCheckpoint checkpoint(kSharded);
  checkpoint.write_config();
  checkpoint.link_weights({kIndexFile});
  json index = read_json(checkpoint.source_file(kIndexFile));
  const std::string moved = first_listed_in(index, kShard2);
  index["weight_map"][moved] = kShard1;  // shard 1 is opened first and does not hold it
  write_file(checkpoint.file(kIndexFile), index.dump(2));
  load_error(checkpoint.dir(), {checkpoint.file(kShard1) + ": tensor '" + moved + "' is listed in " + kIndexFile +
                                    " but that shard does not contain it"});
}

TEST(CheckpointErrorsTest, ShardHoldsTensorTheIndexOmits) {
  const BrokenCheckpoint checkpoint(kSharded);
  checkpoint.write_config();
  checkpoint.link_weights({kIndexFile});
  json index = read_json(checkpoint.source_file(kIndexFile));
  const std::string omitted = first_listed_in(index, kShard3);
  index["weight_map"].erase(omitted);
  write_file(checkpoint.file(kIndexFile), index.dump(2));
  load_error(checkpoint.dir(),
             {checkpoint.file(kShard3) + ": tensor '" + omitted + "' is not listed in " + kIndexFile});
}

// --- forward() on bad token ids ---

class ForwardInputTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() { model_ = Glm5NextModel::load(golden_fixture_dir(kBf16), *backend_); }
  static void TearDownTestSuite() { model_.reset(); }

  static inline std::unique_ptr<CpuBackend> backend_ = std::make_unique<CpuBackend>();
  static inline std::unique_ptr<Glm5NextModel> model_;
};

TEST_F(ForwardInputTest, TokenIdAtVocabSizeIsAnError) {
  const auto sequence = model_->new_sequence();
  const std::vector<int32_t> tokens = {5, 256, 7};
  expect_error([&] { (void)model_->forward(*sequence, tokens); }, {"token id 256 is outside the vocabulary [0, 256)"});
  EXPECT_EQ(sequence->num_tokens(), 0);
}

TEST_F(ForwardInputTest, HugeTokenIdIsAnError) {
  const auto sequence = model_->new_sequence();
  const std::vector<int32_t> tokens = {std::numeric_limits<int32_t>::max()};
  expect_error([&] { (void)model_->forward(*sequence, tokens); }, {"token id 2147483647 is outside the vocabulary"});
}

TEST_F(ForwardInputTest, NegativeTokenIdIsAnError) {
  const auto sequence = model_->new_sequence();
  const std::vector<int32_t> tokens = {1, 2, -1};
  expect_error([&] { (void)model_->forward(*sequence, tokens); }, {"token id -1 is outside the vocabulary [0, 256)"});
  EXPECT_EQ(sequence->num_tokens(), 0);
}

TEST_F(ForwardInputTest, BadTokenInDecodeStepLeavesSequenceUsable) {
  const auto sequence = model_->new_sequence();
  const std::vector<int32_t> prompt = {3, 4, 5};
  const std::vector<float> logits = model_->forward(*sequence, prompt);
  ASSERT_EQ(logits.size(), 3u * 256u);
  const std::vector<int32_t> bad = {1000};
  expect_error([&] { (void)model_->forward(*sequence, bad); }, {"token id 1000"});
  EXPECT_EQ(sequence->num_tokens(), 3);
  const std::vector<int32_t> next = {6};
  EXPECT_EQ(model_->forward(*sequence, next).size(), 256u);
  EXPECT_EQ(sequence->num_tokens(), 4);
}

TEST_F(ForwardInputTest, EmptyTokenListReturnsEmptyLogits) {
  const auto sequence = model_->new_sequence();
  EXPECT_TRUE(model_->forward(*sequence, std::span<const int32_t>()).empty());
  EXPECT_TRUE(model_->forward(*sequence, std::span<const int32_t>(), ForwardOptions{.all_logits = false}).empty());
  EXPECT_EQ(sequence->num_tokens(), 0);
}

// A batched pass checks every call before any sequence changes: a bad token in one call or a sequence named twice
// leaves all of them as they were.
TEST_F(ForwardInputTest, BadBatchLeavesEverySequenceUnchanged) {
  const auto first = model_->new_sequence();
  const auto second = model_->new_sequence();
  const std::vector<int32_t> good = {3, 4, 5}, bad = {9, 300};
  const std::vector<SequenceCall> bad_token = {{first.get(), good}, {second.get(), bad}};
  expect_error([&] { (void)model_->forward_batch(bad_token); }, {"token id 300 is outside the vocabulary"});
  const std::vector<SequenceCall> twice = {{first.get(), good}, {second.get(), good}, {first.get(), good}};
  expect_error([&] { (void)model_->forward_batch(twice); }, {"names one sequence twice (calls 0 and 2)"});
  EXPECT_EQ(first->num_tokens(), 0);
  EXPECT_EQ(second->num_tokens(), 0);
  const std::vector<SequenceCall> fine = {{first.get(), good}, {second.get(), {}}};
  const std::vector<std::vector<float>> logits = model_->forward_batch(fine, ForwardOptions{.all_logits = false});
  ASSERT_EQ(logits.size(), 2u);
  EXPECT_EQ(logits[0].size(), 256u);
  EXPECT_TRUE(logits[1].empty());
  EXPECT_EQ(first->num_tokens(), 3);
  EXPECT_EQ(second->num_tokens(), 0);
}

}  // namespace
}  // namespace kestrel

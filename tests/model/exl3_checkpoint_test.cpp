// Checkpoints whose routed experts are stored as EXL3 (trellis / suh / svh / codebook marker, exllamav3's layout):
// the loader binds them next to float tensors and the forward computes with them — its logits equal those of the
// same model with each expert stored as its dequantised float32 weight — and every inconsistent tensor set is refused
// with an error naming the file and the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../backend/exl3_random_matrix.h"
#include "broken_checkpoint.h"
#include "golden_fixture.h"

namespace kestrel {
namespace {

using namespace kestrel::testing;

constexpr const char* kFixture = "f32_hc4_kp4_shared_vision";  // f32, 6 layers, MoE experts [16, 32] / [32, 16]

// Expert matrices `...mlp.experts.<e>.<gate|up|down>_proj.weight`: the module name, or "" for other tensors.
std::string expert_module(const std::string& name) {
  // No std::regex: it trips GCC 12's -Wmaybe-uninitialized in the -O1 sanitizer build.
  if (name.find(".mlp.experts.") == std::string::npos) return {};
  for (const std::string suffix : {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"}) {
    if (name.ends_with(suffix)) return name.substr(0, name.size() - 7);
  }
  return {};
}

exl3::Codebook codebook_of(size_t i) {
  const exl3::Codebook all[] = {exl3::Codebook::mcg, exl3::Codebook::mul1, exl3::Codebook::inst3};
  return all[i % 3];
}

// The fixture twice: `exl3` with every routed expert replaced by a random EXL3 matrix (codebooks and K = 2..5 vary
// from expert to expert), `dequantized` with each of them stored as the float32 weight it stands for.
struct Exl3Pair {
  BrokenCheckpoint exl3{kFixture}, dequantized{kFixture};
  std::vector<std::string> modules;

  Exl3Pair() {
    std::vector<RandomExl3Matrix> matrices;
    auto quantized = exl3.copy_tensors(kSingleFile, [&](Tensor& tensor) {
      const std::string module = expert_module(tensor.name);
      if (module.empty()) return true;
      const size_t i = modules.size();
      modules.push_back(module);
      matrices.push_back(random_exl3_matrix(tensor.shape[0], tensor.shape[1], 2 + static_cast<int>(i % 4),
                                            codebook_of(i), static_cast<uint32_t>(1000 + i), 0.35f));
      return false;
    });
    for (size_t i = 0; i < modules.size(); ++i) add_exl3_tensors(quantized, modules[i], matrices[i]);
    exl3.config()["quantization_config"] = {{"quant_method", "exl3"}, {"bits", 3.5}, {"codebook", "mcg"}};
    exl3.write_config();
    quantized.write(exl3.file(kSingleFile));

    size_t next = 0;
    dequantized.write_single_file([&](Tensor& tensor) {
      if (expert_module(tensor.name).empty()) return true;
      tensor.bytes = bytes_of(matrices[next++].hf_weight());
      return true;
    });
  }

  static void add_exl3_tensors(SafetensorsBuilder& builder, const std::string& module, const RandomExl3Matrix& m) {
    builder.add_tensor({.name = module + ".trellis", .dtype = "I16",
                        .shape = {m.in_padded / 16, m.out_padded / 16, 16 * m.bits}, .bytes = bytes_of(m.trellis),
                        .data_offsets = {}, .raw_entry = {}});
    builder.add_tensor({.name = module + ".suh", .dtype = "F16", .shape = {m.in_padded}, .bytes = bytes_of(m.suh),
                        .data_offsets = {}, .raw_entry = {}});
    builder.add_tensor({.name = module + ".svh", .dtype = "F16", .shape = {m.out_padded}, .bytes = bytes_of(m.svh),
                        .data_offsets = {}, .raw_entry = {}});
    if (m.codebook != exl3::Codebook::inst3) {
      const bool mcg = m.codebook == exl3::Codebook::mcg;
      const auto marker = static_cast<int32_t>(mcg ? exl3::kMcgMultiplier : exl3::kMul1Multiplier);
      builder.add_tensor({.name = module + (mcg ? ".mcg" : ".mul1"), .dtype = "I32", .shape = {},
                          .bytes = bytes_of(std::vector<int32_t>{marker}), .data_offsets = {}, .raw_entry = {}});
    }
  }
};

TEST(Exl3CheckpointTest, Exl3ExpertsGiveTheLogitsOfTheirDequantizedWeights) {
  const Exl3Pair pair;
  ASSERT_EQ(pair.modules.size(), 3u * 8u * 3u);  // gate/up/down x 8 experts x 3 MoE layers
  const GoldenFixture fixture = read_golden_fixture(kFixture);
  CpuBackend backend;
  const auto exl3_model = Glm5NextModel::load(pair.exl3.dir(), backend);
  const auto float_model = Glm5NextModel::load(pair.dequantized.dir(), backend);
  const std::vector<float> got = exl3_model->forward(*exl3_model->new_sequence(), fixture.tokens);
  const std::vector<float> want = float_model->forward(*float_model->new_sequence(), fixture.tokens);
  ASSERT_EQ(got.size(), want.size());
  // The experts must matter, or the comparison proves nothing: the original fixture's logits differ.
  const auto original = Glm5NextModel::load(golden_fixture_dir(kFixture), backend);
  const std::vector<float> before = original->forward(*original->new_sequence(), fixture.tokens);
  float max_diff = 0, max_change = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    max_change = std::max(max_change, std::abs(want[i] - before[i]));
  }
  EXPECT_LT(max_diff, 1e-4f);  // fp32 rounding: the EXL3 path works in the rotated basis
  EXPECT_GT(max_change, 1e-2f);
}

// --- Inconsistent EXL3 tensor sets ---

class Exl3CheckpointErrorsTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() { pair_ = new Exl3Pair(); }
  static void TearDownTestSuite() {
    delete pair_;
    pair_ = nullptr;
  }

  // modules[0] is MCG with K = 2, modules[1] MUL1 with K = 3, modules[2] 3INST with K = 4.
  static const std::string& module(size_t i) { return pair_->modules.at(i); }

  // The EXL3 checkpoint with `edit` applied to its tensors, `extra` tensors appended and the quantization_config
  // dropped or not; loading it must fail with every fragment in the message.
  static void expect_load_error(const TensorEdit& edit, std::vector<Tensor> extra,
                                std::initializer_list<std::string_view> fragments, bool keep_quantization_config = true) {
    BrokenCheckpoint broken(kFixture);
    broken.config() = read_json(pair_->exl3.file("config.json"));
    if (!keep_quantization_config) broken.config().erase("quantization_config");
    broken.write_config();
    SafetensorsBuilder builder;
    const SafetensorsFile file(pair_->exl3.file(kSingleFile));
    for (const TensorView& view : file.tensors()) {
      Tensor tensor{.name = view.name, .dtype = std::string(dtype_name(view.dtype)), .shape = view.shape,
                    .bytes = std::string(reinterpret_cast<const char*>(view.data), view.nbytes), .data_offsets = {},
                    .raw_entry = {}};
      if (edit && !edit(tensor)) continue;
      builder.add_tensor(std::move(tensor));
    }
    for (Tensor& tensor : extra) builder.add_tensor(std::move(tensor));
    builder.write(broken.file(kSingleFile));
    const std::string message = load_error(broken.dir(), fragments);
    EXPECT_TRUE(message.starts_with(broken.dir())) << message;
  }

  static Tensor tensor(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, size_t bytes) {
    return Tensor{.name = name, .dtype = dtype, .shape = std::move(shape), .bytes = std::string(bytes, '\0'),
                  .data_offsets = {}, .raw_entry = {}};
  }

  static Exl3Pair* pair_;
};

Exl3Pair* Exl3CheckpointErrorsTest::pair_ = nullptr;

TEST_F(Exl3CheckpointErrorsTest, Exl3TensorsWithoutExl3QuantizationConfig) {
  expect_load_error({}, {}, {"is stored as EXL3", "has no quantization_config with quant_method \"exl3\""}, false);
}

TEST_F(Exl3CheckpointErrorsTest, TrellisWithWrongTileCount) {
  const std::string name = module(0) + ".trellis";
  expect_load_error(change(name, [](Tensor& t) { t.shape = {16, 4, 32}; }), {},
                    {"tensor '" + name + "' is I16 [16, 4, 32]", "the EXL3 form of a [32, 16] linear is I16 [8, 8, 16*K] with K in 1..8"});
}

TEST_F(Exl3CheckpointErrorsTest, TrellisWithMoreThanEightBits) {
  const std::string name = module(0) + ".trellis";
  expect_load_error(change(name, [](Tensor& t) {
                      t.shape = {8, 8, 144};
                      t.bytes.assign(8 * 8 * 144 * 2, '\0');
                    }),
                    {}, {"tensor '" + name + "' is I16 [8, 8, 144]"});
}

TEST_F(Exl3CheckpointErrorsTest, TrellisWithPartialTileRecord) {
  const std::string name = module(0) + ".trellis";
  expect_load_error(change(name, [](Tensor& t) {
                      t.shape = {8, 8, 40};
                      t.bytes.assign(8 * 8 * 40 * 2, '\0');
                    }),
                    {}, {"tensor '" + name + "' is I16 [8, 8, 40]"});
}

TEST_F(Exl3CheckpointErrorsTest, TrellisStoredAsF16) {
  const std::string name = module(1) + ".trellis";
  expect_load_error(change(name, [](Tensor& t) { t.dtype = "F16"; }), {}, {"tensor '" + name + "' is F16"});
}

TEST_F(Exl3CheckpointErrorsTest, MissingSuh) {
  expect_load_error(drop(module(1) + ".suh"), {}, {missing(module(1) + ".suh")});
}

TEST_F(Exl3CheckpointErrorsTest, SvhWithWrongLength) {
  const std::string name = module(2) + ".svh";
  expect_load_error(change(name, [](Tensor& t) {
                      t.shape = {64};
                      t.bytes.resize(128);
                    }),
                    {}, {"tensor '" + name + "' is F16 [64]", "vectors are F16 [128]"});
}

TEST_F(Exl3CheckpointErrorsTest, SuhStoredAsBf16) {
  const std::string name = module(2) + ".suh";
  expect_load_error(change(name, [](Tensor& t) { t.dtype = "BF16"; }), {},
                    {"tensor '" + name + "' is BF16 [128]", "vectors are F16 [128]"});
}

TEST_F(Exl3CheckpointErrorsTest, FloatWeightNextToTrellis) {
  expect_load_error({}, {tensor(module(0) + ".weight", "F32", {32, 16}, 32 * 16 * 4)},
                    {"module '" + module(0) + "' has both '" + module(0) + ".weight' and an EXL3 trellis"});
}

TEST_F(Exl3CheckpointErrorsTest, BothCodebookMarkers) {
  expect_load_error({}, {tensor(module(0) + ".mul1", "I32", {}, 4)},
                    {"module '" + module(0) + "' has both the mcg and the mul1 codebook marker"});
}

TEST_F(Exl3CheckpointErrorsTest, MarkerWithUnlockedMultiplier) {
  const std::string name = module(0) + ".mcg";
  expect_load_error(change(name, [](Tensor& t) { t.bytes = bytes_of(std::vector<int32_t>{0x12345678}); }), {},
                    {"codebook marker '" + name + "' must be an I32 scalar holding 0xcbac1fed", "= 0x12345678"});
}

TEST_F(Exl3CheckpointErrorsTest, MarkerStoredAsVector) {
  const std::string name = module(1) + ".mul1";
  expect_load_error(change(name, [](Tensor& t) { t.shape = {1}; }), {},
                    {"codebook marker '" + name + "' must be an I32 scalar holding 0x83dcd12d", "it is I32 [1]"});
}

TEST_F(Exl3CheckpointErrorsTest, LegacyPackedSignVectors) {
  expect_load_error({}, {tensor(module(2) + ".su", "I16", {8}, 16)},
                    {"module '" + module(2) + "' uses packed sign vectors (su/sv)", "re-quantize"});
}

TEST_F(Exl3CheckpointErrorsTest, OrphanExl3TensorIsUnknown) {
  expect_load_error({}, {tensor("model.language_model.layers.4.mlp.experts.99.up_proj.svh", "F16", {128}, 256)},
                    {"tensor 'model.language_model.layers.4.mlp.experts.99.up_proj.svh' is not part of the glm5_next"});
}

}  // namespace
}  // namespace kestrel

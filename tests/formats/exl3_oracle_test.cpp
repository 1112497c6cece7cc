// EXL3 codec against exllamav3's own CUDA kernels: tests/data/exl3/ was written on an H200 by
// tools/exl3_oracle.py (exllamav3 1.4.1). The codebooks, the packer and the decoder must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/exl3_linear.h"
#include "base/npy.h"
#include "base/numeric.h"
#include "formats/exl3_codec.h"
#include "formats/exl3_tensors.h"
#include "formats/safetensors.h"
#include "../formats/safetensors_builder.h"

namespace kestrel {
namespace {

std::string oracle_file(const std::string& name) {
  return (std::filesystem::path(KESTREL_TEST_DATA) / "exl3" / name).string();
}

std::vector<uint16_t> u16_values(const TensorView& view) {
  std::vector<uint16_t> values(view.nbytes / 2);
  std::memcpy(values.data(), view.data, view.nbytes);
  return values;
}

const TensorView& tensor(const SafetensorsFile& file, const std::string& name) {
  const TensorView* view = file.find(name);
  if (view == nullptr) throw std::runtime_error("oracle vector missing: " + name);
  return *view;
}

std::vector<float> f32_values(const TensorView& view) {
  std::vector<float> values(static_cast<size_t>(view.numel()));
  if (view.dtype == DType::f32) {
    std::memcpy(values.data(), view.data, view.nbytes);
  } else {
    const std::vector<uint16_t> halves = u16_values(view);
    for (size_t i = 0; i < values.size(); ++i) values[i] = f16_to_f32(halves[i]);
  }
  return values;
}

// The modules of layers.safetensors (one per stored trellis).
std::vector<std::string> oracle_modules(const SafetensorsFile& file) {
  std::vector<std::string> modules;
  for (const TensorView& view : file.tensors()) {
    constexpr std::string_view suffix = ".trellis";
    if (view.name.ends_with(suffix)) modules.push_back(view.name.substr(0, view.name.size() - suffix.size()));
  }
  return modules;
}

Exl3Tensors module_tensors(const SafetensorsFile& file, const std::string& module) {
  return read_exl3_tensors([&](const std::string& name) { return file.find(name); }, module);
}

TEST(Exl3Oracle, CodebooksEqualTheGpuDecoderForEveryState) {
  const SafetensorsFile file(oracle_file("codebooks.safetensors"));
  for (const exl3::Codebook codebook : {exl3::Codebook::inst3, exl3::Codebook::mcg, exl3::Codebook::mul1}) {
    const std::vector<uint16_t> reference =
        u16_values(tensor(file, "lut." + std::string(exl3::codebook_name(codebook))));
    ASSERT_EQ(reference.size(), 65536u);
    const auto& ours = exl3::codebook_f16(codebook);
    int mismatches = 0;
    for (size_t state = 0; state < reference.size(); ++state) mismatches += ours[state] != reference[state];
    EXPECT_EQ(mismatches, 0) << exl3::codebook_name(codebook);
  }
}

TEST(Exl3Oracle, PackAndUnpackEqualTheGpuPackerForEveryK) {
  const SafetensorsFile file(oracle_file("packing.safetensors"));
  for (int bits = exl3::kMinBits; bits <= exl3::kMaxBits; ++bits) {
    const std::string prefix = "pack.k" + std::to_string(bits) + ".";
    const std::vector<uint16_t> states = u16_values(tensor(file, prefix + "states"));
    const std::vector<uint16_t> packed = u16_values(tensor(file, prefix + "packed"));
    const std::vector<uint16_t> unpacked = u16_values(tensor(file, prefix + "unpacked"));
    const size_t record = static_cast<size_t>(16 * bits);
    const size_t tiles = states.size() / exl3::kTileElements;
    ASSERT_EQ(packed.size(), tiles * record);
    for (size_t tile = 0; tile < tiles; ++tile) {
      std::vector<uint16_t> ours_packed(record);
      exl3::pack_tile(&states[tile * exl3::kTileElements], bits, ours_packed.data());
      EXPECT_TRUE(std::equal(ours_packed.begin(), ours_packed.end(), packed.begin() + tile * record))
          << "K=" << bits << " tile " << tile;
      uint16_t ours_unpacked[exl3::kTileElements];
      exl3::unpack_tile(&packed[tile * record], bits, ours_unpacked);
      EXPECT_TRUE(std::equal(ours_unpacked, ours_unpacked + exl3::kTileElements,
                             unpacked.begin() + tile * exl3::kTileElements))
          << "K=" << bits << " tile " << tile;
    }
  }
}

TEST(Exl3Oracle, DecodedTrellisEqualsReconstructBitForBit) {
  const SafetensorsFile file(oracle_file("layers.safetensors"));
  const std::vector<std::string> modules = oracle_modules(file);
  for (const std::string& module : modules) {
    const Exl3Tensors t = module_tensors(file, module);
    const std::vector<uint16_t> trellis = u16_values(*t.trellis);
    std::vector<uint16_t> decoded(static_cast<size_t>(t.in_padded * t.out_padded));
    exl3::decode_rotated(trellis.data(), t.in_padded, t.out_padded, t.bits, t.codebook, decoded.data());
    EXPECT_EQ(decoded, u16_values(tensor(file, module + ".ref_rotated"))) << module;
  }
  EXPECT_EQ(modules.size(), 27u);  // 3 codebooks x K = 1..8 on 128x256, plus three wider shapes
}

// get_weight_tensor rounds to fp16 after each of its steps (two Hadamard passes and two scalings), so it carries a
// few fp16 roundings of the largest value; our fp32 weight may differ from it by that much and no more.
TEST(Exl3Oracle, FullWeightEqualsGetWeightTensorWithinItsFp16Rounding) {
  const SafetensorsFile file(oracle_file("layers.safetensors"));
  for (const std::string& module : oracle_modules(file)) {
    const Exl3Tensors t = module_tensors(file, module);
    std::vector<float> ours(static_cast<size_t>(t.in_padded * t.out_padded));
    exl3::dequantize(u16_values(*t.trellis).data(), u16_values(*t.suh).data(), u16_values(*t.svh).data(),
                     t.in_padded, t.out_padded, t.bits, t.codebook, ours.data());
    const std::vector<float> reference = f32_values(tensor(file, module + ".ref_weight"));
    ASSERT_EQ(reference.size(), ours.size());
    float max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(reference[i]));
      max_diff = std::max(max_diff, std::abs(ours[i] - reference[i]));
    }
    const float fp16_ulp_of_max = std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(max_abs))) - 10);
    EXPECT_LE(max_diff, 2 * fp16_ulp_of_max) << module << ": max |W| " << max_abs;
  }
}

// exllamav3's GEMM (fp16 x, fp16 weights in registers, fp32 accumulation) on 8 rows against our EXL3 matmul on the
// same fp16 x: they differ only by the reference's fp16 rounding of intermediate activations.
TEST(Exl3Oracle, MatmulAgreesWithTheGpuGemm) {
  const SafetensorsFile file(oracle_file("layers.safetensors"));
  int checked = 0;
  for (const std::string& module : oracle_modules(file)) {
    if (!file.find(module + ".ref_y")) continue;
    const Exl3Tensors t = module_tensors(file, module);
    const std::vector<uint16_t> trellis = u16_values(*t.trellis), suh = u16_values(*t.suh), svh = u16_values(*t.svh);
    LinearWeight weight{.name = module, .dtype = DType::i16, .out_features = t.out_padded,
                        .in_features = t.in_padded, .data = reinterpret_cast<const std::byte*>(trellis.data())};
    weight.exl3 = Exl3Matrix{.trellis = weight.data, .suh = reinterpret_cast<const std::byte*>(suh.data()),
                             .svh = reinterpret_cast<const std::byte*>(svh.data()), .bits = t.bits,
                             .codebook = t.codebook, .in_padded = t.in_padded, .out_padded = t.out_padded};
    const std::vector<float> x = f32_values(tensor(file, module + ".ref_x"));
    const std::vector<float> reference = f32_values(tensor(file, module + ".ref_y"));
    const int64_t rows = static_cast<int64_t>(x.size()) / t.in_padded;
    std::vector<float> y(static_cast<size_t>(rows * t.out_padded));
    exl3_linear(x.data(), rows, weight, y.data());
    double error = 0, norm = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      error += (y[i] - reference[i]) * (y[i] - reference[i]);
      norm += reference[i] * reference[i];
    }
    EXPECT_LT(std::sqrt(error / norm), 2e-3) << module;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

// `kestrel exl3 dequant` writes what the decoder computes: --rotated bit-identical to exllamav3's reconstruct, the
// default the fp32 weight.
TEST(Exl3Oracle, DequantCommandWritesTheDecodedModule) {
  const testing::ScratchDir scratch;
  const SafetensorsFile file(oracle_file("layers.safetensors"));
  for (const std::string module : {"q.mcg.k4.256x384", "q.3inst.k2", "q.mul1.k7"}) {
    for (const bool rotated : {true, false}) {
      const std::string out = scratch.file(module + (rotated ? ".rotated.npy" : ".weight.npy"));
      const std::string command = std::string(KESTREL_BINARY) + " exl3 dequant --file " +
                                  oracle_file("layers.safetensors") + " --prefix " + module + " --out " + out +
                                  (rotated ? " --rotated" : "") + " 2>/dev/null";
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
      const NpyArray written = read_npy(out);
      const Exl3Tensors t = module_tensors(file, module);
      ASSERT_EQ(written.shape, (std::vector<int64_t>{t.in_padded, t.out_padded}));
      if (rotated) {
        EXPECT_EQ(written.data, f32_values(tensor(file, module + ".ref_rotated"))) << module;
      } else {
        std::vector<float> ours(written.data.size());
        exl3::dequantize(u16_values(*t.trellis).data(), u16_values(*t.suh).data(), u16_values(*t.svh).data(),
                         t.in_padded, t.out_padded, t.bits, t.codebook, ours.data());
        EXPECT_EQ(written.data, ours) << module;
      }
    }
  }
  const std::string missing = std::string(KESTREL_BINARY) + " exl3 dequant --file " +
                              oracle_file("layers.safetensors") + " --prefix q.none --out " + scratch.file("x.npy") +
                              " 2>/dev/null";
  EXPECT_EQ(WEXITSTATUS(std::system(missing.c_str())), 1);
}

}  // namespace
}  // namespace kestrel

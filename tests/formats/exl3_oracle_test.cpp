// EXL3 codec against exllamav3's own CUDA kernels: tests/data/exl3/ was written on an H200 by
// tools/exl3_oracle.py (exllamav3 1.4.1). The codebooks, the packer and the decoder must agree bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/exl3_codec.h"
#include "formats/safetensors.h"

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
  int layers = 0;
  for (const TensorView& view : file.tensors()) {
    constexpr std::string_view suffix = ".trellis";
    if (!view.name.ends_with(suffix)) continue;
    const std::string prefix = view.name.substr(0, view.name.size() - suffix.size());
    const exl3::Codebook codebook = file.find(prefix + ".mcg")    ? exl3::Codebook::mcg
                                    : file.find(prefix + ".mul1") ? exl3::Codebook::mul1
                                                                  : exl3::Codebook::inst3;
    const int64_t k = view.shape[0] * 16, n = view.shape[1] * 16;
    const int bits = static_cast<int>(view.shape[2] / 16);
    const std::vector<uint16_t> trellis = u16_values(view);
    std::vector<uint16_t> decoded(static_cast<size_t>(k * n));
    exl3::decode_rotated(trellis.data(), k, n, bits, codebook, decoded.data());
    EXPECT_EQ(decoded, u16_values(tensor(file, prefix + ".ref_rotated"))) << prefix;
    ++layers;
  }
  EXPECT_EQ(layers, 27);  // 3 codebooks x K = 1..8 on 128x256, plus three wider shapes
}

}  // namespace
}  // namespace kestrel

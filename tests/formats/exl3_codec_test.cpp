// The EXL3 codec against the test vectors of shared/docs/exl3-format.md §2.10 (codebook samples and LUT digests, the
// K = 3 packing example, reconstruct digests), pack/unpack against an independent bit-by-bit model of the circular
// stream for K = 1..8, the Hadamard transform against the explicit Sylvester matrix, and the fp32 dequantizer
// against the explicit product diag(suh)·Hk·Ŵ·Hn·diag(svh).
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/npy.h"
#include "base/numeric.h"
#include "formats/exl3_codec.h"
#include "safetensors_builder.h"
#include "sha256.h"

namespace kestrel::exl3 {
namespace {

using testing::bytes_of;
using testing::sha256_hex;

// Hadamard entry r·H[i][j] = (−1)^popcount(i & j) / √128.
double hadamard_entry(int i, int j) {
  return (std::popcount(static_cast<unsigned>(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(128.0);
}

// The spec's reconstruct input: trellis_flat[i] = ((i · 2654435761) >> 7) & 0xFFFF in uint64 arithmetic.
std::vector<uint16_t> hashed_trellis(int64_t k, int64_t n, int bits) {
  std::vector<uint16_t> trellis(static_cast<size_t>(k / 16 * n / 16 * 16 * bits));
  for (uint64_t i = 0; i < trellis.size(); ++i) trellis[i] = static_cast<uint16_t>(((i * 2654435761ull) >> 7) & 0xFFFF);
  return trellis;
}

// A tile's circular stream of 256·K bits, one bool per bit, MSB-first as §2.3 defines it.
using Stream = std::vector<bool>;

Stream random_stream(int bits, std::mt19937& rng) {
  Stream stream(static_cast<size_t>(256 * bits));
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = rng() & 1u;
  return stream;
}

// §2.4 read literally: state p = the 16 bits ending at bit (p + 1)·K, indices modulo the stream length.
std::array<uint16_t, 256> states_of(const Stream& stream, int bits) {
  std::array<uint16_t, 256> states{};
  const auto length = static_cast<int>(stream.size());
  for (int p = 0; p < 256; ++p) {
    uint32_t state = 0;
    for (int q = (p + 1) * bits - 16; q < (p + 1) * bits; ++q) state = (state << 1) | stream[static_cast<size_t>((q + length) % length)];
    states[static_cast<size_t>(p)] = static_cast<uint16_t>(state);
  }
  return states;
}

// §2.3 read literally: 16-bit words s_i of the stream, stored with the halves of each pair swapped.
std::vector<uint16_t> record_of(const Stream& stream) {
  std::vector<uint16_t> words(stream.size() / 16);
  for (size_t i = 0; i < words.size(); ++i) {
    for (size_t b = 0; b < 16; ++b) words[i] = static_cast<uint16_t>((words[i] << 1) | stream[16 * i + b]);
  }
  for (size_t m = 0; m + 1 < words.size(); m += 2) std::swap(words[m], words[m + 1]);
  return words;
}

// --- Codebooks ---

TEST(Exl3CodecTest, Sha256HelperMatchesKnownDigests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(Exl3CodecTest, CodebookSamplesMatchSpec) {
  struct Sample {
    Codebook codebook;
    uint32_t state;
    uint16_t bits;
  };
  const Sample samples[] = {
      {Codebook::inst3, 0x0000, 0x3A25}, {Codebook::inst3, 0x0001, 0xBB5B}, {Codebook::inst3, 0x1234, 0xC066},
      {Codebook::inst3, 0x8000, 0xB7F8}, {Codebook::inst3, 0xFFFF, 0xB110}, {Codebook::mcg, 0x0000, 0x3F60},
      {Codebook::mcg, 0x0001, 0x304E},   {Codebook::mcg, 0x1234, 0x3E0F},   {Codebook::mcg, 0x8000, 0xB915},
      {Codebook::mcg, 0xFFFF, 0x3ACD},   {Codebook::mul1, 0x0000, 0xC2E8},  {Codebook::mul1, 0x0001, 0x3921},
      {Codebook::mul1, 0x1234, 0xB89E},  {Codebook::mul1, 0x8000, 0xBAF2},  {Codebook::mul1, 0xFFFF, 0xB936},
  };
  for (const Sample& sample : samples) {
    EXPECT_EQ(decode_state(sample.state, sample.codebook), sample.bits)
        << codebook_name(sample.codebook) << " state " << sample.state;
    EXPECT_EQ(codebook_f16(sample.codebook)[sample.state], sample.bits);
  }
  EXPECT_FLOAT_EQ(codebook_f32(Codebook::inst3)[0x0000], 0.76806640625f);
  EXPECT_FLOAT_EQ(codebook_f32(Codebook::inst3)[0x1234], -2.19921875f);
  EXPECT_FLOAT_EQ(codebook_f32(Codebook::mcg)[0x0000], 1.84375f);
  EXPECT_FLOAT_EQ(codebook_f32(Codebook::mul1)[0x0000], -3.453125f);
}

TEST(Exl3CodecTest, CodebookTablesMatchSpecDigests) {
  const std::pair<Codebook, const char*> digests[] = {
      {Codebook::inst3, "ad88de2dcff5bb05fff2faec37cceceb43aa1c2e8203f9d81a6fbd6dd3393eea"},
      {Codebook::mcg, "95383563929baa9d1ae5de0be22490284382673620bdd85929feea7bdbef04a9"},
      {Codebook::mul1, "bc48d02cb1c14939dc47b90f870dd689d63e3b1ab69a157e65538db68677a6c8"},
  };
  for (const auto& [codebook, digest] : digests) {
    const auto& table = codebook_f16(codebook);
    EXPECT_EQ(sha256_hex(bytes_of(std::vector<uint16_t>(table.begin(), table.end()))), digest)
        << codebook_name(codebook);
    for (size_t s = 0; s < table.size(); s += 997) EXPECT_EQ(codebook_f32(codebook)[s], f16_to_f32(table[s]));
  }
}

TEST(Exl3CodecTest, CodebookRmsMatchesSpec) {
  const std::pair<Codebook, double> rms[] = {{Codebook::inst3, 1.243711}, {Codebook::mcg, 1.244112},
                                             {Codebook::mul1, 1.000312}};
  for (const auto& [codebook, expected] : rms) {
    double sum = 0.0;
    for (const float value : codebook_f32(codebook)) sum += static_cast<double>(value) * value;
    EXPECT_NEAR(std::sqrt(sum / 65536.0), expected, 1e-6) << codebook_name(codebook);
  }
}

TEST(Exl3CodecTest, CodebookNamesRoundTrip) {
  for (const Codebook codebook : {Codebook::inst3, Codebook::mcg, Codebook::mul1}) {
    EXPECT_EQ(codebook_from_name(codebook_name(codebook)), codebook);
  }
  EXPECT_EQ(codebook_name(Codebook::inst3), "3inst");
  EXPECT_EQ(codebook_from_name("MCG"), std::nullopt);
  EXPECT_EQ(codebook_from_name("qtip"), std::nullopt);
}

// --- Tile element order ---

TEST(Exl3CodecTest, TileCoordFollowsMmaFragmentOrder) {
  // Lane 0's eight positions, then the first position of lanes 1 and 4 (r0 = 2·(lane % 4), c0 = lane / 4).
  const std::pair<int, std::pair<int, int>> expected[] = {
      {0, {0, 0}}, {1, {1, 0}},  {2, {8, 0}}, {3, {9, 0}}, {4, {0, 8}}, {5, {1, 8}},
      {6, {8, 8}}, {7, {9, 8}},  {8, {2, 0}}, {32, {0, 1}}, {255, {15, 15}},
  };
  for (const auto& [position, coord] : expected) {
    const TileCoord actual = tile_coord(position);
    EXPECT_EQ(actual.row, coord.first) << "position " << position;
    EXPECT_EQ(actual.col, coord.second) << "position " << position;
  }
  std::array<int, 256> hits{};
  for (int p = 0; p < 256; ++p) ++hits[static_cast<size_t>(tile_coord(p).row * 16 + tile_coord(p).col)];
  for (const int count : hits) EXPECT_EQ(count, 1);
}

// --- Packing ---

TEST(Exl3CodecTest, PackK3ExampleMatchesSpec) {
  std::array<uint16_t, 256> symbols{};
  for (int t = 0; t < 256; ++t) symbols[static_cast<size_t>(t)] = static_cast<uint16_t>(t % 8);
  std::vector<uint16_t> record(48);
  pack_tile(symbols.data(), 3, record.data());
  const std::vector<uint16_t> first_words = {0x7705, 0x0539, 0x0539, 0x3977, 0x3977, 0x7705, 0x7705, 0x0539};
  EXPECT_EQ(std::vector<uint16_t>(record.begin(), record.begin() + 8), first_words);
  EXPECT_EQ(sha256_hex(bytes_of(record)), "aeadc736d100241f768ea6adea6efc82a16aeeb6fe51d939a49fe9bce2f79aa8");

  std::array<uint16_t, 256> states{};
  unpack_tile(record.data(), 3, states.data());
  EXPECT_EQ(states[0], 0xCBB8);
  EXPECT_EQ(states[1], 0x5DC1);
  EXPECT_EQ(states[2], 0xEE0A);
  EXPECT_EQ(states[3], 0x7053);
  EXPECT_EQ(states[255], 0x3977);
  for (int t = 0; t < 256; ++t) EXPECT_EQ(states[static_cast<size_t>(t)] & 7, t % 8);
}

// Random tail-biting streams: unpack gives the states §2.4 defines, pack of those states gives back the record
// §2.3 defines, and the consecutive states overlap as a bit-shift trellis should.
TEST(Exl3CodecTest, PackUnpackRoundTripForEveryBitrate) {
  std::mt19937 rng(1234);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    for (int trial = 0; trial < 20; ++trial) {
      const Stream stream = random_stream(bits, rng);
      const std::array<uint16_t, 256> expected_states = states_of(stream, bits);
      const std::vector<uint16_t> expected_record = record_of(stream);
      ASSERT_EQ(expected_record.size(), static_cast<size_t>(16 * bits));

      std::array<uint16_t, 256> states{};
      unpack_tile(expected_record.data(), bits, states.data());
      ASSERT_EQ(states, expected_states) << "K = " << bits;
      std::vector<uint16_t> record(static_cast<size_t>(16 * bits));
      pack_tile(states.data(), bits, record.data());
      ASSERT_EQ(record, expected_record) << "K = " << bits;

      const uint32_t low = (1u << (16 - bits)) - 1;
      EXPECT_EQ(states[0] >> bits, states[255] & low) << "K = " << bits;
      for (int p = 1; p < 256; ++p) {
        EXPECT_EQ(states[static_cast<size_t>(p)] >> bits, states[static_cast<size_t>(p - 1)] & low);
      }
    }
  }
}

// Any payload decodes (§2.9), and repacking its states reproduces it word for word.
TEST(Exl3CodecTest, AnyPayloadDecodesAndRepacks) {
  std::mt19937 rng(99);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::vector<uint16_t> payload(static_cast<size_t>(16 * bits));
    for (uint16_t& word : payload) word = static_cast<uint16_t>(rng());
    std::array<uint16_t, 256> states{};
    unpack_tile(payload.data(), bits, states.data());
    std::vector<uint16_t> repacked(payload.size());
    pack_tile(states.data(), bits, repacked.data());
    EXPECT_EQ(repacked, payload) << "K = " << bits;
  }
}

// Widths outside 1..8 have no stream layout: an Error, not a read past the record.
TEST(Exl3CodecTest, UnpackRefusesUndefinedBitWidths) {
  std::vector<uint16_t> record(16 * 9, 0);
  std::array<uint16_t, 256> states{};
  EXPECT_THROW(unpack_tile(record.data(), 9, states.data()), Error);
  EXPECT_THROW(unpack_tile(record.data(), 0, states.data()), Error);
}

// --- Decode ---

TEST(Exl3CodecTest, ReconstructMatchesSpecDigests) {
  struct Vector {
    int bits;
    Codebook codebook;
    const char* digest;
  };
  const Vector vectors[] = {
      {4, Codebook::mcg, "be39f06104f78e0706a160a69b4a2b3757a395b64579db1b10ddd4ccaeb73b8e"},
      {2, Codebook::mul1, "060155f7bbfa580f10bd978061f638d1b43218af9f03e936432307801ceb8f79"},
      {3, Codebook::inst3, "76d80435e210cafde77ded8bd9b8c50e38b3752080f8f89ab79acdcdd48d710b"},
  };
  for (const Vector& v : vectors) {
    const std::vector<uint16_t> trellis = hashed_trellis(16, 128, v.bits);
    std::vector<uint16_t> rotated(16 * 128);
    decode_rotated(trellis.data(), 16, 128, v.bits, v.codebook, rotated.data());
    EXPECT_EQ(sha256_hex(bytes_of(rotated)), v.digest) << "K = " << v.bits << " " << codebook_name(v.codebook);
    if (v.bits == 4) {
      const float expected[] = {1.52734f, 1.86035f, 1.17090f, 0.59668f};
      for (size_t j = 0; j < 4; ++j) EXPECT_NEAR(f16_to_f32(rotated[j]), expected[j], 5e-5) << "Ŵ[0][" << j << "]";
    }
  }
}

TEST(Exl3CodecTest, DecodeTileAgreesWithDecodeRotated) {
  const int bits = 5;
  const std::vector<uint16_t> trellis = hashed_trellis(32, 48, bits);
  std::vector<uint16_t> rotated(32 * 48);
  decode_rotated(trellis.data(), 32, 48, bits, Codebook::mul1, rotated.data());
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 3; ++b) {
      std::array<float, 256> tile{};
      decode_tile(trellis.data() + (a * 3 + b) * 16 * bits, bits, codebook_f32(Codebook::mul1).data(), tile.data());
      for (int r = 0; r < 16; ++r) {
        for (int c = 0; c < 16; ++c) {
          EXPECT_EQ(tile[static_cast<size_t>(r * 16 + c)],
                    f16_to_f32(rotated[static_cast<size_t>((16 * a + r) * 48 + 16 * b + c)]));
        }
      }
    }
  }
}

// Reference vectors made on a GPU will arrive as .npy files of fp16 values; decode_rotated's output compares with
// them through read_npy (which widens '<f2' to float exactly).
TEST(Exl3CodecTest, DecodedValuesCompareWithFp16Npy) {
  const testing::ScratchDir scratch;
  const std::vector<uint16_t> trellis = hashed_trellis(16, 128, 4);
  std::vector<uint16_t> rotated(16 * 128);
  decode_rotated(trellis.data(), 16, 128, 4, Codebook::mcg, rotated.data());
  std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': (16, 128), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');  // magic, version, length, header: 64-aligned
  header += '\n';
  const auto header_len = static_cast<uint16_t>(header.size());
  const std::string file = std::string("\x93NUMPY\x01\x00", 8) + std::string(reinterpret_cast<const char*>(&header_len), 2) +
                           header + bytes_of(rotated);
  testing::write_file(scratch.file("what.npy"), file);

  const NpyArray reference = read_npy(scratch.file("what.npy"));
  ASSERT_EQ(reference.shape, (std::vector<int64_t>{16, 128}));
  for (size_t i = 0; i < rotated.size(); ++i) ASSERT_EQ(f32_to_f16(reference.data[i]), rotated[i]) << i;
}

// --- Hadamard ---

TEST(Exl3CodecTest, HadamardEqualsSylvesterMatrixProduct) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::array<float, 128> x{};
  for (float& value : x) value = normal(rng);
  std::array<float, 128> transformed = x;
  hadamard128(transformed.data());
  for (int i = 0; i < 128; ++i) {
    double expected = 0.0;
    for (int j = 0; j < 128; ++j) expected += hadamard_entry(i, j) * x[static_cast<size_t>(j)];
    EXPECT_NEAR(transformed[static_cast<size_t>(i)], expected, 1e-5) << i;
  }
}

TEST(Exl3CodecTest, HadamardIsAnInvolution) {
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  std::array<float, 128> x{};
  for (float& value : x) value = normal(rng);
  std::array<float, 128> twice = x;
  hadamard128(twice.data());
  hadamard128(twice.data());
  for (size_t i = 0; i < 128; ++i) EXPECT_NEAR(twice[i], x[i], 1e-5) << i;

  std::array<float, 128> unit{};
  unit[5] = 1.0f;
  hadamard128(unit.data());  // column 5 of r·H128
  for (int i = 0; i < 128; ++i) EXPECT_FLOAT_EQ(unit[static_cast<size_t>(i)], static_cast<float>(hadamard_entry(i, 5)));
}

// --- Dequantizer ---

TEST(Exl3CodecTest, DequantizeEqualsExplicitRotationProduct) {
  const int64_t k = 256, n = 128;
  const int bits = 3;
  std::mt19937 rng(11);
  std::vector<uint16_t> trellis(static_cast<size_t>(k / 16 * n / 16 * 16 * bits));
  for (uint16_t& word : trellis) word = static_cast<uint16_t>(rng());
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<uint16_t> suh(static_cast<size_t>(k)), svh(static_cast<size_t>(n));
  for (uint16_t& value : suh) value = f32_to_f16(uniform(rng));
  for (uint16_t& value : svh) value = f32_to_f16(uniform(rng));
  svh[3] = 0;  // an all-zero output channel (§2.9)

  std::vector<float> actual(static_cast<size_t>(k * n));
  dequantize(trellis.data(), suh.data(), svh.data(), k, n, bits, Codebook::inst3, actual.data());

  std::vector<uint16_t> rotated(static_cast<size_t>(k * n));
  decode_rotated(trellis.data(), k, n, bits, Codebook::inst3, rotated.data());
  const auto what = [&](int64_t i, int64_t o) { return static_cast<double>(f16_to_f32(rotated[static_cast<size_t>(i * n + o)])); };
  // (Ŵ · Hn) then Hk · (...), blockwise in double.
  std::vector<double> right(static_cast<size_t>(k * n));
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t o = 0; o < n; ++o) {
      const int64_t block = o / 128 * 128;
      double sum = 0.0;
      for (int c = 0; c < 128; ++c) sum += what(i, block + c) * hadamard_entry(c, static_cast<int>(o - block));
      right[static_cast<size_t>(i * n + o)] = sum;
    }
  }
  double worst = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t block = i / 128 * 128;
    for (int64_t o = 0; o < n; ++o) {
      double sum = 0.0;
      for (int r = 0; r < 128; ++r) sum += hadamard_entry(static_cast<int>(i - block), r) * right[static_cast<size_t>((block + r) * n + o)];
      const double expected = f16_to_f32(suh[static_cast<size_t>(i)]) * sum * f16_to_f32(svh[static_cast<size_t>(o)]);
      worst = std::max(worst, std::fabs(expected - actual[static_cast<size_t>(i * n + o)]));
    }
  }
  EXPECT_LT(worst, 1e-5);
  for (int64_t i = 0; i < k; ++i) EXPECT_EQ(actual[static_cast<size_t>(i * n + 3)], 0.0f);
}

}  // namespace
}  // namespace kestrel::exl3

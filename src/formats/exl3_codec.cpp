// The EXL3 codec, written from shared/docs/exl3-format.md §2 (section numbers below refer to it).
#include "formats/exl3_codec.h"

#include <cmath>
#include <memory>
#include <vector>

#include "base/error.h"
#include "base/numeric.h"

namespace kestrel::exl3 {

namespace {

constexpr int kNumCodebooks = 3;
constexpr int kNumStates = 65536;

// 3INST / MCG (§2.5): the low and high halves of the masked product are two fp16 values in ±[0.125, 2); their sum
// needs at most 15 significant bits, so the float sum is exact and one f32 -> f16 rounding equals __hadd.
uint16_t sum_of_halves(uint32_t x) {
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  const float sum = f16_to_f32(static_cast<uint16_t>(x & 0xFFFFu)) + f16_to_f32(static_cast<uint16_t>(x >> 16));
  return f32_to_f16(sum);
}

// MUL1 (§2.5): (1024 + byte sum) * fp16(0x1EEE) + fp16(0xC931) as one fused rounding. The product needs 22 bits and
// the sum at most 21, so both are exact in float and the single f32 -> f16 rounding equals __hfma.
uint16_t mul1_value(uint32_t x) {
  const uint32_t byte_sum = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
  const float scale = f16_to_f32(0x1EEEu), bias = f16_to_f32(0xC931u);
  return f32_to_f16(static_cast<float>(1024u + byte_sum) * scale + bias);
}

struct CodebookTables {
  std::array<uint16_t, kNumStates> f16[kNumCodebooks];
  std::array<float, kNumStates> f32[kNumCodebooks];
};

const CodebookTables& codebook_tables() {
  static const std::unique_ptr<const CodebookTables> tables = [] {
    auto built = std::make_unique<CodebookTables>();
    for (const Codebook codebook : {Codebook::inst3, Codebook::mcg, Codebook::mul1}) {
      const auto index = static_cast<size_t>(codebook);
      for (uint32_t state = 0; state < kNumStates; ++state) {
        built->f16[index][state] = decode_state(state, codebook);
        built->f32[index][state] = f16_to_f32(built->f16[index][state]);
      }
    }
    return built;
  }();
  return *tables;
}

// Row-major offset (row * 16 + col) of every trellis position inside its tile.
const std::array<uint8_t, kTileElements>& tile_offsets() {
  static const std::array<uint8_t, kTileElements> offsets = [] {
    std::array<uint8_t, kTileElements> built{};
    for (int p = 0; p < kTileElements; ++p) {
      const TileCoord coord = tile_coord(p);
      built[static_cast<size_t>(p)] = static_cast<uint8_t>(coord.row * kTileSide + coord.col);
    }
    return built;
  }();
  return offsets;
}

// §2.3 reading rule: the stream is the record's little-endian uint32 words (int16[2m] low half), each MSB-first.
uint32_t stream_word(const uint16_t* record, int m) {
  return static_cast<uint32_t>(record[2 * m]) | (static_cast<uint32_t>(record[2 * m + 1]) << 16);
}

}  // namespace

std::string_view codebook_name(Codebook codebook) {
  switch (codebook) {
    case Codebook::inst3:
      return "3inst";
    case Codebook::mcg:
      return "mcg";
    case Codebook::mul1:
      return "mul1";
  }
  return "?";
}

std::optional<Codebook> codebook_from_name(std::string_view name) {
  for (const Codebook codebook : {Codebook::inst3, Codebook::mcg, Codebook::mul1}) {
    if (codebook_name(codebook) == name) return codebook;
  }
  return std::nullopt;
}

uint16_t decode_state(uint32_t state, Codebook codebook) {
  state &= 0xFFFFu;
  switch (codebook) {
    case Codebook::inst3:
      return sum_of_halves(state * 89226354u + 64248484u);
    case Codebook::mcg:
      return sum_of_halves(state * kMcgMultiplier);
    case Codebook::mul1:
      return mul1_value(state * kMul1Multiplier);
  }
  return 0;
}

const std::array<uint16_t, 65536>& codebook_f16(Codebook codebook) {
  return codebook_tables().f16[static_cast<size_t>(codebook)];
}

const std::array<float, 65536>& codebook_f32(Codebook codebook) {
  return codebook_tables().f32[static_cast<size_t>(codebook)];
}

TileCoord tile_coord(int position) {
  const int lane = position / 8, j = position % 8;
  const int row = 2 * (lane % 4) + (j & 1) + ((j & 2) ? 8 : 0);
  const int col = lane / 4 + ((j & 4) ? 8 : 0);
  return TileCoord{static_cast<uint8_t>(row), static_cast<uint8_t>(col)};
}

namespace {

// unpack_tile for a fixed bit width: the record's words are read once into registers (the first repeated after the
// last, for the window that wraps), and every window's word and shift are compile-time constants after unrolling.
// A generic loop with the modular arithmetic per state took half the CPU backend's decode time.
template <int Bits>
void unpack_tile_bits(const uint16_t* record, uint16_t states[kTileElements]) {
  constexpr int kWords = 8 * Bits, kStreamBits = kTileElements * Bits;
  uint32_t words[kWords + 1];
  for (int w = 0; w < kWords; ++w) words[w] = stream_word(record, w);
  words[kWords] = words[0];
#pragma GCC unroll 256
  for (int p = 0; p < kTileElements; ++p) {
    // State p is the 16-bit window ending at bit (p + 1) * bits, wrapping around the circular stream (§2.4).
    const int start = (p + 1) * Bits - 16 < 0 ? (p + 1) * Bits - 16 + kStreamBits : (p + 1) * Bits - 16;
    const int word = start >> 5, shift = start & 31;
    const uint64_t pair = (static_cast<uint64_t>(words[word]) << 32) | words[word + 1];
    states[p] = static_cast<uint16_t>(pair >> (48 - shift));
  }
}

}  // namespace

void unpack_tile(const uint16_t* record, int bits, uint16_t states[kTileElements]) {
  switch (bits) {
    case 1: return unpack_tile_bits<1>(record, states);
    case 2: return unpack_tile_bits<2>(record, states);
    case 3: return unpack_tile_bits<3>(record, states);
    case 4: return unpack_tile_bits<4>(record, states);
    case 5: return unpack_tile_bits<5>(record, states);
    case 6: return unpack_tile_bits<6>(record, states);
    case 7: return unpack_tile_bits<7>(record, states);
    case 8: return unpack_tile_bits<8>(record, states);
    default: fail("EXL3 tile with {} bits per weight (1 to 8 are defined)", bits);
  }
}

void pack_tile(const uint16_t states[kTileElements], int bits, uint16_t* record) {
  const uint32_t symbol_mask = (1u << bits) - 1;
  uint64_t pending = 0;  // the unwritten low `pending_bits` bits of the stream
  int pending_bits = 0, word = 0;
  for (int p = 0; p < kTileElements; ++p) {
    pending = (pending << bits) | (states[p] & symbol_mask);
    pending_bits += bits;
    if (pending_bits >= 32) {
      pending_bits -= 32;
      const auto value = static_cast<uint32_t>(pending >> pending_bits);
      record[2 * word] = static_cast<uint16_t>(value & 0xFFFFu);
      record[2 * word + 1] = static_cast<uint16_t>(value >> 16);
      ++word;
    }
  }
}

void decode_tile(const uint16_t* record, int bits, const float* codebook_values, float tile[kTileElements]) {
  uint16_t states[kTileElements];
  unpack_tile(record, bits, states);
  const auto& offsets = tile_offsets();
  for (int p = 0; p < kTileElements; ++p) tile[offsets[static_cast<size_t>(p)]] = codebook_values[states[p]];
}

void decode_rotated(const uint16_t* trellis, int64_t k, int64_t n, int bits, Codebook codebook, uint16_t* out) {
  const auto& values = codebook_f16(codebook);
  const auto& offsets = tile_offsets();
  const int64_t tile_rows = k / kTileSide, tile_cols = n / kTileSide;
  const int64_t record_words = int64_t{16} * bits;
  uint16_t states[kTileElements];
  for (int64_t a = 0; a < tile_rows; ++a) {
    for (int64_t b = 0; b < tile_cols; ++b) {
      unpack_tile(trellis + (a * tile_cols + b) * record_words, bits, states);
      for (int p = 0; p < kTileElements; ++p) {
        const int offset = offsets[static_cast<size_t>(p)];
        out[(a * kTileSide + offset / kTileSide) * n + b * kTileSide + offset % kTileSide] = values[states[p]];
      }
    }
  }
}

void dequantize(const uint16_t* trellis, const uint16_t* suh, const uint16_t* svh, int64_t k, int64_t n, int bits,
                Codebook codebook, float* out) {
  std::vector<uint16_t> rotated(static_cast<size_t>(k * n));
  decode_rotated(trellis, k, n, bits, codebook, rotated.data());
  for (int64_t i = 0; i < k * n; ++i) out[i] = f16_to_f32(rotated[static_cast<size_t>(i)]);
  // Hk · Ŵ: the 128-point transform down every column of each block of 128 rows.
  std::vector<float> column(kHadamardBlock);
  for (int64_t block = 0; block < k; block += kHadamardBlock) {
    for (int64_t o = 0; o < n; ++o) {
      for (int r = 0; r < kHadamardBlock; ++r) column[static_cast<size_t>(r)] = out[(block + r) * n + o];
      hadamard128(column.data());
      for (int r = 0; r < kHadamardBlock; ++r) out[(block + r) * n + o] = column[static_cast<size_t>(r)];
    }
  }
  // (·) Hn and the scales: H is symmetric, so the row transform is the same 128-point transform along each row.
  for (int64_t i = 0; i < k; ++i) {
    float* row = out + i * n;
    for (int64_t block = 0; block < n; block += kHadamardBlock) hadamard128(row + block);
    const float input_scale = f16_to_f32(suh[i]);
    for (int64_t o = 0; o < n; ++o) row[o] = input_scale * row[o] * f16_to_f32(svh[o]);
  }
}

void hadamard128(float* x) {
  for (int half = 1; half < kHadamardBlock; half *= 2) {
    for (int start = 0; start < kHadamardBlock; start += 2 * half) {
      for (int i = start; i < start + half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a + b;
        x[i + half] = a - b;
      }
    }
  }
  const auto scale = static_cast<float>(1.0 / std::sqrt(double{kHadamardBlock}));
  for (int i = 0; i < kHadamardBlock; ++i) x[i] *= scale;
}

}  // namespace kestrel::exl3

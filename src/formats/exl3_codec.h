// The EXL3 weight codec (exllamav3's on-disk format, see shared/docs/exl3-format.md §2): procedural codebooks that
// map a 16-bit trellis state to an fp16 value, the tail-biting bit-shift trellis packing of one 16x16 tile, the
// tensor-core element order inside a tile, and the 128-point Hadamard rotation. The codebooks, packing and decode are
// bit-exact with exllamav3's CUDA kernels; the quantizer (exl3_quantizer) and the EXL3 linear layers are built on it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kestrel::exl3 {

// The codebook of a tensor is chosen by a marker tensor next to it: none = 3INST, `.mcg` = MCG, `.mul1` = MUL1.
enum class Codebook { inst3, mcg, mul1 };

std::string_view codebook_name(Codebook codebook);  // "3inst", "mcg", "mul1" (quantization_config spelling)
std::optional<Codebook> codebook_from_name(std::string_view name);

// Marker values exllamav3 stores (as int32 0-dim tensors) since v0.0.9; they are never used to decode, but a marker
// with another value comes from an experimental pre-release with different multipliers and must be rejected.
inline constexpr uint32_t kMcgMultiplier = 0xCBAC1FEDu;
inline constexpr uint32_t kMul1Multiplier = 0x83DCD12Du;

inline constexpr int kTileSide = 16;                            // a tile is 16 (in) x 16 (out) weights
inline constexpr int kTileElements = kTileSide * kTileSide;     // 256 trellis positions per tile
inline constexpr int kHadamardBlock = 128;                      // padding unit and rotation block of both dims
inline constexpr int kMinBits = 1;
inline constexpr int kMaxBits = 8;
inline constexpr float kCodebookRms = 1.24371088f;              // RMS of the 3INST codebook; the quantizer's scale

// The fp16 bit pattern a codebook gives to a 16-bit trellis state.
uint16_t decode_state(uint32_t state, Codebook codebook);

// All 65,536 values of a codebook, as fp16 bits and as float32 (computed once, thread-safe).
const std::array<uint16_t, 65536>& codebook_f16(Codebook codebook);
const std::array<float, 65536>& codebook_f32(Codebook codebook);

// Position p (0..255) of a tile's trellis -> (row, column) inside the tile, row = input offset, column = output
// offset: lane p/8 holds the two mma.m16n8k16 B fragments of its 8 positions.
struct TileCoord {
  uint8_t row, col;
};
TileCoord tile_coord(int position);

// One tile is stored as 16*K int16 words. Unpacks the 256 16-bit states (in position order) the decoder reads.
void unpack_tile(const uint16_t* record, int bits, uint16_t states[kTileElements]);
// Packs 256 states into 16*K words; only the low `bits` bits of each state are stored (the encoder guarantees the
// rest follows from the tail-biting stream).
void pack_tile(const uint16_t states[kTileElements], int bits, uint16_t* record);

// Decodes one tile record into its 16x16 values, row-major (tile[row * 16 + col]), through a codebook's values
// (codebook_f32(...).data()): the step the CPU matmul runs per tile.
void decode_tile(const uint16_t* record, int bits, const float* codebook_values, float tile[kTileElements]);

// Decodes the rotated weight Ŵ of a whole tensor: trellis [k/16, n/16, 16*bits] -> fp16 bits, row-major [k, n].
// Bit-exact with exllamav3's `reconstruct`; k and n need only be multiples of 16.
void decode_rotated(const uint16_t* trellis, int64_t k, int64_t n, int bits, Codebook codebook, uint16_t* out);

// The effective weight W = diag(suh) · Hk · Ŵ · Hn · diag(svh) (§2.6) in float32 from the fp16 Ŵ, row-major [k, n]
// (y = x W, the orientation EXL3 stores); suh [k] and svh [n] are fp16 bits, k and n multiples of 128. The reference
// every EXL3 matmul is checked against; not bit-exact with any GPU path (they round to fp16 between steps).
void dequantize(const uint16_t* trellis, const uint16_t* suh, const uint16_t* svh, int64_t k, int64_t n, int bits,
                Codebook codebook, float* out);

// In-place x <- H128 x / sqrt(128) for one block of 128 floats (natural-order Sylvester matrix, symmetric).
void hadamard128(float* x);

}  // namespace kestrel::exl3

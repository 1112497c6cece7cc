// How a cache pool stores its rows. `--kv-cache-dtype` picks it for the MLA latents, the cache that grows with the
// context: float32 (auto, what the forward computes), bf16, or fp8 e4m3 with one float32 scale per 128 values
// (amax / 448), the packing vLLM's fp8_ds_mla gives DeepSeek's latents: 528 bytes for a 512-wide row instead of
// 2,048. The indexer's rows stay float32 (they are a quarter of the latents' width and pick the positions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kestrel {

enum class CacheDtype { float32, bf16, fp8_e4m3 };

// vLLM's `--kv-cache-dtype` values: auto (float32 here), bfloat16, fp8 / fp8_e4m3 / fp8_ds_mla (all three the packing
// above); fp8_e5m2 and anything else is an Error naming the choices.
CacheDtype parse_kv_cache_dtype(std::string_view flag);
std::string_view cache_dtype_name(CacheDtype dtype);

struct RowFormat {
  static constexpr int64_t kScaleGroup = 128;  // values per fp8 scale

  CacheDtype dtype = CacheDtype::float32;
  int64_t width = 0;  // values per row

  // A row's bytes: float32 rows are 4 * width, unpadded; bf16 and fp8 rows are padded to 16 bytes, so that a GPU
  // reads any row with 16-byte loads.
  int64_t row_bytes() const;
  // fp8: where the row's float32 scales start, after its values (padded to 4 bytes); one per kScaleGroup values.
  int64_t scale_offset() const { return (width + 3) / 4 * 4; }
  int64_t num_scales() const { return (width + kScaleGroup - 1) / kScaleGroup; }
};

// One row of `format.width` values to its stored bytes and back (decode_row(encode_row(x)) is x rounded to the
// format). Host memory.
void encode_row(const RowFormat& format, const float* values, std::byte* row);
void decode_row(const RowFormat& format, const std::byte* row, float* values);

}  // namespace kestrel

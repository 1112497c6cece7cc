// Test helper: an EXL3 matrix with random content, made the way an encoder would (random trellis symbols packed by
// pack_tile, random suh / svh), with views of it as a LinearWeight, as the float32 effective weight, and as the HF
// `weight` it stands for.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "backend/linear_weight.h"
#include "base/numeric.h"
#include "formats/exl3_codec.h"

namespace kestrel::testing {

struct RandomExl3Matrix {
  int64_t out_features = 0, in_features = 0;  // logical (HF) shape [out, in]
  int64_t in_padded = 0, out_padded = 0;
  int bits = 0;
  exl3::Codebook codebook = exl3::Codebook::inst3;
  std::vector<uint16_t> trellis;  // [in_padded / 16, out_padded / 16, 16 * bits]
  std::vector<uint16_t> suh;      // fp16 [in_padded]
  std::vector<uint16_t> svh;      // fp16 [out_padded]

  // A LinearWeight over this object's vectors (valid while it lives).
  LinearWeight weight() const {
    LinearWeight w{.name = "random_exl3", .dtype = DType::i16, .out_features = out_features,
                   .in_features = in_features, .data = reinterpret_cast<const std::byte*>(trellis.data())};
    w.exl3 = Exl3Matrix{.trellis = w.data,
                        .suh = reinterpret_cast<const std::byte*>(suh.data()),
                        .svh = reinterpret_cast<const std::byte*>(svh.data()),
                        .bits = bits,
                        .codebook = codebook,
                        .in_padded = in_padded,
                        .out_padded = out_padded};
    return w;
  }

  // E = diag(suh) · Hk · Ŵ · Hn · diag(svh), [in_padded, out_padded].
  std::vector<float> effective() const {
    std::vector<float> e(static_cast<size_t>(in_padded * out_padded));
    exl3::dequantize(trellis.data(), suh.data(), svh.data(), in_padded, out_padded, bits, codebook, e.data());
    return e;
  }

  // The HF weight W [out_features, in_features], W[o][i] = E[i][o].
  std::vector<float> hf_weight() const {
    const std::vector<float> e = effective();
    std::vector<float> w(static_cast<size_t>(out_features * in_features));
    for (int64_t o = 0; o < out_features; ++o) {
      for (int64_t i = 0; i < in_features; ++i) {
        w[static_cast<size_t>(o * in_features + i)] = e[static_cast<size_t>(i * out_padded + o)];
      }
    }
    return w;
  }
};

// Symbols uniform in [0, 2^bits); suh and svh uniform in ±[scale/2, scale] with random signs, as fp16.
inline RandomExl3Matrix random_exl3_matrix(int64_t out_features, int64_t in_features, int bits,
                                           exl3::Codebook codebook, uint32_t seed, float scale = 1.0f) {
  const auto padded = [](int64_t n) { return (n + exl3::kHadamardBlock - 1) / exl3::kHadamardBlock * exl3::kHadamardBlock; };
  RandomExl3Matrix m{.out_features = out_features, .in_features = in_features, .in_padded = padded(in_features),
                     .out_padded = padded(out_features), .bits = bits, .codebook = codebook, .trellis = {},
                     .suh = {}, .svh = {}};
  std::mt19937 rng(seed);
  const int64_t num_tiles = m.in_padded / 16 * (m.out_padded / 16);
  m.trellis.resize(static_cast<size_t>(num_tiles * 16 * bits));
  uint16_t symbols[exl3::kTileElements];
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    for (uint16_t& symbol : symbols) symbol = static_cast<uint16_t>(rng() & ((1u << bits) - 1));
    exl3::pack_tile(symbols, bits, m.trellis.data() + tile * 16 * bits);
  }
  std::uniform_real_distribution<float> magnitude(scale / 2, scale);
  const auto random_scale = [&] { return f32_to_f16(rng() & 1u ? magnitude(rng) : -magnitude(rng)); };
  for (int64_t i = 0; i < m.in_padded; ++i) m.suh.push_back(random_scale());
  for (int64_t o = 0; o < m.out_padded; ++o) m.svh.push_back(random_scale());
  return m;
}

}  // namespace kestrel::testing

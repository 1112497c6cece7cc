// The EXL3 quantizer for one linear layer, following exllamav3's `quantize_exl3` (shared/docs/exl3-format.md §4.1-4.7):
// pad both dims to 128, random input/output sign flips, output-channel scales, 128-point Hadamard rotations of both
// sides, input-channel scales, a global scale search over sampled tiles, then LDLQ (error feedback through the block
// LDL factor of the rotated, damped Hessian) with the tail-biting trellis encoder, or plain tile-by-tile encoding
// when there is no Hessian. The proxy error is the one exllamav3 reports: tr(Eᵀ H E) / tr(Wrᵀ H Wr) in the rotated
// basis, E = Wr − Ŵ, H the damped, sign-flipped and rotated Hessian (or the plain MSE of Wr without a Hessian).
//
// The random signs come from our own generator (std::mt19937_64), so the stored tensors differ from exllamav3's for
// the same seed; the error statistics match (tests/formats/exl3_quantizer_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/exl3_codec.h"

namespace kestrel {
class ThreadPool;
}

namespace kestrel::exl3 {

struct QuantizeOptions {
  int bits = 4;  // K, 1..8
  Codebook codebook = Codebook::mcg;
  uint64_t seed = 0;  // output signs (and input signs unless sign_seed is set)
  // Input sign flips belong to the Hessian in exllamav3 (linears sharing an input share them): give gate and up of
  // one expert the same sign_seed. Negative: use `seed`.
  int64_t sign_seed = -1;
  float sigma_reg = 0.025f;  // diagonal damping, times mean(diag H)
  // The global scale search (§4.4) costs ~10 x 3 max(k, n) / 16 tile encodings, more than the layer itself below
  // ~256 x 256; off means g = 1 (exllamav3's skip_g_scale), for tests that do not measure the error.
  bool scale_search = true;
  ThreadPool* pool = nullptr;  // nullptr: ThreadPool::global()
};

struct QuantizedLinear {
  int64_t in_features = 0, out_features = 0;
  int64_t in_padded = 0, out_padded = 0;  // k, n: multiples of 128
  int bits = 0;
  Codebook codebook = Codebook::mcg;
  std::vector<uint16_t> trellis;  // int16 bits [k/16, n/16, 16*bits]
  std::vector<uint16_t> suh;      // fp16 bits [k]
  std::vector<uint16_t> svh;      // fp16 bits [n]
  std::vector<float> rotated;     // Ŵ [k, n]: the codebook values chosen (exactly fp16), what the trellis decodes to
  double proxy_error = 0.0;
  double global_scale = 1.0;
  bool calibrated = false;  // false: no Hessian (or one with a ~zero diagonal), exllamav3's fallback path
};

// Quantizes W, float32 row-major [out_features, in_features] (the checkpoint's nn.Linear layout). `hessian` is the
// mean of xᵀx over calibration rows, float32 [in_features, in_features], or nullptr for the uncalibrated path.
// Throws Error on non-finite weights or Hessian, bad bits, or a Hessian that stays indefinite after damping.
QuantizedLinear quantize_linear(const float* weight, int64_t out_features, int64_t in_features, const float* hessian,
                                const QuantizeOptions& options);

// The int32 marker tensor value for a codebook (MCG / MUL1), none for 3INST.
int32_t codebook_marker(Codebook codebook);

}  // namespace kestrel::exl3

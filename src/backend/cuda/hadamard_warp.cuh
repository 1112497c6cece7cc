// The 128-point Hadamard rotation of EXL3 (natural-order Sylvester matrix, scaled by 1/sqrt(128)) done by one warp:
// lane l holds elements 4l..4l+3 of the block. Butterflies of span 1 and 2 stay inside a lane, spans 4..64 pair lane
// l with lane l ^ (span / 4) through shuffles. Same result as exl3::hadamard128 up to float rounding order.
#pragma once

namespace kestrel::cuda {

__device__ __forceinline__ void hadamard128_warp(float (&v)[4]) {
  const unsigned lane = threadIdx.x & 31u;
  for (int span = 1; span <= 2; span <<= 1) {
    for (int j = 0; j < 4; ++j) {
      if ((j & span) == 0) {
        const float a = v[j], b = v[j | span];
        v[j] = a + b;
        v[j | span] = a - b;
      }
    }
  }
  for (unsigned mask = 1; mask <= 16; mask <<= 1) {
    const bool upper = (lane & mask) != 0;
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, v[j], static_cast<int>(mask));
      v[j] = upper ? other - v[j] : v[j] + other;
    }
  }
  for (float& x : v) x *= 0.088388347648318f;  // 1 / sqrt(128)
}

}  // namespace kestrel::cuda

// EXL3 linear on the CPU in the rotated basis (shared/docs/exl3-format.md §2.6): the inputs are scaled by suh and
// rotated (128-point FWHT per block), multiplied by Ŵ decoded tile by tile from the codebook table, and the outputs
// rotated back and scaled by svh. Ŵ is never materialised: each thread decodes the tiles of its own output columns,
// once per call, and accumulates in float32 over input rows in a fixed order, so results do not depend on the thread
// count.
#include "backend/cpu/exl3_linear.h"

#include <cstring>
#include <vector>

#include "base/numeric.h"
#include "base/thread_pool.h"

namespace kestrel {

namespace {

std::vector<float> load_f16_vector(const std::byte* data, int64_t n) {
  std::vector<float> values(static_cast<size_t>(n));
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + i * 2, 2);
    values[i] = f16_to_f32(bits);
  }
  return values;
}

}  // namespace

void exl3_linear(const float* x, int64_t num_tokens, const LinearWeight& weight, float* y) {
  const Exl3Matrix& m = *weight.exl3;
  constexpr int kBlock = exl3::kHadamardBlock, kSide = exl3::kTileSide;
  const int64_t in = weight.in_features, out = weight.out_features, k = m.in_padded, n = m.out_padded;
  const std::vector<float> suh = load_f16_vector(m.suh, k), svh = load_f16_vector(m.svh, n);
  ThreadPool& pool = ThreadPool::global();

  // rotated[t] = (x[t] zero-extended to k, ⊙ suh) · Hk
  std::vector<float> rotated(static_cast<size_t>(num_tokens * k), 0.0f);
  pool.parallel_for(num_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = rotated.data() + t * k;
      for (int64_t i = 0; i < in; ++i) row[i] = x[t * in + i] * suh[static_cast<size_t>(i)];
      for (int64_t block = 0; block < k; block += kBlock) exl3::hadamard128(row + block);
    }
  });

  // product[t] = rotated[t] · Ŵ, one column of tiles per work item.
  std::vector<float> product(static_cast<size_t>(num_tokens * n), 0.0f);
  pool.parallel_for(n / kSide, [&](int64_t begin, int64_t end) {
    float tile[exl3::kTileElements];
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t a = 0; a < k / kSide; ++a) {
        decode_exl3_tile(m, a, b, tile);
        for (int64_t t = 0; t < num_tokens; ++t) {
          const float* inputs = rotated.data() + t * k + a * kSide;
          float* sums = product.data() + t * n + b * kSide;
          for (int r = 0; r < kSide; ++r) {
            for (int c = 0; c < kSide; ++c) sums[c] += inputs[r] * tile[r * kSide + c];
          }
        }
      }
    }
  });

  // y[t] = (product[t] · Hn ⊙ svh), the padded outputs dropped.
  pool.parallel_for(num_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = product.data() + t * n;
      for (int64_t block = 0; block < n; block += kBlock) exl3::hadamard128(row + block);
      for (int64_t o = 0; o < out; ++o) y[t * out + o] = row[o] * svh[static_cast<size_t>(o)];
    }
  });
}

}  // namespace kestrel

// Linear layers and embedding lookup on the CPU: weights are dequantised one row at a time into a thread-local
// float32 buffer and dotted with every token, so each weight byte is read once per call whatever its format. EXL3
// matrices go through exl3_linear, which works in their rotated basis.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/exl3_linear.h"
#include "base/numeric.h"
#include "base/thread_pool.h"

namespace kestrel {

namespace {

// Eight independent partial sums let the compiler vectorise; the order is fixed, so results are reproducible.
float dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int lane = 0; lane < 8; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  }
  float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

void CpuBackend::linear(const float* x, int64_t num_tokens, const LinearWeight& weight, float* y) {
  linear_taking(x, num_tokens, weight, product_input(), y);
}

void CpuBackend::linear_taking(const float* x, int64_t num_tokens, const LinearWeight& weight, ProductInput input,
                               float* y) {
  if (weight.exl3) {
    exl3_linear(x, num_tokens, weight, y);
    return;
  }
  const int64_t in = weight.in_features, out = weight.out_features;
  std::vector<float> rounded;  // x rounded to bf16, for a bf16 matrix under --dtype bfloat16
  if (weight.dtype == DType::bf16 && input == ProductInput::bf16) {
    rounded.resize(static_cast<size_t>(num_tokens * in));
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = bf16_to_f32(f32_to_bf16(x[i]));
    x = rounded.data();
  }
  // safetensors does not promise aligned data; unaligned float32 rows are copied like any other format.
  const bool direct_f32 = weight.dtype == DType::f32 && reinterpret_cast<uintptr_t>(weight.data) % alignof(float) == 0;
  ThreadPool::global().parallel_for(
      out,
      [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(in));
        for (int64_t o = begin; o < end; ++o) {
          const float* w = row.data();
          if (direct_f32) {
            w = reinterpret_cast<const float*>(weight.data) + o * in;
          } else {
            dequantize_row(weight, o, row.data());
          }
          for (int64_t t = 0; t < num_tokens; ++t) y[t * out + o] = dot(x + t * in, w, in);
        }
      },
      16);
}

void CpuBackend::embed(const int32_t* ids, int64_t num_tokens, const LinearWeight& table, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) dequantize_row(table, ids[t], out + t * table.in_features);
}

}  // namespace kestrel

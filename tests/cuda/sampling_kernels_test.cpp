// CudaBackend::draw_tokens against the host's draw (the CPU backend's, backend/token_draw.h) on the same logits and
// u: every row's token must be the same, for GLM-5.3-Flash's vocabulary and a small one; peaked, flat and tied
// distributions; NaN, -inf and +inf logits; greedy, temperature, min_p, top_k, top_p and their mixes; u at 0, just
// below 1 and random; more rows than one launch sequence takes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/sampling_kernels.h"
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

using namespace kestrel::cuda::testing;

constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Shape { peaked, flat, tied, holes, all_minus_inf, plus_inf };

std::vector<float> row_of(Shape shape, int64_t vocab, uint32_t seed) {
  std::vector<float> row = random_values(static_cast<size_t>(vocab), seed, shape == Shape::peaked ? 4.0f : 0.3f);
  std::mt19937 rng(seed);
  switch (shape) {
    case Shape::peaked:
    case Shape::flat:
      break;
    case Shape::tied:  // few distinct values: the ranking's order among equal logits decides
      for (float& l : row) l = std::round(l * 4.0f) / 4.0f;
      break;
    case Shape::holes:  // NaN and -inf scattered, and -0 beside +0
      for (size_t i = 0; i < row.size(); i += 7) row[i] = std::numeric_limits<float>::quiet_NaN();
      for (size_t i = 3; i < row.size(); i += 11) row[i] = -kInf;
      row[1] = -0.0f;
      row[2] = 0.0f;
      break;
    case Shape::all_minus_inf:
      std::fill(row.begin(), row.end(), -kInf);
      break;
    case Shape::plus_inf:
      row[static_cast<size_t>(rng() % row.size())] = kInf;
      break;
  }
  return row;
}

TEST(CudaDrawTokensTest, TakesTheHostsTokenForEveryRow) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu;
  CudaBackend gpu(0);
  const std::vector<TokenDraw> params = {
      {.temperature = 0.0f},
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_p = 0.95f},
      {.temperature = 1.3f, .top_k = 50},
      {.temperature = 1.0f, .min_p = 0.05f},
      {.temperature = 0.6f, .min_p = 0.02f, .top_p = 0.8f, .top_k = 200},
      {.temperature = 1.0f, .top_k = 1},
      {.temperature = 1.0f, .top_p = 0.01f},
      {.temperature = 2.0f, .top_p = 0.999f, .top_k = 100000},
  };
  uint32_t seed = 7;
  for (const int64_t vocab : {int64_t{154880}, int64_t{1000}}) {
    for (const Shape shape : {Shape::peaked, Shape::flat, Shape::tied, Shape::holes, Shape::all_minus_inf,
                              Shape::plus_inf}) {
      // 20 rows: two launch sequences (kMaxDrawRows = 16); each row its own logits, parameters and u.
      constexpr int kRows = 20;
      std::vector<float> logits;
      std::vector<TokenDraw> draws;
      std::mt19937_64 rng(++seed);
      for (int r = 0; r < kRows; ++r) {
        const std::vector<float> row = row_of(shape, vocab, ++seed);
        logits.insert(logits.end(), row.begin(), row.end());
        TokenDraw draw = params[static_cast<size_t>(r) % params.size()];
        draw.u = r == 1 ? 0.0 : r == 2 ? 1.0 - 0x1.0p-53 : uniform_of(rng());
        draws.push_back(draw);
      }
      std::vector<float> host_logits = logits;
      std::vector<int32_t> expected(kRows), tokens(kRows, -1);
      cpu.draw_tokens(host_logits.data(), vocab, draws, expected);
      float* device_logits = gpu.allocate_floats(logits.size());
      gpu.copy_to_backend(device_logits, logits.data(), logits.size() * sizeof(float));
      gpu.draw_tokens(device_logits, vocab, draws, tokens);
      gpu.free_floats(device_logits);
      for (int r = 0; r < kRows; ++r) {
        const TokenDraw& d = draws[static_cast<size_t>(r)];
        EXPECT_EQ(tokens[static_cast<size_t>(r)], expected[static_cast<size_t>(r)])
            << "vocab " << vocab << " shape " << static_cast<int>(shape) << " row " << r << " temperature "
            << d.temperature << " min_p " << d.min_p << " top_k " << d.top_k << " top_p " << d.top_p << " u " << d.u;
      }
    }
  }
}

TEST(CudaDrawTokensTest, RefusesRowsItCannotTake) {
  DrawTokensArgs args;
  args.rows = kMaxDrawRows + 1;
  args.vocab = 10;
  EXPECT_EQ(draw_tokens(args, nullptr), cudaErrorInvalidValue);
  args.rows = 1;
  args.vocab = 0;
  EXPECT_EQ(draw_tokens(args, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kestrel::cuda
